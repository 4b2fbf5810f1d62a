"""Mutation score of the verifier: known-wrong attention rewrites injected into real models, and
the share the verifier rejects (target: all of them).

    PYTHONPATH=$PWD python benchmarks/mutation_score.py [--models minigpt,bert]

For each model the engine's own rewrite (rule sdpa-attention) is the base; it must pass, or the
score would measure nothing. Each mutant of ``engine.verify.mutants`` is then verified like a
candidate rewrite (with coverage of the kernel); "caught" means any status but passed. Prints one
line per mutant and the score.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from engine.scan import scan_source, select_rules
from engine.verify import Verifier, VerifyConfig
from engine.verify.mutants import mutants

ROOT = Path(__file__).resolve().parent.parent
SDPA = "torch.nn.functional.scaled_dot_product_attention"


def _models() -> dict:
    out = {"minigpt": (ROOT / "examples" / "minigpt", "model.py", VerifyConfig(timeout_s=300))}
    try:
        import transformers
    except ImportError:
        return out
    bert = Path(transformers.__file__).parent / "models" / "bert"
    out["bert"] = (bert, "modeling_bert.py", VerifyConfig(timeout_s=300, hf_max_models=1,
                                                           shapes=({"batch_size": 2, "seq_len": 12},)))
    return out


def score(name: str, root: Path, rel: str, config: VerifyConfig) -> tuple[int, int]:
    original = (root / rel).read_text()
    _, rewritten = scan_source(original, select_rules("sdpa-attention"), rel, rel[:-3])
    if rewritten == original:
        print(f"{name}: the engine does not rewrite {rel}; nothing to mutate")
        return 0, 0
    caught = total = 0
    with Verifier(root, config=config) as verifier:
        base = verifier.check({rel: rewritten}, (SDPA,))
        print(f"{name}: base rewrite {base.status} ({base.message[:160]})")
        if not base.passed:
            print(f"{name}: the correct rewrite does not pass; its mutants would say nothing")
            return 0, 0
        for label, text in mutants(original, rewritten).items():
            started = time.monotonic()
            result = verifier.check({rel: text}, (SDPA,))
            total += 1
            caught += not result.passed
            verdict = "caught" if not result.passed else "MISSED"
            print(f"{name}: {label:36s} {verdict:7s} {result.status:14s} {time.monotonic() - started:5.1f}s "
                  f"{result.message[:140]}")
            sys.stdout.flush()
    return caught, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minigpt,bert")
    args = parser.parse_args(argv)
    available = _models()
    caught = total = 0
    for name in args.models.split(","):
        if name not in available:
            print(f"{name}: not available here (known: {', '.join(available)})")
            continue
        c, t = score(name, *available[name])
        caught, total = caught + c, total + t
    if total:
        print(f"mutation score: {caught}/{total} = {100.0 * caught / total:.0f}% of the known-wrong rewrites rejected")
    return 0 if total and caught == total else 1


if __name__ == "__main__":
    sys.exit(main())
