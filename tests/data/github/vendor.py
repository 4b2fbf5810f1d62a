"""Regenerates the vendored GitHub test data in this folder from the two npm packages.

    cd /tmp && npm pack @octokit/webhooks-examples @octokit/openapi
    tar xzf octokit-webhooks-examples-*.tgz && mv package webhooks
    tar xzf octokit-openapi-*.tgz package/generated/api.github.com.json package/package.json && mv package openapi
    python tests/data/github/vendor.py /tmp/webhooks /tmp/openapi

Only what the service's tests use is copied: a few webhook example payloads, and the response
schemas of the REST operations the App calls, with exactly the components they reach.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (event, action, index among the examples of that event and action) -> file name
WEBHOOKS = {
    ("installation", "created", 0): "installation.created.json",
    ("installation", "deleted", 0): "installation.deleted.json",
    ("installation", "suspend", 0): "installation.suspend.json",
    ("installation", "unsuspend", 0): "installation.unsuspend.json",
    ("installation", "new_permissions_accepted", 0): "installation.new_permissions_accepted.json",
    ("installation_repositories", "added", 0): "installation_repositories.added.json",
    ("installation_repositories", "removed", 0): "installation_repositories.removed.json",
    ("push", None, 4): "push.json",
    ("push", None, 3): "push.deleted.json",
    ("pull_request", "closed", 0): "pull_request.closed.json",
    ("pull_request", "reopened", 0): "pull_request.reopened.json",
    ("pull_request", "synchronize", 0): "pull_request.synchronize.json",
    ("issue_comment", "created", 0): "issue_comment.created.json",
    ("ping", None, 0): "ping.json",
    ("star", "created", 0): "star.created.json",
}

# operationId -> success status whose JSON body the fake server must match
OPERATIONS = {
    "apps/create-installation-access-token": "201",
    "repos/get": "200",
    "repos/get-branch": "200",
    "git/get-ref": "200",
    "git/create-ref": "201",
    "git/update-ref": "200",
    "git/create-blob": "201",
    "git/create-tree": "201",
    "git/get-commit": "200",
    "git/create-commit": "201",
    "pulls/list": "200",
    "pulls/create": "201",
    "pulls/update": "200",
    "pulls/get": "200",
    "issues/create-comment": "201",
    "issues/get-comment": "200",
    "reactions/create-for-issue-comment": "201",
    "repos/create-commit-comment": "201",
    "repos/get-collaborator-permission-level": "200",
    "code-scanning/upload-sarif": "202",
}


def vendor_webhooks(root: Path) -> str:
    examples = json.loads((root / "api.github.com" / "index.json").read_text())
    by_event = {entry["name"]: entry["examples"] for entry in examples}
    out = HERE / "webhooks"
    out.mkdir(exist_ok=True)
    for (event, action, index), name in WEBHOOKS.items():
        matching = [e for e in by_event[event] if e.get("action") == action]
        (out / name).write_text(json.dumps(matching[index], indent=2) + "\n")
    return json.loads((root / "package.json").read_text())["version"]


def _refs(node, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            found.add(ref.rsplit("/", 1)[1])
        for value in node.values():
            _refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _refs(value, found)


def vendor_openapi(root: Path) -> str:
    spec = json.loads((root / "generated" / "api.github.com.json").read_text())
    operations = {}
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if isinstance(op, dict) and op.get("operationId") in OPERATIONS:
                status = OPERATIONS[op["operationId"]]
                response = op["responses"][status]
                if "$ref" in response:
                    response = spec["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
                schema = response["content"]["application/json"]["schema"]
                operations[op["operationId"]] = {
                    "method": method.upper(),
                    "path": path,
                    "status": int(status),
                    "schema": schema,
                }
    missing = set(OPERATIONS) - set(operations)
    if missing:
        raise SystemExit(f"operations not in the description: {sorted(missing)}")
    # Close over the components the chosen schemas reach.
    names: set[str] = set()
    _refs(operations, names)
    done: set[str] = set()
    while names - done:
        name = sorted(names - done)[0]
        done.add(name)
        _refs(spec["components"]["schemas"][name], names)
    fragment = {
        "info": "Response schemas of the REST operations Adopter calls, from @octokit/openapi "
        "generated/api.github.com.json, with the components they reference (see README.md).",
        "operations": operations,
        "components": {"schemas": {name: spec["components"]["schemas"][name] for name in sorted(done)}},
    }
    (HERE / "openapi-fragments.json").write_text(json.dumps(fragment, indent=1, sort_keys=True) + "\n")
    return json.loads((root / "package.json").read_text())["version"]


if __name__ == "__main__":
    webhooks_version = vendor_webhooks(Path(sys.argv[1]))
    openapi_version = vendor_openapi(Path(sys.argv[2]))
    print(f"@octokit/webhooks-examples {webhooks_version}, @octokit/openapi {openapi_version}")
