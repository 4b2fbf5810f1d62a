"""The pull request body: every section, safe escaping, the size limit, the minimum gain."""

from __future__ import annotations

import pytest

from engine.report import (
    GITHUB_BODY_LIMIT,
    Benchmark,
    Finding,
    Report,
    Verification,
    decide,
    normalize_min_gain,
    render,
    render_pr_body,
    utf16_len,
)

VERIFICATION = {
    "per_rewrite": {
        "sdpa-attention": {"status": "passed", "max_abs_err": 2.1e-6, "max_rel_err": 3.4e-7, "cases": [{}] * 6},
        "gelu-tanh": {"status": "passed", "max_abs_err": 1.0e-6, "max_rel_err": 1.0e-7, "cases": [{}] * 6},
        "wrong-scale": {"status": "failed", "max_abs_err": 0.3, "max_rel_err": 0.2, "cases": [{}] * 6,
                        "message": "out.0: max abs error 0.3"},
    },
    "accepted": ["sdpa-attention", "gelu-tanh"],
    "dropped": {"wrong-scale": "failed: out.0: max abs error 0.3"},
    "combined": {"status": "passed", "max_abs_err": 2.5e-6, "max_rel_err": 4e-7, "cases": [{}] * 6},
}
BENCH = {
    "status": "ok", "device": "cpu", "device_name": "AMD EPYC", "dtype": "float32",
    "shape": {"batch_size": 8, "seq_len": 512}, "baseline_step_s": 2.0, "optimized_step_s": 1.25, "speedup": {"median": 1.6, "ci95": [1.55, 1.7], "samples": 12},
    "verdict": "faster", "stopped": "converged", "pair_ratios": [1.55, 1.6, 1.7], "baseline_peak_bytes": 900 * 2**20, "optimized_peak_bytes": 600 * 2**20,
    "memory_reduction": 1 / 3, "memory": {"median": 1 / 3, "ci95": [1 / 3, 1 / 3], "samples": 1}, "repeats": 12, "warmup": 3, "threads": 2,
    "memory_metric": "peak RSS", "versions": {"python": "3.11.7", "torch": "2.13.0", "transformers": "4.34.1"},
}
FINDINGS = [
    {"rule": "sdpa-attention", "file": "model.py", "line": 60, "end_line": 64, "status": "rewritten",
     "message": "attention | via softmax"},
    Finding("gelu-tanh", "model.py", 45, 45),
    {"rule_id": "sdpa-attention", "path": "other.py", "line": 3, "status": "near-miss",
     "reason": "intermediate `att` escapes the match: returned"},
]


def _body(**extra) -> str:
    return render_pr_body({"findings": FINDINGS, "verification": VERIFICATION, "bench": BENCH,
                           "repository": "me/minigpt", "identity": "adopter/sdpa-gelu", **extra})


def test_body_has_every_section():
    body = _body()
    for heading in ("### What changed and why", "### Sites", "### Verification", "### Benchmark",
                    "### Environment", "### Minimum gain", "### Reproduce", "### Commands"):
        assert heading in body
    assert "[`sdpa-attention`](https://github.com/adopter-dev/adopter/blob/main/docs/rules.md#sdpa-attention)" in body
    assert "](docs/" not in body  # no link is relative: on the user's pull request it would point into their repository
    assert "| `sdpa-attention` | ✅ passed | 2.10e-06 | 3.40e-07 | 6 |" in body
    assert "**all accepted together**" in body
    assert "`wrong-scale`: failed" in body  # dropped, with the reason
    assert "| Median step time | 2.000 s | 1.250 s | 1.60x faster | 1.55x to 1.70x |" in body
    assert "| Peak memory | 900.0 MiB | 600.0 MiB | 33.3% less | one measurement per side |" in body
    assert "Verdict: faster: **1.60x** the speed of the original, 95% confidence interval 1.55x to 1.70x." in body
    assert "12 interleaved rounds after 3 warm-up steps (stopped when the interval was narrow enough)" in body
    assert "4.34.1" in body and "AMD EPYC" in body
    assert "adopter scan . --verify --bench --device cpu --dtype float32" in body
    for command in ("@adopter rescan", "@adopter recreate", "@adopter ignore"):
        assert command in body
    assert "attention \\| via softmax" in body  # pipes in cells are escaped
    assert "escapes the match" in body  # near-misses show their reason
    assert body.rstrip().endswith("<!-- adopter-identity: adopter/sdpa-gelu -->")


def test_a_memory_saving_measured_per_round_states_its_interval():
    per_round = dict(BENCH, memory={"median": 1 / 3, "ci95": [0.31, 0.35], "samples": 12})
    body = _body(bench=per_round)
    assert "33.3% less peak memory (95% confidence interval 31.0% to 35.0%)" in body
    assert "| Peak memory | 900.0 MiB | 600.0 MiB | 33.3% less | +31.0% to +35.0% saved |" in body
    assert "confidence interval 33.3%" not in _body()  # one measurement per side has no interval to state


def test_the_memory_interval_says_it_is_one_runs_and_runs_differ_by_more():
    per_round = dict(BENCH, memory={"median": 1 / 3, "ci95": [0.31, 0.35], "samples": 12})
    table = _body(bench=per_round).split("### Benchmark", 1)[1].split("Verdict:", 1)[0]
    assert ("The peak-memory interval is over the rounds of this one run; between runs, peak memory can "
            "differ by a few percentage points more.") in table
    assert "between runs" not in _body()  # one measurement per side: no interval to qualify


def test_one_decision_whether_the_memory_interval_is_real():
    from engine.pipeline import summary_lines

    per_round = dict(BENCH, memory={"median": 1 / 3, "ci95": [0.31, 0.35], "samples": 12})
    assert Benchmark.from_any(per_round).memory_interval == (0.31, 0.35)
    assert Benchmark.from_any(BENCH).memory_interval is None  # [1/3, 1/3]: one measurement per side
    assert Benchmark.from_any(dict(BENCH, memory=None, memory_reduction=None, baseline_peak_bytes=None,
                                   optimized_peak_bytes=None)).memory_interval is None
    # the command line's summary reads the same answer
    [line] = summary_lines({"benchmark": per_round})
    assert "(+33.3% saved, 95% CI +31.0% to +35.0%)" in line
    [line] = summary_lines({"benchmark": BENCH})
    assert "(+33.3% saved)" in line


def test_gain_below_the_minimum_says_no_pull_request():
    slow = dict(BENCH, baseline_step_s=1.0, optimized_step_s=0.99, speedup=1.0101, memory_reduction=0.01, memory=None)
    body = _body(bench=slow)
    assert "would not open a pull request" in body
    assert "would not open" not in _body()


def test_decision_rules():
    v = Verification.from_any(VERIFICATION)
    fast = Benchmark.from_any(BENCH)
    assert decide(v, fast).open_pr
    lean = Benchmark.from_any(dict(BENCH, speedup=1.0, memory_reduction=0.2, memory=None))
    assert decide(v, lean).open_pr and "memory" in decide(v, lean).reason
    assert not decide(v, fast, min_gain=0.7).open_pr
    failed = Verification.from_any(dict(VERIFICATION, combined={"status": "failed"}))
    assert not decide(failed, fast).open_pr
    assert not decide(v, Benchmark.from_any({"status": "timeout", "message": "slow"})).open_pr
    assert normalize_min_gain(1.05) == pytest.approx(0.05) and normalize_min_gain(0.05) == 0.05


def test_worker_context_form_renders():
    body = render_pr_body({
        "repository": "o/r", "identity": "adopter/x", "rule_ids": ["sdpa-attention"],
        "sites": [{"rule_id": "sdpa-attention", "path": "m.py", "line": 3, "end_line": 9, "message": "m"}],
        "result": {"verified": True, "max_abs_error": 1e-6, "device": "cuda", "before_s": 0.02, "after_s": 0.01,
                   "speedup": 2.0, "peak_mem_before": 2**30, "peak_mem_after": 2**29, "versions": {"torch": "2.13.0"}},
        "base_sha": "abc123", "mention": "@adopter-bot", "scan_id": 7,
    })
    assert "git checkout abc123" in body and "@adopter-bot rescan" in body
    # the worker's summary record has two medians and no rounds: a point without an interval is not called faster
    assert "| Median step time | 20.0 ms | 10.0 ms | 2.00x (within noise) | not bounded |" in body
    assert "no confidence interval was measured" in body
    assert "adopter-identity: adopter/x scan: 7" in body


def test_huge_reports_stay_under_the_limit_and_keep_their_tail():
    many = [Finding(f"rule-{i % 7}", f"pkg/very/long/path/to/module_{i}.py", i, i + 3, message="é" * 80 + "😀" * 20)
            for i in range(5000)]
    rows = {f"rewrite-{i}": {"status": "passed", "max_abs_err": 1e-6, "cases": []} for i in range(3000)}
    report = Report(findings=many, verification=Verification.from_any({"per_rewrite": rows, "accepted": list(rows),
                                                                      "dropped": {}, "combined": None}),
                    bench=Benchmark.from_any(BENCH), identity="adopter/big")
    body = render(report)
    assert utf16_len(body) <= GITHUB_BODY_LIMIT
    assert "more site(s), left out" in body
    assert "@adopter ignore" in body and "adopter-identity: adopter/big" in body
    assert body.count("```") % 2 == 0
    small = render(report, limit=4000)  # smaller than 20 sites: the middle of the body is cut
    assert utf16_len(small) <= 4000 and "@adopter rescan" in small and "cut to stay under" in small
    assert small.count("```") % 2 == 0


def test_a_slower_or_larger_rewrite_is_not_called_faster_or_smaller():
    body = render_pr_body({
        "sites": [{"rule_id": "sdpa-attention", "path": "m.py", "line": 3}],
        "verification": {"status": "passed", "max_abs_err": 1e-7, "cases": []},
        "bench": {"status": "ok", "baseline_step_s": 0.8, "optimized_step_s": 1.0,
                  "speedup": {"median": 0.8, "ci95": [0.75, 0.85], "samples": 20}, "verdict": "slower",
                  "baseline_peak_bytes": 2**29, "optimized_peak_bytes": 2**30},
    })
    assert "| Median step time | 800.0 ms | 1.000 s | 1.25x slower | 0.75x to 0.85x |" in body
    assert "| Peak memory | 512.0 MiB | 1024.0 MiB | 100.0% more |" in body
    assert "faster" not in body.split("### Benchmark")[1].split("### Environment")[0]
