"""The scan's findings as SARIF in the repository's code scanning, where the installation grants it
(``security_events: write``): GitHub shows them as alerts on the scanned commit and closes those a
later upload no longer has. Part of the publish step (the process that holds the App key), which
every completed scan of such an installation passes through, one with nothing to propose included
(``worker.pipeline``); an upload GitHub refuses is one line in the scan's outcome, never a failed scan.
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
    """SARIF 2.1.0 of the scan's stored findings, by the engine's writer. Columns and fingerprints
    are the ones the scan stage read from the checkout (``engine.sarif.Place``), so the log equals
    the command line's; a finding stored without them (older scans) gets its line range."""
    from engine.match.matcher import Finding
    from engine.sarif import Place, Region, to_sarif
    from engine.scan import select_rules

    findings = [Finding(rule_id=f.rule_id, status=f.status, file=f.path, cls=f.class_name or "",
                        method=f.method_name or "", line=f.line, end_line=f.end_line or f.line,
                        message=f.message or f.rule_id, reason=f.reason, guard_text=f.guard)
                for f in scan.findings]
    places = [Place(locations=tuple(Region.from_dict(r) for r in f.locations),
                    related=tuple(Region.from_dict(r) for r in f.related_locations or ()), fingerprint=f.fingerprint)
              if f.locations and f.fingerprint else None for f in scan.findings]
    # a relative root that does not exist here: paths stay relative to the repository root
    return to_sarif(findings, select_rules("all"), "repository", places=places)


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
