"""The pull request body and SARIF link to Adopter's documentation by absolute URL, embed each rule's
help, say which version wrote them and what configuration applied; the gain decision uses the
interval's lower bound."""

from __future__ import annotations

import re

import pytest

from engine.report import Benchmark, Verification, decide, render_pr_body
from engine.report.links import default_docs_url, docs_base_url, rule_help_url
from engine.report.rule_help import RuleHelp, library_help

PASSED = {"status": "passed", "max_abs_err": 1e-6, "max_rel_err": 1e-7, "cases": [{}]}
SITES = [{"rule": "sdpa-attention", "file": "model.py", "line": 60, "status": "rewritten"},
         {"rule": "paper/rule_1", "file": "model.py", "line": 90, "status": "rewritten"}]


def _bench(median, low, high, verdict, memory=0.0):
    return {"status": "ok", "baseline_step_s": 1.0, "optimized_step_s": 1.0 / median,
            "speedup": {"median": median, "ci95": [low, high], "samples": 30}, "verdict": verdict,
            "repeats": 30, "stopped": "budget", "baseline_peak_bytes": 100, "optimized_peak_bytes": 100,
            "memory_reduction": memory, "memory": {"median": memory, "ci95": [memory, memory], "samples": 1}}


def test_every_link_is_absolute_under_one_setting(monkeypatch):
    monkeypatch.delenv("ADOPTER_DOCS_URL", raising=False)
    body = render_pr_body({"findings": SITES})
    links = re.findall(r"\]\(([^)]+)\)", body)
    assert links and all(link.startswith("https://") for link in links), links
    assert f"({default_docs_url()}rules.md#paper/rule_1)" in body  # the anchor is the rule id (docs_gen writes it)
    monkeypatch.setenv("ADOPTER_DOCS_URL", "https://docs.example.com/adopter")
    body = render_pr_body({"findings": SITES})
    assert "(https://docs.example.com/adopter/rules.md#sdpa-attention)" in body
    assert default_docs_url() not in body
    with pytest.raises(ValueError, match="absolute URL"):
        docs_base_url("docs/")


def test_sarif_help_uri_is_absolute(monkeypatch):
    from engine.sarif import to_sarif
    from engine.scan import select_rules

    monkeypatch.setenv("ADOPTER_DOCS_URL", "https://docs.example.com/a/")
    log = to_sarif([], select_rules("default"), ".")
    uris = [r["helpUri"] for r in log["runs"][0]["tool"]["driver"]["rules"]]
    assert uris and all(u.startswith("https://docs.example.com/a/rules.md#") for u in uris)
    assert rule_help_url("sdpa-attention") in uris


def test_rule_help_is_embedded_collapsed():
    body = render_pr_body({"findings": SITES[:1]})
    block = body.split("<summary>About <code>sdpa-attention</code></summary>", 1)[1].split("</details>", 1)[0]
    assert library_help()["sdpa-attention"].why.split("\n")[0] in block
    assert "scaled_dot_product_attention" in block and "```python" in block  # the rule's own example
    custom = render_pr_body({"findings": SITES[:1], "rule_help": {"sdpa-attention": RuleHelp(
        "short", why="Because <fused>.", example="x = a ``` b")}})
    assert "Because <fused>." in custom and "````python" in custom  # a fence longer than the backticks inside


def test_version_config_and_dashboard_link():
    body = render_pr_body({"findings": SITES[:1], "version": "9.8.7", "config": {"min_gain": 0.1, "rules": "default"},
                           "dashboard_url": "https://adopter.example.com/scans/42"})
    assert "Adopter](https://github.com/adopter-dev/adopter/blob/main/docs/) 9.8.7" in body
    assert "[this scan on the dashboard](https://adopter.example.com/scans/42)" in body
    config = body.split("### Configuration", 1)[1]
    assert '"min_gain": 0.1' in config and "<details>" in config
    assert "dashboard" not in render_pr_body({"findings": SITES[:1]})  # no dashboard, no link


def test_pull_request_needs_the_lower_bound_to_clear_the_minimum():
    v = Verification.from_any(PASSED)
    lucky = Benchmark.from_any(_bench(1.10, 1.01, 1.25, "faster"))  # the median clears 5%, the interval does not
    decision = decide(v, lucky)
    assert not decision.open_pr and decision.speed_gain == pytest.approx(0.01)
    assert "lower bounds of the 95% intervals" in decision.reason
    sure = decide(v, Benchmark.from_any(_bench(1.10, 1.06, 1.14, "faster")))
    assert sure.open_pr and "lower bound" in sure.reason
    assert not decide(v, Benchmark.from_any(dict(_bench(1.3, 1.0, 1.6, "faster"), speedup=1.3))).open_pr  # no interval
    assert decide(v, Benchmark.from_any(_bench(1.0, 0.9, 1.1, "within-noise", memory=0.2))).open_pr  # memory


def test_body_states_interval_and_verdict_in_words():
    noise = render_pr_body({"findings": SITES[:1], "verification": PASSED, "bench": _bench(1.02, 0.95, 1.1, "within-noise")})
    assert "Verdict: within the noise (neither faster nor slower): **1.02x** the speed of the original, " \
           "95% confidence interval 0.95x to 1.10x." in noise
    assert "1.02x (within noise) | 0.95x to 1.10x |" in noise
    assert "(stopped when the time budget was spent)" in noise
    slower = render_pr_body({"findings": SITES[:1], "verification": PASSED, "bench": _bench(0.8, 0.7, 0.9, "slower")})
    assert "Verdict: slower: **0.80x**" in slower


def test_a_failed_verification_says_which_rewrite_failed_and_why():
    failed = Verification.from_any({"per_rewrite": {
        "sdpa-attention@model.py:12": {"status": "failed", "message": "max abs error 3.1e-02 over tolerance 1e-05\nmore"},
        "gelu-tanh@model.py:30": {"status": "passed"}}, "accepted": []})
    decision = decide(failed, Benchmark.from_any(_bench(1.5, 1.4, 1.6, "faster")))
    assert not decision.open_pr
    assert decision.reason == ("verification did not pass (sdpa-attention@model.py:12: "
                               "max abs error 3.1e-02 over tolerance 1e-05)")
    assert decide(None, None).reason == "verification did not pass (no verification result)"
