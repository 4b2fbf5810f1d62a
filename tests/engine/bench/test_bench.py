"""The training-step benchmark: interleaved rounds in two fresh sandboxed processes."""

from __future__ import annotations

import json
import statistics

import pytest

pytest.importorskip("torch")

from engine.bench import BenchConfig, bench  # noqa: E402
from engine.bench.stats import verdict  # noqa: E402
from tests.engine.verify.fixtures import sdpa_rewrite, write_repo  # noqa: E402

pytestmark = pytest.mark.torch


def test_bench_measures_both_sides(tmp_path):
    repo = write_repo(tmp_path / "repo")
    config = BenchConfig(warmup=2, repeats=6, max_repeats=8, threads=1, timeout_s=120)
    result = bench(repo, sdpa_rewrite(repo), config=config)
    assert result.status == "ok", result.message
    assert result.shape == {"batch_size": 4, "seq_len": 64}  # the bench shape from .adopter.yml
    assert result.input_shapes == {"input.0": [4, 64, 32]}
    # at least the fewest rounds, at most the cap; one more only while the interval was too wide
    assert 6 <= result.repeats <= 8 and result.stopped in ("converged", "max-rounds")
    assert len(result.baseline_times_s) == len(result.optimized_times_s) == len(result.pair_ratios) == result.repeats
    assert (result.stopped == "max-rounds") == (result.repeats == 8)
    assert all(t > 0 for t in result.baseline_times_s + result.optimized_times_s)
    assert result.speedup.median == pytest.approx(statistics.median(result.pair_ratios))
    low, high = result.speedup.ci95
    assert min(result.pair_ratios) <= low <= result.speedup.median <= high <= max(result.pair_ratios)
    assert result.verdict == verdict(result.speedup)
    assert result.baseline_peak_bytes > 0 and result.optimized_peak_bytes > 0
    assert result.memory_reduction == pytest.approx(1 - result.optimized_peak_bytes / result.baseline_peak_bytes)
    assert result.memory.ci95 == (result.memory_reduction, result.memory_reduction)
    assert result.versions["torch"] and result.versions["python"] and result.threads == 1
    assert result.device == "cpu" and result.dtype == "float32"
    data = json.loads(json.dumps(result.to_dict()))
    assert data["speedup"]["ci95"] == [low, high] and data["verdict"] in ("faster", "slower", "within-noise")
    assert data["memory"]["median"] == pytest.approx(result.memory_reduction)


def test_bench_stops_at_its_time_budget(tmp_path):
    repo = write_repo(tmp_path / "repo")
    result = bench(repo, sdpa_rewrite(repo), config=BenchConfig(warmup=1, repeats=1000, budget_s=0.001, threads=1,
                                                                  timeout_s=120))
    assert result.status == "ok", result.message
    assert result.stopped == "budget" and result.repeats == 1  # one round, then the budget was spent
    assert result.speedup.ci95 is None and result.verdict == "within-noise"


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
