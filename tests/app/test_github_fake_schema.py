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
    fake.add_repo(5, "acme/other", {"secret.py": "key = 'acme'\n"})
    fake.add_installation(6, "globex")
    fake.add_repo(6, "globex/private", {"model.py": "z = 3\n"})
    fake.add_collaborator("acme/models", "maintainer", "write")
    fake.add_user("stranger", [])
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
    writer = check("repos/get-collaborator-permission-level", api.get("/collaborators/maintainer/permission"))
    assert writer["permission"] == "write" and writer["user"]["permissions"]["push"] is True
    reader = check("repos/get-collaborator-permission-level", api.get("/collaborators/stranger/permission"))
    assert reader["permission"] == "read" and reader["user"]["permissions"]["push"] is False
    assert api.get("/collaborators/nobody-at-all/permission").status_code == 404
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


def _mint(fake, private, installation_id: int, body: dict | None = None) -> httpx.Response:
    app_jwt = jwt.encode({"iss": "99", "iat": 0, "exp": 2**31 - 1}, private, algorithm="RS256")
    return httpx.post(f"{fake.api}/app/installations/{installation_id}/access_tokens", json=body or {},
                      headers={"Authorization": f"Bearer {app_jwt}"})


def _can_fetch(fake, token: str, full_name: str) -> int:
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    return httpx.get(f"{fake.git_base}/{full_name}.git/info/refs?service=git-upload-pack",
                     headers={"Authorization": f"Basic {basic}"}).status_code


def test_a_token_scoped_to_one_repository_reads_it_and_nothing_else(github):
    fake, private = github
    repo_id = fake.repos["acme/models"].id
    minted = check("apps/create-installation-access-token",
                   _mint(fake, private, 5, {"repository_ids": [repo_id], "permissions": {"contents": "read"}}))
    assert minted["permissions"] == {"contents": "read", "metadata": "read"}
    assert [r["full_name"] for r in minted["repositories"]] == ["acme/models"]
    auth = {"Authorization": f"token {minted['token']}"}
    # It reads its repository: metadata, refs, and a clone.
    assert httpx.get(f"{fake.api}/repos/acme/models", headers=auth).status_code == 200
    main = httpx.get(f"{fake.api}/repos/acme/models/git/ref/heads/main", headers=auth)
    assert main.status_code == 200
    assert _can_fetch(fake, minted["token"], "acme/models") == 200
    # Another repository of the same installation, and another installation's: invisible.
    assert httpx.get(f"{fake.api}/repos/acme/other", headers=auth).status_code == 404
    assert httpx.get(f"{fake.api}/repos/globex/private", headers=auth).status_code == 404
    assert _can_fetch(fake, minted["token"], "acme/other") == 401
    assert _can_fetch(fake, minted["token"], "globex/private") == 401
    # Read-only: no branch, no blob, no pull request, no comment.
    sha = main.json()["object"]["sha"]
    refs_before = fake.ref_sha(fake.repos["acme/models"], "refs/heads/stolen")
    created = httpx.post(f"{fake.api}/repos/acme/models/git/refs", headers=auth,
                         json={"ref": "refs/heads/stolen", "sha": sha})
    assert created.status_code == 403 and "not accessible" in created.json()["message"]
    assert refs_before is None and fake.ref_sha(fake.repos["acme/models"], "refs/heads/stolen") is None
    assert httpx.post(f"{fake.api}/repos/acme/models/git/blobs", headers=auth,
                      json={"content": "x"}).status_code == 403
    assert httpx.post(f"{fake.api}/repos/acme/models/pulls", headers=auth,
                      json={"title": "t", "head": "main", "base": "main"}).status_code == 403


def test_a_token_cannot_be_widened_beyond_the_installation(github):
    fake, private = github
    other_installation = fake.repos["globex/private"].id
    assert _mint(fake, private, 5, {"repository_ids": [other_installation]}).status_code == 422
    assert _mint(fake, private, 5, {"repositories": ["private"]}).status_code == 422
    assert _mint(fake, private, 5, {"permissions": {"administration": "write"}}).status_code == 422
    assert _mint(fake, private, 5, {"permissions": {"metadata": "write"}}).status_code == 422
    # Without a list, a token covers every repository of its installation (and only those).
    whole = _mint(fake, private, 5).json()
    assert whole["repository_selection"] == "all"
    assert _can_fetch(fake, whole["token"], "acme/other") == 200
    assert _can_fetch(fake, whole["token"], "globex/private") == 401
