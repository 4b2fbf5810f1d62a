"""The whole service for end-to-end tests: the API (uvicorn), the control worker (``-Q adopter``) and
a runner (``-Q cpu``) as real processes, real Postgres and Redis, and GitHub played by
``tests.github_fake`` over real HTTP.

The runner is started as production starts it: without the App key, the database URL and the
webhook secret in its environment (``RUNNER_WITHHELD``), and its verify stage is wrapped by
``tests.worker.engine_hooks.verify``, which records what the runner process can see of itself.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WEBHOOKS = ROOT / "tests" / "data" / "github" / "webhooks"
MINIMODEL = Path(__file__).resolve().parent / "data" / "minimodel"
INSTALLATION_ID = 7_700_001
APP_ID = 4242
REPO = "acme/minimodel"
E2E_CONFIG = """\
# Any measured gain earns a pull request. The bench shape makes every rewrite's peak-memory gain
# clear (the attention matrices, 32 MiB each, dominate memory; the GELU rewrite drops intermediates of
# 2 MiB each), so whether a pull request opens does not hang on step times, which a busy machine makes
# noisy: the decision reads the lower bound of their interval.
min_gain: 0
harness:
  build: harness.py:build
  shapes: [{batch_size: 2, seq_len: 8}]
  bench: {batch_size: 2, seq_len: 1024}
"""
HARNESS = """\
import torch

from model import Block


def build(batch_size=2, seq_len=8, dropout=0.0):
    torch.manual_seed(0)
    return Block(dim=64, heads=4), (torch.randn(batch_size, seq_len, 64),)
"""


def example(name: str) -> dict:
    return json.loads((WEBHOOKS / f"{name}.json").read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, *, timeout: float = 90, what: str = "condition", interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class ServiceProcess:
    """A child process in its own process group (so a test can kill it, children included)."""

    def __init__(self, name: str, argv: list[str], env: dict, log: Path):
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.process: subprocess.Popen | None = None

    def start(self) -> ServiceProcess:
        handle = self.log.open("ab")
        self.process = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        handle.close()
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""


@dataclass
class Stack:
    env: dict
    fake: object
    api_url: str
    db: object  # sqlalchemy Engine on the test database
    api: ServiceProcess
    worker: ServiceProcess
    runner: ServiceProcess
    runner_env: dict
    pause_dir: Path
    secret: str
    private_key: str
    repo: object = None
    sent: list = field(default_factory=list)

    # --- webhooks ----------------------------------------------------------------------------

    def send(self, event: str, payload: dict | None = None, *, delivery: str | None = None,
             body: bytes | None = None, secret: str | None = None, headers: dict | None = None):
        import httpx

        from app.webhooks.signature import sign

        raw = body if body is not None else json.dumps(payload).encode()
        delivery = delivery or str(uuid.uuid4())
        all_headers = {
            "Content-Type": "application/json", "X-GitHub-Event": event, "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": sign(secret or self.secret, raw), "User-Agent": "GitHub-Hookshot/test",
        }
        all_headers.update(headers or {})
        response = httpx.post(f"{self.api_url}/webhooks/github", content=raw, headers=all_headers, timeout=30)
        self.sent.append((delivery, response.status_code))
        return response

    def repository_payload(self) -> dict:
        owner, name = REPO.split("/")
        repository = copy.deepcopy(example("push")["repository"])
        repository.update(id=self.repo.id, name=name, full_name=REPO, default_branch="main", private=False)
        repository["owner"].update(login=owner, name=owner)
        return repository

    def installation_created(self) -> dict:
        payload = example("installation.created")
        payload["installation"]["id"] = INSTALLATION_ID
        payload["installation"]["app_id"] = APP_ID
        payload["installation"]["account"]["login"] = REPO.split("/")[0]
        payload["repositories"] = [{"id": self.repo.id, "node_id": "R_1", "name": REPO.split("/")[1],
                                    "full_name": REPO, "private": False}]
        return payload

    def push(self, before: str, after: str) -> dict:
        payload = example("push")
        payload.update(ref="refs/heads/main", before=before, after=after, deleted=False, created=False)
        payload["repository"] = self.repository_payload()
        payload["installation"] = {"id": INSTALLATION_ID, "node_id": "I_1"}
        payload["head_commit"]["id"] = after
        payload["commits"] = [dict(payload["commits"][0], id=after)] if payload["commits"] else []
        return payload

    def pull_request_event(self, action: str, number: int, *, merged: bool = False, head_sha: str | None = None):
        payload = example(f"pull_request.{action}")
        payload["number"] = number
        payload["pull_request"].update(number=number, merged=merged, state="closed" if action == "closed" else "open")
        if head_sha:
            payload["pull_request"]["head"]["sha"] = head_sha
        payload["repository"] = self.repository_payload()
        payload["installation"] = {"id": INSTALLATION_ID, "node_id": "I_1"}
        return payload

    # --- database ----------------------------------------------------------------------------

    def query(self, sql: str, **params):
        from sqlalchemy import text

        with self.db.connect() as connection:
            return connection.execute(text(sql), params).mappings().all()

    def scan_done(self, scan_id: int, timeout: float = 240) -> dict:
        terminal = ("done", "failed", "skipped")

        def finished():
            rows = self.query("SELECT * FROM scans WHERE id = :id", id=scan_id)
            return rows[0] if rows and rows[0]["state"] in terminal else None

        try:
            return wait_until(finished, timeout=timeout, what=f"scan {scan_id} to finish")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- worker log ---\n{self.worker.tail()}\n"
                                 f"--- runner log ---\n{self.runner.tail()}") from None

    def scans_of_delivery(self, delivery: str, timeout: float = 60) -> list[int]:
        return wait_until(
            lambda: [r["id"] for r in self.query("SELECT id FROM scans WHERE delivery_id = :d ORDER BY id",
                                                  d=delivery)],
            timeout=timeout, what=f"a scan for delivery {delivery}")

    def delivery(self, delivery: str) -> dict | None:
        rows = self.query("SELECT * FROM deliveries WHERE id = :d", d=delivery)
        return rows[0] if rows else None

    def delivery_processed(self, delivery: str, timeout: float = 60) -> dict:
        return wait_until(lambda: (d := self.delivery(delivery)) and d["status"] in ("processed", "failed") and d,
                          timeout=timeout, what=f"delivery {delivery} to be processed")

    def restart_worker(self) -> None:
        self.worker.kill()
        self.worker = start_worker(self.env, self.worker.log)


# What a runner's environment never holds (docs/deploy.md): the App key, the database URL (its
# password), the webhook secret, and the App id (useless without the key).
RUNNER_WITHHELD = ("ADOPTER_GITHUB_PRIVATE_KEY", "ADOPTER_GITHUB_PRIVATE_KEY_PATH", "ADOPTER_DATABASE_URL",
                   "ADOPTER_WEBHOOK_SECRET", "ADOPTER_GITHUB_APP_ID")


def start_worker(env: dict, log: Path, queues: str = "adopter") -> ServiceProcess:
    name = f"e2e-{queues.replace(',', '-')}-{secrets.token_hex(3)}@%h"
    worker = ServiceProcess("worker", [
        sys.executable, "-m", "celery", "-A", "worker.celery_app:celery_app", "worker", "-Q", queues,
        "-c", "1", "-P", "prefork", "--without-mingle", "--without-gossip", "--without-heartbeat",
        "-l", "INFO", "-n", name,
    ], env, log)
    start = log.stat().st_size if log.exists() else 0
    worker.start()

    def ready():
        if worker.process.poll() is not None:
            raise AssertionError(f"worker exited:\n{worker.tail()}")
        return "ready." in log.read_text(errors="replace")[start:]

    wait_until(ready, timeout=60, what="the Celery worker to be ready")
    return worker


@pytest.fixture(scope="session")
def stack(pg_url, redis_target, tmp_path_factory):
    """The running service, installed on nothing yet; ``stack.repo`` is the fake repository."""
    import httpx
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    from tests.github_fake.keys import app_key_pair
    from tests.github_fake.server import FakeGitHub

    base = tmp_path_factory.mktemp("e2e")
    private_key, public_key = app_key_pair()
    fake = FakeGitHub(base / "github", app_id=APP_ID, public_key=public_key).start()
    fake.add_installation(INSTALLATION_ID, REPO.split("/")[0])
    files = {p.name: p.read_text() for p in MINIMODEL.iterdir() if p.is_file()}
    files.update({".adopter.yml": E2E_CONFIG, "harness.py": HARNESS})
    repo = fake.add_repo(INSTALLATION_ID, REPO, files)

    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["database_url"] = pg_url
    command.upgrade(config, "head")

    redis_url, prefix = redis_target
    secret = secrets.token_hex(16)
    pause_dir = base / "pause"
    pause_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADOPTER_")}
    env.update({
        "ADOPTER_ENV": "development",
        "ADOPTER_DATABASE_URL": pg_url,
        "ADOPTER_REDIS_URL": redis_url,
        "ADOPTER_REDIS_KEY_PREFIX": prefix,
        "ADOPTER_GITHUB_API_URL": fake.api,
        "ADOPTER_GITHUB_APP_ID": str(APP_ID),
        "ADOPTER_GITHUB_PRIVATE_KEY": private_key,
        "ADOPTER_WEBHOOK_SECRET": secret,
        "ADOPTER_WEBHOOK_MAX_BODY_BYTES": str(1024 * 1024),
        "ADOPTER_WORK_DIR": str(base / "work"),
        "ADOPTER_BROKER_VISIBILITY_TIMEOUT": "4",
        "ADOPTER_TASK_MAX_RETRIES": "3",
        "ADOPTER_BENCH_BUDGET_S": "15",  # the rounds' budget: enough for an interval, short for a test
        "ADOPTER_ENGINE_SCAN": "tests.worker.engine_hooks:scan_path",
        "ADOPTER_ENGINE_VERIFY": "tests.worker.engine_hooks:verify",
        "ADOPTER_TEST_PAUSE_DIR": str(pause_dir),
        "PYTHONPATH": str(ROOT),
    })
    port = free_port()
    api = ServiceProcess("api", [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "warning"], env, base / "api.log").start()
    api_url = f"http://127.0.0.1:{port}"

    def api_up():
        if api.process.poll() is not None:
            raise AssertionError(f"API exited:\n{api.tail()}")
        try:
            return httpx.get(f"{api_url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(api_up, timeout=60, what="the API to answer /healthz")
    worker = start_worker(env, base / "worker.log")
    runner_env = {k: v for k, v in env.items() if k not in RUNNER_WITHHELD}
    runner = start_worker(runner_env, base / "runner.log", queues="cpu")
    db = create_engine(pg_url)
    the_stack = Stack(env=env, fake=fake, api_url=api_url, db=db, api=api, worker=worker, runner=runner,
                      runner_env=runner_env, pause_dir=pause_dir, secret=secret, private_key=private_key, repo=repo)
    try:
        yield the_stack
    finally:
        the_stack.runner.stop()
        the_stack.worker.stop()
        api.stop()
        db.dispose()
        fake.stop()
        shutil.rmtree(base / "work", ignore_errors=True)
