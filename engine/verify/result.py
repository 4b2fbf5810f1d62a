"""Verification results: plain data, JSON-serializable through ``to_dict``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# Statuses, in the order a reader should worry about them.
PASSED = "passed"  # every case agreed within tolerance
FAILED = "failed"  # the rewritten model computes something else (numbers, missing gradients)
INCOMPATIBLE = "incompatible"  # the original's checkpoint does not load strictly into the rewritten model
ERROR = "error"  # a side failed to build or run
TIMEOUT = "timeout"  # the time limit stopped a side
OOM = "oom"  # the memory limit stopped a side
SKIPPED = "skipped"  # nothing to verify with (no harness, no Hugging Face model class)
NOT_EXERCISED = "not exercised"  # the numbers agree, but the rewritten code path (its kernel) never ran


def _finite(value: float | None) -> float | None:
    if value is None or math.isfinite(value):
        return value
    return None  # JSON has no infinity


@dataclass
class CaseResult:
    """One model build, shape, mode and dtype, compared tensor by tensor."""

    name: str  # target and shape, e.g. "harness.py:build[batch_size=1,seq_len=7]"
    run: str  # "eval|float32", "train|float32", "train-dropout" (finite-loss smoke check)
    passed: bool
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    worst: str | None = None  # the tensor with the largest relative error
    criterion: str | None = None
    message: str = ""
    tensors: int = 0
    # counted in the result's max errors (a low-precision probe's bfloat16 errors are not the
    # rewrite's error in the dtype it is compared in)
    headline: bool = True

    def to_dict(self) -> dict:
        data = asdict(self)
        data["max_abs_err"] = _finite(self.max_abs_err)
        data["max_rel_err"] = _finite(self.max_rel_err)
        return data


@dataclass
class VerifyResult:
    status: str
    message: str = ""
    cases: list[CaseResult] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    network_isolated: bool | None = None
    notes: list[str] = field(default_factory=list)
    kernel_calls: dict = field(default_factory=dict)  # kernel -> [original's calls, rewritten's calls]
    kernel_eligibility: dict = field(default_factory=dict)  # kernel -> {"fused": n, "math only": n, "why": ...}

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def max_abs_err(self) -> float | None:
        values = [c.max_abs_err for c in self.cases if c.max_abs_err is not None and c.headline]
        return max(values) if values else None

    @property
    def max_rel_err(self) -> float | None:
        values = [c.max_rel_err for c in self.cases if c.max_rel_err is not None and c.headline]
        return max(values) if values else None

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "passed": self.passed,
            "message": self.message,
            "max_abs_err": _finite(self.max_abs_err),
            "max_rel_err": _finite(self.max_rel_err),
            "targets": list(self.targets),
            "cases": [c.to_dict() for c in self.cases],
            "duration_s": round(self.duration_s, 3),
            "network_isolated": self.network_isolated,
            "notes": list(self.notes),
            "kernel_calls": {k: list(v) for k, v in self.kernel_calls.items()},
            "kernel_eligibility": {k: dict(v) for k, v in self.kernel_eligibility.items()},
        }


@dataclass
class Candidate:
    """One proposed rewrite: an identity and the full new text of each file it changes."""

    id: str
    files: dict[str, str]
    kernels: tuple[str, ...] = ()  # the rule's `kernel`s: verification requires that one of them ran


@dataclass
class CandidatesResult:
    """Each rewrite verified on its own, then the accepted ones together."""

    per_rewrite: dict[str, VerifyResult]
    accepted: list[str]
    dropped: dict[str, str]  # id -> why
    combined: VerifyResult | None
    combined_files: dict[str, str]

    def to_dict(self) -> dict:
        return {
            "per_rewrite": {key: value.to_dict() for key, value in self.per_rewrite.items()},
            "accepted": list(self.accepted),
            "dropped": dict(self.dropped),
            "combined": self.combined.to_dict() if self.combined else None,
            "combined_files": sorted(self.combined_files),
        }
