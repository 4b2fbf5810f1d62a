"""A local HTTP server that plays GitHub for the service's tests.

It implements the REST endpoints the App uses (installation tokens, repositories, branches, the Git
database API, pull requests, comments, reactions), with answers shaped by GitHub's OpenAPI
description (``objects.py``), and serves each repository for cloning through ``git http-backend``
(smart HTTP, so shallow fetches of one commit work). Every repository is a real bare git
repository: blobs, trees, commits and refs created through the API are real git objects, so a test
can ``git diff`` what the App pushed.

Authentication is checked as GitHub does: the access-token endpoint wants an RS256 JWT signed with
the App's key, everything else an installation token of an installation that holds the repository
(HTTP basic ``x-access-token:<token>`` for git). Tokens are scoped as GitHub scopes them
(``POST /app/installations/{id}/access_tokens`` with ``repositories``/``repository_ids`` and
``permissions``): a repository outside the token's list answers 404, an operation needing a
permission the token lacks answers 403 ("Resource not accessible by integration"), and asking for a
repository outside the installation or a permission the installation was not granted answers 422.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import secrets
import subprocess
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import jwt

from tests.github_fake import objects as O

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "HOME": "/tmp"}
BOT_USER_ID = 41898282


def git(repo_dir: Path, *args: str, input: bytes | None = None, env: dict | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=repo_dir, input=input, capture_output=True, check=False,
                          env={**os.environ, **GIT_ENV, **(env or {})})
    if done.returncode != 0:
        raise GitError(done.stderr.decode(errors="replace").strip())
    return done.stdout.decode(errors="replace").strip()


class GitError(Exception):
    pass


class HttpError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


@dataclass
class FakeRepo:
    id: int
    owner: str
    name: str
    path: Path
    installation_id: int
    default_branch: str = "main"
    private: bool = False
    size_kib: int = 10
    pulls: list[dict] = field(default_factory=list)
    issue_comments: list[dict] = field(default_factory=list)
    commit_comments: list[dict] = field(default_factory=list)
    sarif_uploads: list[dict] = field(default_factory=list)  # decoded SARIF logs posted to code scanning

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


# The App's permissions on every installation (what the App registration asks for).
INSTALLATION_PERMISSIONS = {"contents": "write", "pull_requests": "write", "issues": "write", "checks": "write",
                            "metadata": "read"}
LEVELS = {"none": 0, "read": 1, "write": 2, "admin": 3}
# handler -> the permissions (any one suffices) and level it needs, as GitHub's REST docs list them.
NEEDS: dict[str, tuple[tuple[str, ...], str]] = {
    "get_repo": (("metadata",), "read"),
    "get_collaborator_permission": (("metadata",), "read"),
    "get_branch": (("contents",), "read"),
    "get_ref": (("contents",), "read"),
    "get_tree": (("contents",), "read"),
    "get_commit": (("contents",), "read"),
    "create_ref": (("contents",), "write"),
    "update_ref": (("contents",), "write"),
    "create_blob": (("contents",), "write"),
    "create_tree": (("contents",), "write"),
    "create_commit": (("contents",), "write"),
    "create_commit_comment": (("contents",), "write"),
    "list_pulls": (("pull_requests",), "read"),
    "get_pull": (("pull_requests",), "read"),
    "create_pull": (("pull_requests",), "write"),
    "update_pull": (("pull_requests",), "write"),
    "create_issue_comment": (("issues", "pull_requests"), "write"),
    "get_issue_comment": (("issues", "pull_requests"), "read"),
    "create_reaction": (("issues", "pull_requests"), "write"),
    "upload_sarif": (("security_events",), "write"),
}


@dataclass(frozen=True)
class Grant:
    """What one installation token may do."""

    installation_id: int
    expires: datetime
    repository_ids: frozenset[int] | None  # None: every repository of the installation
    permissions: dict[str, str]

    def allows(self, names: tuple[str, ...], level: str) -> bool:
        return any(LEVELS.get(self.permissions.get(n, "none"), 0) >= LEVELS[level] for n in names)


class FakeGitHub:
    def __init__(self, root: Path, *, app_id: int, public_key: str, app_slug: str = "adopter"):
        self.root = root
        self.app_id = app_id
        self.public_key = public_key
        self.app_slug = app_slug
        self.installations: dict[int, dict] = {}
        self.repos: dict[str, FakeRepo] = {}
        self.tokens: dict[str, Grant] = {}
        # full name -> login -> legacy base role ("admin", "write", "read"), as a collaborator has it
        self.collaborators: dict[str, dict[str, str]] = {}
        self.reactions: list[dict] = []
        self.git_fetches: list[tuple[str, Grant]] = []  # (repository, token grant) of every git request
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.fail_next: list[tuple[str, str, int, dict]] = []  # (method, path regex, status, headers)
        self.lock = threading.RLock()
        self._ids = itertools.count(1000)
        self._server: ThreadingHTTPServer | None = None
        # The OAuth web flow of the App (dashboard sign-in): people, the App's OAuth credentials,
        # codes handed out by the authorize page, user tokens they were exchanged for.
        self.users: dict[str, dict] = {}  # login -> {"id", "installations": set of ids}
        self.oauth_clients: dict[str, str] = {}  # client id -> client secret
        self.oauth_codes: dict[str, tuple[str, str, str]] = {}  # code -> (login, client id, redirect uri)
        self.user_tokens: dict[str, str] = {}  # token -> login
        self.signed_in: str | None = None  # whom the authorize page approves as (the browser's GitHub user)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeGitHub:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def api(self) -> str:
        return f"{self.url}/api/v3"

    @property
    def web(self) -> str:
        return f"{self.url}/web"

    @property
    def git_base(self) -> str:
        return f"{self.url}/git"

    def next_id(self) -> int:
        return next(self._ids)

    # --- state set up by tests ---------------------------------------------------------------

    def add_installation(self, installation_id: int, account: str, permissions: dict | None = None) -> None:
        self.installations[installation_id] = {"account": account,
                                               "permissions": dict(permissions or INSTALLATION_PERMISSIONS)}

    def add_collaborator(self, full_name: str, login: str, permission: str) -> None:
        """``login`` gets ``permission`` (admin, write, read) on ``full_name``; a GitHub user from now on."""
        self.users.setdefault(login, {"id": self.next_id(), "installations": set()})
        self.collaborators.setdefault(full_name, {})[login] = permission

    def add_repo(self, installation_id: int, full_name: str, files: dict[str, str], *, repo_id: int | None = None,
                 default_branch: str = "main") -> FakeRepo:
        owner, name = full_name.split("/")
        path = self.root / owner / f"{name}.git"
        path.mkdir(parents=True)
        git(path, "init", "--bare", "-q", f"--initial-branch={default_branch}")
        git(path, "config", "uploadpack.allowAnySHA1InWant", "true")
        git(path, "config", "http.receivepack", "false")
        repo = FakeRepo(id=repo_id or self.next_id(), owner=owner, name=name, path=path,
                        installation_id=installation_id, default_branch=default_branch)
        self.repos[full_name] = repo
        self.commit_files(full_name, files, "Initial commit")
        return repo

    def commit_files(self, full_name: str, files: dict[str, str], message: str, *, branch: str | None = None,
                     author: str = "Octo Cat") -> str:
        """A person's push: a commit on ``branch`` (default branch) changing ``files``."""
        repo = self.repos[full_name]
        branch = branch or repo.default_branch
        with self.lock:
            parent = self.ref_sha(repo, f"refs/heads/{branch}")
            elements = [{"path": p, "mode": "100644", "type": "blob", "sha": self.write_blob(repo, c.encode())}
                        for p, c in files.items()]
            tree = self.write_tree(repo, parent and self.commit_info(repo, parent)["tree"], elements)
            sha = self.write_commit(repo, message, tree, [parent] if parent else [], author=author)
            git(repo.path, "update-ref", f"refs/heads/{branch}", sha)
            return sha

    def add_user(self, login: str, installation_ids: list[int], *, user_id: int | None = None) -> None:
        """A person who can access ``installation_ids`` (what ``GET /user/installations`` lists)."""
        self.users[login] = {"id": user_id or self.next_id(), "installations": set(installation_ids)}

    def add_oauth_client(self, client_id: str, client_secret: str) -> None:
        self.oauth_clients[client_id] = client_secret

    def sign_in(self, login: str | None) -> None:
        """The person signed in to GitHub in the browser: the authorize page approves as them."""
        self.signed_in = login

    def pull(self, full_name: str, number: int) -> dict:
        return next(p for p in self.repos[full_name].pulls if p["number"] == number)

    def close_pull(self, full_name: str, number: int, *, merged: bool = False) -> dict:
        pull = self.pull(full_name, number)
        pull.update(state="closed", closed_at=O.now_iso(), merged=merged,
                    merged_at=O.now_iso() if merged else None)
        return pull

    def file_at(self, full_name: str, rev: str, path: str) -> str:
        return git(self.repos[full_name].path, "show", f"{rev}:{path}")

    # --- git plumbing ------------------------------------------------------------------------

    def ref_sha(self, repo: FakeRepo, ref: str) -> str | None:
        try:
            return git(repo.path, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        except GitError:
            return None

    def write_blob(self, repo: FakeRepo, content: bytes) -> str:
        return git(repo.path, "hash-object", "-w", "--stdin", input=content)

    def write_tree(self, repo: FakeRepo, base_tree: str | None, elements: list[dict]) -> str:
        index = repo.path / f"index-{secrets.token_hex(4)}"
        env = {"GIT_INDEX_FILE": str(index)}
        try:
            if base_tree:
                git(repo.path, "read-tree", base_tree, env=env)
            else:
                git(repo.path, "read-tree", "--empty", env=env)
            for element in elements:
                if element.get("sha") is None and "content" not in element:
                    git(repo.path, "update-index", "--force-remove", element["path"], env=env)
                    continue
                sha = element.get("sha") or self.write_blob(repo, element["content"].encode())
                git(repo.path, "update-index", "--add", "--cacheinfo",
                    f"{element['mode']},{sha},{element['path']}", env=env)
            return git(repo.path, "write-tree", env=env)
        finally:
            index.unlink(missing_ok=True)

    def write_commit(self, repo: FakeRepo, message: str, tree: str, parents: list[str], *,
                     author: str = "adopter[bot]") -> str:
        args = ["commit-tree", tree]
        for parent in parents:
            args += ["-p", parent]
        email = f"{author.replace(' ', '.')}@users.noreply.fake"
        env = {"GIT_AUTHOR_NAME": author, "GIT_AUTHOR_EMAIL": email,
               "GIT_COMMITTER_NAME": author, "GIT_COMMITTER_EMAIL": email}
        return git(repo.path, *args, input=message.encode(), env=env)

    def commit_info(self, repo: FakeRepo, sha: str) -> dict:
        raw = git(repo.path, "cat-file", "commit", sha)
        header, _, message = raw.partition("\n\n")
        info = {"sha": git(repo.path, "rev-parse", sha), "parents": [], "message": message}
        for line in header.splitlines():
            key, _, value = line.partition(" ")
            if key == "tree":
                info["tree"] = value
            elif key == "parent":
                info["parents"].append(value)
            elif key in ("author", "committer"):
                m = re.match(r"(.*) <(.*)> (\d+) ([+-]\d{4})", value)
                when = datetime.fromtimestamp(int(m.group(3)), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                info[key] = O.git_user(m.group(1), m.group(2), when)
        return info

    def tree_entries(self, repo: FakeRepo, sha: str) -> list[dict]:
        entries = []
        for line in git(repo.path, "ls-tree", "-l", sha).splitlines():
            meta, path = line.split("\t", 1)
            mode, kind, obj, size = meta.split()
            entry = {"path": path, "mode": mode, "type": kind, "sha": obj,
                     "url": f"{self.api}/repos/{repo.full_name}/git/{kind}s/{obj}"}
            if kind == "blob":
                entry["size"] = int(size)
            entries.append(entry)
        return entries

    # --- objects -----------------------------------------------------------------------------

    def owner_obj(self, repo: FakeRepo) -> dict:
        return O.user(self.api, self.web, repo.owner, 1_000_000 + repo.id % 1000, "Organization")

    def bot_obj(self) -> dict:
        return O.user(self.api, self.web, f"{self.app_slug}[bot]", BOT_USER_ID, "Bot")

    def repo_obj(self, repo: FakeRepo, *, full: bool) -> dict:
        return O.repository(self.api, self.web, self.git_base, repo, self.owner_obj(repo), full=full)

    def pull_obj(self, repo: FakeRepo, pull: dict, *, full: bool) -> dict:
        pull["head_sha"] = self.ref_sha(repo, f"refs/heads/{pull['head']}") or pull["head_sha"]
        return O.pull_request(self.api, self.web, self.repo_obj(repo, full=False), pull, full=full)


def _json_body(handler: BaseHTTPRequestHandler) -> dict:
    length = int(handler.headers.get("content-length") or 0)
    raw = handler.rfile.read(length) if length else b""
    try:
        return json.loads(raw or b"{}")
    except json.JSONDecodeError as exc:
        raise HttpError(400, f"Problems parsing JSON: {exc}") from None


class _Handler(BaseHTTPRequestHandler):
    fake: FakeGitHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    # --- plumbing ----------------------------------------------------------------------------

    def _send(self, status: int, body: dict | list | None, headers: dict | None = None) -> None:
        payload = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)

    def _dispatch(self, method: str) -> None:
        fake = self.fake
        path = urlsplit(self.path).path
        with fake.lock:
            fake.requests.append((method, path))
            injected = next((f for f in fake.fail_next if f[0] == method and re.fullmatch(f[1], path)), None)
            if injected:
                fake.fail_next.remove(injected)
        try:
            if injected:
                raise HttpError(injected[2], "injected failure", injected[3])
            if path.startswith("/git/"):
                return self._git_http(method, path)
            if path.startswith("/login/oauth/"):
                return self._oauth(method, path)
            if not path.startswith("/api/v3/"):
                raise HttpError(404, "Not Found")
            route = path.removeprefix("/api/v3")
            for pattern, verb, handler_name in ROUTES:
                match = re.fullmatch(pattern, route)
                if match and verb == method:
                    self._operation = handler_name
                    status, body = getattr(self, handler_name)(*[unquote(g) for g in match.groups()])
                    return self._send(status, body)
            raise HttpError(404, f"Not Found: {method} {route}")
        except HttpError as exc:
            self._send(exc.status, {"message": exc.message,
                                    "documentation_url": "https://docs.github.com/rest"}, exc.headers)

    def do_GET(self):  # noqa: N802
        self._dispatch("GET")

    def do_POST(self):  # noqa: N802
        self._dispatch("POST")

    def do_PATCH(self):  # noqa: N802
        self._dispatch("PATCH")

    def do_DELETE(self):  # noqa: N802
        self._dispatch("DELETE")

    # --- authentication ----------------------------------------------------------------------

    def _grant_of_token(self, token: str) -> Grant:
        grant = self.fake.tokens.get(token)
        if grant is None or grant.expires < datetime.now(UTC):
            raise HttpError(401, "Bad credentials")
        return grant

    def _visible(self, grant: Grant, repo: FakeRepo | None) -> bool:
        return (repo is not None and repo.installation_id == grant.installation_id
                and (grant.repository_ids is None or repo.id in grant.repository_ids))

    def _repo(self, owner: str, name: str) -> FakeRepo:
        header = self.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() not in ("token", "bearer") or not token:
            raise HttpError(401, "Requires authentication")
        grant = self._grant_of_token(token)
        repo = self.fake.repos.get(f"{owner}/{name}")
        if not self._visible(grant, repo):
            raise HttpError(404, "Not Found")
        names, level = NEEDS[self._operation]
        if not grant.allows(names, level):
            raise HttpError(403, "Resource not accessible by integration")
        return repo

    def _git_http(self, method: str, path: str) -> None:
        """Smart HTTP through ``git http-backend`` (CGI), behind installation-token basic auth."""
        fake = self.fake
        header = self.headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        try:
            user, _, token = base64.b64decode(encoded).decode().partition(":") if scheme == "Basic" else ("", "", "")
            grant = self._grant_of_token(token) if user == "x-access-token" else None
        except (HttpError, ValueError):
            grant = None
        full_name = re.match(r"/git/([^/]+/[^/]+)\.git/", path)
        repo = fake.repos.get(full_name.group(1)) if full_name else None
        if grant is None or not self._visible(grant, repo):
            raise HttpError(401, "Authentication failed", {"WWW-Authenticate": 'Basic realm="fake"'})
        if not grant.allows(("contents",), "read"):
            raise HttpError(403, "Permission to read the repository's contents denied")
        with fake.lock:
            fake.git_fetches.append((repo.full_name, grant))
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        env = {
            **os.environ, **GIT_ENV, "GIT_PROJECT_ROOT": str(fake.root), "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path.removeprefix("/git"), "REQUEST_METHOD": method,
            "QUERY_STRING": urlsplit(self.path).query, "CONTENT_TYPE": self.headers.get("content-type", ""),
            "CONTENT_LENGTH": str(len(body)), "REMOTE_USER": "x-access-token",
            "HTTP_GIT_PROTOCOL": self.headers.get("git-protocol", ""),
        }
        done = subprocess.run(["git", "http-backend"], input=body, capture_output=True, env=env, check=False)
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.strip().split()[0])
            elif key:
                headers.append((key, value.strip()))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    # --- OAuth web flow (github.com/login/oauth/...) -----------------------------------------

    def _oauth(self, method: str, path: str) -> None:
        fake = self.fake
        if path == "/login/oauth/authorize" and method == "GET":
            query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
            client_id, redirect_uri = query.get("client_id"), query.get("redirect_uri", "")
            if client_id not in fake.oauth_clients:
                raise HttpError(404, "Not Found")
            if fake.signed_in not in fake.users:
                raise HttpError(401, "Sign in to GitHub first")
            code = secrets.token_hex(10)
            fake.oauth_codes[code] = (fake.signed_in, client_id, redirect_uri)
            sep = "&" if "?" in redirect_uri else "?"
            location = f"{redirect_uri}{sep}code={code}"
            if "state" in query:
                location += f"&state={query['state']}"
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if path == "/login/oauth/access_token" and method == "POST":
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length).decode() if length else ""
            if "json" in self.headers.get("content-type", ""):
                form = json.loads(raw or "{}")
            else:
                form = {k: v[0] for k, v in parse_qs(raw).items()}
            client_id = form.get("client_id")
            if client_id not in fake.oauth_clients or fake.oauth_clients[client_id] != form.get("client_secret"):
                return self._send(200, {"error": "incorrect_client_credentials",
                                        "error_description": "The client_id and/or client_secret passed are incorrect."})
            entry = fake.oauth_codes.pop(form.get("code", ""), None)
            if entry is None or entry[1] != client_id or (form.get("redirect_uri") and form["redirect_uri"] != entry[2]):
                return self._send(200, {"error": "bad_verification_code",
                                        "error_description": "The code passed is incorrect or expired."})
            token = f"ghu_{secrets.token_hex(18)}"
            fake.user_tokens[token] = entry[0]
            return self._send(200, {"access_token": token, "token_type": "bearer", "scope": ""})
        raise HttpError(404, "Not Found")

    def _user_login(self) -> str:
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        login = self.fake.user_tokens.get(token) if scheme.lower() in ("token", "bearer") else None
        if login is None:
            raise HttpError(401, "Bad credentials")
        return login

    def revoke_user_token(self, client_id):
        """``DELETE /applications/{client_id}/token``: basic auth with the OAuth client's id and secret."""
        fake = self.fake
        scheme, _, encoded = self.headers.get("authorization", "").partition(" ")
        try:
            user, _, secret = base64.b64decode(encoded).decode().partition(":") if scheme == "Basic" else ("", "", "")
        except ValueError:
            user = secret = ""
        if user != client_id or fake.oauth_clients.get(client_id) != secret:
            raise HttpError(404, "Not Found")
        token = _json_body(self).get("access_token")
        if fake.user_tokens.pop(token, None) is None:
            raise HttpError(422, "Validation Failed: access_token")
        return 204, None

    def get_user(self):
        fake, login = self.fake, self._user_login()
        return 200, O.user(fake.api, fake.web, login, fake.users[login]["id"])

    def user_installations(self):
        fake, login = self.fake, self._user_login()
        query = parse_qs(urlsplit(self.path).query)
        per_page = min(int(query.get("per_page", ["30"])[0]), 100)
        page = max(int(query.get("page", ["1"])[0]), 1)
        ids = sorted(i for i in fake.users[login]["installations"] if i in fake.installations)
        chosen = ids[(page - 1) * per_page: page * per_page]
        return 200, {"total_count": len(ids), "installations": [
            O.installation(fake.api, fake.web, i, fake.installations[i]["account"], fake.app_id, fake.app_slug,
                           1_000_000 + i % 1000) for i in chosen]}

    # --- REST handlers (each returns (status, body)) -----------------------------------------

    def access_token(self, installation_id: str):
        fake = self.fake
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        try:
            claims = jwt.decode(token, fake.public_key, algorithms=["RS256"], leeway=60)
        except jwt.PyJWTError as exc:
            raise HttpError(401, f"A JSON web token could not be decoded: {exc}") from None
        if scheme.lower() != "bearer" or str(claims.get("iss")) != str(fake.app_id):
            raise HttpError(401, "'Issuer' claim ('iss') must be the App's id")
        installation = fake.installations.get(int(installation_id))
        if installation is None:
            raise HttpError(404, "Not Found")
        body = _json_body(self)
        names, ids = body.get("repositories"), body.get("repository_ids")
        if (names is not None and not isinstance(names, list)) or (ids is not None and not isinstance(ids, list)):
            raise HttpError(422, "Invalid request: repositories and repository_ids must be arrays")
        granted = installation["permissions"]
        wanted = body.get("permissions")
        if wanted is not None and (not isinstance(wanted, dict) or any(
                LEVELS.get(level, 99) > LEVELS.get(granted.get(name, "none"), 0) for name, level in wanted.items())):
            raise HttpError(422, "The permissions requested are not granted to this installation.")
        own = [r for r in fake.repos.values() if r.installation_id == int(installation_id)]
        chosen: list[FakeRepo] | None = None
        if names is not None or ids is not None:
            by_name = {r.name: r for r in own}
            by_id = {r.id: r for r in own}
            if any(n not in by_name for n in names or []) or any(i not in by_id for i in ids or []):
                raise HttpError(422, "There is at least one repository that does not exist or is not accessible "
                                     "to the parent installation.")
            chosen = list({r.id: r for r in [*(by_name[n] for n in names or []),
                                               *(by_id[i] for i in ids or [])]}.values())
        # No permissions (or none listed, as PyGithub sends them) means all the installation's.
        permissions = dict(wanted) if wanted else dict(granted)
        permissions["metadata"] = "read"  # every token can read the metadata of its repositories
        token = f"ghs_{secrets.token_hex(18)}"
        expires = datetime.now(UTC) + timedelta(hours=1)
        fake.tokens[token] = Grant(int(installation_id), expires,
                                   None if chosen is None else frozenset(r.id for r in chosen), permissions)
        answer = {"token": token, "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "permissions": permissions,
                  "repository_selection": "selected" if chosen is not None else "all"}
        if chosen is not None:
            answer["repositories"] = [fake.repo_obj(r, full=False) for r in chosen]
        return 201, answer

    def get_collaborator_permission(self, owner, name, login):
        fake, repo = self.fake, self._repo(owner, name)
        user = fake.users.get(login)
        if user is None:
            raise HttpError(404, "Not Found")
        permission = fake.collaborators.get(repo.full_name, {}).get(login)
        role = permission or ("none" if repo.private else "read")
        return 200, {"permission": role, "role_name": role,
                     "user": O.collaborator(fake.api, fake.web, login, user["id"], role)}

    def get_repo(self, owner, name):
        return 200, self.fake.repo_obj(self._repo(owner, name), full=True)

    def get_branch(self, owner, name, branch):
        fake, repo = self.fake, self._repo(owner, name)
        sha = fake.ref_sha(repo, f"refs/heads/{branch}")
        if sha is None:
            raise HttpError(404, "Branch not found")
        info = fake.commit_info(repo, sha)
        return 200, {
            "name": branch, "commit": O.commit(fake.api, fake.web, repo.full_name, info, fake.owner_obj(repo)),
            "_links": {"html": f"{fake.web}/{repo.full_name}/tree/{branch}",
                       "self": f"{fake.api}/repos/{repo.full_name}/branches/{branch}"},
            "protected": False, "protection": {"enabled": False},
            "protection_url": f"{fake.api}/repos/{repo.full_name}/branches/{branch}/protection",
        }

    def get_ref(self, owner, name, ref):
        fake, repo = self.fake, self._repo(owner, name)
        sha = fake.ref_sha(repo, f"refs/{ref}")
        if sha is None:
            raise HttpError(404, "Not Found")
        return 200, O.git_ref(fake.api, repo.full_name, f"refs/{ref}", sha)

    def create_ref(self, owner, name):
        fake, repo = self.fake, self._repo(owner, name)
        body = _json_body(self)
        ref, sha = body.get("ref", ""), body.get("sha", "")
        if not ref.startswith("refs/") or ref.count("/") < 2:
            raise HttpError(422, "ref must start with 'refs' and have at least two slashes")
        with fake.lock:
            if fake.ref_sha(repo, ref):
                raise HttpError(422, "Reference already exists")
            try:
                git(repo.path, "update-ref", ref, sha, "0" * 40)
            except GitError:
                raise HttpError(422, "Object does not exist") from None
        return 201, O.git_ref(fake.api, repo.full_name, ref, sha)

    def update_ref(self, owner, name, ref):
        fake, repo = self.fake, self._repo(owner, name)
        body = _json_body(self)
        with fake.lock:
            old = fake.ref_sha(repo, f"refs/{ref}")
            if old is None:
                raise HttpError(422, "Reference does not exist")
            new = body.get("sha", "")
            if not body.get("force"):
                try:
                    git(repo.path, "merge-base", "--is-ancestor", old, new)
                except GitError:
                    raise HttpError(422, "Update is not a fast forward") from None
            git(repo.path, "update-ref", f"refs/{ref}", new, old)
        return 200, O.git_ref(fake.api, repo.full_name, f"refs/{ref}", new)

    def create_blob(self, owner, name):
        fake, repo = self.fake, self._repo(owner, name)
        body = _json_body(self)
        content = body.get("content")
        if not isinstance(content, str):
            raise HttpError(422, "content is required")
        data = base64.b64decode(content) if body.get("encoding") == "base64" else content.encode()
        sha = fake.write_blob(repo, data)
        return 201, {"url": f"{fake.api}/repos/{repo.full_name}/git/blobs/{sha}", "sha": sha}

    def create_tree(self, owner, name):
        fake, repo = self.fake, self._repo(owner, name)
        body = _json_body(self)
        try:
            sha = fake.write_tree(repo, body.get("base_tree"), body.get("tree") or [])
        except GitError as exc:
            raise HttpError(422, f"tree could not be created: {exc}") from None
        return 201, {"sha": sha, "url": f"{fake.api}/repos/{repo.full_name}/git/trees/{sha}",
                     "tree": fake.tree_entries(repo, sha), "truncated": False}

    def get_tree(self, owner, name, sha):
        fake, repo = self.fake, self._repo(owner, name)
        return 200, {"sha": sha, "url": f"{fake.api}/repos/{repo.full_name}/git/trees/{sha}",
                     "tree": fake.tree_entries(repo, sha), "truncated": False}

    def get_commit(self, owner, name, sha):
        fake, repo = self.fake, self._repo(owner, name)
        try:
            info = fake.commit_info(repo, sha)
        except GitError:
            raise HttpError(404, "Not Found") from None
        return 200, O.git_commit(fake.api, fake.web, repo.full_name, info)

    def create_commit(self, owner, name):
        fake, repo = self.fake, self._repo(owner, name)
        body = _json_body(self)
        try:
            sha = fake.write_commit(repo, body["message"], body["tree"], body.get("parents") or [])
        except (GitError, KeyError) as exc:
            raise HttpError(422, f"commit could not be created: {exc}") from None
        return 201, O.git_commit(fake.api, fake.web, repo.full_name, fake.commit_info(repo, sha))

    def list_pulls(self, owner, name):
        fake, repo = self.fake, self._repo(owner, name)
        query = parse_qs(urlsplit(self.path).query)
        state = query.get("state", ["open"])[0]
        head = query.get("head", [None])[0]
        base = query.get("base", [None])[0]
        pulls = [p for p in repo.pulls
                 if (state == "all" or p["state"] == state)
                 and (head is None or f"{repo.owner}:{p['head']}" == head)
                 and (base is None or p["base"] == base)]
        return 200, [fake.pull_obj(repo, p, full=False) for p in pulls]

    def create_pull(self, owner, name):
        fake, repo = self.fake, self._repo(owner, name)
        body = _json_body(self)
        head, base = body.get("head", ""), body.get("base", "")
        head_branch = head.split(":")[-1]
        head_sha = fake.ref_sha(repo, f"refs/heads/{head_branch}")
        base_sha = fake.ref_sha(repo, f"refs/heads/{base}")
        if head_sha is None or base_sha is None:
            raise HttpError(422, "Validation Failed: head or base does not exist")
        with fake.lock:
            if any(p["head"] == head_branch and p["base"] == base and p["state"] == "open" for p in repo.pulls):
                raise HttpError(422, f"A pull request already exists for {owner}:{head_branch}.")
            stamp = O.now_iso()
            number = len(repo.pulls) + 1
            changed = git(repo.path, "diff", "--name-only", base_sha, head_sha).splitlines()
            pull = {"id": fake.next_id(), "number": number, "state": "open", "title": body.get("title", ""),
                    "body": body.get("body"), "head": head_branch, "base": base, "head_sha": head_sha,
                    "base_sha": base_sha, "user": fake.bot_obj(), "created_at": stamp, "updated_at": stamp,
                    "closed_at": None, "merged_at": None, "merged": False, "changed_files": len(changed)}
            repo.pulls.append(pull)
        return 201, fake.pull_obj(repo, pull, full=True)

    def get_pull(self, owner, name, number):
        fake, repo = self.fake, self._repo(owner, name)
        pull = next((p for p in repo.pulls if p["number"] == int(number)), None)
        if pull is None:
            raise HttpError(404, "Not Found")
        return 200, fake.pull_obj(repo, pull, full=True)

    def update_pull(self, owner, name, number):
        fake, repo = self.fake, self._repo(owner, name)
        pull = next((p for p in repo.pulls if p["number"] == int(number)), None)
        if pull is None:
            raise HttpError(404, "Not Found")
        body = _json_body(self)
        with fake.lock:
            for key in ("title", "body"):
                if key in body:
                    pull[key] = body[key]
            if body.get("state") in ("open", "closed"):
                pull["state"] = body["state"]
                pull["closed_at"] = O.now_iso() if body["state"] == "closed" else None
            pull["updated_at"] = O.now_iso()
        return 200, fake.pull_obj(repo, pull, full=True)

    def create_issue_comment(self, owner, name, number):
        fake, repo = self.fake, self._repo(owner, name)
        body = _json_body(self)
        comment = {"id": fake.next_id(), "issue_number": int(number), "body": body.get("body", ""),
                   "user": fake.bot_obj(), "created_at": O.now_iso()}
        repo.issue_comments.append(comment)
        return 201, O.issue_comment(fake.api, fake.web, repo.full_name, comment)

    def get_issue_comment(self, owner, name, comment_id):
        fake, repo = self.fake, self._repo(owner, name)
        comment = next((c for c in repo.issue_comments if c["id"] == int(comment_id)), None)
        if comment is None:
            raise HttpError(404, "Not Found")
        return 200, O.issue_comment(fake.api, fake.web, repo.full_name, comment)

    def create_reaction(self, owner, name, comment_id):
        fake, repo = self.fake, self._repo(owner, name)
        content = _json_body(self).get("content")
        if content not in ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes"):
            raise HttpError(422, "Validation Failed: content")
        reaction = {"id": fake.next_id(), "comment_id": int(comment_id), "content": content,
                    "repo": repo.full_name}
        fake.reactions.append(reaction)
        return 201, O.reaction(reaction["id"], content, fake.bot_obj())

    def create_commit_comment(self, owner, name, sha):
        fake, repo = self.fake, self._repo(owner, name)
        comment = {"id": fake.next_id(), "sha": sha, "body": _json_body(self).get("body", ""),
                   "user": fake.bot_obj(), "created_at": O.now_iso()}
        repo.commit_comments.append(comment)
        return 201, O.commit_comment(fake.api, fake.web, repo.full_name, comment)


_R = r"/repos/([^/]+)/([^/]+)"
ROUTES = [
    (r"/app/installations/(\d+)/access_tokens", "POST", "access_token"),
    (r"/applications/([^/]+)/token", "DELETE", "revoke_user_token"),
    (r"/user", "GET", "get_user"),
    (r"/user/installations", "GET", "user_installations"),
    (_R, "GET", "get_repo"),
    (_R + r"/collaborators/([^/]+)/permission", "GET", "get_collaborator_permission"),
    (_R + r"/branches/(.+)", "GET", "get_branch"),
    (_R + r"/git/ref/(.+)", "GET", "get_ref"),
    (_R + r"/git/refs", "POST", "create_ref"),
    (_R + r"/git/refs/(.+)", "PATCH", "update_ref"),
    (_R + r"/git/blobs", "POST", "create_blob"),
    (_R + r"/git/trees", "POST", "create_tree"),
    (_R + r"/git/trees/([0-9a-f]{40})", "GET", "get_tree"),
    (_R + r"/git/commits", "POST", "create_commit"),
    (_R + r"/git/commits/([0-9a-f]{40})", "GET", "get_commit"),
    (_R + r"/pulls", "GET", "list_pulls"),
    (_R + r"/pulls", "POST", "create_pull"),
    (_R + r"/pulls/(\d+)", "GET", "get_pull"),
    (_R + r"/pulls/(\d+)", "PATCH", "update_pull"),
    (_R + r"/issues/(\d+)/comments", "POST", "create_issue_comment"),
    (_R + r"/issues/comments/(\d+)", "GET", "get_issue_comment"),
    (_R + r"/issues/comments/(\d+)/reactions", "POST", "create_reaction"),
    (_R + r"/commits/([0-9a-f]{40})/comments", "POST", "create_commit_comment"),
]


# --- code scanning: SARIF uploads (POST /repos/{owner}/{repo}/code-scanning/sarifs) ----------------
# As GitHub's OpenAPI describes code-scanning/upload-sarif: commit_sha (40 hex), a full ref, and the
# SARIF log gzip-compressed then base64-encoded; 202 with the receipt. An installation without the
# `security_events: write` permission (``fake.installations[id]["permissions"]``) gets GitHub's 403.


SARIF_MAX_GZIP_BYTES = 10 * 1024 * 1024  # GitHub's limit on the compressed upload


def _upload_sarif(self, owner, name):
    import gzip

    fake, repo = self.fake, self._repo(owner, name)
    permissions = fake.installations.get(repo.installation_id, {}).get("permissions", {})
    if permissions.get("security_events") != "write":
        raise HttpError(403, "Resource not accessible by integration")
    body = _json_body(self)
    if not re.fullmatch(r"[0-9a-f]{40}", str(body.get("commit_sha", ""))):
        raise HttpError(400, "Invalid request: commit_sha must be a 40-character SHA")
    if not re.fullmatch(r"refs/(heads|tags|pull)/.+", str(body.get("ref", ""))):
        raise HttpError(400, "Invalid request: ref must be a full Git reference")
    try:
        compressed = base64.b64decode(body.get("sarif", ""), validate=True)
        if len(compressed) > SARIF_MAX_GZIP_BYTES:
            raise HttpError(413, "Payload Too Large: the compressed SARIF file is over 10 MB")
        log = json.loads(gzip.decompress(compressed))
    except (ValueError, OSError, EOFError):
        raise HttpError(400, "Invalid request: sarif must be gzip-compressed and base64-encoded") from None
    if not isinstance(log, dict) or log.get("version") != "2.1.0" or not isinstance(log.get("runs"), list):
        raise HttpError(400, "Invalid request: not a SARIF 2.1.0 log")
    upload_id = f"{secrets.token_hex(4)}-{secrets.token_hex(2)}-{fake.next_id()}"
    repo.sarif_uploads.append({"id": upload_id, "commit_sha": body["commit_sha"], "ref": body["ref"],
                               "tool_name": body.get("tool_name"), "sarif": log})
    return 202, {"id": upload_id, "url": f"{fake.api}/repos/{repo.full_name}/code-scanning/sarifs/{upload_id}"}


_Handler.upload_sarif = _upload_sarif
ROUTES.append((_R + r"/code-scanning/sarifs", "POST", "upload_sarif"))
