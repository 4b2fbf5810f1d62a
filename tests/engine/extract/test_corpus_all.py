"""Every file of the paper's corpus extracts with no crash and no error diagnostic (slow)."""

from __future__ import annotations

import pytest

from benchmarks.corpus import all_files
from engine.extract import extract_file


@pytest.mark.slow
def test_whole_corpus_extracts_without_errors():
    files = all_files()
    assert len(files) >= 200, f"the corpus is incomplete: {len(files)} files"
    crashes, errors, classes, nodes = [], [], 0, 0
    for path in files:
        try:
            fm = extract_file(path)
        except Exception as exc:  # noqa: BLE001 - the point is to list every crash
            crashes.append(f"{path}: {type(exc).__name__}: {exc}")
            continue
        errors.extend(f"{d.file}:{d.line}: {d.message}" for d in fm.diagnostics if d.severity == "error")
        classes += len(fm.classes)
        nodes += sum(len(m.nodes) for c in fm.classes for m in c.methods)
    assert not crashes, crashes[:10]
    assert not errors, errors[:10]
    assert classes > 3000 and nodes > 100_000  # extraction really ran over the corpus
