"""Procedural 3D scenes with exact geometry, for tests, demos and the synthetic dataset."""

from data_pipelines.synthetic.questions import FAMILIES, SpatialQuestion, make_questions
from data_pipelines.synthetic.rigs import arc_rig, orbit_cameras, rotation_rig
from data_pipelines.synthetic.room import Room, SceneObject, make_room
from data_pipelines.synthetic.samples import RIGS, Sample, SampleConfig, make_sample, scene_seed

__all__ = ["FAMILIES", "RIGS", "Room", "Sample", "SampleConfig", "SceneObject",
           "SpatialQuestion", "arc_rig", "make_questions", "make_room", "make_sample",
           "orbit_cameras", "rotation_rig", "scene_seed"]
