"""TFDS builders (ArrayRecord files, read without TensorFlow through tfds.data_source)."""

from data_pipelines.builders.synthetic_spatial import SyntheticSpatial, SyntheticSpatialConfig

__all__ = ["SyntheticSpatial", "SyntheticSpatialConfig"]
