"""Per repository: findings new, fixed and still open since the previous finished scan, the per-rule
trend, and each scan's verification states, errors and options, as the API answers them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.dashboard.changes import pair_findings
from app.dashboard.verification import benchmark_view, verification_view
from tests.dashboard.seed import BENCH_DETAILS, PER_REWRITE, VISION


def _f(rule, path, line, status="rewritten", fingerprint=None):
    return SimpleNamespace(rule_id=rule, path=path, line=line, status=status, message=None, fingerprint=fingerprint)


def test_pairing_follows_moved_lines_and_counts_duplicates():
    before = [_f("sdpa", "a.py", 10), _f("sdpa", "a.py", 40), _f("gelu", "a.py", 5), _f("sdpa", "b.py", 3, "near-miss")]
    after = [_f("sdpa", "a.py", 12), _f("sdpa", "a.py", 42), _f("sdpa", "a.py", 90),  # moved down 2, one more
             _f("sdpa", "b.py", 3, "rewritten")]  # a near-miss that became a rewrite: one fixed, one new
    new, fixed, still = pair_findings(before, after)
    assert [(f.rule_id, f.path, f.line, f.status) for f in new] == [("sdpa", "a.py", 90, "rewritten"),
                                                                    ("sdpa", "b.py", 3, "rewritten")]
    assert [(f.rule_id, f.line, f.status) for f in fixed] == [("gelu", 5, "rewritten"), ("sdpa", 3, "near-miss")]
    assert [f.line for f in still] == [12, 42]
    assert pair_findings([], []) == ([], [], [])


def test_a_finding_moved_by_inserted_lines_is_still_open_by_its_fingerprint():
    # One attention block rewritten away (line 10), 30 lines inserted above the other (50 -> 80), and
    # a new one written further down (90): by line order alone 10-80 and 50-90 would pair, nothing new.
    before = [_f("sdpa", "a.py", 10, fingerprint="aaa:1"), _f("sdpa", "a.py", 50, fingerprint="bbb:1")]
    after = [_f("sdpa", "a.py", 80, fingerprint="bbb:1"), _f("sdpa", "a.py", 90, fingerprint="ccc:1")]
    new, fixed, still = pair_findings(before, after)
    assert [f.line for f in still] == [80]
    assert [f.line for f in new] == [90] and [f.line for f in fixed] == [10]
    # A fingerprint that lands on another finding's old line still pairs with its own.
    before = [_f("sdpa", "a.py", 10, fingerprint="aaa:1"), _f("sdpa", "a.py", 20, fingerprint="bbb:1")]
    after = [_f("sdpa", "a.py", 20, fingerprint="aaa:1"), _f("sdpa", "a.py", 30, fingerprint="bbb:1")]
    assert pair_findings(before, after)[:2] == ([], [])
    # The code at a finding's line edited (a renamed variable): the same line, still open.
    new, fixed, still = pair_findings([_f("sdpa", "a.py", 10, fingerprint="aaa:1")],
                                      [_f("sdpa", "a.py", 10, fingerprint="ddd:1")])
    assert (new, fixed, [f.line for f in still]) == ([], [], [10])
    # A scan stored before fingerprints were kept pairs with a later one in line order.
    new, fixed, still = pair_findings([_f("sdpa", "a.py", 10), _f("sdpa", "a.py", 50)],
                                      [_f("sdpa", "a.py", 40, fingerprint="aaa:1"),
                                       _f("sdpa", "a.py", 80, fingerprint="bbb:1")])
    assert (new, fixed, [f.line for f in still]) == ([], [], [40, 80])


def test_verification_states_are_shown_as_they_were():
    view = verification_view({"verify": PER_REWRITE}, True, None)
    assert view.status == "1 of 4 passed"
    assert [(r.name, r.status, r.kept) for r in view.rows] == [
        ("sdpa-attention", "passed", True), ("layer-norm", "skipped", False), ("gelu-tanh", "failed", False),
        ("rms-norm", "not exercised", False)]
    assert view.rows[0].errors == {"max_abs_err": 3.1e-7, "max_rel_err": 2.2e-7}
    assert view.rows[1].errors == {} and "no harness" in view.rows[1].message
    every_skipped = {"per_rewrite": {"a": {"status": "skipped"}, "b": {"status": "skipped"}}, "accepted": []}
    assert verification_view({"verify": every_skipped}).status == "skipped"
    later = {"status": "passed", "max_abs_err": 1e-6, "normalized_err": 0.02}  # an error measure added later
    assert verification_view({"verify": later}).rows[0].errors == {"max_abs_err": 1e-6, "normalized_err": 0.02}
    assert verification_view({}, None).status == "not run"
    old = verification_view({"verify": {"max_abs_error": 3e-7}}, True, 3e-7)  # a worker record without a status
    assert old.status == "unknown" and old.rows[0].errors == {"max_abs_error": 3e-7}
    bench = benchmark_view({"bench": BENCH_DETAILS})
    assert bench.speedup_ci95 == [1.38, 1.52] and bench.verdict == "faster" and bench.rounds == 24



@pytest.fixture
def root(service):
    return service("root")


@pytest.mark.service
def test_repository_changes_since_the_previous_scan(root, dash_pg):
    detail = root.get(f"/api/repositories/{VISION}").json()
    changes = detail["changes"]
    assert changes["scan_id"] == dash_pg[1]["vision_done"] and changes["previous_scan_id"] < changes["scan_id"]
    assert [(f["rule_id"], f["path"], f["status"]) for f in changes["new"]] == [("fused-adamw", "train.py", "detected")]
    assert [(f["rule_id"], f["line"]) for f in changes["fixed"]] == [("gelu-tanh", 50)]
    assert sorted((f["path"], f["line"]) for f in changes["still_open"]) == [("model.py", 12), ("other.py", 42)]
    trends = {t["rule_id"]: t for t in detail["rule_trends"]}
    assert len(detail["trend_scans"]) == 6 and detail["trend_scans"][-1] == changes["scan_id"]
    assert trends["sdpa-attention"]["counts"] == [2] * 6 and trends["sdpa-attention"]["change"] == 0
    assert trends["gelu-tanh"]["counts"] == [0, 0, 0, 0, 1, 0] and trends["gelu-tanh"]["change"] == -1
    assert trends["fused-adamw"]["counts"][-1] == 1 and trends["fused-adamw"]["change"] == 1


@pytest.mark.service
def test_scan_detail_has_options_states_errors_and_interval(root, dash_pg):
    done = root.get(f"/api/scans/{dash_pg[1]['vision_done']}").json()
    assert done["options"]["device"] == "cuda" and done["options"]["verify"] is True
    result = done["change_sets"][0]["result"]
    assert [r["status"] for r in result["verification"]["rows"]] == ["passed", "skipped", "failed", "not exercised"]
    assert result["verification"]["rows"][2]["errors"]["max_abs_err"] == pytest.approx(0.31)
    assert result["benchmark"]["speedup_ci95"] == [1.38, 1.52]
    page = root.get(f"/scans/{dash_pg[1]['vision_done']}").text
    for text in ("not exercised", "skipped", "no harness builds", "3.1e-07", "0.31", "max abs error", "1.38× to 1.52×",
                 "How this scan ran", "<dt>device</dt><dd><code>\"cuda\"</code>"):
        assert text in page, text
    repo = root.get(f"/repos/{VISION}").text
    assert 'id="changes-new">1<' in repo and 'id="changes-fixed">1<' in repo and 'id="changes-open">2<' in repo
    assert 'class="sparkline"' in repo and "fused-adamw" in repo
