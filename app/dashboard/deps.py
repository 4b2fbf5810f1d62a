"""Dependencies shared by the pages and the API: the viewer, a database session, the filters."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date
from urllib.parse import quote

from fastapi import Depends, HTTPException, Query, Request
from sqlalchemy.orm import Session

from app.dashboard.access import NotSignedIn, Viewer, get_config, viewer
from app.dashboard.queries import ScanFilters
from app.db.models import ScanState
from app.db.session import get_sessionmaker


def db(request: Request) -> Iterator[Session]:
    session = get_sessionmaker(get_config(request).database_url)()
    try:
        yield session
    finally:
        session.close()


def api_viewer(request: Request) -> Viewer:
    try:
        return viewer(request)
    except NotSignedIn:
        raise HTTPException(401, "sign in at /auth/login", headers={"WWW-Authenticate": "Cookie"}) from None


def page_viewer(request: Request) -> Viewer:
    try:
        return viewer(request)
    except NotSignedIn:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(303, "sign in first", headers={"Location": f"/auth/login?next={quote(target)}"}) from None


def scan_filters(
    repository: int | None = Query(None, description="repository id"),
    installation: int | None = Query(None, description="installation id"),
    state: ScanState | None = Query(None, description="scan state"),
    rule: str | None = Query(None, max_length=128, description="scans with a finding of this rule id"),
    since: date | None = Query(None, description="scans created on or after this day (UTC)"),
    until: date | None = Query(None, description="scans created on or before this day (UTC)"),
) -> ScanFilters:
    return ScanFilters(repository_id=repository, installation_id=installation,
                       state=state.value if state else None, rule=rule or None, since=since, until=until)


def page_filters(
    repository: str | None = Query(None), installation: str | None = Query(None), state: str | None = Query(None),
    rule: str | None = Query(None), since: str | None = Query(None), until: str | None = Query(None),
) -> ScanFilters:
    """The same filters from an HTML form: empty fields mean "any", nonsense is ignored, not a 422."""

    def as_int(v):
        return int(v) if v and v.strip().lstrip("-").isdigit() else None

    def as_date(v):
        try:
            return date.fromisoformat(v) if v else None
        except ValueError:
            return None

    return ScanFilters(repository_id=as_int(repository), installation_id=as_int(installation),
                       state=state if state in {s.value for s in ScanState} else None, rule=(rule or None),
                       since=as_date(since), until=as_date(until))


Pagination = tuple[int, int]


def pagination(page: int = Query(1, ge=1, description="page number, from 1"),
               per_page: int = Query(25, ge=1, le=100, description="items per page")) -> Pagination:
    return page, per_page


__all__ = ["db", "api_viewer", "page_viewer", "scan_filters", "page_filters", "pagination", "Depends"]
