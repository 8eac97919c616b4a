"""Readers for the benchmarks the papers evaluate on, in their published formats."""

from data_pipelines.readers.blink import read_blink
from data_pipelines.readers.common import (BenchmarkFormatError, BenchmarkQuestion,
                                           MissingImageError, parse_options)
from data_pipelines.readers.mindcube import read_mindcube
from data_pipelines.readers.scanqa import read_scanqa
from data_pipelines.readers.vsibench import read_vsibench

__all__ = ["BenchmarkFormatError", "BenchmarkQuestion", "MissingImageError", "parse_options",
           "read_blink", "read_mindcube", "read_scanqa", "read_vsibench"]
