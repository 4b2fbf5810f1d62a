"""The service's settings: environment variables prefixed ``ADOPTER_``.

Two classes, because two kinds of process read them:

- ``RunnerSettings``: what a *runner* needs, the process that clones a repository with a
  short-lived read-only token and builds its code (verify, bench). It names no secret: a runner
  never holds the App's private key, the database URL (with its password) or the webhook secret.
  The runner reads only this class (``get_runner_settings``), so a runner started without those
  variables works, and ``secrets_in_environment`` tells when one was started with them.
- ``Settings`` (``get_settings``): the API and the control worker (webhooks, database, minting
  tokens, publishing): the runner's fields plus the secrets.

Outside development a missing secret stops start-up with a message naming the variable; in
development the App's private key may be absent (webhooks are still verified with the secret,
which is required everywhere: an unverified webhook endpoint is never acceptable).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SettingsError(RuntimeError):
    """Raised when the environment cannot make a working service; the message says what to set."""


# Variables that hold a credential a runner must never see (each names a secret or carries one:
# the database URL holds its password). Checked by ``secrets_in_environment``.
SECRET_VARIABLES = (
    "ADOPTER_GITHUB_PRIVATE_KEY",
    "ADOPTER_GITHUB_PRIVATE_KEY_PATH",
    "ADOPTER_WEBHOOK_SECRET",
    "ADOPTER_DATABASE_URL",
    "ADOPTER_GITHUB_CLIENT_SECRET",
    "ADOPTER_SESSION_SECRET",
)


def secrets_in_environment(environ: Mapping[str, str]) -> list[str]:
    """The names of ``SECRET_VARIABLES`` set (non-empty) in ``environ``."""
    return [name for name in SECRET_VARIABLES if environ.get(name)]


class RunnerSettings(BaseSettings):
    """What a runner (clone with a read-only token, verify, bench) needs; no secrets."""

    model_config = SettingsConfigDict(env_prefix="ADOPTER_", extra="ignore")

    env: Literal["development", "production"] = "development"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Every Redis key the broker uses starts with this (isolates deployments sharing one Redis).
    redis_key_prefix: str = ""

    # Where workers clone repositories; each scan gets its own folder, removed when the scan ends.
    work_dir: Path = Path(".adopter/work")
    clone_timeout_s: int = 300
    max_checkout_bytes: int = 1024 * 1024 * 1024  # checked on disk after cloning
    max_files: int = 50_000

    # Queue for verify+bench: "gpu" when GPU workers consume it, otherwise "cpu".
    bench_queue: Literal["gpu", "cpu"] = "cpu"
    # Device this worker benchmarks on: "cuda" on GPU workers (the ``gpu`` queue's consumers).
    bench_device: Literal["cpu", "cuda"] = "cpu"
    # Seconds of interleaved benchmark rounds per change set before the speedup's interval is reported
    # as wide as it is (rounds stop earlier once it is within +/- 5%).
    bench_budget_s: float = Field(default=180.0, gt=0)
    # Seconds before an unacknowledged task (its worker died) is handed to another worker.
    # Must be longer than the longest task time limit.
    broker_visibility_timeout: int = 3600
    task_soft_time_limit: int = 1500
    task_time_limit: int = 1800
    task_max_retries: int = 5

    # Entry points of the engine stages, "module:function". The defaults are the engine's own; the
    # end-to-end tests wrap the scan (tests/worker/engine_hooks.py) to pause it mid-scan.
    engine_scan: str = "engine.scan:scan_path"
    engine_verify: str = "engine.verify:verify"
    engine_bench: str = "engine.bench:bench"
    engine_report: str = "engine.report:render_pr_body"

    @model_validator(mode="after")
    def _limits_consistent(self) -> RunnerSettings:
        if self.task_soft_time_limit >= self.task_time_limit:
            raise ValueError("ADOPTER_TASK_SOFT_TIME_LIMIT must be below ADOPTER_TASK_TIME_LIMIT")
        return self


class Settings(RunnerSettings):
    """The API's and the control worker's settings: the runner's plus database and credentials."""

    database_url: str = "sqlite:///.adopter/adopter.db"
    github_api_url: str = "https://api.github.com"
    github_app_id: str | None = None
    github_private_key: str | None = None
    github_private_key_path: Path | None = None
    webhook_secret: str | None = None

    # Webhook bodies above this are answered 413 while streaming, before they are buffered
    # (GitHub caps payloads at 25 MB).
    webhook_max_body_bytes: int = Field(default=25 * 1024 * 1024, gt=0)
    # The word that starts a command in a pull request comment.
    bot_mention: str = "@adopter"
    # Where this App's dashboard is published (https://adopter.example.com): pull requests link to
    # their scan's page there. None: the dashboard is not public, and pull requests do not link to it.
    # (Links to the documentation follow ADOPTER_DOCS_URL, read by engine.report.links.)
    dashboard_url: str | None = None
    max_repo_kib: int = 500 * 1024  # checked against the API's size before cloning

    @model_validator(mode="after")
    def _secrets_present(self) -> Settings:
        missing = []
        if not self.webhook_secret:
            missing.append("ADOPTER_WEBHOOK_SECRET")
        if self.env != "development":
            if not self.github_app_id:
                missing.append("ADOPTER_GITHUB_APP_ID")
            if not (self.github_private_key or self.github_private_key_path):
                missing.append("ADOPTER_GITHUB_PRIVATE_KEY or ADOPTER_GITHUB_PRIVATE_KEY_PATH")
        if missing:
            raise ValueError(f"Adopter ({self.env}) cannot start: set {', '.join(missing)}")
        if self.github_private_key_path and not self.github_private_key_path.is_file():
            raise ValueError(f"ADOPTER_GITHUB_PRIVATE_KEY_PATH: no file at {self.github_private_key_path}")
        return self

    def private_key(self) -> str | None:
        """The App's PEM key, from the variable or the file."""
        if self.github_private_key:
            return self.github_private_key
        if self.github_private_key_path:
            return self.github_private_key_path.read_text()
        return None


def _read(cls: type[RunnerSettings]) -> RunnerSettings:
    try:
        return cls()
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        messages = []
        for error in getattr(exc, "errors", lambda: [])():
            where = ".".join(str(p) for p in error.get("loc", ()))
            msg = error.get("msg", "").removeprefix("Value error, ")
            messages.append(f"ADOPTER_{where.upper()}: {msg}" if where else msg)
        raise SettingsError("; ".join(messages) or str(exc)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The API's and control worker's settings, read once. Raises SettingsError with a readable message."""
    return _read(Settings)


@lru_cache(maxsize=1)
def get_runner_settings() -> RunnerSettings:
    """A runner's settings (no secrets), read once. Raises SettingsError with a readable message."""
    return _read(RunnerSettings)
