"""Cameras (OpenCV convention), rigid transforms, depth unprojection and padded point clouds."""

from jaxspatial.geometry.camera import (
    Camera,
    check_fov,
    concrete,
    fov_degrees,
    intrinsics_from_fov,
    look_at,
    make_transform,
    matmul,
    project,
    rigid_inverse,
    rotation_about_axis,
    round_half_away,
    stack_cameras,
    validate_camera,
    world_to_camera,
)
from jaxspatial.geometry.pointcloud import (
    PointCloud,
    bucket_size,
    concatenate,
    pad_to,
    morton_order,
    pad_to_bucket,
    sort_spatially,
    stack,
    validate_point_cloud,
)
from jaxspatial.geometry.unproject import unproject_depth

__all__ = [
    "Camera", "PointCloud", "bucket_size", "check_fov", "concatenate", "concrete",
    "fov_degrees",
    "intrinsics_from_fov", "look_at", "make_transform",
    "matmul", "morton_order", "pad_to", "pad_to_bucket",
    "project", "rigid_inverse", "rotation_about_axis", "round_half_away", "sort_spatially", "stack", "stack_cameras",
    "unproject_depth", "validate_camera", "validate_point_cloud", "world_to_camera",
]
