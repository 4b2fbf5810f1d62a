from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.webhooks.events import ignore_reason
from worker.events import parse_command

WEBHOOKS = Path(__file__).resolve().parents[1] / "data" / "github" / "webhooks"


def example(name: str) -> dict:
    return json.loads((WEBHOOKS / f"{name}.json").read_text())


@pytest.mark.parametrize("event, name", [
    ("installation", "installation.created"), ("installation", "installation.deleted"),
    ("installation", "installation.suspend"), ("installation", "installation.unsuspend"),
    ("installation", "installation.new_permissions_accepted"),
    ("installation_repositories", "installation_repositories.added"),
    ("installation_repositories", "installation_repositories.removed"),
    ("push", "push"), ("pull_request", "pull_request.closed"), ("pull_request", "pull_request.reopened"),
    ("pull_request", "pull_request.synchronize"), ("issue_comment", "issue_comment.created"),
])
def test_handled_examples_go_to_a_worker(event, name):
    assert ignore_reason(event, example(name)) is None


def test_ignored_deliveries_say_why():
    assert ignore_reason("ping", example("ping")) == "ping"
    assert "not handled" in ignore_reason("star", example("star.created"))
    assert "deletion" in ignore_reason("push", example("push.deleted"))
    tag = dict(example("push"), ref="refs/tags/v1")
    assert "not to the default branch" in ignore_reason("push", tag)
    opened = dict(example("pull_request.closed"), action="opened")
    assert "'opened'" in ignore_reason("pull_request", opened)


def test_commands_are_found_at_the_start_of_a_line_only():
    assert parse_command("@adopter rescan", "@adopter") == "rescan"
    assert parse_command("Thanks!\n\n  @Adopter Recreate please", "@adopter") == "recreate"
    assert parse_command("@adopter ignore", "@adopter") == "ignore"
    assert parse_command("please ask @adopter rescan", "@adopter") is None
    assert parse_command("@adopterbot rescan", "@adopter") is None
    assert parse_command("", "@adopter") is None
