"""The runner's side of the credential split: settings without secrets, refusal to build where a
credential is in reach, and the control worker's checks on what a runner reports."""

from __future__ import annotations

import logging
import math

import pytest
from pydantic import ValidationError

from app.settings import SettingsError, get_runner_settings, get_settings, secrets_in_environment
from worker.build_messages import BuildJob, BuildReport, BuildResult, ChangeJob, ticket

pytestmark = pytest.mark.usefixtures("no_adopter_env")


def test_a_runner_starts_without_any_secret_where_the_control_worker_cannot(monkeypatch):
    monkeypatch.setenv("ADOPTER_ENV", "production")
    monkeypatch.setenv("ADOPTER_REDIS_URL", "redis://broker:6379/0")
    assert get_runner_settings().redis_url == "redis://broker:6379/0"
    assert not hasattr(get_runner_settings(), "github_private_key")
    assert not hasattr(get_runner_settings(), "database_url")
    with pytest.raises(SettingsError, match="ADOPTER_WEBHOOK_SECRET"):
        get_settings()


def test_a_runner_holding_a_credential_refuses_to_build_in_production(monkeypatch, caplog):
    from worker.runner import credentials_refusal

    assert credentials_refusal() is None
    monkeypatch.setenv("ADOPTER_GITHUB_PRIVATE_KEY", "-----BEGIN PRIVATE KEY-----")
    monkeypatch.setenv("ADOPTER_DATABASE_URL", "postgresql://adopter:pw@db/adopter")
    assert secrets_in_environment({"ADOPTER_WEBHOOK_SECRET": ""}) == []
    with caplog.at_level(logging.WARNING):
        assert credentials_refusal() is None  # development: runs, but says so loudly
    assert "DEVELOPMENT ONLY" in caplog.text and "ADOPTER_GITHUB_PRIVATE_KEY" in caplog.text
    monkeypatch.setenv("ADOPTER_ENV", "production")
    get_runner_settings.cache_clear()
    refusal = credentials_refusal()
    assert refusal and "ADOPTER_GITHUB_PRIVATE_KEY" in refusal and "ADOPTER_DATABASE_URL" in refusal


@pytest.mark.parametrize("bad", [
    {"speedup": math.nan}, {"before_s": -1.0}, {"max_abs_error": math.inf},
    {"versions": {"torch": "x" * 201}}, {"versions": {f"p{i}": "1" for i in range(51)}},
    {"device": "x" * 201}, {"unexpected": 1},
])
def test_a_runners_figures_are_checked_before_they_are_stored(bad):
    with pytest.raises(ValidationError):
        BuildResult.model_validate({"change_set_id": 1, "verified": True, **bad})
    assert BuildResult.model_validate({"change_set_id": 1, "verified": True, "speedup": 1.2}).speedup == 1.2


def test_a_report_without_the_jobs_ticket_is_dropped_untouched(monkeypatch):
    from worker.pipeline import record_results_stage

    monkeypatch.setenv("ADOPTER_WEBHOOK_SECRET", "control-only")
    job = BuildJob(scan_id=7, clone_url="https://x/y.git", token="t", ref="main", sha="a" * 40,
                   changes=[ChangeJob(id=3, files={"m.py": "x"})])
    genuine = ticket("control-only", 7, job.key)
    assert genuine != ticket("control-only", 8, job.key) and genuine != ticket("other", 7, job.key)
    forged = BuildReport(scan_id=7, key=job.key, ticket="0" * 64,
                         results=[BuildResult(change_set_id=3, verified=True, speedup=99.0)])
    # Dropped before the database is touched (there is none here: a session would be needed).
    assert record_results_stage(None, forged) is False
    with pytest.raises(AttributeError):  # the genuine ticket gets as far as the session
        record_results_stage(None, forged.model_copy(update={"ticket": genuine}))
