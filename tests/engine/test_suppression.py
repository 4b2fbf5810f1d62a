"""`# adopter: ignore[RULE-ID]` / `# adopter: ignore` on a finding's first line: reported as
suppressed in text, JSON and SARIF, never rewritten."""

from __future__ import annotations

import json

from engine.sarif import to_sarif
from engine.scan import scan_path, scan_source, select_rules
from engine.suppression import suppression_marks

OPTIMIZERS = """\
import torch


def a(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)  # adopter: ignore[fused-adamw]


def b(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)  # adopter: ignore


def c(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)  # adopter: ignore[gelu-tanh, layer-norm]


def d(model):
    note = "# adopter: ignore"
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
"""


def test_marks_are_read_from_comments_only():
    marks = suppression_marks(OPTIMIZERS)
    assert marks == {5: (frozenset({"fused-adamw"}), "# adopter: ignore[fused-adamw]"),
                     9: (None, "# adopter: ignore"),
                     13: (frozenset({"gelu-tanh", "layer-norm"}), "# adopter: ignore[gelu-tanh, layer-norm]")}


def test_a_suppressed_finding_is_reported_and_not_rewritten():
    findings, new_text = scan_source(OPTIMIZERS, select_rules("fused-adamw"))
    by_line = {f.line: f for f in findings}
    assert by_line[5].status == by_line[9].status == "suppressed"
    assert by_line[5].reason == "`# adopter: ignore[fused-adamw]` on line 5 (would have been rewritten)"
    assert by_line[13].status == "rewritten"  # the comment names other rules
    assert by_line[18].status == "rewritten"  # the words in a string are no comment
    rewritten = new_text.splitlines()
    assert rewritten[4] == OPTIMIZERS.splitlines()[4] and rewritten[8] == OPTIMIZERS.splitlines()[8]
    functions = {chunk.split("(", 1)[0]: chunk for chunk in new_text.split("\ndef ")[1:]}
    assert "fused=" not in functions["a"] and "fused=" not in functions["b"]
    assert "fused=all(p.device.type" in functions["c"] and "fused=" in functions["d"]


def test_suppressed_in_json_and_sarif(tmp_path):
    (tmp_path / "train.py").write_text(OPTIMIZERS)
    result = scan_path(tmp_path, rules="fused-adamw")
    statuses = [f["status"] for f in result.to_json()["findings"]]
    assert statuses == ["suppressed", "suppressed", "rewritten", "rewritten"]
    sarif = json.loads(json.dumps(to_sarif(result.findings, select_rules("all"), tmp_path)))
    results = sarif["runs"][0]["results"]
    assert [r["properties"]["status"] for r in results] == statuses
    assert results[0]["suppressions"] == [{"kind": "inSource", "justification": result.findings[0].reason}]
    assert "suppressions" not in results[2]
    assert "fused=" not in "\n".join(result.files["train.py"].splitlines()[:10])
