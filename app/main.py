"""The ASGI application: ``uvicorn app.main:app``.

Settings are read at start-up (the lifespan), so a missing secret stops the server with a message
naming the variable, while importing this module (tests, tools) needs no environment.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.dashboard import router as dashboard_router
from app.observability import router as observability_router
from app.security_headers import SecurityHeaders
from app.settings import Settings, get_settings
from app.webhooks.receiver import router as webhook_router


def create_app(settings: Settings | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if getattr(app.state, "settings", None) is None:
            app.state.settings = get_settings()  # raises SettingsError: start-up fails clearly
        yield

    app = FastAPI(title="Adopter", lifespan=lifespan)
    app.state.settings = settings
    app.include_router(webhook_router)
    app.include_router(observability_router)
    app.include_router(dashboard_router)  # pages, /api/..., /auth/... (app/dashboard)
    app.add_middleware(SecurityHeaders)  # CSP and frame protection on every response
    return app


app = create_app()
