"""The JSON API behind the pages (``/api/...``), documented in the OpenAPI schema."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel
from sqlalchemy.orm import Session

from app.dashboard import queries
from app.dashboard.access import Viewer
from app.dashboard.deps import Pagination, api_viewer, db, pagination, scan_filters
from app.dashboard.queries import ScanFilters
from app.dashboard.schemas import (
    Overview,
    RepositoryDetail,
    RepositoryPage,
    ScanDetail,
    ScanPage,
    ScanStates,
    ScanStatus,
)

router = APIRouter(prefix="/api", tags=["dashboard"])


class Me(BaseModel):
    login: str
    local: bool
    installation_ids: list[int] | None


@router.get("/me", response_model=Me, summary="Who is signed in and which installations they see")
def me(viewer: Viewer = Depends(api_viewer)) -> Me:
    ids = None if viewer.installation_ids is None else sorted(viewer.installation_ids)
    return Me(login=viewer.login, local=viewer.local, installation_ids=ids)


@router.get("/overview", response_model=Overview, summary="Installations, repositories, recent scans, totals")
def overview(installation: int | None = Query(None), q: str | None = Query(None, max_length=255),
             pages: Pagination = Depends(pagination), viewer: Viewer = Depends(api_viewer),
             session: Session = Depends(db)) -> Overview:
    return queries.overview(session, viewer, installation_id=installation, q=q, page=pages[0], per_page=pages[1])


@router.get("/repositories", response_model=RepositoryPage, summary="Repositories, filtered and paginated")
def repositories(installation: int | None = Query(None), q: str | None = Query(None, max_length=255),
                 pages: Pagination = Depends(pagination), viewer: Viewer = Depends(api_viewer),
                 session: Session = Depends(db)) -> RepositoryPage:
    return queries.list_repositories(session, viewer, installation_id=installation, q=q, page=pages[0],
                                     per_page=pages[1])


@router.get("/repositories/{repository_id}", response_model=RepositoryDetail,
            summary="One repository: its scans (filtered, paginated), chart data, pull requests, config",
            responses={404: {"description": "no such repository, or not yours to see"}})
def repository(repository_id: int, filters: ScanFilters = Depends(scan_filters),
               pages: Pagination = Depends(pagination), viewer: Viewer = Depends(api_viewer),
               session: Session = Depends(db)) -> RepositoryDetail:
    detail = queries.repository_detail(session, viewer, repository_id, filters, pages[0], pages[1])
    if detail is None:
        raise HTTPException(404, "repository not found")
    return detail


@router.get("/scans", response_model=ScanPage, summary="Scans, newest first, filtered and paginated")
def scans(filters: ScanFilters = Depends(scan_filters), pages: Pagination = Depends(pagination),
          viewer: Viewer = Depends(api_viewer), session: Session = Depends(db)) -> ScanPage:
    return queries.list_scans(session, viewer, filters, pages[0], pages[1])


@router.get("/scans/states", response_model=ScanStates, summary="Current state of several scans (for polling)")
def states(ids: str = Query(..., max_length=2000, description="comma-separated scan ids"),
           viewer: Viewer = Depends(api_viewer), session: Session = Depends(db)) -> ScanStates:
    wanted = [int(i) for i in ids.split(",") if i.strip().isdigit()]
    return ScanStates(states=queries.scan_states(session, viewer, wanted))


@router.get("/scans/{scan_id}", response_model=ScanDetail,
            summary="One scan: timeline, findings, change sets with verification and benchmark, diff",
            responses={404: {"description": "no such scan, or not yours to see"}})
def scan(scan_id: int, viewer: Viewer = Depends(api_viewer), session: Session = Depends(db)) -> ScanDetail:
    detail = queries.scan_detail(session, viewer, scan_id)
    if detail is None:
        raise HTTPException(404, "scan not found")
    return detail


@router.get("/scans/{scan_id}/status", response_model=ScanStatus, summary="A scan's state and timeline (for polling)",
            responses={404: {"description": "no such scan, or not yours to see"}})
def scan_status(scan_id: int, viewer: Viewer = Depends(api_viewer), session: Session = Depends(db)) -> ScanStatus:
    status = queries.scan_status(session, viewer, scan_id)
    if status is None:
        raise HTTPException(404, "scan not found")
    return status


@router.get("/rules", response_model=list[str], summary="Rule ids found in the scans you can see")
def rules(repository: int | None = Query(None), viewer: Viewer = Depends(api_viewer),
          session: Session = Depends(db)) -> list[str]:
    return queries.rule_ids(session, viewer, repository)
