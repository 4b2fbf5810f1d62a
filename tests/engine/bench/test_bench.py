"""The training-step benchmark: interleaved rounds in two fresh sandboxed processes."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from engine.bench import BenchConfig, bench  # noqa: E402
from tests.engine.verify.fixtures import sdpa_rewrite, write_repo  # noqa: E402

pytestmark = pytest.mark.torch


def test_bench_measures_both_sides(tmp_path):
    repo = write_repo(tmp_path / "repo")
    result = bench(repo, sdpa_rewrite(repo), config=BenchConfig(warmup=2, repeats=4, threads=1, timeout_s=120))
    assert result.status == "ok", result.message
    assert result.shape == {"batch_size": 4, "seq_len": 64}  # the bench shape from .adopter.yml
    assert result.input_shapes == {"input.0": [4, 64, 32]}
    assert len(result.baseline_times_s) == len(result.optimized_times_s) == len(result.pair_ratios) == 4
    assert all(t > 0 for t in result.baseline_times_s + result.optimized_times_s)
    assert result.speedup == pytest.approx(result.baseline_step_s / result.optimized_step_s)
    assert result.baseline_peak_bytes > 0 and result.optimized_peak_bytes > 0
    assert result.memory_reduction == pytest.approx(1 - result.optimized_peak_bytes / result.baseline_peak_bytes)
    assert result.versions["torch"] and result.versions["python"] and result.threads == 1
    assert result.device == "cpu" and result.dtype == "float32"
    json.dumps(result.to_dict())


def test_bench_bfloat16_and_shape_override(tmp_path):
    repo = write_repo(tmp_path / "repo")
    result = bench(repo, sdpa_rewrite(repo), config=BenchConfig(dtype="bfloat16", warmup=1, repeats=2, threads=1,
                                                                  shape={"batch_size": 2, "seq_len": 16}, timeout_s=120))
    assert result.status == "ok", result.message
    assert result.input_shapes == {"input.0": [2, 16, 32]} and result.dtype == "bfloat16"


def test_bench_reports_a_rewrite_that_breaks(tmp_path):
    repo = write_repo(tmp_path / "repo")
    broken = {"model.py": (repo / "model.py").read_text().replace("import math", "import math\nraise ImportError('gone')")}
    result = bench(repo, broken, config=BenchConfig(warmup=1, repeats=2, threads=1, timeout_s=120))
    assert result.status == "error"
    assert "rewritten" in result.message and "gone" in result.message


def test_bench_time_limit(tmp_path):
    repo = write_repo(tmp_path / "repo", harness="""
        import time

        def build(batch_size=1, seq_len=4):
            time.sleep(600)
    """)
    result = bench(repo, sdpa_rewrite(repo), config=BenchConfig(warmup=1, repeats=2, timeout_s=5))
    assert result.status == "timeout"
    assert result.duration_s < 30
