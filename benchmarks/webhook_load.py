"""Latency of ``POST /webhooks/github`` under load: p50, p95, p99 of signed deliveries.

Against a running API (it must know the same webhook secret):

    python benchmarks/webhook_load.py --url http://127.0.0.1:8000 --secret "$ADOPTER_WEBHOOK_SECRET"

Or let the script start one (uvicorn, one process) over the given database and broker:

    python benchmarks/webhook_load.py --spawn --database-url postgresql+psycopg://postgres@127.0.0.1/test \\
        --redis-url redis://127.0.0.1:6379/5

Each delivery is a distinct ``push`` to a non-default branch or an ``issue_comment``, so each one is
stored and (for comments) enqueued, which is the work the endpoint does for real traffic. With
``--spawn`` the script migrates the database, uses a fresh broker key prefix, and deletes its
deliveries afterwards. No worker needs to run: the endpoint only enqueues.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.webhooks.signature import sign  # noqa: E402

EXAMPLES = ROOT / "tests" / "data" / "github" / "webhooks"


def payloads() -> list[tuple[str, bytes]]:
    push = json.loads((EXAMPLES / "push.json").read_text())
    push["ref"] = "refs/heads/feature"  # stored and acknowledged as not the default branch
    comment = json.loads((EXAMPLES / "issue_comment.created.json").read_text())
    return [("push", json.dumps(push).encode()), ("issue_comment", json.dumps(comment).encode())]


async def run(url: str, secret: str, total: int, concurrency: int, warmup: int) -> list[float]:
    bodies = payloads()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        counter = iter(range(total + warmup))

        async def one_client() -> None:
            for index in counter:
                event, body = bodies[index % len(bodies)]
                headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": f"load-{uuid.uuid4()}",
                           "X-Hub-Signature-256": sign(secret, body), "Content-Type": "application/json"}
                started = time.perf_counter()
                response = await client.post("/webhooks/github", content=body, headers=headers)
                elapsed = time.perf_counter() - started
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if index >= warmup:
                    latencies.append(elapsed)

        await asyncio.gather(*(one_client() for _ in range(concurrency)))
    bad = {code: n for code, n in statuses.items() if code not in (200, 202)}
    if bad:
        raise SystemExit(f"unexpected answers: {bad}")
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def spawn(database_url: str, redis_url: str, secret: str) -> tuple[subprocess.Popen, str, dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADOPTER_")}
    env.update(ADOPTER_DATABASE_URL=database_url, ADOPTER_REDIS_URL=redis_url, ADOPTER_WEBHOOK_SECRET=secret,
               ADOPTER_REDIS_KEY_PREFIX=f"adopter_load_{secrets.token_hex(4)}:", PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1",
                               "--port", str(port), "--log-level", "warning", "--no-access-log"],
                              cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return server, url, env
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.terminate()
    raise SystemExit("the API did not start")


def cleanup(env: dict) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(env["ADOPTER_DATABASE_URL"])
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM deliveries WHERE id LIKE 'load-%'"))
    engine.dispose()
    import redis

    client = redis.Redis.from_url(env["ADOPTER_REDIS_URL"])
    for key in client.scan_iter(f"{env['ADOPTER_REDIS_KEY_PREFIX']}*"):
        client.delete(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running API")
    parser.add_argument("--secret", default=os.environ.get("ADOPTER_WEBHOOK_SECRET"))
    parser.add_argument("--spawn", action="store_true", help="start an API for the measurement")
    parser.add_argument("--database-url", default=os.environ.get("ADOPTER_DATABASE_URL"))
    parser.add_argument("--redis-url", default=os.environ.get("ADOPTER_REDIS_URL", "redis://127.0.0.1:6379/5"))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args()

    server = env = None
    if args.spawn:
        if not args.database_url:
            raise SystemExit("--spawn needs --database-url (or ADOPTER_DATABASE_URL)")
        args.secret = args.secret or secrets.token_hex(16)
        server, args.url, env = spawn(args.database_url, args.redis_url, args.secret)
    elif not (args.url and args.secret):
        raise SystemExit("give --url and --secret, or --spawn")
    try:
        started = time.perf_counter()
        latencies = asyncio.run(run(args.url, args.secret, args.requests, args.concurrency, args.warmup))
        wall = time.perf_counter() - started
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
            cleanup(env)
    ms = [v * 1000 for v in latencies]
    print(f"{len(ms)} deliveries, concurrency {args.concurrency}, {len(ms) / wall:.0f} req/s")
    print(f"p50 {percentile(ms, 50):.1f} ms  p95 {percentile(ms, 95):.1f} ms  p99 {percentile(ms, 99):.1f} ms  "
          f"max {max(ms):.1f} ms  mean {statistics.mean(ms):.1f} ms")


if __name__ == "__main__":
    main()
