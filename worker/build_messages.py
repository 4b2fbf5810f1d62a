"""The two messages between the control worker and a runner, validated on both sides.

``BuildJob`` (control -> runner, ``adopter.run_builds``): where to fetch the scanned commit, a
short-lived read-only token for that one repository, and the change sets to verify and benchmark.
``BuildReport`` (runner -> control, ``adopter.record_results``): the figures, or why there are none.

A runner builds repository code, so the control worker treats its report as untrusted input: types
and sizes are checked here, ids against the scan in ``worker.pipeline.record_results_stage``. Each
job carries a ``ticket`` (an HMAC of the job's scan and key under a key only the control worker
holds) that its report must return: a runner can answer the jobs it was given and no other, so a
message put on the broker by anything else cannot write figures into someone's scan.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

RUN_BUILDS = "adopter.run_builds"
RECORD_RESULTS = "adopter.record_results"

Short = Annotated[str, StringConstraints(max_length=200)]


class ChangeJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int
    files: dict[str, str]


class BuildJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scan_id: int
    clone_url: str
    token: str  # installation token: one repository, contents read, expires within the hour
    ref: str
    sha: str
    changes: list[ChangeJob]
    ticket: str = ""  # returned in the report (see the module's docstring)

    @property
    def key(self) -> str:
        """The same build (scan, commit, change sets) has the same key, however often it is sent."""
        ids = ",".join(str(c.id) for c in sorted(self.changes, key=lambda c: c.id))
        return hashlib.sha256(f"{self.scan_id}:{self.sha}:{ids}".encode()).hexdigest()[:32]


class BuildResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    change_set_id: int
    verified: bool
    max_abs_error: float | None = None
    device: Short | None = None
    before_s: float | None = Field(default=None, ge=0)
    after_s: float | None = Field(default=None, ge=0)
    speedup: float | None = Field(default=None, ge=0)
    peak_mem_before: int | None = Field(default=None, ge=0)
    peak_mem_after: int | None = Field(default=None, ge=0)
    versions: dict[Short, Short] = Field(default_factory=dict, max_length=50)
    verify: dict | None = None
    bench: dict | None = None

    @field_validator("max_abs_error", "before_s", "after_s", "speedup")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


def ticket(secret: str, scan_id: int, key: str) -> str:
    """The control worker's MAC of one build (the secret never leaves the control worker)."""
    derived = hashlib.sha256(f"adopter-build-ticket:{secret}".encode()).digest()
    return hmac.new(derived, f"{scan_id}:{key}".encode(), hashlib.sha256).hexdigest()


class BuildReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scan_id: int
    key: Annotated[str, StringConstraints(max_length=64)] = ""
    ticket: Annotated[str, StringConstraints(max_length=64)] = ""
    results: list[BuildResult] = Field(default_factory=list)
    error: Annotated[str, StringConstraints(max_length=2000)] | None = None
