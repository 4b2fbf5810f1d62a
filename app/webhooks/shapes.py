"""The shape a handled delivery must have: the fields ``worker.events`` reads, with their types.

GitHub's payloads carry far more; only what the handlers use is required (extra fields pass). A
signed delivery that lacks one (or has it with the wrong type) is answered 422 and stored as
``rejected`` with the reason, instead of failing later in a worker, or as a 500 here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

GitHubId = int  # checked positive below


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class Ref(_Open):
    id: GitHubId = Field(gt=0, lt=2**63)


class Installation(Ref):
    account: dict | None = None
    permissions: dict | None = None


class RepositoryRef(Ref):
    full_name: str = Field(min_length=3, max_length=255, pattern=r"^[^/\s]+/[^/\s]+$")
    private: bool | None = None
    default_branch: str | None = None


class InstallationEvent(_Open):
    installation: Installation
    repositories: list[RepositoryRef] | None = None


class InstallationRepositoriesEvent(_Open):
    installation: Installation
    repositories_added: list[RepositoryRef] = Field(default_factory=list)
    repositories_removed: list[Ref] = Field(default_factory=list)


class PushEvent(_Open):
    ref: str
    after: str = Field(pattern=r"^[0-9a-f]{40}$")
    repository: RepositoryRef
    installation: Ref


class Head(_Open):
    sha: str


class PullRequest(_Open):
    number: int = Field(gt=0)
    merged: bool | None = None
    head: Head


class PullRequestEvent(_Open):
    pull_request: PullRequest
    repository: RepositoryRef
    installation: Ref


class Author(_Open):
    login: str = Field(min_length=1, max_length=100)
    type: str


class Comment(_Open):
    id: GitHubId = Field(gt=0, lt=2**63)
    body: str | None = None
    user: Author


class Issue(_Open):
    number: int = Field(gt=0)
    pull_request: dict | None = None


class IssueCommentEvent(_Open):
    comment: Comment
    issue: Issue
    repository: RepositoryRef
    installation: Ref


SHAPES: dict[str, type[BaseModel]] = {
    "installation": InstallationEvent,
    "installation_repositories": InstallationRepositoriesEvent,
    "push": PushEvent,
    "pull_request": PullRequestEvent,
    "issue_comment": IssueCommentEvent,
}


def shape_error(event: str, payload: dict) -> str | None:
    """Why ``payload`` cannot be handled as ``event`` (one line), or None when it fits."""
    shape = SHAPES.get(event)
    if shape is None:
        return None
    try:
        shape.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "payload"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return f"{event} payload: {where}: {first['msg']}{more}"
    return None
