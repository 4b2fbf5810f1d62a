"""Extraction: Python source -> DSL structure (see engine.dsl.ir)."""

from engine.extract.extractor import extract_file, extract_path, extract_source, iter_python_files

__all__ = ["extract_file", "extract_path", "extract_source", "iter_python_files"]
