"""Reports: the pull request body in Markdown, and the minimum-gain decision behind it."""

from engine.report.findings import Benchmark, Finding, Verification, VerificationRow
from engine.report.gain import DEFAULT_MIN_GAIN, GainDecision, decide, normalize_min_gain
from engine.report.markdown import GITHUB_BODY_LIMIT, Report, render, render_pr_body, utf16_len

__all__ = [
    "DEFAULT_MIN_GAIN",
    "GITHUB_BODY_LIMIT",
    "Benchmark",
    "Finding",
    "GainDecision",
    "Report",
    "Verification",
    "VerificationRow",
    "decide",
    "normalize_min_gain",
    "render",
    "render_pr_body",
    "utf16_len",
]
