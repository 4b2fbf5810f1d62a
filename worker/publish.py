"""One branch, one commit, one pull request per identity, through the Git database API.

The commit is built from blobs and a tree on top of the base branch's head (no local git, no
token on disk). Before the branch moves, the commit is recorded in ``pull_requests.head_sha``, so
a task that died half-way recognises its own branch when it runs again; a branch whose head is
not Adopter's last commit was pushed to by a person and is never force-pushed (unless that person
asked with ``@adopter recreate``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from github import GithubException, InputGitTreeElement
from github.GitRef import GitRef
from github.Repository import Repository as GhRepository
from sqlalchemy.orm import Session

from app.db.models import PullRequest, PullRequestState


@dataclass(frozen=True)
class Proposal:
    """What to publish: deterministic from the change set."""

    identity: str
    branch: str
    base_branch: str
    base_sha: str  # the scanned commit: the rewrite was verified against it
    title: str
    body: str
    files: dict[str, str]
    code_digest: str
    scan_id: int
    force: bool = False  # ``@adopter recreate``: overwrite a branch a person pushed to

    @property
    def content_digest(self) -> str:
        return digest_files(self.files)


@dataclass(frozen=True)
class Published:
    number: int | None
    url: str | None
    outcome: str  # created, updated, unchanged, or why nothing was pushed


def digest_files(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + files[path].encode() + b"\0")
    return h.hexdigest()


def _branch_ref(repo: GhRepository, branch: str) -> GitRef | None:
    """The branch's ref, fetched (so that ``edit`` targets the ``url`` GitHub answered with)."""
    try:
        ref = repo.get_git_ref(f"heads/{branch}")
        ref.object  # noqa: B018  (completes the lazy object)
        return ref
    except GithubException as exc:
        if exc.status == 404:
            return None
        raise


def _make_commit(repo: GhRepository, proposal: Proposal, base_sha: str) -> str:
    base_commit = repo.get_git_commit(base_sha)
    elements = []
    for path in sorted(proposal.files):
        blob = repo.create_git_blob(proposal.files[path], "utf-8")
        elements.append(InputGitTreeElement(path, "100644", "blob", sha=blob.sha))
    tree = repo.create_git_tree(elements, base_commit.tree)
    message = f"{proposal.title}\n\n{len(proposal.files)} file(s) rewritten by Adopter.\n\nAdopter-Identity: {proposal.identity}\n"
    return repo.create_git_commit(message, tree, [base_commit]).sha


def publish(session: Session, repo: GhRepository, repository_id: int, proposal: Proposal) -> Published:
    """Create or update the branch and pull request of ``proposal.identity``. Idempotent."""
    record = session.query(PullRequest).filter_by(repository_id=repository_id, identity=proposal.identity).one_or_none()
    if record is None:
        record = PullRequest(repository_id=repository_id, identity=proposal.identity, branch=proposal.branch,
                             base_branch=proposal.base_branch, title=proposal.title,
                             state=PullRequestState.pending, person_pushed=False)
        session.add(record)
        session.flush()
    if record.last_scan_id and record.last_scan_id > proposal.scan_id:
        return Published(record.number, record.html_url, f"not published: scan {record.last_scan_id} is newer")

    base_sha = proposal.base_sha
    ref = _branch_ref(repo, proposal.branch)
    branch_sha = ref.object.sha if ref else None
    ours = branch_sha is None or branch_sha == record.head_sha
    if branch_sha is not None and not ours and not proposal.force:
        record.person_pushed = True
        session.commit()
        return Published(record.number, record.html_url,
                         "not published: a person pushed to the branch; it is never force-pushed "
                         "(comment '@adopter recreate' to rebuild it)")

    unchanged = (
        ours and branch_sha is not None and record.base_sha == base_sha
        and record.content_digest == proposal.content_digest
    )
    if not unchanged:
        new_sha = _make_commit(repo, proposal, base_sha)
        # Remember the commit before the branch moves: a rerun then knows the branch as its own.
        record.head_sha, record.base_sha = new_sha, base_sha
        record.content_digest, record.code_digest = proposal.content_digest, proposal.code_digest
        session.commit()
        if ref is None:
            try:
                repo.create_git_ref(f"refs/heads/{proposal.branch}", new_sha)
            except GithubException as exc:
                if exc.status != 422:  # 422: the ref appeared meanwhile; move it below
                    raise
                ref = _branch_ref(repo, proposal.branch)
        if ref is not None:
            ref.edit(new_sha, force=True)

    owner = repo.full_name.split("/")[0]
    existing = list(repo.get_pulls(state="open", head=f"{owner}:{proposal.branch}", base=proposal.base_branch))
    if existing:
        pull = existing[0]
        if pull.title != proposal.title or (pull.body or "") != proposal.body:
            pull.edit(title=proposal.title, body=proposal.body)
        outcome = "unchanged" if unchanged else "updated"
    else:
        pull = repo.create_pull(base=proposal.base_branch, head=proposal.branch, title=proposal.title,
                                body=proposal.body, maintainer_can_modify=True)
        outcome = "created"
    record.number, record.html_url, record.title = pull.number, pull.html_url, proposal.title
    record.state = PullRequestState.open
    record.person_pushed = False
    record.closed_at = None
    record.last_scan_id = proposal.scan_id
    session.commit()
    return Published(record.number, record.html_url, outcome)
