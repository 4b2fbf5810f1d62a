"""The scan's findings as SARIF in the repository's code scanning, where the installation grants it
(``security_events: write``): GitHub shows them as alerts on the scanned commit and closes those a
later upload no longer has. Part of the publish step (the process that holds the App key); an upload
GitHub refuses is one line in the scan's outcome, never a failed scan.
"""

from __future__ import annotations

import base64
import gzip
import json

from github import GithubException

from app.db.models import Installation, Repository, Scan

MAX_GZIP_BYTES = 10 * 1024 * 1024  # GitHub refuses larger compressed uploads
TOOL_NAME = "adopter"


def sarif_log(scan: Scan) -> dict:
    """SARIF 2.1.0 of the scan's stored findings (the engine's writer; positions are the findings'
    line ranges, since the publish step has no checkout to read columns from)."""
    from engine.match.matcher import Finding
    from engine.sarif import to_sarif
    from engine.scan import select_rules

    findings = [Finding(rule_id=f.rule_id, status=f.status, file=f.path, cls="", method="", line=f.line,
                        end_line=f.end_line or f.line, message=f.message or f.rule_id, reason=f.reason)
                for f in scan.findings]
    # a relative root that does not exist here: paths stay relative to the repository root
    return to_sarif(findings, select_rules("all"), "repository")


def grants_code_scanning(installation: Installation) -> bool:
    return (installation.permissions or {}).get("security_events") == "write"


def upload_sarif(gh_repo, installation: Installation, repository: Repository, scan: Scan) -> str | None:
    """Upload the scan's findings; return a line for the scan's outcome (None: not granted)."""
    if not grants_code_scanning(installation):
        return None
    if not scan.head_sha:
        return "code scanning: not uploaded (the scanned commit is not known)"
    compressed = gzip.compress(json.dumps(sarif_log(scan), separators=(",", ":")).encode())
    if len(compressed) > MAX_GZIP_BYTES:
        return f"code scanning: not uploaded (SARIF is {len(compressed)} bytes compressed, over GitHub's 10 MB)"
    body = {"commit_sha": scan.head_sha, "ref": f"refs/heads/{scan.branch or repository.default_branch}",
            "sarif": base64.b64encode(compressed).decode("ascii"), "tool_name": TOOL_NAME}
    try:
        _, receipt = gh_repo.requester.requestJsonAndCheck("POST", f"{gh_repo.url}/code-scanning/sarifs", input=body)
    except GithubException as exc:
        message = exc.data.get("message") if isinstance(exc.data, dict) else exc.data
        return f"code scanning: upload refused ({exc.status}: {message})"
    return f"code scanning: {len(scan.findings)} finding(s) uploaded (SARIF {receipt.get('id')})"
