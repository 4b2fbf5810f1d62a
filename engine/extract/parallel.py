"""Extraction of many files over several processes (each file is independent)."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from engine.dsl.ir import FileModel
from engine.extract.extractor import extract_file


def extract_many(paths: list[str | Path], jobs: int = 1) -> list[FileModel]:
    """`extract_file` for every path, in order; with `jobs` > 1 the files are spread over that many
    worker processes (results come back pickled, which costs about a fifth of the extraction)."""
    if jobs <= 1 or len(paths) < 2:
        return [extract_file(p) for p in paths]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(extract_file, paths, chunksize=max(1, len(paths) // (jobs * 8))))
