"""A scan whose pool process keeps dying (what repository code that gets its process killed, or the
OOM killer, does) is retried a bounded number of times and then fails with that reason, instead of
being redelivered for ever. Runs on the end-to-end stack (real API, Celery worker, Redis, Postgres)."""

from __future__ import annotations

import os
import signal

import pytest

from tests.worker.conftest import wait_until

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def installed(stack):
    response = stack.send("installation", stack.installation_created())
    assert response.status_code == 202, response.text
    for scan_id in stack.scans_of_delivery(response.json()["delivery"]):
        stack.scan_done(scan_id)


def test_a_pool_process_killed_again_and_again_fails_the_scan_after_the_retry_limit(stack, installed):
    from worker.tasks import MAX_LOST_ATTEMPTS

    repo = stack.fake.repos["acme/minimodel"]
    old = stack.fake.ref_sha(repo, "refs/heads/main")
    model = stack.fake.file_at("acme/minimodel", "refs/heads/main", "model.py") + "\n# killer\n"
    new = stack.fake.commit_files("acme/minimodel", {"model.py": model}, "A model that gets its worker killed")
    started = stack.pause_dir / "started"
    (stack.pause_dir / "arm").write_text("")
    try:
        response = stack.send("push", stack.push(old, new))
        [scan_id] = stack.scans_of_delivery(response.json()["delivery"])
        killed = []
        for _ in range(MAX_LOST_ATTEMPTS + 1):
            try:
                wait_until(lambda: started.exists() and started.read_text().strip(), what="the scan to (re)start",
                           timeout=120)
            except AssertionError as exc:
                raise AssertionError(f"{exc} after {len(killed)} kills\n{stack.worker.tail(80)}") from None
            pid = int(started.read_text())
            started.unlink()
            os.kill(pid, signal.SIGKILL)  # the pool process only: the worker's main process lives on
            killed.append(pid)
        scan = stack.scan_done(scan_id, timeout=120)
    finally:
        (stack.pause_dir / "arm").unlink()
    assert len(set(killed)) == MAX_LOST_ATTEMPTS + 1  # each redelivery ran in a fresh pool process
    assert scan["state"] == "failed"
    assert f"died {MAX_LOST_ATTEMPTS + 1} times" in scan["reason"] and scan["reason"].startswith("scan:")
    assert not started.exists()  # the last delivery failed the scan without running it again
    assert stack.worker.process.poll() is None  # the worker itself survived all of it
