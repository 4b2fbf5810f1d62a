"""Verify and benchmark the hand-written rewrites of examples/minigpt (the README's demo).

    python -m benchmarks.bench_minigpt                     # CPU, float32, batch 8 x seq 512
    python -m benchmarks.bench_minigpt --device cuda --dtype bfloat16 --json out.json

Each rewrite (benchmarks/minigpt_rewrites.py) is verified on its own and all together; then the
training step of the original and of the fully rewritten model is timed and its peak memory
measured. Until the engine synthesizes these rewrites itself, this is the reference for what
`adopter scan examples/minigpt --verify --bench` should report.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.minigpt_rewrites import EXAMPLE, rewrites, wrong_scale
from engine.bench import BenchConfig, bench
from engine.report import render_pr_body
from engine.verify import Candidate, VerifyConfig, verify_candidates


def _estimate(estimate, unit: str) -> str:
    """A median with its 95% confidence interval, as the PR body quotes it."""
    if estimate is None:
        return "n/a"
    if estimate.ci95 is None:
        return f"{estimate.median:.2f}{unit} (too few rounds for an interval)"
    low, high = estimate.ci95
    return f"{estimate.median:.2f}{unit} (95% CI {low:.2f}{unit} to {high:.2f}{unit})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--skip-verify", action="store_true")
    parser.add_argument("--json", help="write all results to this file")
    parser.add_argument("--report", help="write the pull request body (Markdown) to this file")
    args = parser.parse_args(argv)

    candidates = [Candidate(rule, files) for rule, files in rewrites().items()]
    candidates.append(Candidate("wrong-scale (negative control)", wrong_scale()))
    verification = None
    if not args.skip_verify:
        verification = verify_candidates(EXAMPLE, candidates, config=VerifyConfig(threads=args.threads))
        for cid, result in verification.per_rewrite.items():
            print(f"verify {cid:32s} {result.status:8s} max rel err {result.max_rel_err or 0:.2e}  ({result.duration_s:.0f}s)")
        combined = verification.combined
        print(f"verify {'all accepted together':32s} {combined.status if combined else 'n/a':8s} "
              f"accepted={verification.accepted} dropped={sorted(verification.dropped)}")
        files = verification.combined_files
    else:
        from benchmarks.minigpt_rewrites import all_rewrites

        files = all_rewrites()

    config = BenchConfig(device=args.device, dtype=args.dtype, repeats=args.repeats, warmup=args.warmup,
                         threads=args.threads, shape={"batch_size": args.batch_size, "seq_len": args.seq_len})
    result = bench(EXAMPLE, files, config=config)
    if not result.ok:
        print(f"bench failed: {result.status}: {result.message}", file=sys.stderr)
        return 1
    ratios = sorted(result.pair_ratios)
    print(f"bench  {result.device} ({result.device_name}) {result.dtype} shape {result.shape} threads {result.threads}")
    print(f"       step time  {result.baseline_step_s * 1000:8.1f} ms -> {result.optimized_step_s * 1000:8.1f} ms"
          f"   speedup {_estimate(result.speedup, 'x')} (per-round {ratios[0]:.2f}x..{ratios[-1]:.2f}x, "
          f"{len(ratios)} rounds)")
    print(f"       peak mem   {result.baseline_peak_bytes / 2**20:8.1f} MiB -> {result.optimized_peak_bytes / 2**20:8.1f} MiB"
          f"   reduction {'n/a' if result.memory_reduction is None else f'{result.memory_reduction:.1%}'}"
          f"  ({result.memory_metric})")
    print(f"       versions   {result.versions}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"verification": verification.to_dict() if verification else None, "bench": result.to_dict()},
                      handle, indent=2)
    if args.report:
        findings = [{"rule_id": rule, "path": next(iter(files_)), "line": 0} for rule, files_ in rewrites().items()]
        with open(args.report, "w") as handle:
            handle.write(render_pr_body({"findings": findings, "verification": verification, "bench": result,
                                         "repository": "examples/minigpt",
                                         "reproduce": "python -m benchmarks.bench_minigpt"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
