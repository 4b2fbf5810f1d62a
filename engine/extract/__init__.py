"""Extraction: Python source -> DSL structure (see engine.dsl.ir)."""

from engine.extract import _native

# before the first import of the extractor: the compiled module only when it is current
IMPLEMENTATION = _native.choose()

from engine.extract.extractor import (  # noqa: E402
    extract_file,
    extract_path,
    extract_source,
    extract_tree,
    iter_python_files,
)
from engine.extract.parallel import extract_many  # noqa: E402

__all__ = ["IMPLEMENTATION", "extract_file", "extract_many", "extract_path", "extract_source", "extract_tree",
           "iter_python_files"]
