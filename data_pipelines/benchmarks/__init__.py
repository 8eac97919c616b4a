"""Benchmark task builders: a benchmark's published files (+ its images, videos or scans)
-> BenchmarkScene records, stored by builders/spatial_benchmark.py."""

from data_pipelines.benchmarks.scene import (GEOMETRY, BenchmarkScene, letterbox,
                                             nominal_cameras, read_image)

__all__ = ["GEOMETRY", "BenchmarkScene", "letterbox", "nominal_cameras", "read_image"]
