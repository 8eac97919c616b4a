"""Procedural 3D scenes with exact geometry, for tests, demos and the synthetic dataset."""

from data_pipelines.synthetic.rigs import orbit_cameras
from data_pipelines.synthetic.room import Room, SceneObject, make_room

__all__ = ["Room", "SceneObject", "make_room", "orbit_cameras"]
