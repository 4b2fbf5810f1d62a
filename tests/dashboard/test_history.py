"""The local history: ``adopter scan`` records, ``adopter history`` lists, ``adopter dashboard`` serves
the same pages over it, on this machine only."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.dashboard.seed import DIFF

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FakeResult:  # what app.history reads of engine.scan.ScanResult
    diff: str = DIFF
    files: dict = field(default_factory=lambda: {"model.py": "new\n"})
    originals: dict = field(default_factory=lambda: {"model.py": "old\n"})

    def to_json(self) -> dict:
        return {"files_scanned": 3, "changed_files": ["model.py"], "findings": [
            {"rule": "sdpa-attention", "status": "rewritten", "file": "model.py", "line": 12, "end_line": 14,
             "message": "use sdpa", "reason": None, "guard": None},
            {"rule": "sdpa-attention", "status": "guarded", "file": "b.py", "line": 3, "end_line": 9,
             "message": "use sdpa", "reason": None, "guard": "output_attentions"},
            {"rule": "sdpa-attention", "status": "near-miss", "file": "c.py", "line": 7, "end_line": None,
             "message": "looks like attention", "reason": "softmax over dim 1", "guard": None}]}


@pytest.fixture
def history_url(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'h' / 'history.sqlite'}"
    monkeypatch.setenv("ADOPTER_HISTORY_URL", url)
    return url


def local_client(url: str, host: str = "127.0.0.1"):
    from fastapi.testclient import TestClient

    from app.dashboard.local import create_local_app

    return TestClient(create_local_app(url), base_url=f"http://{host}")


def test_a_recorded_scan_renders_on_the_same_pages(history_url, tmp_path):
    from app.history import record_scan

    bench = {"status": "ok", "device": "cpu", "device_name": "cpu (16 threads)", "baseline_step_s": 0.02,
             "optimized_step_s": 0.0125, "speedup": 1.6, "baseline_peak_bytes": 1000, "optimized_peak_bytes": 600,
             "versions": {"torch": "2.13.0"}}
    scan_id = record_scan(FakeResult(), tmp_path, verification={"passed": True, "max_abs_err": 2e-7}, benchmark=bench)
    client = local_client(history_url)
    detail = client.get(f"/api/scans/{scan_id}").json()
    assert detail["scan"]["repository"] == str(tmp_path.resolve()) and detail["scan"]["trigger"] == "cli"
    assert [e["state"] for e in detail["events"]] == ["queued", "scanning", "verifying", "benchmarking", "done"]
    assert {f["status"] for f in detail["findings"]} == {"rewritten", "guarded", "near-miss"}
    assert any(f["reason"] == "original kept when: output_attentions" for f in detail["findings"])
    result = detail["change_sets"][0]["result"]
    assert result["verified"] and result["speedup"] == 1.6 and result["memory_reduction"] == pytest.approx(0.4)
    page = client.get(f"/scans/{scan_id}").text
    assert "scaled_dot_product_attention" in page and 'class="benchmark"' in page and "1.60×" in page
    assert "softmax over dim 1" in page
    # the same folder again: the same repository, two scans
    second = record_scan(FakeResult(diff=""), tmp_path)
    repo = client.get(f"/api/scans/{second}").json()["scan"]["repository_id"]
    assert client.get(f"/api/repositories/{repo}").json()["repository"]["scans"] == 2
    assert client.get("/").status_code == 200 and "local history" in client.get("/").text


def test_the_history_schema_is_the_migrations_head(history_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import create_engine

    from app.db.models import Base
    from app.history import ensure_schema

    ensure_schema(history_url)
    ensure_schema(history_url)  # a second time: nothing to do
    engine = create_engine(history_url)
    with engine.connect() as connection:
        assert MigrationContext.configure(connection).get_current_heads()
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    engine.dispose()


def test_cli_scan_records_unless_told_not_to_and_history_lists_it(history_url, tmp_path):
    from sqlalchemy import create_engine, func, select

    from app.db.models import Scan
    from engine.cli import app

    model = tmp_path / "proj"
    model.mkdir()
    (model / "model.py").write_text((ROOT / "examples" / "minigpt" / "model.py").read_text()
                                    if (ROOT / "examples" / "minigpt" / "model.py").exists() else "import torch\n")
    runner = CliRunner()
    assert runner.invoke(app, ["scan", str(model), "--no-history"]).exit_code == 0
    db = Path(history_url.removeprefix("sqlite:///"))
    assert not db.exists()
    done = runner.invoke(app, ["scan", str(model)])
    assert done.exit_code == 0, done.output
    engine = create_engine(history_url)
    with engine.connect() as connection:
        assert connection.scalar(select(func.count(Scan.id))) == 1
    engine.dispose()
    listed = runner.invoke(app, ["history", "--limit", "5"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and str(model.resolve()) in listed.output and "1 scan(s)" in listed.output
    none = runner.invoke(app, ["history", "--state", "failed"], env={"COLUMNS": "200"})
    assert "0 scan(s)" in none.output


def test_local_dashboard_answers_this_machine_only(history_url):
    from typer.testing import CliRunner

    from app.dashboard.local import serve
    from engine.cli import app

    assert local_client(history_url).get("/api/me").json()["local"] is True
    assert local_client(history_url, host="evil.example").get("/").status_code == 403  # DNS rebinding
    with pytest.raises(ValueError):
        serve(history_url, host="0.0.0.0")
    refused = CliRunner().invoke(app, ["dashboard", "--host", "192.168.1.5"])
    assert refused.exit_code == 2 and "this machine only" in refused.output


def test_local_history_keeps_each_stages_instant_errors_options_and_states(history_url, tmp_path):
    from datetime import UTC, datetime, timedelta

    from app.history import record_scan

    started = datetime.now(UTC) - timedelta(minutes=5)
    timeline = {"verifying": (started + timedelta(seconds=20)).isoformat(),
                "benchmarking": (started + timedelta(seconds=140)).isoformat()}
    verification = {"per_rewrite": {
        "sdpa-attention": {"status": "passed", "passed": True, "max_abs_err": 2.5e-6, "max_rel_err": 1e-6},
        "gelu-tanh": {"status": "passed", "passed": True, "max_abs_err": 4e-6, "max_rel_err": 2e-6},
        "layer-norm": {"status": "not exercised", "passed": False, "max_abs_err": None, "max_rel_err": None}},
        "accepted": ["sdpa-attention", "gelu-tanh"], "dropped": {"layer-norm": "not exercised"},
        "combined": None, "passed": True}
    bench = {"status": "ok", "baseline_step_s": 0.5, "optimized_step_s": 0.4, "repeats": 30, "verdict": "faster",
             "speedup": {"median": 1.25, "ci95": [1.2, 1.3], "samples": 30}, "stopped": "converged"}
    options = {"rules": "default", "verify": True, "bench": True, "device": "cpu", "repeats": 10}
    scan_id = record_scan(FakeResult(), tmp_path, started_at=started, timeline=timeline, verification=verification,
                          benchmark=bench, options=options)
    client = local_client(history_url)
    detail = client.get(f"/api/scans/{scan_id}").json()
    at = {e["state"]: datetime.fromisoformat(e["at"]) for e in detail["events"]}
    assert at["queued"] == at["scanning"] == started
    assert at["verifying"] - started == timedelta(seconds=20) and at["benchmarking"] - started == timedelta(seconds=140)
    assert at["done"] > at["benchmarking"]
    assert detail["options"] == options
    result = detail["change_sets"][0]["result"]
    assert result["max_abs_error"] == pytest.approx(4e-6)  # the largest over the kept rewrites, not "-"
    assert result["speedup"] == 1.25
    page = client.get(f"/scans/{scan_id}").text
    assert "4e-06" in page and "not exercised" in page and "1.20× to 1.30×" in page and "(+2 min 0 s)" in page

    # verification kept nothing: the scan still shows what each rewrite's check found
    skipped = {"per_rewrite": {"sdpa-attention": {"status": "skipped", "passed": False,
                                                  "message": "no harness and no Hugging Face model class"}},
               "accepted": [], "dropped": {"sdpa-attention": "skipped"}, "combined": None, "passed": False}
    second = record_scan(FakeResult(diff="", files={}), tmp_path, verification=skipped,
                         options={"verify": True, "bench": False})
    page = client.get(f"/scans/{second}").text
    assert "No rewrites to verify" not in page
    assert "skipped" in page and "no harness and no Hugging Face model class" in page
    assert "Not benchmarked (the scan ran without --bench)" in page


def test_cli_history_keeps_each_findings_place_and_code_that_moved_stays_open(history_url, tmp_path):
    import json

    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from app.db.models import Finding
    from engine.cli import app

    model = tmp_path / "proj"
    model.mkdir()
    source = (ROOT / "examples" / "minigpt" / "model.py").read_text()
    (model / "model.py").write_text(source)
    runner = CliRunner()
    first = runner.invoke(app, ["scan", str(model), "--format", "sarif"])
    assert first.exit_code == 0, first.output
    sarif = json.loads(first.output)["runs"][0]["results"]
    engine = create_engine(history_url)
    with Session(engine) as session:
        rows = session.scalars(select(Finding).order_by(Finding.id)).all()
        assert len(rows) == len(sarif) > 0
        for row, result in zip(rows, sarif, strict=True):  # what the App's scan stage stores, as SARIF says
            assert row.fingerprint == result["partialFingerprints"]["adopterMatchHash/v1"]
            region = result["locations"][0]["physicalLocation"]["region"]
            assert (row.locations[0]["start_line"], row.locations[0]["start_column"]) == (
                region["startLine"], region["startColumn"])
            assert row.class_name == result["properties"]["class"]
            assert row.method_name == result["properties"]["method"]
    # --apply writes the files after the scan: the places are the scanned text's
    applied = runner.invoke(app, ["scan", str(model), "--apply", "--no-history"])
    assert applied.exit_code == 0, applied.output
    (model / "model.py").write_text("# a licence header\n" * 7 + source)  # the same code, 7 lines down
    assert runner.invoke(app, ["scan", str(model)]).exit_code == 0
    engine.dispose()
    client = local_client(history_url)
    scans = client.get("/api/scans").json()
    repo = client.get(f"/api/scans/{scans['items'][0]['id']}").json()["scan"]["repository_id"]
    changes = client.get(f"/api/repositories/{repo}").json()["changes"]
    assert changes["new"] == [] and changes["fixed"] == []
    assert sorted(f["line"] for f in changes["still_open"]) == sorted(
        r["locations"][0]["physicalLocation"]["region"]["startLine"] + 7 for r in sarif)
