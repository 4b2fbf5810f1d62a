"""No network and no Unix socket: Postgres's socket, Postgres and Redis over TCP are all out of reach
(a network namespace alone does not cover Unix sockets; the mount namespace hides them)."""

from __future__ import annotations

import glob
import socket

import pytest

pytest.importorskip("torch")

from engine.verify import verify  # noqa: E402
from tests.engine.verify.fixtures import sdpa_rewrite  # noqa: E402
from tests.security.hostile import hostile_repo, probes, verify_config  # noqa: E402

pytestmark = pytest.mark.torch

UNIX_SOCKETS = ["/var/run/postgresql/.s.PGSQL.5432", "/run/postgresql/.s.PGSQL.5432", "/var/run/redis/redis.sock",
                "/run/dbus/system_bus_socket", "/var/run/docker.sock"]


def _reachable_here(address) -> bool:
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(address)
            return True
        except OSError:
            return False


def test_postgres_socket_and_local_services_are_unreachable(tmp_path):
    sockets = sorted(set(UNIX_SOCKETS) | set(glob.glob("/var/run/postgresql/.s.PGSQL.*")))
    tcp = [("127.0.0.1", 5432), ("127.0.0.1", 6379)]
    reachable_from_host = [a for a in [*sockets, *tcp] if _reachable_here(a)]
    # CI runs Postgres and Redis on this machine: the attack has something to reach
    assert any(isinstance(a, tuple) for a in reachable_from_host), "no local Postgres/Redis to attack"
    repo = hostile_repo(tmp_path / "repo", f"""
        outcome = {{}}
        for path in {sockets!r}:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                try:
                    s.connect(path)
                    outcome[path] = "connected"
                except OSError as exc:
                    outcome[path] = type(exc).__name__
        for host, port in {tcp!r}:
            try:
                socket.create_connection((host, port), timeout=2).close()
                outcome[f"{{host}}:{{port}}"] = "connected"
            except OSError as exc:
                outcome[f"{{host}}:{{port}}"] = type(exc).__name__
        try:
            socket.getaddrinfo("github.com", 443)
            outcome["dns"] = "resolved"
        except OSError as exc:
            outcome["dns"] = type(exc).__name__
        outcome["interfaces"] = [name for _, name in socket.if_nameindex()]
        return outcome
    """)
    result = verify(repo, sdpa_rewrite(repo), config=verify_config(tmp_path / "verify"))
    assert result.passed, result.message
    assert result.network_isolated is True
    seen = probes(tmp_path / "verify")
    assert len(seen) == 2
    for outcome in seen:
        assert outcome.pop("interfaces") == ["lo"]
        assert "connected" not in outcome.values() and outcome["dns"] != "resolved", outcome
