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
    # each round's own peak on both sides; the saving is their median with its interval over rounds
    assert len(result.baseline_peaks_bytes) == len(result.optimized_peaks_bytes) == result.repeats
    assert all(p > 0 for p in result.baseline_peaks_bytes + result.optimized_peaks_bytes)
    assert result.baseline_peak_bytes == int(statistics.median(result.baseline_peaks_bytes))
    assert result.optimized_peak_bytes == int(statistics.median(result.optimized_peaks_bytes))
    savings = [1 - o / b for b, o in zip(result.baseline_peaks_bytes, result.optimized_peaks_bytes, strict=True)]
    assert result.memory_reduction == pytest.approx(statistics.median(savings)) == result.memory.median
    low_m, high_m = result.memory.ci95
    assert min(savings) <= low_m <= result.memory.median <= high_m <= max(savings)
    assert result.versions["torch"] and result.versions["python"] and result.threads == 1
    assert result.device == "cpu" and result.dtype == "float32"
    data = json.loads(json.dumps(result.to_dict()))
    assert data["speedup"]["ci95"] == [low, high] and data["verdict"] in ("faster", "slower", "within-noise")
    assert data["memory"]["median"] == pytest.approx(result.memory_reduction)


FIRST_ROUND_HOG = """
    import torch

    from model import Net

    calls = []


    class Hog(torch.nn.Module):
        \"\"\"The model, plus 192 MiB held only while its first forward pass runs.\"\"\"

        def __init__(self):
            super().__init__()
            self.net = Net(dropout=0.0)

        def forward(self, x):
            calls.append(1)
            hog = torch.ones(48 * 2**20) if len(calls) == 1 else None
            out = self.net(x)
            return out if hog is None else out + 0 * hog[0]


    def build(batch_size=2, seq_len=8):
        torch.manual_seed(0)
        return Hog(), (torch.randn(batch_size, seq_len, 32, requires_grad=True),)
"""


def test_each_round_has_its_own_peak(tmp_path):
    """The peak is started anew before every round: a first round that held 192 MiB more than the
    others shows it, and the later rounds do not (one peak over the whole run would be 192 MiB in
    every round, and its interval a single value)."""
    repo = write_repo(tmp_path / "repo", harness=FIRST_ROUND_HOG)
    result = bench(repo, sdpa_rewrite(repo), config=BenchConfig(warmup=0, repeats=6, max_repeats=6, threads=1,
                                                                  timeout_s=120))
    assert result.status == "ok", result.message
    for peaks in (result.baseline_peaks_bytes, result.optimized_peaks_bytes):
        assert len(peaks) == 6
        assert peaks[0] > max(peaks[1:]) + 150 * 2**20, [p / 2**20 for p in peaks]


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
