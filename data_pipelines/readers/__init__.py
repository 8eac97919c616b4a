"""Readers for the benchmarks the papers evaluate on, in their published formats."""

from data_pipelines.readers.blink import read_blink
from data_pipelines.readers.chartqa import read_chartqa
from data_pipelines.readers.common import (BenchmarkFormatError, BenchmarkQuestion,
                                           MissingImageError, parse_options)
from data_pipelines.readers.hrbench import read_hrbench
from data_pipelines.readers.mindcube import read_mindcube
from data_pipelines.readers.scannet import MissingScanError, Scan, ScanFormatError, read_scan
from data_pipelines.readers.scanqa import read_scanqa
from data_pipelines.readers.sqa3d import read_sqa3d
from data_pipelines.readers.vsibench import read_vsibench

__all__ = ["BenchmarkFormatError", "BenchmarkQuestion", "MissingImageError",
           "MissingScanError", "Scan", "ScanFormatError", "parse_options", "read_blink",
           "read_chartqa", "read_hrbench", "read_mindcube", "read_scan", "read_scanqa",
           "read_sqa3d", "read_vsibench"]
