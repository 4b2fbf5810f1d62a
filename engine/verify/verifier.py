"""Differential verification: the original and the rewritten model, same weights, same inputs.

The original side runs once per target group (a harness, or the model classes of one Hugging Face
package) and its weights, inputs and results are reused for every candidate rewrite. Each side is a
sandboxed child (``engine.verify.sandbox``) running ``engine/verify/child.py`` in a working copy
(``engine.verify.workspace``); the parent compares the saved tensors (``engine.verify.compare``).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.verify import result as R
from engine.verify.merge import MergeConflict, merge_overlays
from engine.verify.messages import MalformedMessage, read_result_file
from engine.verify.result import Candidate, CandidatesResult, CaseResult, VerifyResult
from engine.verify.sandbox import Limits, SandboxUnavailable, run_child
from engine.verify.sites import Site, added_sites, unexercised
from engine.verify.targets import HFTarget, Target, discover_targets
from engine.verify.workspace import materialize, overlay_from, scratch_dir

CHILD = Path(__file__).with_name("child.py")


@dataclass(frozen=True)
class VerifyConfig:
    timeout_s: float = 300.0  # per child process (one side of one target group)
    memory_bytes: int | None = 6 * 1024**3  # address-space limit per child (CPU)
    threads: int | None = None
    seed: int = 0
    dtype: str = "float32"  # the dtype both sides are compared in
    fp64_reference: bool = True  # also run the original in float64 (see engine.verify.compare)
    reinit_weights: bool = True  # fan-in scaled random weights instead of the model's own init
    shapes: tuple[dict, ...] | None = None  # overrides every target's shapes
    hf_max_models: int = 2  # model classes built per Hugging Face modeling file
    allow_network: bool = False
    workdir: Path | None = None  # where working copies go (a temporary folder if None)
    keep_workdir: bool = False
    # kernels whose calls both sides count (coverage); None: every rule's `kernel`
    count_kernels: tuple[str, ...] | None = None
    # inputs beyond the harness's (fully masked rows and samples, non-contiguous inputs), compared
    # like the harness's own (see child.probe_variants)
    probes: bool = True
    # also run eval mode in these dtypes on both sides, held against the original's float64 run
    low_precision: tuple[str, ...] = ("bfloat16", "float16")
    # where each kernel call is offered to the fused backends alone (engine.verify.child._try_fused):
    # the device and dtype the rewrite is meant to run in (the benchmark's); None: the compared dtype
    eligibility_device: str = "cpu"
    eligibility_dtype: str | None = None

    def limits(self) -> Limits:
        return Limits(timeout_s=self.timeout_s, memory_bytes=self.memory_bytes, threads=self.threads,
                      network=self.allow_network)


def _shape_label(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(shape.items()))


def _group_key(target: Target) -> str:
    return f"hf:{target.package_dir}" if isinstance(target, HFTarget) else f"harness:{target.label}"


@dataclass
class _SideRun:
    status: str  # R.PASSED meaning "ran"; else a failure status
    message: str = ""
    cases: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    reference_file: Path | None = None
    network_isolated: bool | None = None
    sandboxed: bool = False
    tree_dir: str = ""  # the side's working copy (the files the child's kernel calls come from)


MAX_TENSORS_BYTES = 8 * 1024**3


def _load_tensors(path: Path) -> dict:
    """The child's saved tensors: a file it wrote, so bounded and loaded ``weights_only``."""
    if not path.is_file():
        return {}
    if path.stat().st_size > MAX_TENSORS_BYTES:
        raise MalformedMessage(f"{path.stat().st_size} bytes, over the {MAX_TENSORS_BYTES}-byte limit")
    import torch  # only here: the rest of engine.verify works without torch installed

    try:
        tensors = torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a forged file must fail the run, not the parent
        raise MalformedMessage(f"cannot be loaded ({type(exc).__name__})") from None
    if not isinstance(tensors, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in tensors.items()):
        raise MalformedMessage("not a mapping of names to tensors")
    return tensors


class Verifier:
    """Verifies overlays of one original tree; reuses the original side's run across calls."""

    def __init__(self, original_root: Path, targets: list[Target] | None = None, *, config: VerifyConfig | None = None):
        self.root = Path(original_root).resolve()
        self.targets = list(targets) if targets is not None else None
        self.config = config or VerifyConfig()
        self._own_dir = self.config.workdir is None
        self.dir = scratch_dir("verify") if self._own_dir else Path(self.config.workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._references: dict[str, _SideRun] = {}
        self._counter = 0
        self.count_kernels = self.config.count_kernels if self.config.count_kernels is not None else _rule_kernels()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._own_dir and not self.config.keep_workdir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---------------------------------------------------------------------------------------------

    def _cases(self, targets: list[Target], tree_root: Path) -> list[dict]:
        cases = []
        for target in targets:
            for shape in self.config.shapes or target.shapes:
                cases.append({"name": f"{target.label}[{_shape_label(shape)}]", "target": target.spec(tree_root),
                              "shape": dict(shape)})
        return cases

    def _run_side(self, side: str, targets: list[Target], overlay: dict[str, str],
                  reference: _SideRun | None) -> _SideRun:
        self._counter += 1
        base = self.dir / f"{self._counter:03d}-{side}"
        try:
            tree = materialize(self.root, overlay, base / "tree", targets[0])
        except (OSError, ValueError) as exc:
            return _SideRun(R.ERROR, f"could not prepare the working copy: {exc}")
        job_dir = base / "job"
        job_dir.mkdir(parents=True)
        reference_file = reference.reference_file if reference else job_dir / "reference.pt"
        job = {
            "mode": "run",
            "side": side,
            "sys_path": list(tree.sys_path),
            "cases": self._cases(targets, tree.harness_root),
            "seed": self.config.seed,
            "dtype": self.config.dtype,
            "fp64": self.config.fp64_reference,
            "reinit": self.config.reinit_weights,
            "probes": self.config.probes,
            "low_precision": list(self.config.low_precision if self.config.probes else ()),
            "threads": self.config.threads,
            "reference_file": str(reference_file),
            "count_kernels": list(self.count_kernels),
            "eligibility_device": self.config.eligibility_device,
            "eligibility_dtype": self.config.eligibility_dtype,
            "tensors_file": str(job_dir / "tensors.pt"),
            "result_file": str(job_dir / "result.json"),
        }
        (job_dir / "job.json").write_text(json.dumps(job))
        try:
            run = run_child(CHILD, [str(job_dir / "job.json")], cwd=tree.cwd, home=base / "home", log_dir=job_dir,
                            limits=self.config.limits(), writable=[base / "tree"],
                            cuda=self.config.eligibility_device.startswith("cuda"),  # its device nodes, no address-space cap
                            readable=[reference_file] if reference else [])
        except SandboxUnavailable as exc:
            return _SideRun(R.ERROR, str(exc))
        except OSError as exc:
            return _SideRun(R.ERROR, f"could not start the child: {exc}")
        out = _SideRun(R.PASSED, reference_file=reference_file, network_isolated=run.network_isolated,
                       sandboxed=run.sandboxed, tree_dir=str(base / "tree"))
        if run.status == "timeout":
            out.status, out.message = R.TIMEOUT, f"stopped by the time limit after {run.elapsed_s:.0f}s"
            return out
        result_path = job_dir / "result.json"
        if not result_path.exists():
            if run.status == "killed":
                # SIGKILL: the kernel's OOM killer (cgroup limits); SIGABRT after std::bad_alloc: RLIMIT_AS in C++
                oom = run.returncode == -9 or "bad_alloc" in run.stderr_tail or "MemoryError" in run.stderr_tail
                out.status = R.OOM if oom else R.ERROR
                out.message = f"killed by signal {-run.returncode}" + (" (out of memory)" if oom else "")
                out.message += f": {run.stderr_tail[-800:]}" if run.stderr_tail.strip() else ""
            else:
                out.status = R.ERROR
                out.message = f"exited with code {run.returncode} without a result: {run.stderr_tail[-1500:]}"
            return out
        try:
            data = read_result_file(result_path)
        except MalformedMessage as exc:
            out.status, out.message = R.ERROR, f"the child's report was rejected: {exc}"
            return out
        if data["status"] != "ok":
            out.status = R.OOM if data["status"] == "oom" else R.ERROR
            out.message = data["message"]
            return out
        out.cases = data["cases"]
        try:
            out.tensors = _load_tensors(Path(job["tensors_file"]))
        except MalformedMessage as exc:
            out.status, out.message = R.ERROR, f"the child's tensors were rejected: {exc}"
        return out

    def _reference(self, key: str, targets: list[Target]) -> _SideRun:
        if key not in self._references:
            self._references[key] = self._run_side("original", targets, {}, None)
        return self._references[key]

    # ---------------------------------------------------------------------------------------------

    def check(self, overlay: dict[str, str], kernels: tuple[str, ...] = ()) -> VerifyResult:
        """Compare the original with ``overlay``. Where ``kernels`` are given, one of them must run
        more often in the rewritten model than in the original during verification; otherwise the
        result is "not exercised" (the code the rewrite added never ran: a guard sent every call
        down the original path), never "passed"."""
        started = time.monotonic()
        targets = self.targets if self.targets is not None else discover_targets(
            self.root, overlay, hf_limit=self.config.hf_max_models)
        if not targets:
            return VerifyResult(R.SKIPPED, "nothing to build: no harness in .adopter.yml and no Hugging Face-style "
                                "model class affected by the rewrite (see docs/harness.md)")
        groups: dict[str, list[Target]] = {}
        for target in targets:
            groups.setdefault(_group_key(target), []).append(target)
        result = VerifyResult(R.PASSED, targets=[t.label for t in targets])
        statuses: list[tuple[str, str]] = []
        sites = added_sites(self.root, overlay, kernels) if kernels else []
        site_hits: list[tuple[dict, str]] = []  # (kernel -> place -> calls, the working copy they ran in)
        for key, members in groups.items():
            reference = self._reference(key + "|" + ",".join(t.label for t in members), members)
            result.network_isolated = reference.network_isolated
            if reference.status == R.PASSED and not reference.sandboxed:
                note = "UNSANDBOXED: no working sandbox here (bubblewrap), repository code ran with the user's rights"
                if note not in result.notes:
                    result.notes.append(note)
            if reference.status != R.PASSED:
                statuses.append((reference.status, f"the original model could not be run: {reference.message}"))
                continue
            broken = [(n, c) for n, c in reference.cases.items() if c.get("status") != "ok"]
            if len(broken) == len(reference.cases):  # not one case ran: say why instead of comparing nothing
                name, case = broken[0]
                status = R.OOM if case.get("status") == "oom" else R.ERROR
                statuses.append((status, f"the original model could not be run: {name} ({case.get('phase', '')}): "
                                         f"{case.get('message', '')}"))
                continue
            candidate = self._run_side("rewritten", members, overlay, reference)
            if candidate.status != R.PASSED:
                statuses.append((candidate.status, f"the rewritten model: {candidate.message}"))
                continue
            statuses += self._compare(reference, candidate, result)
            _count_calls(reference, candidate, result, kernels)
            site_hits.append((_site_hits(candidate), candidate.tree_dir))
            statuses += _eligibility(candidate, result, kernels, sites)
        if kernels and not statuses and result.cases:
            statuses += _coverage(result, kernels)
        if kernels and not statuses and result.cases and sites:
            statuses += _site_coverage(sites, site_hits, result)
        if result.network_isolated is False:
            result.notes.append("network was not isolated (no `unshare -n` here); the child could reach the network")
        if not result.cases and not statuses:
            statuses.append((R.ERROR, "no case could be run on the original model"))
        for status in (R.INCOMPATIBLE, R.FAILED, R.OOM, R.TIMEOUT, R.ERROR, R.NOT_EXERCISED):
            messages = [m for s, m in statuses if s == status]
            if messages:
                result.status, result.message = status, "; ".join(dict.fromkeys(messages))[:4000]
                break
        else:
            n = len(result.cases)
            result.message = f"{n} comparisons agree (max error {result.max_rel_err or 0:.2g} of the tensors' scale)"
            ran = [f"{k}: {v[1]} call(s), original {v[0]}" for k, v in result.kernel_calls.items() if k in kernels]
            if ran:
                result.message += "; kernel ran (" + "; ".join(ran) + ")"
        result.duration_s = time.monotonic() - started
        return result

    def candidates(self, candidates: list[Candidate], combine=None, on_check=None) -> CandidatesResult:
        """Verify each candidate on its own, drop the failures, then verify the survivors together.

        When the combination fails (two rewrites interact) or two candidates' edits conflict, the
        survivors are added one at a time in the given order and each one that breaks the
        combination is dropped too.

        ``combine(ids) -> {path: text}`` builds the rewrite holding several candidates (the scan
        re-synthesizes it with just those rules, which is exact where a line merge of separately
        rewritten texts may conflict, e.g. two rules adding imports at the same place); it may raise
        ``MergeConflict``. By default the candidates' texts are merged line by line. ``on_check(label)``
        is called as each check finishes (a progress display).
        """
        root = self.root
        checked = self.check

        def check(overlay, label: str, kernels: tuple[str, ...]):
            outcome = checked(overlay, kernels)
            if on_check is not None:
                on_check(label)
            return outcome

        overlays = {c.id: overlay_from(root, c.files) for c in candidates}

        def merged_overlay(ids: list[str]) -> dict[str, str]:
            if combine is not None:
                return overlay_from(root, combine(list(ids)))
            return merge_overlays(root, [overlays[cid] for cid in ids])

        kernels_of = {c.id: tuple(c.kernels) for c in candidates}

        def kernels(ids) -> tuple[str, ...]:
            return tuple(dict.fromkeys(k for cid in ids for k in kernels_of[cid]))

        per = {c.id: check(overlays[c.id], c.id, kernels_of[c.id]) for c in candidates}
        dropped = {cid: f"{r.status}: {r.message}" for cid, r in per.items() if not r.passed}
        passing = [c.id for c in candidates if per[c.id].passed]
        if not passing:
            return CandidatesResult(per, [], dropped, None, {})
        if len(passing) == 1:
            return CandidatesResult(per, passing, dropped, per[passing[0]], overlays[passing[0]])
        try:
            merged = merged_overlay(passing)
            together = check(merged, "together", kernels(passing))
            if together.passed:
                return CandidatesResult(per, passing, dropped, together, merged)
        except MergeConflict:
            pass
        accepted = [passing[0]]
        combined, combined_files = per[passing[0]], overlays[passing[0]]
        for cid in passing[1:]:
            try:
                trial = merged_overlay([*accepted, cid])
            except MergeConflict as exc:
                dropped[cid] = f"conflict: {exc}"
                continue
            outcome = check(trial, f"{cid} with {', '.join(accepted)}", kernels([*accepted, cid]))
            if outcome.passed:
                accepted.append(cid)
                combined, combined_files = outcome, trial
            else:
                dropped[cid] = f"fails together with {', '.join(accepted)}: {outcome.status}: {outcome.message}"
        return CandidatesResult(per, accepted, dropped, combined, combined_files)

    def _compare(self, reference: _SideRun, candidate: _SideRun, result: VerifyResult) -> list[tuple[str, str]]:
        from engine.verify.compare import check_run  # torch, only when there is something to compare

        statuses: list[tuple[str, str]] = []
        dtype = self.config.dtype
        for name, ref_case in reference.cases.items():
            if ref_case.get("status") != "ok":
                result.notes.append(f"{name}: skipped, the original model fails here too ({ref_case.get('message', '')[:300]})")
                continue
            new_case = candidate.cases.get(name, {"status": "error", "message": "not run"})
            if new_case.get("status") != "ok":
                phase = new_case.get("phase", "")
                status = R.INCOMPATIBLE if phase == "load_state_dict" else (R.OOM if new_case["status"] == "oom" else R.ERROR)
                message = f"{name} ({phase}): {new_case.get('message', '')}"
                result.cases.append(CaseResult(name, phase or "build", False, message=message))
                statuses.append((status, message))
                continue
            for run in ref_case["runs"]:
                mode, run_dtype = run.split("|")
                if run_dtype != dtype:
                    continue
                prefix = f"{name}|{run}|"
                ref64_prefix = f"{name}|{mode}|float64|"
                checks = check_run(_prefixed(reference.tensors, prefix), _prefixed(candidate.tensors, prefix), dtype,
                                   _prefixed(reference.tensors, ref64_prefix) or None)
                case = _case_of(name, run, checks)
                result.cases.append(case)
                if not case.passed:
                    statuses.append((R.FAILED, f"{name} {run}: {case.message}"))
            smoke_ok = new_case.get("train_smoke_finite") or not ref_case.get("train_smoke_finite")
            result.cases.append(CaseResult(name, "train-dropout", bool(smoke_ok),
                                           message="" if smoke_ok else "non-finite loss in train mode with dropout"))
            if not smoke_ok:
                statuses.append((R.FAILED, f"{name}: non-finite loss in train mode with dropout"))
            statuses += self._compare_shipped(name, ref_case, new_case, reference, candidate, result)
            statuses += self._compare_probes(name, ref_case, new_case, reference, candidate, result)
        return statuses

    def _compare_probes(self, name: str, ref_case: dict, new_case: dict, reference: _SideRun, candidate: _SideRun,
                        result: VerifyResult) -> list[tuple[str, str]]:
        """Inputs beyond the harness's (child.run_probes): each probe the original could run must run
        on the rewritten side and agree. Mask and layout probes are compared in the compared dtype
        against the original's float64 run of the same inputs; low-precision probes in their dtype
        against the original's float64 run of the harness's inputs. A probe's errors are listed with
        the others but are not the headline error of a low-precision run."""
        from engine.verify.compare import NAN_ORIGINAL, check_run

        statuses: list[tuple[str, str]] = []
        for label, ref_probe in (ref_case.get("probes") or {}).items():
            if ref_probe.get("status") != "ok":
                result.notes.append(f"{name}: probe {label} skipped, the original model fails on it "
                                    f"({ref_probe.get('message', '')[:200]})")
                continue
            new_probe = (new_case.get("probes") or {}).get(label, {"status": "error", "message": "not run"})
            run = f"probe:{label}"
            if new_probe.get("status") != "ok":
                message = f"{name} probe {label}: the rewritten model fails where the original runs: " \
                          f"{new_probe.get('message', '')[:600]}"
                result.cases.append(CaseResult(name, run, False, message=message))
                statuses.append((R.FAILED, message))
                continue
            low = label in self.config.low_precision
            dtype = label if low else self.config.dtype
            ref64 = _prefixed(reference.tensors, f"{name}|eval|float64|" if low else f"{name}|{run}|float64|")
            checks = check_run(_prefixed(reference.tensors, f"{name}|{run}|{dtype}|"),
                               _prefixed(candidate.tensors, f"{name}|{run}|{dtype}|"), dtype, ref64 or None,
                               nan_original_grads_ok=not low)
            excused = [c for c in checks if c.passed and c.criterion == NAN_ORIGINAL]
            case = _case_of(name, run, checks, headline=not low)
            result.cases.append(case)
            if excused:
                result.notes.append(f"{name} probe {label}: the original's gradient is NaN where the rewrite's is "
                                    f"finite ({', '.join(c.key for c in excused[:3])}); compared elsewhere")
            if not case.passed:
                statuses.append((R.FAILED, f"{name} probe {label}: {case.message}"))
        return statuses

    def _compare_shipped(self, name: str, ref_case: dict, new_case: dict, reference: _SideRun, candidate: _SideRun,
                         result: VerifyResult) -> list[tuple[str, str]]:
        """Dropout as the model ships: the rewrite must drop in exactly the modes the original drops
        in, and where neither drops in eval mode the outputs must agree."""
        from engine.verify.compare import check_run

        ref, new = ref_case.get("shipped"), new_case.get("shipped")
        if not ref or not new:
            return []
        problems = [f"in {mode} mode the original {'drops' if ref['drops'][mode] else 'does not drop'} "
                    f"and the rewrite {'does' if new['drops'][mode] else 'does not'}"
                    for mode in ("eval", "train") if ref["drops"].get(mode) != new["drops"].get(mode)]
        checks = []
        if not problems and not ref["drops"]["eval"]:
            prefix = f"{name}|shipped|"
            pick = lambda tensors: {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}  # noqa: E731
            checks = check_run(pick(reference.tensors), pick(candidate.tensors), "float32")
            problems += [f"{c.key}: {c.message}" for c in checks if not c.passed][:5]
        case = CaseResult(name, "eval-as-shipped", not problems, message="; ".join(problems),
                          max_abs_err=max((c.max_abs_err for c in checks), default=None),
                          max_rel_err=max((c.max_rel_err for c in checks), default=None), tensors=len(checks))
        result.cases.append(case)
        return [(R.FAILED, f"{name} with dropout as shipped: {case.message}")] if problems else []


def _prefixed(tensors: dict, prefix: str) -> dict:
    """The tensors saved under `prefix`, keyed by the rest of their names."""
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def _case_of(name: str, run: str, checks: list, headline: bool = True) -> CaseResult:
    """One compared run as a case: passed when every check did, its largest errors, and the first
    failing check (else the worst) named."""
    failed = [c for c in checks if not c.passed]
    worst = max(checks, key=lambda c: c.max_rel_err, default=None)
    named = failed[0] if failed else worst
    return CaseResult(
        name, run, not failed,
        max_abs_err=max((c.max_abs_err for c in checks), default=0.0),
        max_rel_err=worst.max_rel_err if worst else 0.0,
        worst=named.key if named else None,
        criterion=named.criterion if named else None,
        message="; ".join(f"{c.key}: {c.message}" for c in failed[:5]),
        tensors=len(checks), headline=headline,
    )


def _rule_kernels() -> tuple[str, ...]:
    from engine.scan import select_rules  # the rule library names its kernels

    return tuple(dict.fromkeys(r.kernel for r in select_rules("all") if getattr(r, "kernel", None)))


def _count_calls(reference: _SideRun, candidate: _SideRun, result: VerifyResult, kernels: tuple[str, ...]) -> None:
    """Sum each kernel's calls over the compared runs, per side: the runs both sides made (the
    original's float64 reference run has no rewritten counterpart, and counting its calls would
    hide the rewrite's where the original already calls the kernel)."""
    for name, ref_case in reference.cases.items():
        new_case = candidate.cases.get(name) or {}
        both = set(ref_case.get("kernel_calls") or {}) & set(new_case.get("kernel_calls") or {})
        for side, case in ((0, ref_case), (1, new_case)):
            for run, calls in (case.get("kernel_calls") or {}).items():
                if run not in both:
                    continue
                for kernel, n in calls.items():
                    if kernel in kernels:
                        result.kernel_calls.setdefault(kernel, [0, 0])[side] += int(n)


def _site_hits(candidate: _SideRun) -> dict:
    """kernel -> "PATH:LINE" -> calls from there, over the rewritten side's compared runs."""
    hits: dict = {}
    for case in candidate.cases.values():
        for kernel, where in (case.get("kernel_sites") or {}).items():
            for place, n in where.items():
                hits.setdefault(kernel, {})[place] = hits.get(kernel, {}).get(place, 0) + int(n)
    return hits


def _site_coverage(sites: list[Site], site_hits: list[tuple[dict, str]], result: VerifyResult) -> list[tuple[str, str]]:
    """Each kernel call the rewrite adds must have run (in some target group's working copy): one
    that never did is not exercised, whatever the others did."""
    if not any(hits for hits, _ in site_hits):
        result.notes.append("coverage per call site not measured: the child recorded no call sites")
        return []
    missing = [site for site in sites if all(site in unexercised([site], hits, tree) for hits, tree in site_hits)]
    if not missing:
        return []
    where = ", ".join(site.label for site in missing[:8])
    return [(R.NOT_EXERCISED, f"the rewrite's kernel call at {where} never ran during verification "
             f"({len(sites) - len(missing)} of its {len(sites)} new call sites did): a guard or branch sent every "
             "call there down the original code, or no verified model reaches it")]


def _eligibility(candidate: _SideRun, result: VerifyResult, kernels: tuple[str, ...],
                 sites: list[Site]) -> list[tuple[str, str]]:
    """How many of the rewritten model's kernel calls a fused backend could take (on the device the
    child runs on: with only the fused backends enabled the call must succeed). A call it cannot take
    runs the math path, which materializes what the rewrite meant to save: where such a call is one
    the rewrite added, the rewrite fails ("runs the math path only"); other refused calls (the
    repository's own) are a note."""
    totals: dict = {}
    refused: dict = {}  # kernel -> "PATH:LINE" -> calls no fused backend took
    for case in candidate.cases.values():
        for kernel, entry in (case.get("kernel_eligibility") or {}).items():
            if kernel in kernels:
                total = totals.setdefault(kernel, {"fused": 0, "math only": 0, "why": "", "on": entry.get("on", "")})
                total["fused"] += entry.get("fused", 0)
                total["math only"] += entry.get("math only", 0)
                total["why"] = total["why"] or entry.get("why", "")
                for place, n in (entry.get("sites") or {}).items():
                    refused.setdefault(kernel, {})[place] = refused.get(kernel, {}).get(place, 0) + n
    for kernel, total in totals.items():
        result.kernel_eligibility[kernel] = total
        if total["math only"]:
            result.notes.append(f"{kernel}: {total['math only']} of {total['fused'] + total['math only']} calls "
                                f"no fused kernel takes{' on ' + total['on'] if total['on'] else ''} (they run the math path and cannot pay): {total['why']}")
    math_only = [site for site in sites if not unexercised([site], refused, candidate.tree_dir)]
    if not math_only:
        return []
    where = ", ".join(site.label for site in math_only[:8])
    why = "; ".join(dict.fromkeys(totals[site.kernel]["why"] for site in math_only if site.kernel in totals))
    return [(R.FAILED, f"the rewrite's kernel call at {where} runs the math path only: no fused kernel takes it "
             f"({why}), so it cannot pay")]


def _coverage(result: VerifyResult, kernels: tuple[str, ...]) -> list[tuple[str, str]]:
    counted = {k: v for k, v in result.kernel_calls.items() if k in kernels}
    if not counted:
        result.notes.append(f"coverage not measured: {', '.join(kernels)} could not be counted in the child")
        return []
    if any(new > old for old, new in counted.values()):
        return []
    calls = "; ".join(f"{k}: {new} call(s) in the rewritten model, {old} in the original" for k, (old, new) in counted.items())
    return [(R.NOT_EXERCISED, "the outputs agree, but the rewritten code path never ran during verification "
             f"({calls}): a guard or branch sent every call down the original code")]


def verify(original_root: Path, rewritten: dict[str, str] | Path, targets: list[Target] | None = None, *,
           config: VerifyConfig | None = None, kernels: tuple[str, ...] = ()) -> VerifyResult:
    """Verify one rewrite: the original tree against it (a ``{path: text}`` overlay or a rewritten
    copy of the tree). ``targets`` default to what ``discover_targets`` finds."""
    with Verifier(original_root, targets, config=config) as verifier:
        return verifier.check(overlay_from(Path(original_root), rewritten), kernels)


def verify_candidates(original_root: Path, candidates: list[Candidate], targets: list[Target] | None = None, *,
                      config: VerifyConfig | None = None, combine=None, on_check=None) -> CandidatesResult:
    """Verify each candidate on its own, drop the failures, then verify the survivors together
    (see ``Verifier.candidates``)."""
    with Verifier(original_root, targets, config=config) as verifier:
        return verifier.candidates(candidates, combine=combine, on_check=on_check)
