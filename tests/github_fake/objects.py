"""JSON objects shaped as GitHub's OpenAPI description says (``tests/data/github/openapi-fragments.json``).

Every builder fills all of a schema's required fields; ``tests/app/test_github_fake_schema.py``
validates the server's answers against the vendored schemas.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_id(kind: str, number: int | str) -> str:
    return base64.b64encode(f"{kind}:{number}".encode()).decode()


def user(api: str, web: str, login: str, uid: int, kind: str = "User") -> dict:
    return {
        "login": login, "id": uid, "node_id": node_id("User", uid), "type": kind, "site_admin": False,
        "avatar_url": f"{web}/avatars/{login}", "gravatar_id": "", "url": f"{api}/users/{login}",
        "html_url": f"{web}/{login}", "followers_url": f"{api}/users/{login}/followers",
        "following_url": f"{api}/users/{login}/following{{/other_user}}",
        "gists_url": f"{api}/users/{login}/gists{{/gist_id}}",
        "starred_url": f"{api}/users/{login}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{api}/users/{login}/subscriptions",
        "organizations_url": f"{api}/users/{login}/orgs", "repos_url": f"{api}/users/{login}/repos",
        "events_url": f"{api}/users/{login}/events{{/privacy}}",
        "received_events_url": f"{api}/users/{login}/received_events",
    }


def collaborator(api: str, web: str, login: str, uid: int, role: str) -> dict:
    """``collaborator`` (inside ``repository-collaborator-permission``)."""
    levels = ["read", "triage", "write", "maintain", "admin"]
    rank = levels.index(role) if role in levels else -1
    return {**user(api, web, login, uid), "role_name": role, "permissions": {
        "pull": rank >= 0, "triage": rank >= 1, "push": rank >= 2, "maintain": rank >= 3, "admin": rank >= 4}}


REPO_URL_FIELDS = [
    "archive_url", "assignees_url", "blobs_url", "branches_url", "collaborators_url", "comments_url",
    "commits_url", "compare_url", "contents_url", "contributors_url", "deployments_url", "downloads_url",
    "events_url", "forks_url", "git_commits_url", "git_refs_url", "git_tags_url", "hooks_url",
    "issue_comment_url", "issue_events_url", "issues_url", "keys_url", "labels_url", "languages_url",
    "merges_url", "milestones_url", "notifications_url", "pulls_url", "releases_url", "stargazers_url",
    "statuses_url", "subscribers_url", "subscription_url", "tags_url", "teams_url", "trees_url",
]


def repository(api: str, web: str, git_base: str, repo, owner: dict, *, full: bool) -> dict:
    """``full-repository`` (GET /repos/{owner}/{repo}) or ``repository`` (inside pull requests)."""
    full_name = repo.full_name
    data = {name: f"{api}/repos/{full_name}/{name.removesuffix('_url')}" for name in REPO_URL_FIELDS}
    stamp = now_iso()
    data.update({
        "id": repo.id, "node_id": node_id("Repository", repo.id), "name": repo.name, "full_name": full_name,
        "owner": owner, "private": repo.private, "html_url": f"{web}/{full_name}", "description": None,
        "fork": False, "url": f"{api}/repos/{full_name}", "clone_url": f"{git_base}/{full_name}.git",
        "git_url": f"git://fake/{full_name}.git", "ssh_url": f"git@fake:{full_name}.git",
        "svn_url": f"{web}/{full_name}", "mirror_url": None, "homepage": None, "language": "Python",
        "forks": 0, "forks_count": 0, "stargazers_count": 0, "watchers": 0, "watchers_count": 0,
        "size": repo.size_kib, "default_branch": repo.default_branch, "open_issues": 0, "open_issues_count": 0,
        "has_issues": True, "has_projects": False, "has_wiki": False, "has_pages": False,
        "has_downloads": True, "has_discussions": False, "archived": False, "disabled": False,
        "license": None, "pushed_at": stamp, "created_at": stamp, "updated_at": stamp,
    })
    if full:
        data.update({"network_count": 0, "subscribers_count": 0})
    return data


def git_user(name: str, email: str, date: str) -> dict:
    return {"name": name, "email": email, "date": date}


def git_commit(api: str, web: str, full_name: str, info: dict) -> dict:
    sha = info["sha"]
    return {
        "sha": sha, "node_id": node_id("Commit", sha), "url": f"{api}/repos/{full_name}/git/commits/{sha}",
        "html_url": f"{web}/{full_name}/commit/{sha}", "author": info["author"], "committer": info["committer"],
        "message": info["message"],
        "tree": {"sha": info["tree"], "url": f"{api}/repos/{full_name}/git/trees/{info['tree']}"},
        "parents": [{"sha": p, "url": f"{api}/repos/{full_name}/git/commits/{p}",
                     "html_url": f"{web}/{full_name}/commit/{p}"} for p in info["parents"]],
        "verification": {"verified": False, "reason": "unsigned", "payload": None, "signature": None,
                         "verified_at": None},
    }


def git_ref(api: str, full_name: str, ref: str, sha: str) -> dict:
    return {
        "ref": ref, "node_id": node_id("Ref", f"{full_name}:{ref}"), "url": f"{api}/repos/{full_name}/git/{ref}",
        "object": {"type": "commit", "sha": sha, "url": f"{api}/repos/{full_name}/git/commits/{sha}"},
    }


def commit(api: str, web: str, full_name: str, info: dict, author: dict) -> dict:
    """``commit`` (inside a branch): the REST commit wrapping the git commit."""
    sha = info["sha"]
    return {
        "url": f"{api}/repos/{full_name}/commits/{sha}", "sha": sha, "node_id": node_id("Commit", sha),
        "html_url": f"{web}/{full_name}/commit/{sha}", "comments_url": f"{api}/repos/{full_name}/commits/{sha}/comments",
        "commit": {
            "url": f"{api}/repos/{full_name}/git/commits/{sha}", "author": info["author"],
            "committer": info["committer"], "message": info["message"], "comment_count": 0,
            "tree": {"sha": info["tree"], "url": f"{api}/repos/{full_name}/git/trees/{info['tree']}"},
        },
        "author": author, "committer": author,
        "parents": [{"sha": p, "url": f"{api}/repos/{full_name}/commits/{p}"} for p in info["parents"]],
    }


def pull_request(api: str, web: str, repo_obj: dict, pull: dict, *, full: bool) -> dict:
    full_name, number = repo_obj["full_name"], pull["number"]
    base_url = f"{api}/repos/{full_name}/pulls/{number}"

    def side(ref: str, sha: str) -> dict:
        return {"label": f"{repo_obj['owner']['login']}:{ref}", "ref": ref, "sha": sha,
                "user": repo_obj["owner"], "repo": repo_obj}

    data = {
        "url": base_url, "id": pull["id"], "node_id": node_id("PullRequest", pull["id"]),
        "html_url": f"{web}/{full_name}/pull/{number}", "diff_url": f"{web}/{full_name}/pull/{number}.diff",
        "patch_url": f"{web}/{full_name}/pull/{number}.patch", "issue_url": f"{api}/repos/{full_name}/issues/{number}",
        "commits_url": f"{base_url}/commits", "review_comments_url": f"{base_url}/comments",
        "review_comment_url": f"{api}/repos/{full_name}/pulls/comments{{/number}}",
        "comments_url": f"{api}/repos/{full_name}/issues/{number}/comments",
        "statuses_url": f"{api}/repos/{full_name}/statuses/{pull['head_sha']}",
        "number": number, "state": pull["state"], "locked": False, "title": pull["title"], "user": pull["user"],
        "body": pull["body"], "labels": [], "milestone": None, "active_lock_reason": None,
        "created_at": pull["created_at"], "updated_at": pull["updated_at"], "closed_at": pull["closed_at"],
        "merged_at": pull["merged_at"], "merge_commit_sha": None, "assignee": None, "assignees": [],
        "requested_reviewers": [], "requested_teams": [], "draft": False,
        "head": side(pull["head"], pull["head_sha"]), "base": side(pull["base"], pull["base_sha"]),
        "_links": {name: {"href": href} for name, href in {
            "self": base_url, "html": f"{web}/{full_name}/pull/{number}",
            "issue": f"{api}/repos/{full_name}/issues/{number}",
            "comments": f"{api}/repos/{full_name}/issues/{number}/comments",
            "review_comments": f"{base_url}/comments",
            "review_comment": f"{api}/repos/{full_name}/pulls/comments{{/number}}",
            "commits": f"{base_url}/commits", "statuses": f"{api}/repos/{full_name}/statuses/{pull['head_sha']}",
        }.items()},
        "author_association": "NONE", "auto_merge": None,
    }
    if full:
        data.update({
            "merged": pull["merged"], "mergeable": True, "rebaseable": True, "mergeable_state": "clean",
            "merged_by": None, "comments": 0, "review_comments": 0, "maintainer_can_modify": True,
            "commits": 1, "additions": pull.get("additions", 0), "deletions": pull.get("deletions", 0),
            "changed_files": pull.get("changed_files", 0),
        })
    return data


def issue_comment(api: str, web: str, full_name: str, comment: dict) -> dict:
    cid, number = comment["id"], comment["issue_number"]
    return {
        "id": cid, "node_id": node_id("IssueComment", cid), "url": f"{api}/repos/{full_name}/issues/comments/{cid}",
        "html_url": f"{web}/{full_name}/pull/{number}#issuecomment-{cid}", "body": comment["body"],
        "user": comment["user"], "created_at": comment["created_at"], "updated_at": comment["created_at"],
        "issue_url": f"{api}/repos/{full_name}/issues/{number}", "author_association": "NONE",
    }


def reaction(reaction_id: int, content: str, by: dict) -> dict:
    return {"id": reaction_id, "node_id": node_id("Reaction", reaction_id), "user": by, "content": content,
            "created_at": now_iso()}


def commit_comment(api: str, web: str, full_name: str, comment: dict) -> dict:
    cid = comment["id"]
    return {
        "url": f"{api}/repos/{full_name}/comments/{cid}", "html_url": f"{web}/{full_name}/commit/{comment['sha']}#commitcomment-{cid}",
        "id": cid, "node_id": node_id("CommitComment", cid), "user": comment["user"], "position": None,
        "line": None, "path": None, "commit_id": comment["sha"], "body": comment["body"],
        "author_association": "NONE", "created_at": comment["created_at"], "updated_at": comment["created_at"],
    }


def installation(api: str, web: str, installation_id: int, account: str, app_id: int, app_slug: str,
                 account_id: int) -> dict:
    """``installation`` (as ``GET /user/installations`` lists it)."""
    stamp = now_iso()
    return {
        "id": installation_id, "account": user(api, web, account, account_id, "Organization"),
        "repository_selection": "selected", "access_tokens_url": f"{api}/app/installations/{installation_id}/access_tokens",
        "repositories_url": f"{api}/installation/repositories",
        "html_url": f"{web}/organizations/{account}/settings/installations/{installation_id}",
        "app_id": app_id, "app_slug": app_slug, "target_id": account_id, "target_type": "Organization",
        "permissions": {"contents": "write", "pull_requests": "write", "checks": "write", "metadata": "read"},
        "events": ["push", "pull_request", "issue_comment"], "created_at": stamp, "updated_at": stamp,
        "single_file_name": None, "has_multiple_single_files": False, "single_file_paths": [],
        "suspended_by": None, "suspended_at": None,
    }
