"""The dashboard: HTML pages and the JSON API over the scan history, with GitHub sign-in.

``router`` holds every route (pages, ``/api/...``, ``/auth/...``, ``/static/...``); the service
includes it in ``app.main``; ``adopter dashboard`` serves it over the local history
(``app.dashboard.local``).
"""

from __future__ import annotations

from fastapi import APIRouter

from app.auth import router as auth_router
from app.dashboard.api import router as api_router
from app.dashboard.pages import router as pages_router

router = APIRouter()
router.include_router(api_router)
router.include_router(auth_router)
router.include_router(pages_router)

__all__ = ["router"]
