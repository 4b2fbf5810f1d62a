"""The JSON API: pagination, filters, the shape of each answer, the OpenAPI description."""

from __future__ import annotations

import pytest

from tests.dashboard.seed import NLP, SECRET, VISION

pytestmark = pytest.mark.service


@pytest.fixture
def root(service):
    return service("root")  # sees both installations: 12 scans in all


def test_pagination_walks_every_scan_once_newest_first(root):
    seen = []
    first = root.get("/api/scans", params={"per_page": 5}).json()
    assert (first["total"], first["pages"], first["page"], first["per_page"]) == (12, 3, 1, 5)
    for page in (1, 2, 3):
        body = root.get("/api/scans", params={"per_page": 5, "page": page}).json()
        assert len(body["items"]) == (5 if page < 3 else 2)
        seen.extend(body["items"])
    assert len({s["id"] for s in seen}) == 12
    stamps = [s["created_at"] for s in seen]
    assert stamps == sorted(stamps, reverse=True)
    assert root.get("/api/scans", params={"per_page": 5, "page": 9}).json()["items"] == []


@pytest.mark.parametrize("params", [{"per_page": 101}, {"per_page": 0}, {"page": 0}, {"state": "exploded"},
                                    {"since": "yesterday"}])
def test_invalid_paging_or_filter_values_are_422(root, params):
    assert root.get("/api/scans", params=params).status_code == 422


def test_filters_narrow_the_scans(root, dash_pg):
    ids = dash_pg[1]

    def scans(**params):
        body = root.get("/api/scans", params={"per_page": 100, **params}).json()
        return body["total"], body["items"]

    total, items = scans(state="failed")
    assert total == 1 and items[0]["id"] == ids["vision_failed"] and "outputs differ" in items[0]["reason"]
    total, items = scans(rule="fused-bias-gelu")
    assert total == 3 and {s["repository_id"] for s in items} == {NLP}
    assert scans(repository=VISION)[0] == 8
    assert scans(repository=VISION, state="done")[0] == 6
    # seeded: acme/vision one scan a day 03-01..03-06, failed 03-07, running 03-08; acme/nlp 03-01..03-03;
    # globex 03-03. Both ends of the range are inclusive days.
    total, items = scans(since="2026-03-07", until="2026-03-07")
    assert total == 1 and items[0]["id"] == ids["vision_failed"]
    total, items = scans(since="2026-03-03", until="2026-03-04")
    assert total == 4 and all(s["created_at"][:10] in ("2026-03-03", "2026-03-04") for s in items)
    assert scans(until="2026-02-28")[0] == 0
    assert scans(since="2026-03-08")[0] == 1  # the running scan
    assert scans(repository=SECRET, rule="sdpa-attention")[0] == 0


def test_scan_summary_counts_and_figures(root, dash_pg):
    done = root.get(f"/api/scans/{dash_pg[1]['vision_done']}").json()
    summary = done["scan"]
    assert (summary["rewritten"], summary["guarded"], summary["near_miss"]) == (1, 0, 1)
    assert summary["speedup"] == pytest.approx(1.45) and summary["verified"] is True
    assert summary["memory_reduction"] == pytest.approx(1 - 250 / 400)
    assert [e["state"] for e in done["events"]][-1] == "done"
    change = done["change_sets"][0]
    assert change["result"]["device"].startswith("cuda") and change["pull_request"]["number"] == 7
    assert "scaled_dot_product_attention" in done["diff"]
    near = [f for f in done["findings"] if f["status"] == "near-miss"]
    assert near and "escape" in near[0]["reason"]
    running = root.get(f"/api/scans/{dash_pg[1]['vision_running']}/status").json()
    assert running["state"] == "benchmarking" and running["terminal"] is False


def test_repository_detail_and_repository_list(root, dash_pg):
    detail = root.get(f"/api/repositories/{VISION}", params={"per_page": 3, "page": 2}).json()
    assert detail["repository"]["full_name"] == "acme/vision" and detail["repository"]["scans"] == 8
    assert detail["scans"]["total"] == 8 and len(detail["scans"]["items"]) == 3 and detail["scans"]["page"] == 2
    assert len(detail["chart"]) == 6  # the scans with figures
    speedups = [p["speedup"] for p in detail["chart"]]
    assert speedups == sorted(speedups)  # seeded rising, oldest first
    assert {p["state"] for p in detail["pull_requests"]} == {"open", "closed"}
    assert detail["ignored"][0]["identity"] == "adopter/old-rule"
    assert detail["config"] == {"min_gain": 0.05, "max_open_pull_requests": 2}
    filtered = root.get(f"/api/repositories/{VISION}", params={"state": "failed"}).json()
    assert filtered["scans"]["total"] == 1
    repos = root.get("/api/repositories", params={"per_page": 2}).json()
    assert repos["total"] == 3 and repos["pages"] == 2 and len(repos["items"]) == 2
    assert root.get("/api/repositories", params={"q": "secret"}).json()["items"][0]["id"] == SECRET
    assert root.get("/api/repositories", params={"installation": 101}).json()["total"] == 2


def test_overview_totals(root):
    totals = root.get("/api/overview").json()["totals"]
    assert totals["scans"] == 12 and totals["running"] == 1
    assert totals["rewrites_verified"] == 10
    assert (totals["pull_requests_opened"], totals["pull_requests_open"], totals["pull_requests_merged"],
            totals["pull_requests_closed"]) == (4, 2, 1, 1)
    assert totals["median_speedup"] == pytest.approx(1.275)


def test_the_api_is_described_in_openapi(root):
    spec = root.get("/openapi.json").json()
    for path in ("/api/scans", "/api/scans/{scan_id}", "/api/scans/{scan_id}/status", "/api/repositories",
                 "/api/repositories/{repository_id}", "/api/overview", "/api/scans/states"):
        assert "get" in spec["paths"][path], path
    ok = spec["paths"]["/api/scans"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"].endswith("/ScanPage")
    params = {p["name"] for p in spec["paths"]["/api/scans"]["get"]["parameters"]}
    assert {"repository", "state", "rule", "since", "until", "page", "per_page"} <= params
    assert "/scans/{scan_id}" not in spec["paths"]  # pages are not part of the API description
