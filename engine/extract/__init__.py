"""Extraction: Python source -> DSL structure (see engine.dsl.ir)."""

from engine.extract.extractor import extract_file, extract_path, extract_source, iter_python_files
from engine.extract.parallel import extract_many

__all__ = ["extract_file", "extract_many", "extract_path", "extract_source", "iter_python_files"]
