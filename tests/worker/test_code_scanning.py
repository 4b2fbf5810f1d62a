"""The publish step uploads the scan's findings to code scanning when the installation grants
`security_events: write` (against the fake GitHub over real HTTP, which answers per the OpenAPI)."""

from __future__ import annotations

import base64
import gzip
import json

import httpx
import pytest

from tests.worker.test_publish_and_clone import REPO, github  # noqa: F401 - the fixture

pytest.importorskip("sqlalchemy")

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


def test_granted_the_findings_go_to_code_scanning_on_the_scanned_commit(github):  # noqa: F811
    fake, repo = github
    fake.installations[3]["permissions"] = {"security_events": "write"}
    scan_id = _publishing_scan(fake, granted=True)
    reason = _publish(scan_id)
    [upload] = repo.sarif_uploads
    assert reason == f"code scanning: 3 finding(s) uploaded (SARIF {upload['id']})"
    assert upload["commit_sha"] == fake.ref_sha(repo, "refs/heads/main") and upload["ref"] == "refs/heads/main"
    assert upload["tool_name"] == "adopter"
    [run] = upload["sarif"]["runs"]
    assert run["tool"]["driver"]["name"] == "adopter"
    results = {r["ruleId"]: r for r in run["results"]}
    assert set(results) == {"sdpa-attention", "gelu-tanh", "layer-norm"}
    region = results["sdpa-attention"]["locations"][0]["physicalLocation"]
    assert region["artifactLocation"]["uri"] == "model.py" and region["region"] == {"startLine": 12, "endLine": 14}
    assert results["gelu-tanh"]["properties"]["reason"] == "constant differs"
    assert results["layer-norm"]["suppressions"][0]["kind"] == "inSource"
    assert "suppressions" not in results["sdpa-attention"]
    assert "originalUriBaseIds" not in run  # no path of the worker's machine leaks into the log


def test_not_granted_nothing_is_sent(github):  # noqa: F811
    fake, repo = github
    before = len(fake.requests)
    reason = _publish(_publishing_scan(fake, granted=False))
    assert repo.sarif_uploads == [] and "code scanning" not in (reason or "")
    assert not any(path.endswith("/code-scanning/sarifs") for _, path in fake.requests[before:])


def test_a_refused_upload_is_one_line_and_the_scan_still_finishes(github):  # noqa: F811
    fake, repo = github  # the stored permissions say yes; GitHub (the fake) says no
    reason = _publish(_publishing_scan(fake, granted=True))
    assert reason == "code scanning: upload refused (403: Resource not accessible by integration)"
    assert repo.sarif_uploads == []


def test_the_fake_answers_uploads_as_the_openapi_says(github):  # noqa: F811
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
