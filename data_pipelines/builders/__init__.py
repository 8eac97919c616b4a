"""TFDS builders (ArrayRecord files, read without TensorFlow through tfds.data_source)."""

from data_pipelines.builders.spatial_benchmark import (BENCHMARK_LIMITS, NAMES as BENCHMARKS,
                                                       SpatialBenchmark, build_benchmark,
                                                       load_benchmark, question_index,
                                                       stored_text, task_limits)
from data_pipelines.builders.synthetic_spatial import SyntheticSpatial, SyntheticSpatialConfig

__all__ = ["BENCHMARKS", "BENCHMARK_LIMITS", "SpatialBenchmark", "SyntheticSpatial",
           "SyntheticSpatialConfig", "build_benchmark", "load_benchmark", "question_index",
           "stored_text", "task_limits"]
