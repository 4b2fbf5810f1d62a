"""What the JSON API answers (and what the pages render): FastAPI response models."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class ScanSummary(BaseModel):
    id: int
    repository_id: int
    repository: str
    state: str
    trigger: str
    head_sha: str | None = None
    branch: str | None = None
    reason: str | None = None
    created_at: datetime
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    rewritten: int = 0
    guarded: int = 0
    near_miss: int = 0
    verified: bool | None = Field(None, description="True if a change set of the scan passed verification")
    speedup: float | None = Field(None, description="best measured training-step speedup (before / after)")
    memory_reduction: float | None = Field(None, description="best peak-memory reduction, 0.25 = 25% less")
    terminal: bool = True


class Paged(BaseModel):
    total: int
    page: int
    per_page: int
    pages: int


class ScanPage(Paged):
    items: list[ScanSummary]


class RepositorySummary(BaseModel):
    id: int
    full_name: str
    installation_id: int
    account: str
    private: bool = False
    default_branch: str | None = None
    removed: bool = False
    scans: int = 0
    last_scan_id: int | None = None
    last_scan_state: str | None = None
    last_scan_at: datetime | None = None


class RepositoryPage(Paged):
    items: list[RepositorySummary]


class InstallationSummary(BaseModel):
    id: int
    account_login: str
    account_type: str | None = None
    active: bool
    repositories: int


class Totals(BaseModel):
    scans: int
    running: int
    rewrites_verified: int = Field(description="change sets that passed verification")
    pull_requests_opened: int
    pull_requests_open: int
    pull_requests_merged: int
    pull_requests_closed: int = Field(description="closed without merging")
    median_speedup: float | None
    median_memory_reduction: float | None


class Overview(BaseModel):
    installations: list[InstallationSummary]
    repositories: RepositoryPage
    recent_scans: list[ScanSummary]
    totals: Totals


class PullRequestOut(BaseModel):
    id: int
    repository_id: int
    identity: str
    number: int | None
    title: str
    html_url: str | None
    state: str
    branch: str
    created_at: datetime
    closed_at: datetime | None = None
    last_scan_id: int | None = None


class IgnoredIdentityOut(BaseModel):
    identity: str
    reason: str
    code_digest: str | None = None
    created_at: datetime


class ChartPoint(BaseModel):
    scan_id: int
    at: datetime
    speedup: float | None
    memory_reduction: float | None


class FindingRef(BaseModel):
    rule_id: str
    path: str
    line: int
    status: str
    message: str | None = None


class FindingChanges(BaseModel):
    scan_id: int = Field(description="the latest finished scan")
    previous_scan_id: int = Field(description="the finished scan before it")
    new: list[FindingRef] = Field(description="in the latest scan, not in the previous one")
    fixed: list[FindingRef] = Field(description="in the previous scan, gone from the latest")
    still_open: list[FindingRef] = Field(description="in both (as the latest scan reports them)")


class RuleTrend(BaseModel):
    rule_id: str
    counts: list[int] = Field(description="findings of the rule in each of trend_scans, oldest first")
    change: int = Field(description="latest count minus the one before")


class RepositoryDetail(BaseModel):
    repository: RepositorySummary
    scans: ScanPage
    chart: list[ChartPoint]
    pull_requests: list[PullRequestOut]
    ignored: list[IgnoredIdentityOut]
    config: dict | None = Field(None, description="the configuration the latest scan ran with")
    config_scan_id: int | None = None
    changes: FindingChanges | None = Field(None, description="findings new, fixed and still open since the "
                                                             "previous finished scan (none before two)")
    trend_scans: list[int] = Field(default_factory=list, description="the latest finished scans, oldest first")
    rule_trends: list[RuleTrend] = Field(default_factory=list)


class ScanEventOut(BaseModel):
    state: str
    reason: str | None = None
    at: datetime


class FindingOut(BaseModel):
    id: int
    rule_id: str
    status: str
    path: str
    line: int
    end_line: int | None = None
    message: str | None = None
    reason: str | None = None


class VerificationRowOut(BaseModel):
    name: str = Field(description="the rewrite (candidate id), or all kept rewrites together")
    status: str = Field(description="as the engine named it: passed, failed, skipped, not exercised, ...")
    errors: dict[str, float] = Field(default_factory=dict, description="each error measure, e.g. max_abs_err")
    message: str = ""
    kept: bool | None = Field(None, description="whether the rewrite stayed in the patch")
    comparisons: int = 0


class VerificationView(BaseModel):
    status: str = Field(description="overall: passed, 'k of n passed', or the rewrites' common state")
    rows: list[VerificationRowOut]


class BenchmarkView(BaseModel):
    status: str
    message: str = ""
    speedup_ci95: list[float] | None = None
    verdict: str | None = None
    rounds: int | None = None
    stopped: str | None = None


class ResultOut(BaseModel):
    verified: bool
    max_abs_error: float | None = None
    device: str | None = None
    before_s: float | None = None
    after_s: float | None = None
    speedup: float | None = None
    peak_mem_before: int | None = None
    peak_mem_after: int | None = None
    memory_reduction: float | None = None
    versions: dict = {}
    details: dict = {}
    verification: VerificationView | None = None
    benchmark: BenchmarkView | None = None


class ChangeSetOut(BaseModel):
    id: int
    identity: str
    rule_ids: list
    outcome: str | None = None
    diff: str
    result: ResultOut | None = None
    pull_request: PullRequestOut | None = None


class TaskRunOut(BaseModel):
    task: str
    outcome: str
    started_at: datetime
    duration_s: float


class ScanDetail(BaseModel):
    scan: ScanSummary
    events: list[ScanEventOut]
    findings: list[FindingOut]
    change_sets: list[ChangeSetOut]
    diff: str | None = None
    config: dict | None = None
    options: dict | None = Field(None, description="how the scan was run (rules, verify, bench, device, ...)")
    task_runs: list[TaskRunOut]


class ScanStatus(BaseModel):
    id: int
    state: str
    reason: str | None = None
    terminal: bool
    updated_at: datetime | None = None
    events: list[ScanEventOut]


class ScanStates(BaseModel):
    states: dict[int, str] = Field(description="scan id -> state, for the ids asked that the viewer may see")
