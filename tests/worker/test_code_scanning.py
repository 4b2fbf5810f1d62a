"""Every completed scan uploads its findings to code scanning when the installation grants
`security_events: write`, from the publish step (the process with the App key): a scan that proposes
nothing too (an empty list included), so GitHub closes the alerts a later commit no longer has. The
uploaded SARIF carries the columns and fingerprints the scan stage read from the checkout, equal to
what `adopter scan --format sarif` writes. Against the fake GitHub over real HTTP, which answers per
the OpenAPI, and a real Postgres."""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest

from tests.github_fake.server import INSTALLATION_PERMISSIONS
from tests.worker.test_publish_and_clone import REPO, fake_github

pytest.importorskip("sqlalchemy")

ROOT = Path(__file__).resolve().parents[2]
SARIF_SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif" / "sarif-2.1.0-rtm.5.json").read_text())
GRANTED = dict(INSTALLATION_PERMISSIONS, security_events="write")


@pytest.fixture
def github(tmp_path, monkeypatch, own_pg_url):
    # a database of its own: fake_github seeds fixed ids and migrates the database down at the end,
    # which on the worker's shared database broke the end-to-end stack and the API tests beside it
    with fake_github(tmp_path, monkeypatch, own_pg_url, scans=()) as pair:
        yield pair


FINDINGS = [("sdpa-attention", "rewritten", "model.py", 12, 14, None),
            ("gelu-tanh", "near-miss", "model.py", 30, 30, "constant differs"),
            ("layer-norm", "suppressed", "model.py", 40, 41, "`# adopter: ignore` on line 40 (would have been rewritten)")]


def _publishing_scan(fake, *, granted: bool) -> int:
    from app.db.models import Finding, Installation, Scan
    from app.db.session import session_scope

    sha = fake.ref_sha(fake.repos[REPO], "refs/heads/main")
    with session_scope() as session:
        session.get(Installation, 3).permissions = {"security_events": "write"} if granted else {"contents": "read"}
        scan = Scan(repository_id=fake.repos[REPO].id, trigger="test", state="publishing", head_sha=sha, branch="main",
                    config={"source": None})
        session.add(scan)
        session.flush()
        for rule, status, path, line, end, reason in FINDINGS:
            session.add(Finding(scan_id=scan.id, rule_id=rule, status=status, path=path, line=line, end_line=end,
                                message=f"{rule} message", reason=reason))
        return scan.id


def _publish(scan_id: int) -> str:
    from app.db.models import Scan
    from app.db.session import session_scope
    from worker.pipeline import publish_stage

    with session_scope() as session:
        publish_stage(session, scan_id)
    with session_scope() as session:
        scan = session.get(Scan, scan_id)
        assert scan.state == "done"
        return scan.reason


def test_granted_the_findings_go_to_code_scanning_on_the_scanned_commit(github):
    fake, repo = github
    fake.installations[3]["permissions"] = {"security_events": "write"}
    scan_id = _publishing_scan(fake, granted=True)
    reason = _publish(scan_id)
    [upload] = repo.sarif_uploads
    assert reason == ("nothing to propose (1 near-miss, 1 rewritten, 1 suppressed); "
                      f"code scanning: 3 finding(s) uploaded (SARIF {upload['id']})")
    assert upload["commit_sha"] == fake.ref_sha(repo, "refs/heads/main") and upload["ref"] == "refs/heads/main"
    assert upload["tool_name"] == "adopter"
    [run] = upload["sarif"]["runs"]
    assert run["tool"]["driver"]["name"] == "adopter"
    results = {r["ruleId"]: r for r in run["results"]}
    assert set(results) == {"sdpa-attention", "gelu-tanh", "layer-norm"}
    # stored without places (a scan from before they were kept): the line range, nothing invented
    region = results["sdpa-attention"]["locations"][0]["physicalLocation"]
    assert region["artifactLocation"]["uri"] == "model.py" and region["region"] == {"startLine": 12, "endLine": 14}
    assert results["gelu-tanh"]["properties"]["reason"] == "constant differs"
    assert results["layer-norm"]["suppressions"][0]["kind"] == "inSource"
    assert "suppressions" not in results["sdpa-attention"]
    assert "originalUriBaseIds" not in run  # no path of the worker's machine leaks into the log


def test_not_granted_nothing_is_sent(github):
    fake, repo = github
    before = len(fake.requests)
    reason = _publish(_publishing_scan(fake, granted=False))
    assert repo.sarif_uploads == [] and "code scanning" not in (reason or "")
    assert not any(path.endswith("/code-scanning/sarifs") for _, path in fake.requests[before:])


def test_a_refused_upload_is_one_line_and_the_scan_still_finishes(github):
    fake, repo = github  # the stored permissions say yes; GitHub (the fake) says no
    reason = _publish(_publishing_scan(fake, granted=True))
    assert reason.endswith("; code scanning: upload refused (403: Resource not accessible by integration)")
    assert repo.sarif_uploads == []


def test_the_fake_answers_uploads_as_the_openapi_says(github):
    from tests.app.test_github_fake_schema import check
    from worker import github_client

    fake, repo = github
    fake.installations[3]["permissions"] = {"security_events": "write"}
    token = github_client.installation_token(3)
    url = f"{fake.api}/repos/{REPO}/code-scanning/sarifs"
    headers = {"Authorization": f"token {token}"}
    sarif = base64.b64encode(gzip.compress(json.dumps({"version": "2.1.0", "runs": []}).encode())).decode()
    sha = fake.ref_sha(repo, "refs/heads/main")
    ok = httpx.post(url, headers=headers, json={"commit_sha": sha, "ref": "refs/heads/main", "sarif": sarif})
    receipt = check("code-scanning/upload-sarif", ok)
    assert receipt["url"].endswith(receipt["id"])
    for bad in ({"commit_sha": "abc", "ref": "refs/heads/main", "sarif": sarif},
                {"commit_sha": sha, "ref": "main", "sarif": sarif},
                {"commit_sha": sha, "ref": "refs/heads/main", "sarif": base64.b64encode(b"{}").decode()}):
        assert httpx.post(url, headers=headers, json=bad).status_code == 400


# --- every ending uploads; the worker's SARIF is the command line's -------------------------------

# The paper's rules on hand-written attention: detect-only findings and a near-miss, none rewritten,
# so the scan proposes nothing. One match is reached through an inlined helper (related locations),
# and a two-byte character before a match makes byte offsets and code-point columns differ.
MODEL = '''\
from torch import nn
import torch.nn.functional as F

class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.h = h

    def _split_heads(self, t):
        t = t.view(t.size()[:-1] + (self.h, -1))
        return t.permute(0, 2, 1, 3)

    def forward(self, x):
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        é = 1; s = F.softmax(q @ k.transpose(-1, -2), dim=-1)
        t = F.softmax(s, dim=1)
        return s @ v + t
'''
TREE = {".adopter.yml": "rules: paper\n", "pkg/__init__.py": "", "pkg/model.py": MODEL}


def _validate(log: dict) -> None:
    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(log)


def _events(scan_id: int) -> list[tuple[str, str | None]]:
    from sqlalchemy import select

    from app.db.models import ScanEvent
    from app.db.session import session_scope

    with session_scope() as session:
        return [(e.state, e.reason) for e in session.scalars(
            select(ScanEvent).where(ScanEvent.scan_id == scan_id).order_by(ScanEvent.id))]


def _cli_sarif(tmp_path: Path, files: dict[str, str]) -> dict:
    """What `adopter scan --format sarif` writes for the same tree."""
    tree = tmp_path / "cli-tree"
    for path, text in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text, encoding="utf-8")
    out = tmp_path / "cli.sarif"
    done = subprocess.run([sys.executable, "-m", "engine.cli", "scan", str(tree), "--format", "sarif",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.is_file(), done.stderr
    return json.loads(out.read_text())


class _Task:
    class request:  # noqa: N801 - Celery's attribute name
        retries = 0


@pytest.fixture
def stages(github, redis_target, monkeypatch):
    """The stage tasks' own code (attempt counts in a real Redis), the broker replaced by a list of
    what would be enqueued: [(stage, scan id)]."""
    from app.settings import get_settings
    from worker import tasks

    url, prefix = redis_target
    monkeypatch.setenv("ADOPTER_REDIS_URL", url)
    monkeypatch.setenv("ADOPTER_REDIS_KEY_PREFIX", prefix)
    get_settings.cache_clear()
    tasks._redis.cache_clear()
    enqueued: list[tuple[str, int]] = []
    monkeypatch.setattr(tasks, "enqueue_stage", lambda stage, scan_id: enqueued.append((stage, scan_id)))
    yield enqueued
    tasks._redis.cache_clear()


def _grant(fake) -> None:
    """Installation 3 grants code scanning, on GitHub and as the App stored it."""
    from app.db.models import Installation
    from app.db.session import session_scope

    fake.installations[3]["permissions"] = GRANTED
    with session_scope() as session:
        session.get(Installation, 3).permissions = GRANTED


def _new_scan(fake) -> int:
    from app.db.session import session_scope
    from worker.state import new_scan

    with session_scope() as session:
        return new_scan(session, repository_id=fake.repos[REPO].id, trigger="test", delivery_id=None).id


def _drive(scan_id: int, enqueued: list) -> None:
    """Run the stages as the broker would hand them out, from clone until nothing is enqueued."""
    from worker.tasks import run_stage

    stage = "clone"
    while stage:
        before = len(enqueued)
        run_stage(_Task(), stage, scan_id)
        stage = enqueued[-1][0] if len(enqueued) > before else None


def _scan_row(scan_id: int):
    from app.db.models import Scan
    from app.db.session import session_scope

    with session_scope() as session:
        scan = session.get(Scan, scan_id)
        session.expunge(scan)
        return scan


def test_a_scan_that_proposes_nothing_still_uploads_what_the_cli_writes(github, stages, tmp_path):
    from worker.pipeline import scan_dir

    fake, repo = github
    _grant(fake)
    fake.commit_files(REPO, TREE, "A model with hand-written attention")
    scan_id = _new_scan(fake)
    _drive(scan_id, stages)

    assert [stage for stage, _ in stages] == ["scan", "publish"]  # publishing follows the scan directly
    scan = _scan_row(scan_id)
    assert scan.state == "done"
    [upload] = repo.sarif_uploads
    assert scan.reason.startswith("nothing to propose (") and scan.reason.endswith(
        f"; code scanning: {len(upload['sarif']['runs'][0]['results'])} finding(s) uploaded (SARIF {upload['id']})")
    events = _events(scan_id)
    assert [state for state, _ in events] == ["queued", "cloning", "scanning", "publishing", "done"]
    assert events[3][1].startswith("nothing to propose (")  # the timeline says why it went to publishing
    assert upload["commit_sha"] == scan.head_sha == fake.ref_sha(repo, "refs/heads/main")
    assert not scan_dir(scan_id).exists()  # publishing needs no checkout: it was removed after the scan

    log = upload["sarif"]  # what the fake gunzipped and base64-decoded
    _validate(log)
    [run] = log["runs"]
    results = run["results"]
    assert {r["properties"]["status"] for r in results} == {"detected", "near-miss"}
    cli = _cli_sarif(tmp_path, {"model.py": "x = 1\n", "link": "placeholder\n", **TREE})
    [cli_run] = cli["runs"]
    assert results == cli_run["results"]  # locations with columns, related locations, fingerprints, properties
    assert run["tool"] == cli_run["tool"] and run["columnKind"] == cli_run["columnKind"]
    # what makes them equal is there: columns in code points, the helper's call sites, fingerprints
    softmax = next(r for r in results if r["ruleId"] == "paper/rule_4" and r["properties"]["status"] == "detected")
    line = MODEL.splitlines()[softmax["locations"][0]["physicalLocation"]["region"]["startLine"] - 1]
    assert softmax["locations"][0]["physicalLocation"]["region"]["startColumn"] == line.index("F.softmax") + 1
    assert any(r.get("relatedLocations") for r in results)
    assert all(r["partialFingerprints"]["adopterMatchHash/v1"].endswith(":1") for r in results)
    assert all(r["properties"]["class"] == "Attention" for r in results)


def test_a_later_scan_without_the_findings_uploads_an_empty_list(github, stages):
    fake, repo = github
    _grant(fake)
    fake.commit_files(REPO, TREE, "A model with hand-written attention")
    _drive(_new_scan(fake), stages)
    fake.commit_files(REPO, {"pkg/model.py": "import torch\n\nclass Attention(torch.nn.Module):\n    pass\n"},
                      "The attention moved to a library")
    scan_id = _new_scan(fake)
    _drive(scan_id, stages)

    first, second = repo.sarif_uploads
    assert first["sarif"]["runs"][0]["results"]
    assert second["sarif"]["runs"][0]["results"] == []  # GitHub closes every alert the first one opened
    assert second["commit_sha"] == fake.ref_sha(repo, "refs/heads/main") != first["commit_sha"]
    _validate(second["sarif"])
    scan = _scan_row(scan_id)
    assert scan.state == "done" and scan.reason == (
        f"nothing to propose (no findings); code scanning: 0 finding(s) uploaded (SARIF {second['id']})")


def test_not_granted_a_scan_that_proposes_nothing_ends_without_publishing(github, stages):
    fake, repo = github
    fake.commit_files(REPO, TREE, "A model with hand-written attention")
    scan_id = _new_scan(fake)
    _drive(scan_id, stages)
    assert [stage for stage, _ in stages] == ["scan"]
    assert [state for state, _ in _events(scan_id)] == ["queued", "cloning", "scanning", "done"]
    assert repo.sarif_uploads == []
    assert _scan_row(scan_id).reason.startswith("nothing to propose (")


def _measured_scan(fake, *, verified: bool) -> int:
    """A scan waiting in verifying with one change set already measured (figures reused)."""
    from app.db.models import ChangeSet, Finding, Result, Scan
    from app.db.session import session_scope

    sha = fake.ref_sha(fake.repos[REPO], "refs/heads/main")
    with session_scope() as session:
        scan = Scan(repository_id=fake.repos[REPO].id, trigger="test", state="verifying", head_sha=sha,
                    branch="main", config={"source": None})
        session.add(scan)
        session.flush()
        session.add(Finding(scan_id=scan.id, rule_id="gelu-tanh", status="rewritten", path="model.py", line=3,
                            end_line=3, message="gelu", locations=[{"path": "model.py", "start_line": 3,
                                                                    "start_column": 5, "end_line": 3,
                                                                    "end_column": 40}],
                            related_locations=[], fingerprint="ab" * 16 + ":1", class_name="MLP",
                            method_name="forward"))
        change = ChangeSet(scan_id=scan.id, identity="adopter/gelu-tanh", rule_ids=["gelu-tanh"],
                           files={"model.py": "y = 2\n"}, diff="", code_digest="c")
        session.add(change)
        session.flush()
        verify = {"status": "passed" if verified else "failed", "message": "max abs error 0.3 over tolerance"}
        session.add(Result(change_set_id=change.id, verified=verified, device="cpu", versions={},
                           details={"verify": verify}))
        return scan.id


def test_changes_not_worth_it_end_through_publishing_with_the_upload(github):
    from app.db.session import session_scope
    from worker.pipeline import next_stage, publish_stage, verify_bench_stage

    fake, repo = github
    _grant(fake)
    scan_id = _measured_scan(fake, verified=False)
    with session_scope() as session:
        assert verify_bench_stage(session, scan_id) is True  # publish next: for the upload
    scan = _scan_row(scan_id)
    assert scan.state == "publishing" and next_stage("verify_bench", scan.state) == "publish"
    with session_scope() as session:
        assert publish_stage(session, scan_id) is True  # it moved the scan on, to done
    scan = _scan_row(scan_id)
    [upload] = repo.sarif_uploads
    assert scan.state == "done" and scan.reason == (
        "nothing to propose (1 rewritten): adopter/gelu-tanh: not published: verification did not pass "
        "(rewrite: max abs error 0.3 over tolerance); "
        f"code scanning: 1 finding(s) uploaded (SARIF {upload['id']})")
    assert [state for state, _ in _events(scan_id)] == ["benchmarking", "publishing", "done"]
    assert fake.repos[REPO].pulls == []  # nothing was proposed
    [result] = upload["sarif"]["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": 3, "startColumn": 5,
                                                                     "endLine": 3, "endColumn": 40}
    assert result["partialFingerprints"] == {"adopterMatchHash/v1": "ab" * 16 + ":1"}
    assert result["properties"] == {"status": "rewritten", "class": "MLP", "method": "forward"}
    _validate(upload["sarif"])


def test_not_granted_changes_not_worth_it_end_at_once(github):
    from app.db.session import session_scope
    from worker.pipeline import verify_bench_stage

    fake, repo = github
    scan_id = _measured_scan(fake, verified=False)
    with session_scope() as session:
        assert verify_bench_stage(session, scan_id) is False
    assert _scan_row(scan_id).state == "done"
    assert [state for state, _ in _events(scan_id)] == ["benchmarking", "done"]
    assert repo.sarif_uploads == []


def test_the_next_stage_is_the_one_that_runs_from_the_new_state():
    from worker.pipeline import next_stage

    assert next_stage("clone", "scanning") == "scan"
    assert next_stage("scan", "verifying") == "verify_bench"
    assert next_stage("scan", "publishing") == "publish"  # nothing to propose, findings to upload
    assert next_stage("verify_bench", "publishing") == "publish"
    assert next_stage("verify_bench", "benchmarking") is None  # waits for the runner's report
    assert next_stage("clone", "verifying") is None  # a stale message: not its successor to enqueue
    assert next_stage("scan", "done") is None and next_stage("publish", "done") is None

