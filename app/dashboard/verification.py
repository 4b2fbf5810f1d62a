"""A stored result's verification and benchmark, as they were: each rewrite's state and errors.

The stored details come in two shapes: the engine pipeline's (``per_rewrite`` rows, the accepted ones
checked ``combined``, ``dropped`` with reasons) and a single check's (the worker's ``VerifyResult``).
States are shown as the engine named them (passed, failed, skipped, not exercised, error, ...), never
mapped onto a fixed list: a state the engine adds later shows as itself. Error measures are every
number whose key names an error (``max_abs_err``, ``max_rel_err``, any later one), in the order found.
"""

from __future__ import annotations

from typing import Any

from app.dashboard.schemas import BenchmarkView, VerificationRowOut, VerificationView


def _errors(row: dict) -> dict[str, float]:
    return {key: float(value) for key, value in row.items()
            if "err" in key and isinstance(value, (int, float)) and not isinstance(value, bool)}


def _status(row: dict) -> str:
    status = row.get("status")
    if status:
        return str(status)
    if "passed" in row or "verified" in row:
        return "passed" if row.get("passed", row.get("verified")) else "failed"
    return "unknown"


def _row(name: str, row: Any, *, kept: bool | None = None, dropped: str | None = None) -> VerificationRowOut:
    data = row if isinstance(row, dict) else {}
    return VerificationRowOut(name=name, status=_status(data), errors=_errors(data),
                              message=str(data.get("message") or dropped or ""), kept=kept,
                              comparisons=len(data.get("cases") or []))


def verification_view(details: dict | None, verified: bool | None = None,
                      max_abs_error: float | None = None) -> VerificationView:
    v = (details or {}).get("verify")
    if not isinstance(v, dict) or not v:
        if verified is None:
            return VerificationView(status="not run", rows=[])
        row = {"status": "passed" if verified else "failed", "max_abs_err": max_abs_error}
        return VerificationView(status=row["status"], rows=[_row("rewrite", row)])
    per = v.get("per_rewrite")
    if isinstance(per, dict):
        accepted, dropped = set(v.get("accepted") or []), dict(v.get("dropped") or {})
        rows = [_row(name, row, kept=name in accepted, dropped=dropped.get(name)) for name, row in per.items()]
        combined = v.get("combined")
        if isinstance(combined, dict) and len(accepted) > 1:
            rows.append(_row("all kept rewrites together", combined, kept=True))
        statuses = {r.status for r in rows}
        if accepted:
            status = "passed" if len(accepted) == len(per) else f"{len(accepted)} of {len(per)} passed"
        else:
            status = statuses.pop() if len(statuses) == 1 else "none passed"
        return VerificationView(status=status, rows=rows)
    row = _row("rewrite", v)
    return VerificationView(status=row.status, rows=[row])


def benchmark_view(details: dict | None) -> BenchmarkView | None:
    """The benchmark's interval and verdict (present in results measured since the benchmark reports
    them; older results have the medians only)."""
    b = (details or {}).get("bench")
    if not isinstance(b, dict) or not b:  # the local history stores {} when --bench was not given
        return None
    speed = b.get("speedup") if isinstance(b.get("speedup"), dict) else {}
    ci = speed.get("ci95")
    return BenchmarkView(status=str(b.get("status") or "ok"), message=str(b.get("message") or ""),
                         speedup_ci95=list(ci) if ci else None, verdict=b.get("verdict"),
                         rounds=b.get("repeats"), stopped=b.get("stopped") or None)
