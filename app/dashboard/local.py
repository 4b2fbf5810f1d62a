"""The local dashboard (``adopter dashboard``): the same pages over the local history, no sign-in,
reachable from this machine only.

Two guards: the server binds a loopback address (``serve`` refuses any other host), and every
request must come from a loopback client with a ``Host`` of localhost/127.0.0.1/[::1] (so a web
page elsewhere cannot reach it through DNS rebinding).
"""

from __future__ import annotations

import ipaddress

from fastapi import FastAPI
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.dashboard.config import DashboardConfig

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class LocalOnly:
    """ASGI middleware: answers 403 to any request not from and addressed to this machine."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            client = (scope.get("client") or ("", 0))[0]
            host = ""
            for key, value in scope.get("headers", []):
                if key == b"host":
                    host = value.decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
            if not (is_loopback(client) or client == "testclient") or not is_loopback(name):
                await PlainTextResponse("the local dashboard answers this machine only", 403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_local_app(database_url: str) -> FastAPI:
    from app.dashboard import router

    app = FastAPI(title="Adopter (local history)")
    app.state.dashboard = DashboardConfig(database_url=database_url, local=True)
    app.include_router(router)
    app.add_middleware(LocalOnly)
    return app


def serve(database_url: str, host: str = "127.0.0.1", port: int = 8765) -> None:
    if not is_loopback(host):
        raise ValueError(f"the local dashboard binds to this machine only (127.0.0.1, ::1), not {host!r}")
    import uvicorn

    uvicorn.run(create_local_app(database_url), host=host, port=port, log_level="warning")
