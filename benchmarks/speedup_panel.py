"""Scan, verify and benchmark a panel of transformers==4.34.1 architectures; next to each, the same
model with the library's own hand-written SDPA attention from a later transformers release.

    python -m benchmarks.speedup_panel                                   # every model, CPU, float32
    python -m benchmarks.speedup_panel --models bert,llama,vit --json panel.json
    python -m benchmarks.speedup_panel --device cuda --dtype bfloat16 --batch-size 8

Per model: the installed package's ``transformers/models/<name>/modeling_<name>.py`` is scanned with
the default rules; the rewrites are verified (each on its own, then together) by building the
affected model classes from a small config against a *patched copy* of the package (the installed
one is never edited, see docs/harness.md); then the training step of the base model (hidden 256,
4 layers, 4 heads, ``--batch-size`` x ``--seq-len`` tokens, 224x224 images for ViT) is timed,
original against rewritten, and peak memory measured (``engine.bench``). Printed: the rules applied
(and near-misses, with their reason, where nothing could be rewritten), the verification result,
the speedup (original step time / rewritten step time) and the peak-memory ratio (rewritten /
original). Results are printed as each model finishes; ``--json`` keeps them all. Beside the
verification result: how many of the rewritten model's attention calls the fused kernels alone take
on the benchmark's device and dtype (``fused-eligible on cuda bfloat16: 56/56 calls``).
``--jobs N`` verifies N models at once (child processes sharing the cores) before the benchmarks,
which then run one at a time; ``--bench-budget S`` caps each model's timed rounds.
``benchmarks/device_panel.sh`` runs it on a CUDA machine.

The library's own SDPA (``attn_implementation="sdpa"``, added in transformers 4.36) needs a newer
transformers than the one Adopter targets here, so it runs in a separate virtual environment as a
subprocess of this script (``--sdpa-python``, default ``/tmp/tf-new/bin/python``). Make one that
reuses this venv's torch (no second torch download) and has its own transformers:

    python -m venv /tmp/tf-new
    echo "$(python -c 'import site; print(site.getsitepackages()[0])')" \\
        > "$(/tmp/tf-new/bin/python -c 'import site; print(site.getsitepackages()[0])')/main-venv.pth"
    /tmp/tf-new/bin/pip install transformers==4.46.3

(or ``/tmp/tf-new/bin/pip install torch==2.13.0 transformers==4.46.3`` for a self-contained one).
In that interpreter the same engine.bench runs the same base model class with
``attn_implementation="eager"`` (baseline) against ``"sdpa"`` (the library's hand-written
rewrite), same weights, same sizes. Architectures without an SDPA path in that release (T5,
GPT-Neo) are marked so; when the interpreter is missing the column says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine.bench.stats import point

REPO = Path(__file__).resolve().parents[1]

# name -> (folder under transformers/models, base model class to benchmark, config overrides)
PANEL: dict[str, tuple[str, str, dict]] = {
    "bert": ("bert", "BertModel", {}),
    "roberta": ("roberta", "RobertaModel", {}),
    "gpt2": ("gpt2", "GPT2Model", {}),
    "gpt-neo": ("gpt_neo", "GPTNeoModel", {}),
    "t5": ("t5", "T5Model", {}),
    "bart": ("bart", "BartModel", {}),
    "vit": ("vit", "ViTModel", {}),
    "llama": ("llama", "LlamaModel", {}),
    "opt": ("opt", "OPTModel", {}),
    "whisper": ("whisper", "WhisperModel", {"max_source_positions": None}),  # None: the encoder runs --seq-len
    "clip": ("clip", "CLIPTextModel", {}),
}


def _overrides(name: str, seq_len: int) -> dict:
    return {k: (seq_len if v is None else v) for k, v in PANEL[name][2].items()}


def _target(package_dir: Path, name: str, seq_len: int, extra: dict | None = None):
    from engine.verify import HFTarget

    folder, model_class, _ = PANEL[name]
    return HFTarget(package_dir=package_dir, module=f"transformers.models.{folder}.modeling_{folder}",
                    model_class=model_class, config_overrides={**_overrides(name, seq_len), **(extra or {})})


def _bench_config(args):
    from engine.bench import BenchConfig

    return BenchConfig(device=args.device, dtype=args.dtype, repeats=args.repeats, warmup=args.warmup,
                       threads=args.threads, shape={"batch_size": args.batch_size, "seq_len": args.seq_len},
                       **({"budget_s": args.bench_budget} if args.bench_budget else {}))


def _ratios(bench: dict | None) -> tuple[float | None, float | None]:
    if not bench or bench.get("status") != "ok":
        return None, None
    mem = None
    if bench.get("baseline_peak_bytes") and bench.get("optimized_peak_bytes") is not None:
        mem = bench["optimized_peak_bytes"] / bench["baseline_peak_bytes"]
    return point(bench.get("speedup")), mem


def _fmt(bench: dict) -> str:
    speedup, mem = _ratios(bench)
    ci = (bench.get("speedup") or {}).get("ci95") if isinstance(bench.get("speedup"), dict) else None
    s = f"{speedup:.2f}x" if speedup is not None else "n/a"
    if ci:
        s += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    m = f"{mem:.2f}" if mem is not None else "n/a"
    rounds = bench.get("pair_ratios") or []
    spread = f" (rounds {min(rounds):.2f}..{max(rounds):.2f})" if rounds else ""
    return f"speedup {s:>6s}{spread}, peak mem after/before {m:>5s}"


# --------------------------------------------------------------------------------------------------
# Adopter's rewrite (this interpreter, transformers 4.34.1)


def _with_sources(package: Path, rel: str) -> list[str]:
    """`rel` (under the package's models/) and the model files its `# Copied from` marks name."""
    from engine.synthesize.copies import marked_blocks

    found = [rel]
    for block in marked_blocks((package / "models" / rel).read_text(encoding="utf-8"), rel):
        parts = block.source.removeprefix("transformers.").removeprefix("models.").split(".")
        if parts[0] == "models":
            parts = parts[1:]
        for cut in range(len(parts) - 1, 0, -1):
            candidate = "/".join(parts[:cut]) + ".py"
            if (package / "models" / candidate).is_file():
                if candidate not in found:
                    found.append(candidate)
                break
    return found


def verify_ours(name: str, args) -> tuple[dict, dict | None]:
    """Scan the model's files and verify the rewrites (no benchmark): the panel row and the files
    that passed (None where nothing is left to benchmark). Verification runs in child processes, so
    several models can be verified at once (``--jobs``); benchmarks then run one at a time."""
    import transformers

    from engine.pipeline import verify_and_bench
    from engine.scan import scan_path

    package = Path(transformers.__file__).resolve().parent
    folder = PANEL[name][0]
    root = package / "models"
    started = time.monotonic()
    # the model's file and the files its `# Copied from` blocks copy (RoBERTa's attention is BERT's,
    # Whisper's BART's): a copy is rewritten together with its source or not at all
    result = scan_path(root, rules=args.rules, include=_with_sources(package, f"{folder}/modeling_{folder}.py"))
    sites: dict[str, int] = {}
    near: list[str] = []
    for f in result.findings:
        if f.status in ("rewritten", "guarded"):
            key = f"{f.rule_id}" + (" (guarded)" if f.status == "guarded" else "")
            sites[key] = sites.get(key, 0) + 1
        elif f.status == "near-miss":
            near.append(f"{f.rule_id} near-miss at line {f.line}: {f.reason}")
    out = {"model": name, "transformers": transformers.__version__, "sites": sites, "near_misses": near,
           "scan_s": round(time.monotonic() - started, 1)}
    if not sites:
        out["verification"] = out["benchmark"] = None
        out["note"] = "no rule rewrote this model's code" + (f" ({len(near)} near-miss(es))" if near else "")
        return out, None
    # models verified at once share the cores (each child would otherwise take them all)
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else args.threads
    outcome = verify_and_bench(result, root, verify=not args.no_verify, bench=False, device=args.device,
                               dtype=args.dtype, threads=threads, bench_target=_target(package, name, args.seq_len),
                               log=lambda line: print(f"  [{name}] {line}", flush=True))
    files = outcome.pop("files", None)
    out.update({k: outcome[k] for k in ("rewrites", "verification", "notes")})
    out["verify_s"] = round(time.monotonic() - started, 1)
    return out, (files or None)


def bench_ours(name: str, args, out: dict, files: dict | None) -> dict:
    """Time the training step, original against the verified rewrites (``out`` from verify_ours)."""
    import transformers

    from engine.bench import bench

    if files is None:
        if out.get("sites"):
            out["benchmark"] = {"status": "skipped", "message": "no rewrite passed verification"}
        return out
    started = time.monotonic()
    package = Path(transformers.__file__).resolve().parent
    print(f"  [{name}] benchmarking the training step on {args.device} ({args.dtype}), original against rewritten",
          flush=True)
    out["benchmark"] = bench(package / "models", files, _target(package, name, args.seq_len),
                             config=_bench_config(args)).to_dict()
    out["bench_s"] = round(time.monotonic() - started, 1)
    return out


# --------------------------------------------------------------------------------------------------
# The library's own SDPA (a newer transformers, in another interpreter)


def sdpa_worker(name: str, args) -> dict:
    """Runs inside the newer transformers' interpreter: eager against sdpa, same engine.bench."""
    import transformers

    from engine.bench import bench

    package = Path(transformers.__file__).resolve().parent
    folder = PANEL[name][0]
    source = (package / "models" / folder / f"modeling_{folder}.py").read_text()
    out = {"model": name, "transformers": transformers.__version__}
    if PANEL[name][1] not in source:
        out.update(status="skipped", message=f"no {PANEL[name][1]} in transformers {transformers.__version__}")
        return out
    if "_supports_sdpa = True" not in source:
        out.update(status="no-sdpa", message=f"transformers {transformers.__version__} has no SDPA path for {name}")
        return out
    eager = _target(package, name, args.seq_len, {"_attn_implementation": "eager"})
    sdpa = _target(package, name, args.seq_len, {"_attn_implementation": "sdpa"})
    result = bench(package, {}, eager, config=_bench_config(args), rewritten_target=sdpa)
    out.update(result.to_dict())
    return out


def run_library_sdpa(name: str, args) -> dict:
    python = Path(args.sdpa_python)
    if not python.exists():
        return {"model": name, "status": "unavailable",
                "message": f"{python} not found: see this script's docstring to make the newer-transformers venv"}
    command = [str(python), "-m", "benchmarks.speedup_panel", "--sdpa-worker", name, "--device", args.device,
               "--dtype", args.dtype, "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
               "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    try:
        run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "status": "timeout", "message": f"over {args.timeout}s"}
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not lines:
        return {"model": name, "status": "error", "message": (run.stderr or run.stdout)[-1500:]}
    return json.loads(lines[-1])


# --------------------------------------------------------------------------------------------------


def _eligible(verification: dict) -> str:
    """The rewritten model's kernel calls a fused backend took, where it was asked (the run's device
    and dtype), from the combined rewrite's verification (else each rewrite's)."""
    rows = [verification["combined"]] if verification.get("combined") else list(verification["per_rewrite"].values())
    fused = math = 0
    on, why = "", ""
    for row in rows:
        for entry in (row.get("kernel_eligibility") or {}).values():
            fused, math = fused + entry.get("fused", 0), math + entry.get("math only", 0)
            on, why = on or entry.get("on", ""), why or entry.get("why", "")
    if not fused + math:
        return "fused-eligible: no kernel call counted"
    return f"fused-eligible{' on ' + on if on else ''}: {fused}/{fused + math} calls" + (f" ({why[:120]})" if math else "")


def _line(ours: dict, lib: dict | None) -> str:
    rules = ", ".join(f"{k} x{v}" for k, v in ours["sites"].items()) or "none"
    parts = [f"{ours['model']:8s} rules: {rules}"]
    v = ours.get("verification")
    if ours.get("note"):
        parts.append(f"verify: n/a ({ours['note']})")
    elif v is None:
        parts.append("verify: skipped")
    else:
        rows = v["per_rewrite"]
        # max rel err is relative to each tensor's largest entry: on a gradient that is zero in exact
        # arithmetic (a key bias under softmax) it is noise over noise; such tensors pass against float64
        worst_abs = max((r["max_abs_err"] for r in rows.values() if r["max_abs_err"] is not None), default=None)
        worst = max((r["max_rel_err"] for r in rows.values() if r["max_rel_err"] is not None), default=None)
        status = "passed" if v["accepted"] and not v["dropped"] else ("partly passed" if v["accepted"] else "FAILED")
        parts.append(f"verify: {status}" + (f" (max abs err {worst_abs:.1e}, max rel err {worst:.1e})"
                                            if worst is not None and worst_abs is not None else "")
                     + (f"; dropped {', '.join(v['dropped'])}" if v["dropped"] else ""))
        parts.append(_eligible(v))
    b = ours.get("benchmark")
    if b is not None:
        parts.append("ours: " + (_fmt(b) if b.get("status") == "ok" else f"bench {b.get('status')}: "
                                 f"{str(b.get('message', ''))[:200]}"))
    if lib is not None:
        if lib.get("status") == "ok":
            parts.append(f"library sdpa ({lib.get('transformers')}): " + _fmt(lib))
        else:
            parts.append(f"library sdpa: {lib.get('status')} ({str(lib.get('message', ''))[:200]})")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(PANEL), help=f"comma-separated, from: {', '.join(PANEL)}")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bench-budget", type=float, default=None,
                        help="seconds of timed rounds per model (default: engine.bench's); past it the interval is as wide as it is")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rules", default="default")
    parser.add_argument("--no-verify", action="store_true", help="benchmark without verifying (not for reports)")
    parser.add_argument("--no-library-sdpa", action="store_true", help="skip the newer transformers' SDPA column")
    parser.add_argument("--sdpa-python", default="/tmp/tf-new/bin/python",
                        help="interpreter with a transformers that supports attn_implementation='sdpa'")
    parser.add_argument("--timeout", type=int, default=3600, help="per library-SDPA subprocess, seconds")
    parser.add_argument("--json", help="write every result here (rewritten after each model)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="models verified at once (child processes); the benchmarks run one at a time after")
    parser.add_argument("--sdpa-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))

    if args.sdpa_worker:
        print(json.dumps(sdpa_worker(args.sdpa_worker, args)))
        return 0
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in PANEL]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {list(PANEL)}")
    print(f"panel: {names} on {args.device} {args.dtype}, batch {args.batch_size} x seq {args.seq_len}, "
          f"{args.repeats} interleaved rounds after {args.warmup} warm-up steps", flush=True)
    results = []

    def verified(name: str) -> tuple[dict, dict | None]:
        try:
            return verify_ours(name, args)
        except Exception as exc:  # one model's failure must not end the panel
            return {"model": name, "sites": {}, "note": f"error: {type(exc).__name__}: {exc}"}, None

    ahead: dict = {}
    if args.jobs > 1:  # every model verified first, several at once; nothing else runs while a benchmark is timed
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            ahead = dict(zip(names, pool.map(verified, names), strict=True))
    for name in names:
        ours, files = ahead[name] if name in ahead else verified(name)
        try:
            ours = bench_ours(name, args, ours, files)
        except Exception as exc:  # noqa: BLE001
            ours["benchmark"] = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
        lib = None if args.no_library_sdpa else run_library_sdpa(name, args)
        results.append({"ours": ours, "library_sdpa": lib})
        print(_line(ours, lib), flush=True)
        for miss in ours.get("near_misses", [])[:3] if not ours.get("sites") else []:
            print(f"         {miss}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
