"""The fake GitHub answers as GitHub's OpenAPI description says (vendored in tests/data/github)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import jsonschema
import jwt
import pytest

from tests.github_fake.keys import app_key_pair
from tests.github_fake.server import FakeGitHub


def json_schema(node):
    """OpenAPI 3.0 schema -> JSON Schema: ``nullable: true`` becomes a null alternative."""
    if isinstance(node, list):
        return [json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        if "$ref" in out or "allOf" in out or "anyOf" in out or "oneOf" in out:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


SPEC = json_schema(json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "github" / "openapi-fragments.json").read_text()))


def check(operation: str, response: httpx.Response) -> dict:
    expected = SPEC["operations"][operation]
    assert response.status_code == expected["status"], (operation, response.text)
    schema = {**expected["schema"], "components": SPEC["components"]}
    jsonschema.validate(response.json(), schema, cls=jsonschema.Draft202012Validator)
    return response.json()


@pytest.fixture(scope="module")
def github(tmp_path_factory):
    private, public = app_key_pair()
    fake = FakeGitHub(tmp_path_factory.mktemp("gh"), app_id=99, public_key=public).start()
    fake.add_installation(5, "acme")
    fake.add_repo(5, "acme/models", {"model.py": "x = 1\n", "pkg/util.py": "y = 2\n"})
    yield fake, private
    fake.stop()


def test_every_operation_the_app_uses_matches_the_schema(github):
    fake, private = github
    with pytest.raises(jsonschema.ValidationError):  # the check itself can fail
        jsonschema.validate({"token": 1}, {**SPEC["operations"]["apps/create-installation-access-token"]["schema"],
                                           "components": SPEC["components"]})
    app_jwt = jwt.encode({"iss": "99", "iat": 0, "exp": 2**31 - 1}, private, algorithm="RS256")
    token = check("apps/create-installation-access-token",
                  httpx.post(f"{fake.api}/app/installations/5/access_tokens",
                             headers={"Authorization": f"Bearer {app_jwt}"}))["token"]
    api = httpx.Client(base_url=f"{fake.api}/repos/acme/models", headers={"Authorization": f"token {token}"})

    check("repos/get", api.get(f"{fake.api}/repos/acme/models"))
    branch = check("repos/get-branch", api.get("/branches/main"))
    base = branch["commit"]["sha"]
    check("git/get-ref", api.get("/git/ref/heads/main"))
    base_commit = check("git/get-commit", api.get(f"/git/commits/{base}"))
    blob = check("git/create-blob", api.post("/git/blobs", json={"content": "y = 3\n", "encoding": "utf-8"}))
    tree = check("git/create-tree", api.post("/git/trees", json={
        "base_tree": base_commit["tree"]["sha"],
        "tree": [{"path": "pkg/util.py", "mode": "100644", "type": "blob", "sha": blob["sha"]}]}))
    commit = check("git/create-commit", api.post("/git/commits", json={
        "message": "Rewrite", "tree": tree["sha"], "parents": [base]}))
    check("git/create-ref", api.post("/git/refs", json={"ref": "refs/heads/adopter/x", "sha": commit["sha"]}))
    check("git/update-ref", api.patch("/git/refs/heads/adopter/x", json={"sha": commit["sha"], "force": True}))
    pull = check("pulls/create", api.post("/pulls", json={"title": "T", "head": "adopter/x", "base": "main",
                                                          "body": "B"}))
    listed = check("pulls/list", api.get("/pulls", params={"head": "acme:adopter/x", "state": "open"}))
    assert [p["number"] for p in listed] == [pull["number"]]
    check("pulls/get", api.get(f"/pulls/{pull['number']}"))
    check("pulls/update", api.patch(f"/pulls/{pull['number']}", json={"body": "B2"}))
    comment = check("issues/create-comment", api.post(f"/issues/{pull['number']}/comments", json={"body": "hi"}))
    check("issues/get-comment", api.get(f"/issues/comments/{comment['id']}"))
    check("reactions/create-for-issue-comment",
          api.post(f"/issues/comments/{comment['id']}/reactions", json={"content": "+1"}))
    check("repos/create-commit-comment", api.post(f"/commits/{base}/comments", json={"body": "config error"}))
    # The commit is a real git commit: the file changed, the rest came from the base tree.
    assert fake.file_at("acme/models", "adopter/x", "pkg/util.py") == "y = 3"
    assert fake.file_at("acme/models", "adopter/x", "model.py") == "x = 1"


def test_authentication_is_enforced(github):
    fake, private = github
    assert httpx.get(f"{fake.api}/repos/acme/models").status_code == 401
    assert httpx.get(f"{fake.api}/repos/acme/models", headers={"Authorization": "token nope"}).status_code == 401
    other_key, _ = app_key_pair()
    forged = jwt.encode({"iss": "99", "iat": 0, "exp": 2**31 - 1}, other_key, algorithm="RS256")
    answer = httpx.post(f"{fake.api}/app/installations/5/access_tokens", headers={"Authorization": f"Bearer {forged}"})
    assert answer.status_code == 401
    basic = base64.b64encode(b"x-access-token:nope").decode()
    git = httpx.get(f"{fake.git_base}/acme/models.git/info/refs?service=git-upload-pack",
                    headers={"Authorization": f"Basic {basic}"})
    assert git.status_code == 401
