"""Every file of the paper's corpus: extract, print, parse back, compare (slow: downloads wheels)."""

from __future__ import annotations

import pytest

from benchmarks.corpus import all_files
from engine.dsl.parser import parse_file
from engine.dsl.printer import print_file
from engine.extract import extract_file


@pytest.mark.slow
def test_corpus_round_trip():
    files = all_files()
    assert files, "the corpus is empty"
    failures = []
    for path in files:
        fm = extract_file(path)
        text = print_file(fm)
        back = parse_file(text)
        if back != fm or repr(back) != repr(fm):
            failures.append(str(path))
    assert not failures, f"{len(failures)} of {len(files)} files do not round-trip: {failures[:10]}"
