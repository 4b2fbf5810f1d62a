"""The pull request body, in GitHub Markdown.

Sections: summary, what changed and why (per rule, linking its documentation by absolute URL, with
the rule's help folded in a ``<details>`` section), the sites, the verification table, the benchmark
table with its 95% interval and verdict, the environment, the minimum-gain decision, the
configuration that applied, how to reproduce with one command, the commands the bot understands,
and which Adopter version wrote the body (with a link to the scan on the dashboard when there is one). The body always fits GitHub's
limit of 65,536 characters (counted, as GitHub counts them, in UTF-16 code units): the site and
verification tables shrink first, then the middle of the body is cut at a line boundary; the
reproduction, commands and identity marker at the end are never cut.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from engine.report.findings import Benchmark, Finding, Verification
from engine.report.gain import GainDecision, decide
from engine.report.links import adopter_version, doc_url, docs_base_url, rule_help_url
from engine.report.rule_help import RuleHelp, library_help

GITHUB_BODY_LIMIT = 65536

# Two runs of one benchmark measured savings of +16.6% [15.3, 18.1] and +20.7% [19.9, 21.4]: the
# per-round interval is honest about its run, but a process's peak moves between runs by more.
MEMORY_BETWEEN_RUNS = ("The peak-memory interval is over the rounds of this one run; between runs, "
                       "peak memory can differ by a few percentage points more.")

# Why a rule family helps, for rules whose own documentation is not at hand. Matched on the rule id.
_WHY = (
    (("sdpa", "attention"), "hand-written `softmax(q @ k^T * scale) @ v` becomes "
     "`torch.nn.functional.scaled_dot_product_attention`, which dispatches to fused (flash / memory-"
     "efficient) kernels and never materializes the attention matrix for the backward pass."),
    (("gelu",), "a hand-written GELU formula becomes `torch.nn.functional.gelu`, one fused elementwise kernel "
     "instead of about eight, each storing an intermediate for backward."),
    (("rms",), "a hand-written RMSNorm becomes `torch.nn.functional.rms_norm`, a fused normalization kernel."),
    (("layer-norm", "layernorm", "layer_norm"), "a hand-written LayerNorm becomes "
     "`torch.nn.functional.layer_norm`, a fused kernel with a fused backward."),
    (("adam", "optim", "fused"), "the optimizer runs its fused implementation (`fused=True`): one kernel "
     "per step for all parameters instead of a loop of small ones."),
)


def why_for(rule_id: str) -> str:
    lowered = rule_id.lower()
    for keys, text in _WHY:
        if any(key in lowered for key in keys):
            return text
    return "the matched code is replaced by an equivalent optimized kernel."


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ").strip()


def _code(value: Any) -> str:
    text = _cell(value).replace("`", "'")
    return f"`{text}`" if text else ""


def _err(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2e}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.3f} s"


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f} MiB"


@dataclass
class Report:
    """Everything the body says. Build it directly, or let ``render_pr_body`` adapt a context."""

    findings: list[Finding]
    verification: Verification | None = None
    bench: Benchmark | None = None
    repository: str | None = None
    identity: str | None = None
    base_sha: str | None = None
    reproduce: str | None = None  # the one command; default: adopter scan . --verify --bench ...
    mention: str = "@adopter"
    min_gain: float | None = None
    docs_url: str | None = None  # documentation folder (absolute URL); default: ADOPTER_DOCS_URL, else published
    rule_summaries: dict[str, str] = field(default_factory=dict)
    rule_help: dict[str, RuleHelp] = field(default_factory=dict)  # embedded per rule
    extra_marker: str | None = None  # appended to the identity comment (e.g. "scan: 12")
    config: dict | None = None  # the configuration that applied (repository file and options)
    dashboard_url: str | None = None  # this scan on the dashboard
    version: str | None = None  # the Adopter version that wrote the body; default: the installed one

    @property
    def decision(self) -> GainDecision:
        return decide(self.verification, self.bench, self.min_gain)


def _summary(report: Report, applied: list[Finding]) -> list[str]:
    rules = sorted({f.rule_id for f in applied})
    where = f" in `{report.repository}`" if report.repository else ""
    lines = [f"Adopter rewrote {len(applied)} site(s){where} to use optimized PyTorch kernels "
             f"({', '.join(f'`{r}`' for r in rules) or 'no rules'})."]
    b = report.bench
    if b is not None and b.ok and b.speedup is not None:
        memory = ""
        if b.memory_reduction and b.memory_reduction > 0:
            ci = b.memory_interval
            bounded = f" (95% confidence interval {ci[0]:.1%} to {ci[1]:.1%})" if ci else ""
            memory = f", {b.memory_reduction:.1%} less peak memory{bounded}"
        lines.append(f"Measured training step: {speed_in_words(b)}{memory} ({b.device or 'cpu'}, {b.dtype or 'float32'}).")
    return lines + [""]


def _ratio(value: float) -> str:
    return f"{value:.2f}x"


def speed_in_words(b: Benchmark) -> str:
    """The verdict, the median and its 95% interval in one sentence."""
    median = f"**{_ratio(b.speedup)}** the speed of the original" if b.speedup is not None else "no speedup measured"
    if b.speedup_ci95 is None:
        why = (f"{b.repeats} round(s) are too few to bound the median at 95% confidence" if b.repeats
               else "no confidence interval was measured")
        return f"within the noise as far as can be told: {median}; {why}"
    low, high = (_ratio(x) for x in b.speedup_ci95)
    words = {"faster": "faster", "slower": "slower", "within-noise": "within the noise (neither faster nor slower)"}
    return f"{words.get(b.verdict, b.verdict)}: {median}, 95% confidence interval {low} to {high}"


def _changes(report: Report, applied: list[Finding]) -> list[str]:
    lines = ["### What changed and why", ""]
    counts = Counter(f.rule_id for f in applied)
    for rule_id in sorted(counts):
        help_ = report.rule_help.get(rule_id)
        why = report.rule_summaries.get(rule_id) or (help_.summary if help_ else "") or why_for(rule_id)
        link = rule_help_url(rule_id, report.docs_url)
        lines.append(f"- **[`{rule_id}`]({link})** ({counts[rule_id]} site(s)): {why}")
        if help_ is not None:
            lines += _help_details(rule_id, help_, link)
    if not counts:
        lines.append("No site was rewritten.")
    return lines + [""]


def _fence(code: str, language: str = "python") -> list[str]:
    ticks = "```"
    while ticks in code:  # a fence longer than any run of backticks inside
        ticks += "`"
    return [f"{ticks}{language}", code, ticks]


def _help_details(rule_id: str, help_: RuleHelp, link: str) -> list[str]:
    """The rule's help, folded. GitHub renders Markdown inside <details> after a blank line; indented
    by two spaces, the block stays inside the list item."""
    body: list[str] = []
    if help_.why:
        body += [help_.why, ""]
    if help_.example:
        body += ["Example:", "", *_fence(help_.example), ""]
    if help_.use_instead:
        body += ["Becomes:", "", *_fence(help_.use_instead), ""]
    body.append(f"Full documentation: {link}")
    text = "\n".join(["<details>", f"<summary>About <code>{_html(rule_id)}</code></summary>", "", *body, "",
                      "</details>"])
    return ["", *("  " + line if line else "" for line in text.split("\n")), ""]


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _sites(findings: list[Finding], limit: int | None) -> list[str]:
    lines = ["### Sites", "", "| Rule | File | Lines | Status | Note |", "|---|---|---|---|---|"]
    shown = findings if limit is None else findings[:limit]
    for f in shown:
        span = f"{f.line}" if not f.end_line or f.end_line == f.line else f"{f.line}-{f.end_line}"
        note = f.reason if f.reason and not f.applied else (f.message or "")
        lines.append(f"| {_code(f.rule_id)} | {_code(f.path)} | {span} | {_cell(f.status)} | {_cell(note)[:300]} |")
    if len(shown) < len(findings):
        lines.append(f"\n… and {len(findings) - len(shown)} more site(s), left out to stay under GitHub's size limit.")
    return lines + [""]


def _verification(v: Verification | None, limit: int | None) -> list[str]:
    lines = ["### Verification", ""]
    if v is None:
        return lines + ["Not verified.", ""]
    lines += [
        "The original and the rewritten model were built with the same weights and run on the same inputs "
        "(several shapes, batch size 1 among them; eval and train mode with dropout off; a float64 run of the "
        "original as the reference where a kernel rounds differently; eval and train mode again with dropout as "
        "the model ships, which must drop in the same modes; the rewrite's kernel must have run). The error is "
        "measured against the largest magnitude of each tensor. Compared: outputs, loss, the gradients "
        "of every parameter and of inputs requiring grad, and the parameters after one optimizer step. "
        "The rewritten model loads the original's state dict strictly, so existing checkpoints still load.",
        "",
        "| Rewrite | Result | Max abs error | Max error / scale | Comparisons |",
        "|---|---|---|---|---|",
    ]
    rows = v.rows if limit is None else v.rows[:limit]
    for row in rows:
        mark = "✅ passed" if row.passed else f"❌ {_cell(row.status)}"
        lines.append(f"| {_code(row.name)} | {mark} | {_err(row.max_abs_err)} | {_err(row.max_rel_err)} | {row.comparisons} |")
    if v.combined is not None:
        c = v.combined
        mark = "✅ passed" if c.passed else f"❌ {_cell(c.status)}"
        lines.append(f"| **{_cell(c.name)}** | {mark} | {_err(c.max_abs_err)} | {_err(c.max_rel_err)} | {c.comparisons} |")
    if len(rows) < len(v.rows):
        lines.append(f"\n… and {len(v.rows) - len(rows)} more rewrite(s), left out to stay under GitHub's size limit.")
    if v.dropped:
        lines += ["", "Dropped from this pull request (not equivalent, or conflicting):", ""]
        for name, why in list(v.dropped.items())[: (limit if limit is not None else None)]:
            lines.append(f"- {_code(name)}: {_cell(why)[:500]}")
    return lines + [""]


def _benchmark(b: Benchmark | None) -> list[str]:
    lines = ["### Benchmark (training step: forward, backward, optimizer step)", ""]
    if b is None:
        return lines + ["Not benchmarked.", ""]
    if not b.ok:
        return lines + [f"The benchmark did not complete: {_cell(b.message)}", ""]
    if not b.speedup:
        ratio = "n/a"
    elif b.verdict == "within-noise":  # neither word would be true
        ratio = f"{b.speedup:.2f}x (within noise)"
    elif b.speedup >= 1:
        ratio = f"{b.speedup:.2f}x faster"
    else:  # "0.76x faster" would read as a gain
        ratio = f"{1 / b.speedup:.2f}x slower"
    interval = " to ".join(_ratio(x) for x in b.speedup_ci95) if b.speedup_ci95 else "not bounded"
    lines += ["| | Before | After | Ratio | 95% interval |", "|---|---|---|---|---|",
              f"| Median step time | {_seconds(b.baseline_step_s)} | {_seconds(b.optimized_step_s)} | {ratio} | "
              f"{interval} |"]
    if b.baseline_peak_bytes is not None:
        if not b.optimized_peak_bytes or not b.baseline_peak_bytes:
            mem_ratio = "n/a"
        elif b.optimized_peak_bytes <= b.baseline_peak_bytes:  # in the interval's unit: a share saved
            mem_ratio = f"{1 - b.optimized_peak_bytes / b.baseline_peak_bytes:.1%} less"
        else:
            mem_ratio = f"{b.optimized_peak_bytes / b.baseline_peak_bytes - 1:.1%} more"
        if b.memory_interval:
            mem_interval = " to ".join(f"{x:+.1%}" for x in b.memory_interval) + " saved"
        else:
            mem_interval = "one measurement per side" if b.memory_ci95 else "n/a"
        lines.append(f"| Peak memory | {_mib(b.baseline_peak_bytes)} | {_mib(b.optimized_peak_bytes)} | {mem_ratio} | "
                     f"{mem_interval} |")
        if b.memory_interval:  # beside the figure: its interval is one run's
            lines += ["", MEMORY_BETWEEN_RUNS]
    lines += ["", f"Verdict: {speed_in_words(b)}.", ""]
    details = [f"device {_code(b.device_name or b.device or 'cpu')}", f"dtype {_code(b.dtype or 'float32')}"]
    if b.shape:
        details.append("shape " + _code(", ".join(f"{k}={v}" for k, v in sorted(b.shape.items()))))
    if b.repeats:
        stopped = {"converged": "the interval was narrow enough",
                   "budget": "the time budget was spent", "max-rounds": "the cap on rounds was reached"}.get(b.stopped)
        details.append(f"{b.repeats} interleaved rounds after {b.warmup or 0} warm-up steps"
                       + (f" (stopped when {stopped})" if stopped else ""))
    if b.pair_ratios:
        details.append(f"per-round ratio {min(b.pair_ratios):.2f}x to {max(b.pair_ratios):.2f}x")
    if b.memory_metric:
        details.append(f"memory: {_cell(b.memory_metric)}")
    return lines + ["; ".join(details) + ".", ""]


def _environment(b: Benchmark | None) -> list[str]:
    if b is None or not (b.versions or b.device):
        return []
    rows = [("Device", f"{b.device or 'cpu'}" + (f" ({b.device_name})" if b.device_name else ""))]
    if b.threads:
        rows.append(("Threads", str(b.threads)))
    for key in ("python", "torch", "transformers", "platform"):
        if b.versions.get(key):
            rows.append((key.capitalize() if key != "torch" else "PyTorch", str(b.versions[key])))
    return ["### Environment", "", "| | |", "|---|---|", *[f"| {k} | {_cell(v)} |" for k, v in rows], ""]


def _decision(report: Report) -> list[str]:
    d = report.decision
    if d.open_pr:
        text = f"Minimum gain: {d.min_gain:.0%} (speed or memory); {d.reason}."
    else:
        text = (f"**Below the bar:** {d.reason}. With a minimum gain of {d.min_gain:.0%} (speed or memory), "
                "Adopter would not open a pull request for this change.")
    return ["### Minimum gain", "", text, ""]


def _config(report: Report) -> list[str]:
    if not report.config:
        return []
    text = json.dumps(report.config, indent=2, sort_keys=True, default=str)
    return ["### Configuration", "", "<details>",
            f"<summary>The configuration this scan ran with (keys: {doc_url('config.md#keys', report.docs_url)})</summary>",
            "", *_fence(text, "json"), "", "</details>", ""]


def _tail(report: Report) -> list[str]:
    b = report.bench
    command = report.reproduce or (
        "adopter scan . --verify --bench"
        + (f" --device {b.device}" if b is not None and b.device else "")
        + (f" --dtype {b.dtype}" if b is not None and b.dtype else "")
    )
    checkout = f"git checkout {report.base_sha}   # the commit this pull request starts from\n" if report.base_sha else ""
    m = report.mention
    lines = [
        "### Reproduce", "",
        "```bash", f"{checkout}{command}", "```", "",
        "### Commands", "", "Comment on this pull request:",
        f"- `{m} rescan`: scan again and update this pull request",
        f"- `{m} recreate`: rebuild this branch from scratch, discarding edits made to it",
        f"- `{m} ignore`: close this pull request and stop proposing it until the code changes",
    ]
    footer = f"Written by [Adopter]({docs_base_url(report.docs_url)}) {_html(report.version or adopter_version())}"
    if report.dashboard_url:
        footer += f" · [this scan on the dashboard]({report.dashboard_url})"
    lines += ["", f"<sub>{footer}.</sub>"]
    if report.identity:
        extra = f" {report.extra_marker}" if report.extra_marker else ""
        lines += ["", f"<!-- adopter-identity: {_cell(report.identity).replace('--', '')}{extra} -->"]
    return lines


def _head(report: Report, site_limit: int | None, row_limit: int | None) -> str:
    applied = [f for f in report.findings if f.applied]
    shown = applied + [f for f in report.findings if not f.applied]
    parts = (_summary(report, applied) + _changes(report, applied) + _sites(shown, site_limit)
             + _verification(report.verification, row_limit) + _benchmark(report.bench)
             + _environment(report.bench) + _decision(report) + _config(report))
    return "\n".join(parts) + "\n"


def _cut(text: str, budget: int) -> str:
    """The longest prefix of whole lines within ``budget`` UTF-16 units, code fences closed."""
    notice = "\n\n*(The rest of this section was cut to stay under GitHub's size limit.)*\n\n"
    budget -= utf16_len(notice) + 8
    kept: list[str] = []
    used = 0
    for line in text.splitlines(keepends=True):
        size = utf16_len(line)
        if used + size > budget:
            break
        kept.append(line)
        used += size
    body = "".join(kept)
    if body.count("```") % 2:
        body += "\n```"
    return body + notice


def render(report: Report, *, limit: int = GITHUB_BODY_LIMIT) -> str:
    """The Markdown body, at most ``limit`` UTF-16 code units long."""
    tail = "\n".join(_tail(report)) + "\n"
    site_limit: int | None = None
    row_limit: int | None = None
    head = _head(report, site_limit, row_limit)
    n_sites = len(report.findings)
    n_rows = len(report.verification.rows) if report.verification else 0
    while utf16_len(head) + utf16_len(tail) > limit and (n_sites > 20 or n_rows > 20):
        if n_sites > 20:
            n_sites = max(20, n_sites * 2 // 3)
            site_limit = n_sites
        if n_rows > 20:
            n_rows = max(20, n_rows * 2 // 3)
            row_limit = n_rows
        head = _head(report, site_limit, row_limit)
    if utf16_len(head) + utf16_len(tail) > limit:
        head = _cut(head, limit - utf16_len(tail))
    body = head + tail
    if utf16_len(body) > limit:  # only an absurd tail (a huge reproduce command) gets here
        body = _cut(body, limit)
    return body


def render_pr_body(context: dict | Report | None = None, /, **kwargs) -> str:
    """The pull request body.

    Takes a ``Report``, or a context mapping (what ``worker.pipeline`` passes): ``sites`` or
    ``findings`` (findings in any accepted form, see ``engine.report.findings``), ``verification``
    (a ``CandidatesResult``/``VerifyResult`` or its dict) or ``result`` (the worker's record, also used
    for the benchmark), ``bench`` (a ``BenchResult`` or its dict), ``repository``, ``identity``,
    ``base_sha``, ``mention``, ``min_gain``, ``reproduce``, ``docs_url``, ``scan_id``, ``config``,
    ``dashboard_url`` (this scan's page), ``version``, ``rule_help`` (default: the rule library's).
    """
    if isinstance(context, Report):
        return render(context, **kwargs)
    ctx = dict(context or {})
    ctx.update(kwargs)
    findings = [Finding.from_any(f) for f in (ctx.get("findings") or ctx.get("sites") or [])]
    verification = Verification.from_any(ctx.get("verification") if ctx.get("verification") is not None
                                         else ctx.get("result"))
    bench = Benchmark.from_any(ctx.get("bench") if ctx.get("bench") is not None else ctx.get("result"))
    report = Report(
        findings=findings,
        verification=verification,
        bench=bench,
        repository=ctx.get("repository"),
        identity=ctx.get("identity"),
        base_sha=ctx.get("base_sha"),
        reproduce=ctx.get("reproduce"),
        mention=ctx.get("mention") or "@adopter",
        min_gain=ctx.get("min_gain"),
        docs_url=ctx.get("docs_url"),
        rule_summaries=dict(ctx.get("rule_summaries") or {}),
        rule_help=dict(ctx["rule_help"]) if ctx.get("rule_help") is not None else library_help(),
        config=ctx.get("config"),
        dashboard_url=ctx.get("dashboard_url"),
        version=ctx.get("version"),
        extra_marker=f"scan: {ctx['scan_id']}" if ctx.get("scan_id") is not None else None,
    )
    return render(report, limit=int(ctx.get("limit", GITHUB_BODY_LIMIT)))
