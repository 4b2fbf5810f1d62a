"""After the scan: verify each rewrite, benchmark the accepted ones, decide whether the gain is worth
a pull request.

One candidate per rule per file: the file rewritten with only that rule's findings (the scan is run
again on the original text with just that rule, so the candidate is exactly what the synthesizer
makes of it). Each candidate is verified on its own, then all that passed together (re-synthesized
with the accepted rules, see ``Verifier.candidates``); failures are dropped with their errors. The
combined accepted rewrite is then benchmarked and the minimum-gain decision applied.

Everything returned is plain JSON data (the command line prints it with ``--format json``); the
accepted rewrite's file texts are under ``"files"``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from engine.scan import ScanResult, scan_source, select_rules

APPLIED = ("rewritten", "guarded")


@dataclass
class RewriteGroup:
    """The findings of one rule in one file, rewritten on their own."""

    id: str
    rule_id: str
    file: str
    lines: list[int]
    text: str  # the file rewritten with only this rule
    findings: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"id": self.id, "rule": self.rule_id, "file": self.file, "lines": self.lines,
                "sites": len(self.findings)}


def _base(result: ScanResult, root: Path | str | None) -> Path:
    root = Path(root if root is not None else result.root)
    return root if root.is_dir() else root.parent


def _module_for(base: Path, rel: str) -> str:
    from engine.extract.imports import module_name_for

    return module_name_for(base / rel)


def _rule_table(rules: dict | None) -> dict:
    return rules if rules is not None else {r.id: r for r in select_rules("all")}


def rewrite_groups(result: ScanResult, root: Path | str | None = None, rules: dict | None = None,
                   ) -> tuple[list[RewriteGroup], list[str]]:
    """One group per (rule, file) among the applied findings, with that file rewritten by that rule
    alone; and notes on groups that could not be rewritten on their own. ``rules`` maps rule ids to
    rules (default: the rule library, loaded now)."""
    base = _base(result, root)
    rules = _rule_table(rules)
    by_key: dict[tuple[str, str], list] = {}
    for finding in result.findings:
        if finding.status in APPLIED and finding.file in result.files:
            by_key.setdefault((finding.rule_id, finding.file), []).append(finding)
    groups: list[RewriteGroup] = []
    notes: list[str] = []
    per_rule_files = {}
    for rule_id, rel in by_key:
        per_rule_files.setdefault(rule_id, []).append(rel)
    for (rule_id, rel), findings in by_key.items():
        original = result.originals[rel]
        try:
            _, text = scan_source(original, [rules[rule_id]], path=rel, module=_module_for(base, rel),
                                  package=result.package)
        except Exception as exc:  # a synthesis bug must not lose the other rewrites
            notes.append(f"{rule_id} in {rel}: could not be rewritten on its own: {type(exc).__name__}: {exc}")
            continue
        if text == original:
            notes.append(f"{rule_id} in {rel}: the rule alone changes nothing (it depends on another rule's edit)")
            continue
        gid = rule_id if len(per_rule_files[rule_id]) == 1 else f"{rule_id}:{rel}"
        groups.append(RewriteGroup(gid, rule_id, rel, sorted({f.line for f in findings}), text, findings))
    return groups, notes


def combined_files(result: ScanResult, groups: list[RewriteGroup], ids: list[str],
                   root: Path | str | None = None, rules: dict | None = None) -> dict[str, str]:
    """The rewrite holding exactly the groups ``ids``: each file re-synthesized with the rules
    accepted for it. Raises ``MergeConflict`` where that fails."""
    from engine.verify.merge import MergeConflict

    base = _base(result, root)
    rules = _rule_table(rules)
    wanted: dict[str, list[str]] = {}
    by_id = {g.id: g for g in groups}
    for gid in ids:
        group = by_id[gid]
        wanted.setdefault(group.file, []).append(group.rule_id)
    files: dict[str, str] = {}
    for rel, rule_ids in wanted.items():
        if len(rule_ids) == 1:
            files[rel] = next(g.text for g in groups if g.file == rel and g.rule_id == rule_ids[0])
            continue
        try:
            order = list(rules)  # the library's order, as in the scan
            chosen = [rules[r] for r in sorted(set(rule_ids), key=order.index)]
            _, text = scan_source(result.originals[rel], chosen, path=rel,
                                  module=_module_for(base, rel), package=result.package)
        except Exception as exc:
            raise MergeConflict(f"{rel}: rules {', '.join(rule_ids)} could not be applied together: {exc}") from exc
        files[rel] = text
    return files


def environment(device: str = "cpu", dtype: str = "float32") -> dict:
    """Where this ran (without importing torch: the parent process may not have it)."""

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "device": device,
        "dtype": dtype,
    }


def _repo_min_gain(base: Path) -> float | None:
    from engine.verify.targets import ConfigError, load_repo_config

    try:
        _, data = load_repo_config(base)
    except ConfigError:
        return None
    value = data.get("min_gain")
    return float(value) if isinstance(value, (int, float)) else None


def _row(result) -> dict:
    data = result.to_dict()
    return {key: data[key] for key in ("status", "passed", "message", "max_abs_err", "max_rel_err", "targets",
                                       "duration_s", "notes", "kernel_eligibility")} | {"comparisons": len(data["cases"]),
                                                                  "cases": data["cases"]}


def bench_rounds(progress, config) -> Callable[[int, int], None]:
    """The benchmark's ``on_round(done, total)`` as progress steps. Up to the fewest rounds the count
    and its time left are those rounds'; past them rounds go on until the speedup's interval is
    narrow enough or the time budget for rounds ends, so the count has no total. The time left is
    never more than the budget leaves (the budget ends the rounds before the fewest too), estimated
    from the rounds' own pace, not from the stage's start: building both models and warming up come
    before the first round."""
    fewest, ends = config.repeats, []

    def on_round(done: int, total: int) -> None:
        ends.append(time.monotonic())
        pace = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else None
        budget_left = max(0.0, config.budget_s - (ends[-1] - ends[0] + (pace or 0.0)))
        if done >= total:
            progress.step(f"round {done}/{done}", total=done)
        elif done < fewest:
            progress.step(f"round {done}/{fewest}",
                          left_s=min(pace * (fewest - done), budget_left) if pace is not None else budget_left)
        else:
            progress.step(f"round {done}, more until the speedup's 95% interval is within "
                          f"+/- {config.ci_tolerance:.0%}", total=None, left_s=budget_left)

    return on_round


def _now() -> str:
    return datetime.now(UTC).isoformat()


def verify_and_bench(result: ScanResult, root: Path | str | None = None, *, verify: bool = True, bench: bool = False,
                     device: str = "cpu", dtype: str = "float32", min_gain: float | None = None,
                     verify_config=None, bench_config=None, bench_shape: dict | None = None,
                     repeats: int | None = None, warmup: int | None = None, threads: int | None = None,
                     bench_budget_s: float | None = None,
                     targets=None, bench_target=None, log: Callable[[str], None] | None = None,
                     progress=None) -> dict:
    """Verify and benchmark the scan's rewrites; see the module docstring.

    ``verify_config``/``bench_config`` (``VerifyConfig``/``BenchConfig``) override the defaults built
    from ``dtype``, ``device``, ``bench_shape``, ``repeats`` (the fewest rounds), ``bench_budget_s`` (time
    for the rounds), ``warmup`` and ``threads``. ``targets``
    overrides what is built (default: the harness in ``.adopter.yml``, else Hugging Face model
    classes); ``bench_target`` what is benchmarked (default: the first of ``targets``, else the
    first discovered). ``log`` receives progress lines; ``progress`` (``engine.progress.Progress``)
    is told the stages and their steps (verification checks, benchmark rounds).
    """
    from engine.report import Benchmark, Verification, decide

    say = log or (lambda _line: None)
    base = _base(result, root)
    started = time.monotonic()
    out: dict = {"root": str(base), "environment": environment(device, dtype), "rewrites": [], "notes": [],
                 "verification": None, "benchmark": None, "decision": None, "files": {},
                 "timeline": {}}  # stage -> when it began (UTC, ISO 8601), for the history's timeline
    rules = {r.id: r for r in select_rules("all")}  # loaded once: every candidate uses the same rules
    groups, notes = rewrite_groups(result, base, rules)
    out["rewrites"] = [g.to_json() for g in groups]
    out["notes"] += notes
    files = dict(result.files)  # what the benchmark measures and the patch holds
    if not groups:
        out["notes"].append("no rewrite to verify or benchmark")
        out["decision"] = {"open_pr": False, "reason": "nothing was rewritten", "min_gain": None,
                           "speed_gain": None, "memory_gain": None}
        return out

    verification = None
    if verify:
        from engine.verify import Candidate, VerifyConfig, verify_candidates

        # the fused backends are asked where the rewrite is to run: the benchmark's device and dtype
        config = verify_config or VerifyConfig(dtype=dtype, threads=threads, eligibility_device=device,
                                               eligibility_dtype=dtype)
        out["timeline"]["verifying"] = _now()
        say(f"verifying {len(groups)} rewrite(s) on their own"
            + (" and together" if len(groups) > 1 else "") + " (each side in a sandboxed child process)")
        candidates = [Candidate(g.id, {g.file: g.text}, _kernels(rules.get(g.rule_id))) for g in groups]
        if progress is not None:  # each on its own, then together (more checks if that fails)
            progress.stage("verify", len(candidates) + (len(candidates) > 1))
        watch = {"on_check": progress.step} if progress is not None else {}
        verification = verify_candidates(base, candidates, targets, config=config,
                                         combine=lambda ids: combined_files(result, groups, ids, base, rules), **watch)
        data = verification.to_dict()
        data["per_rewrite"] = {cid: _row(r) for cid, r in verification.per_rewrite.items()}
        data["combined"] = _row(verification.combined) if verification.combined else None
        data["passed"] = bool(verification.accepted)
        data["rules"] = {}
        for group in groups:  # per rule: passed only if every file's rewrite of it passed
            row = data["per_rewrite"][group.id]
            entry = data["rules"].setdefault(group.rule_id, {"passed": True, "accepted": True, "max_abs_err": None,
                                                             "max_rel_err": None})
            entry["passed"] = entry["passed"] and row["passed"]
            entry["accepted"] = entry["accepted"] and group.id in verification.accepted
            for key in ("max_abs_err", "max_rel_err"):
                if row[key] is not None:
                    entry[key] = max(entry[key] or 0.0, row[key])
        out["verification"] = data
        files = dict(verification.combined_files)
        for cid, why in verification.dropped.items():
            say(f"dropped {cid}: {why[:300]}")
    out["files"] = files

    bench_result = None
    if bench and files:
        from engine.bench import BenchConfig
        from engine.bench import bench as run_bench

        if bench_config is None:
            kwargs = {"device": device, "dtype": dtype, "shape": bench_shape, "threads": threads}
            if repeats is not None:
                kwargs["repeats"] = repeats
            if warmup is not None:
                kwargs["warmup"] = warmup
            if bench_budget_s is not None:
                kwargs["budget_s"] = bench_budget_s
            bench_config = BenchConfig(**kwargs)
        say(f"benchmarking the training step on {device} ({dtype}), original against rewritten")
        out["timeline"]["benchmarking"] = _now()
        if bench_target is None and targets:
            bench_target = targets[0]
        if progress is not None:
            progress.stage("bench", bench_config.repeats)
        watch = {"on_round": bench_rounds(progress, bench_config)} if progress else {}
        bench_result = run_bench(base, files, bench_target, config=bench_config, **watch)
        out["benchmark"] = bench_result.to_dict()
    elif bench:
        out["benchmark"] = {"status": "skipped", "message": "no rewrite passed verification"}

    threshold = min_gain if min_gain is not None else _repo_min_gain(base)
    v_view = Verification.from_any(verification) if verification is not None else None
    b_view = Benchmark.from_any(bench_result) if bench_result is not None else None
    decision = decide(v_view, b_view, threshold)
    reason = decision.reason
    if verification is None:
        reason = "verification was not run (--verify)"
    elif bench_result is None and decision.open_pr is False and v_view is not None and v_view.passed:
        reason = "the gain was not measured (--bench)"
    out["decision"] = {"open_pr": decision.open_pr and verification is not None, "reason": reason,
                       "min_gain": decision.min_gain, "speed_gain": decision.speed_gain,
                       "memory_gain": decision.memory_gain}
    out["duration_s"] = round(time.monotonic() - started, 3)
    return out


def report_markdown(result: ScanResult, outcome: dict, *, repository: str | None = None,
                    reproduce: str | None = None, min_gain: float | None = None, config: dict | None = None) -> str:
    """The pull request body for the scan and its verification and benchmark; ``config``: the
    options and settings the scan ran with."""
    from engine.report import Finding, render_pr_body

    dropped_ids = set((outcome.get("verification") or {}).get("dropped", {}))
    dropped = {(g["rule"], g["file"]) for g in outcome.get("rewrites", []) if g["id"] in dropped_ids}
    findings = []
    for f in result.findings:
        status = "dropped: not verified" if (f.rule_id, f.file) in dropped and f.status in APPLIED else f.status
        findings.append(Finding(rule_id=f.rule_id, path=f.file, line=f.line, end_line=f.end_line, status=status,
                                reason=f.reason, message=f.message))
    decision = outcome.get("decision") or {}
    return render_pr_body({
        "findings": findings,
        "verification": outcome.get("verification"),
        "bench": outcome.get("benchmark") if (outcome.get("benchmark") or {}).get("status") != "skipped" else None,
        "repository": repository or outcome.get("root"),
        "reproduce": reproduce,
        "min_gain": min_gain if min_gain is not None else decision.get("min_gain"),
        "config": config,
    })


def _kernels(rule) -> tuple[str, ...]:
    """The kernel a rule introduces, which verification requires to have run."""
    return (rule.kernel,) if rule is not None and getattr(rule, "kernel", None) else ()


def _memory_interval(bench: dict) -> str:
    """The saving's 95% interval over rounds, in words; nothing for a single measurement per side."""
    from engine.report.findings import Benchmark

    ci = Benchmark.from_any(bench).memory_interval
    if ci is None:
        return ""
    return f", 95% CI {ci[0]:+.1%} to {ci[1]:+.1%}"


def summary_lines(outcome: dict) -> list[str]:
    """A few lines for the terminal."""
    lines: list[str] = []
    v = outcome.get("verification")
    if v is not None:
        for cid, row in v["per_rewrite"].items():
            err = f"max abs err {row['max_abs_err']:.2e}, max err/scale {row['max_rel_err']:.2e}" \
                if row["max_abs_err"] is not None and row["max_rel_err"] is not None else row["message"][:200]
            lines.append(f"verify {cid}: {row['status']} ({err})")
        c = v.get("combined")
        if c is not None and len(v["accepted"]) > 1:
            lines.append(f"verify all {len(v['accepted'])} accepted together: {c['status']}")
        for cid, why in v["dropped"].items():
            lines.append(f"dropped {cid}: {why[:300]}")
    b = outcome.get("benchmark")
    if b is not None:
        if b.get("status") == "ok":
            mem = ""
            if b.get("baseline_peak_bytes") is not None and b.get("optimized_peak_bytes") is not None:
                mem = (f"; peak memory {b['baseline_peak_bytes'] / 2**20:.1f} -> {b['optimized_peak_bytes'] / 2**20:.1f} MiB"
                       + (f" ({b['memory_reduction']:+.1%} saved{_memory_interval(b)})"
                          if b.get("memory_reduction") is not None else ""))
            speed = b["speedup"] or {}
            ci = speed.get("ci95")
            interval = f", 95% CI {ci[0]:.2f}x-{ci[1]:.2f}x" if ci else ", not bounded"
            lines.append(f"bench {b['device']} {b['dtype']} {b.get('shape')}: step {b['baseline_step_s'] * 1000:.1f} -> "
                         f"{b['optimized_step_s'] * 1000:.1f} ms ({speed.get('median', 0):.2f}x{interval}, "
                         f"{b.get('verdict')}, {b.get('repeats')} rounds, stopped: {b.get('stopped')}){mem}")
        else:
            lines.append(f"bench: {b.get('status')}: {str(b.get('message', ''))[:300]}")
    d = outcome.get("decision")
    if d is not None:
        lines.append(f"pull request: {'yes' if d['open_pr'] else 'no'} ({d['reason']})")
    lines += [f"note: {n}" for n in outcome.get("notes", [])]
    return lines


if __name__ == "__main__":  # pragma: no cover - python -m engine.pipeline PATH
    from engine.scan import scan_path

    scanned = scan_path(sys.argv[1])
    print("\n".join(summary_lines(verify_and_bench(scanned, sys.argv[1], bench="--bench" in sys.argv,
                                                   log=print))))
