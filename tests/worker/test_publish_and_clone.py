"""Publishing and cloning against the fake GitHub (real HTTP, real git), with a SQLite database."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from tests.github_fake.keys import app_key_pair
from tests.github_fake.server import FakeGitHub

REPO = "acme/models"


@contextmanager
def fake_github(tmp_path, monkeypatch, url: str, *, scans: tuple[int, ...] = (1, 2, 3, 4)):
    """The fake GitHub with installation 3 holding REPO, and the database at ``url`` migrated and
    seeded with them (and scans ``scans`` in publishing); yields (fake, repo)."""
    from alembic import command
    from alembic.config import Config

    from app.db.session import get_engine, get_sessionmaker
    from app.settings import get_settings
    from worker import github_client

    private, public = app_key_pair()
    fake = FakeGitHub(tmp_path / "gh", app_id=11, public_key=public).start()
    fake.add_installation(3, "acme")
    repo = fake.add_repo(3, REPO, {"model.py": "x = 1\n", "link": "placeholder\n"})
    for key, value in {"ADOPTER_WEBHOOK_SECRET": "s", "ADOPTER_GITHUB_APP_ID": "11",
                       "ADOPTER_GITHUB_PRIVATE_KEY": private, "ADOPTER_GITHUB_API_URL": fake.api,
                       "ADOPTER_DATABASE_URL": url, "ADOPTER_WORK_DIR": str(tmp_path / "work")}.items():
        monkeypatch.setenv(key, value)
    for cache in (get_settings, get_engine, get_sessionmaker):
        cache.cache_clear()
    github_client.forget_clients()
    config = Config("alembic.ini")
    config.attributes["database_url"] = url
    command.upgrade(config, "head")
    from app.db.models import Installation, Repository, Scan
    from app.db.session import session_scope

    try:
        with session_scope() as session:
            session.add(Installation(id=3, account_login="acme", permissions={}))
            session.flush()
            session.add(Repository(id=repo.id, installation_id=3, full_name=REPO, default_branch="main"))
            session.flush()
            for scan_id in scans:
                session.add(Scan(id=scan_id, repository_id=repo.id, trigger="test", state="publishing"))
        yield fake, repo
    finally:
        fake.stop()
        github_client.forget_clients()
        get_engine().dispose()
        for cache in (get_settings, get_engine, get_sessionmaker):
            cache.cache_clear()
        if not url.startswith("sqlite"):  # a shared server database: leave it empty for the next test
            command.downgrade(config, "base")


@pytest.fixture
def github(tmp_path, monkeypatch):
    with fake_github(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'db.sqlite'}") as pair:
        yield pair


def proposal(fake, scan_id: int, text: str, *, force: bool = False):
    from worker.publish import Proposal

    base = fake.ref_sha(fake.repos[REPO], "refs/heads/main")
    return Proposal(identity="adopter/gelu", branch="adopter/gelu", base_branch="main", base_sha=base,
                    title="Adopter: use optimized kernels (gelu)", body=f"body {scan_id}",
                    files={"model.py": text}, code_digest="c", scan_id=scan_id, force=force)


def publish(fake, p):
    from app.db.models import Repository
    from app.db.session import session_scope
    from worker import github_client
    from worker.publish import publish as do_publish

    with session_scope() as session:
        repository = session.get(Repository, fake.repos[REPO].id)
        return do_publish(session, github_client.client_for(3).get_repo(REPO), repository.id, p)


def commits_on(fake, branch: str) -> list[str]:
    from tests.github_fake.server import git

    return git(fake.repos[REPO].path, "rev-list", f"main..refs/heads/{branch}").split()


def test_publishing_twice_makes_one_commit_and_one_pull_request(github):
    fake, _ = github
    first = publish(fake, proposal(fake, 1, "x = 2\n"))
    assert first.outcome == "created" and first.number == 1
    head = fake.ref_sha(fake.repos[REPO], "refs/heads/adopter/gelu")
    again = publish(fake, proposal(fake, 1, "x = 2\n"))
    assert again.outcome == "unchanged" and again.number == 1
    assert fake.ref_sha(fake.repos[REPO], "refs/heads/adopter/gelu") == head
    assert len(fake.repos[REPO].pulls) == 1 and len(commits_on(fake, "adopter/gelu")) == 1
    assert fake.file_at(REPO, "adopter/gelu", "model.py") == "x = 2"


def test_a_new_base_regenerates_the_branch_and_updates_the_pull_request(github):
    fake, _ = github
    publish(fake, proposal(fake, 1, "x = 2\n"))
    fake.commit_files(REPO, {"README.md": "hello\n"}, "Docs")
    result = publish(fake, proposal(fake, 2, "x = 2\n"))
    assert result.outcome == "updated" and len(fake.repos[REPO].pulls) == 1
    assert len(commits_on(fake, "adopter/gelu")) == 1  # one commit, on the new base
    assert fake.repos[REPO].pulls[0]["body"] == "body 2"


def test_a_branch_a_person_pushed_to_is_never_force_pushed_unless_recreated(github):
    fake, _ = github
    publish(fake, proposal(fake, 1, "x = 2\n"))
    person = fake.commit_files(REPO, {"model.py": "x = 3  # tuned by hand\n"}, "Tweak", branch="adopter/gelu")
    result = publish(fake, proposal(fake, 2, "x = 2\n"))
    assert result.outcome.startswith("not published: a person pushed")
    assert fake.ref_sha(fake.repos[REPO], "refs/heads/adopter/gelu") == person
    recreated = publish(fake, proposal(fake, 3, "x = 2\n", force=True))
    assert recreated.outcome == "updated"
    assert fake.file_at(REPO, "adopter/gelu", "model.py") == "x = 2"


def test_an_older_scan_never_overwrites_a_newer_one(github):
    fake, _ = github
    publish(fake, proposal(fake, 3, "x = 3\n"))
    stale = publish(fake, proposal(fake, 2, "x = 2\n"))
    assert stale.outcome.startswith("not published: scan 3 is newer")
    assert fake.file_at(REPO, "adopter/gelu", "model.py") == "x = 3"


def test_clone_is_shallow_and_leaves_no_token_and_no_symlinks(github, tmp_path):
    from tests.github_fake.server import git
    from worker import github_client
    from worker.clone import CloneError, shallow_clone

    fake, repo = github
    # A symbolic link in the repository pointing outside of it.
    blob = git(repo.path, "hash-object", "-w", "--stdin", input=b"/etc/passwd")
    base_tree = fake.commit_info(repo, fake.ref_sha(repo, "refs/heads/main"))["tree"]
    tree = fake.write_tree(repo, base_tree, [{"path": "link", "mode": "120000", "type": "blob", "sha": blob}])
    sha = fake.write_commit(repo, "link", tree, [fake.ref_sha(repo, "refs/heads/main")])
    git(repo.path, "update-ref", "refs/heads/main", sha)
    fake.commit_files(REPO, {"later.py": "y = 1\n"}, "Later")  # the clone asks for `sha`, not the tip

    token = github_client.installation_token(3)
    checkout = shallow_clone(f"{fake.git_base}/{REPO}.git", tmp_path / "co", token=token, ref="main", sha=sha,
                             timeout=60)
    assert checkout.sha == sha
    assert git(checkout.path, "rev-list", "--count", "HEAD") == "1"  # depth 1
    assert not (checkout.path / "later.py").exists()
    link = checkout.path / "link"
    assert not link.is_symlink() and link.read_text() == "/etc/passwd"
    assert token not in (checkout.path / ".git" / "config").read_text()
    for path in (checkout.path / ".git").rglob("*"):
        if path.is_file() and path.stat().st_size < 1_000_000:
            assert token.encode() not in path.read_bytes(), path
    again = shallow_clone(f"{fake.git_base}/{REPO}.git", tmp_path / "co", token=token, ref="main", sha=sha,
                          timeout=60)
    assert again == checkout  # reused, not cloned twice
    with pytest.raises(CloneError) as refused:
        shallow_clone(f"{fake.git_base}/{REPO}.git", tmp_path / "co2", token="ghs_wrong", ref="main", sha=None,
                      timeout=60)
    assert not refused.value.transient
