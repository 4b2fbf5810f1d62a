"""engine.pipeline and `adopter scan --verify/--bench`: per-rule candidates, verification in sandboxed
children, dropped failures, the benchmark and the minimum-gain decision.

The tests marked `torch` run real verification children (each side of each candidate is a fresh
process importing torch: tens of seconds each on a loaded machine), so they use a copy of
examples/minigpt with small verification shapes and two rules.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.pipeline as pipeline
from engine.cli import app
from engine.scan import scan_path, select_rules

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minigpt"
RULES = "sdpa-attention,gelu-tanh"
SMALL_CONFIG = """\
harness:
  build: harness.py:build
  shapes:
    - {batch_size: 2, seq_len: 12}
    - {batch_size: 1, seq_len: 7}
  bench: {batch_size: 1, seq_len: 32}
min_gain: 1.05
"""


@pytest.fixture
def minigpt(tmp_path: Path) -> Path:
    """A copy of examples/minigpt with small verification shapes (the model itself is unchanged)."""
    root = tmp_path / "minigpt"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / ".adopter.yml").write_text(SMALL_CONFIG)
    return root


# ------------------------------------------------------------------------------------------------
# Without torch children


def test_one_candidate_per_rule_per_file_each_rewriting_only_its_rule(minigpt: Path):
    result = scan_path(minigpt, rules=RULES)
    groups, notes = pipeline.rewrite_groups(result, minigpt)
    assert notes == []
    assert sorted(g.id for g in groups) == ["gelu-tanh", "sdpa-attention"]
    by_id = {g.id: g for g in groups}
    sdpa, gelu = by_id["sdpa-attention"].text, by_id["gelu-tanh"].text
    assert "scaled_dot_product_attention" in sdpa and "torch.tanh(" in sdpa  # GELU formula kept
    assert 'approximate="tanh"' in gelu and "scaled_dot_product_attention" not in gelu
    # both together is exactly what the scan produced with both rules
    assert pipeline.combined_files(result, groups, ["sdpa-attention", "gelu-tanh"], minigpt) == result.files
    assert pipeline.combined_files(result, groups, ["gelu-tanh"], minigpt) == {"model.py": gelu}


def test_bench_without_verify_applies_min_gain(minigpt: Path, monkeypatch):
    from engine.bench import BenchResult
    from engine.bench.stats import Estimate

    seen = {}

    def fake_bench(root, files, target=None, *, config=None):
        seen.update(root=Path(root), files=files, config=config)
        return BenchResult("ok", device=config.device, dtype=config.dtype, shape=config.shape,
                           baseline_step_s=0.2, optimized_step_s=0.19, speedup=Estimate(0.2 / 0.19, (1.0, 1.1), 8),
                           baseline_peak_bytes=100 << 20, optimized_peak_bytes=99 << 20, memory_reduction=0.01)

    monkeypatch.setattr("engine.bench.bench", fake_bench)
    result = scan_path(minigpt, rules=RULES)
    outcome = pipeline.verify_and_bench(result, minigpt, verify=False, bench=True, bench_shape={"batch_size": 1},
                                        repeats=3, bench_budget_s=7, min_gain=0.10)
    json.dumps(outcome)  # plain data
    assert seen["files"] == result.files and seen["config"].repeats == 3 and seen["config"].budget_s == 7
    assert seen["config"].shape == {"batch_size": 1}
    assert outcome["verification"] is None
    assert outcome["decision"]["open_pr"] is False and "not run" in outcome["decision"]["reason"]
    assert outcome["benchmark"]["speedup"]["median"] == pytest.approx(0.2 / 0.19)
    assert outcome["benchmark"]["speedup"]["ci95"] == (1.0, 1.1)
    assert outcome["environment"]["cpu_count"] >= 1


def test_nothing_rewritten_gives_a_clear_decision(tmp_path: Path):
    (tmp_path / "m.py").write_text("import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    outcome = pipeline.verify_and_bench(scan_path(tmp_path), tmp_path, bench=True)
    assert outcome["rewrites"] == [] and outcome["decision"]["open_pr"] is False
    assert outcome["decision"]["reason"] == "nothing was rewritten"


def test_bad_bench_shape_is_a_usage_error(minigpt: Path):
    out = CliRunner().invoke(app, ["scan", str(minigpt), "--bench", "--bench-shape", "batch_size"])
    assert out.exit_code == 2 and "--bench-shape" in out.output


# ------------------------------------------------------------------------------------------------
# Real verification children


@pytest.mark.torch
def test_cli_verify_json_reports_each_applied_rule_passed(minigpt: Path, tmp_path: Path):
    report = tmp_path / "pr.md"
    out = CliRunner().invoke(app, ["scan", str(minigpt), "--rules", RULES, "--verify", "--format", "json",
                                   "--report", str(report), "--diff", str(tmp_path / "patch.diff")])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    applied = {f["rule"] for f in data["findings"] if f["status"] in ("rewritten", "guarded")}
    assert applied == {"sdpa-attention", "gelu-tanh"}
    verification = data["verification"]
    for rule in applied:
        assert verification["rules"][rule]["passed"] is True, verification["per_rewrite"]
        row = verification["per_rewrite"][rule]
        assert row["status"] == "passed" and row["comparisons"] > 0
        assert row["max_abs_err"] is not None and row["max_rel_err"] < 1e-3
    assert sorted(verification["accepted"]) == sorted(applied) and verification["dropped"] == {}
    assert verification["combined"]["passed"] is True  # both together, re-synthesized
    assert data["benchmark"] is None and data["decision"]["open_pr"] is False  # not measured
    patch = (tmp_path / "patch.diff").read_text()
    assert "scaled_dot_product_attention" in patch and 'approximate="tanh"' in patch
    body = report.read_text()
    assert "✅ passed" in body and "all accepted together" in body


@pytest.mark.torch
def test_wrong_rewrite_is_caught_dropped_and_reported(minigpt: Path, tmp_path: Path, monkeypatch):
    """The sdpa rule's template is sabotaged (scale doubled): verification fails it, it leaves the
    patch, the GELU rewrite stays, and the report and JSON say why."""
    real = select_rules("all")
    wrong = [replace(r, rewrite=r.rewrite.replace("scale=", "scale=2.0 * ")) if r.id == "sdpa-attention" else r
             for r in real]
    assert any("scale=2.0 * " in (r.rewrite or "") for r in wrong)
    monkeypatch.setattr(pipeline, "select_rules", lambda spec="default": wrong)
    report = tmp_path / "pr.md"
    out = CliRunner().invoke(app, ["scan", str(minigpt), "--rules", RULES, "--verify", "--format", "json",
                                   "--report", str(report), "--diff", str(tmp_path / "patch.diff")])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    verification = data["verification"]
    bad = verification["per_rewrite"]["sdpa-attention"]
    assert bad["passed"] is False and bad["status"] == "failed", bad
    assert bad["max_rel_err"] > 1e-2  # really different, not a rounding matter
    assert verification["rules"]["sdpa-attention"]["passed"] is False
    assert "sdpa-attention" in verification["dropped"]
    assert verification["accepted"] == ["gelu-tanh"] and verification["rules"]["gelu-tanh"]["passed"] is True
    patch = (tmp_path / "patch.diff").read_text()
    assert "scaled_dot_product_attention" not in patch and 'approximate="tanh"' in patch
    assert data["decision"]["open_pr"] is False
    body = report.read_text()
    assert "Dropped from this pull request" in body and "`sdpa-attention`" in body and "❌ failed" in body
    assert "dropped: not verified" in body  # its sites are not listed as applied
