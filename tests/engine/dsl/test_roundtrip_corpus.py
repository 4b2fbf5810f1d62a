"""Every file of the paper's corpus: extract, print, parse back, compare (slow: downloads wheels)."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from benchmarks.corpus import all_files
from engine.dsl.parser import parse_file
from engine.dsl.printer import print_file
from engine.extract import extract_file


def _round_trip_fails(path) -> str | None:
    fm = extract_file(path)
    text = print_file(fm)
    back = parse_file(text)
    return str(path) if back != fm or repr(back) != repr(fm) else None


@pytest.mark.slow
def test_corpus_round_trip():
    files = all_files()
    assert files, "the corpus is empty"
    # the files are independent: spread over the machine's cores
    jobs = min(2, os.cpu_count() or 1)
    if jobs < 2:
        failures = [f for f in map(_round_trip_fails, files) if f]
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            failures = [f for f in pool.map(_round_trip_fails, files, chunksize=4) if f]
    assert not failures, f"{len(failures)} of {len(files)} files do not round-trip: {failures[:10]}"
