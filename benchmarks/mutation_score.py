"""Mutation score of the verifier: known-wrong attention rewrites injected into real models, and
the share the verifier rejects (target: all of them).

    PYTHONPATH=$PWD python benchmarks/mutation_score.py [--models minigpt,padded-encoder,bert,swin]

For each model the engine's own rewrite (rule sdpa-attention) is the base; it must pass, or the
score would measure nothing. Each mutant of ``engine.verify.mutants`` is then verified like a
candidate rewrite, with coverage of the kernel, except the mutants of the original code
(``ON_ORIGINAL``: the softmax over the wrong axis), which have no kernel call and must be caught by
their numbers alone; "caught" means any status but passed. A mutant that is provably equivalent on
one model (``EQUIVALENT``, with the reason) is run and shown but left out of the score. Prints one
line per mutant and the score.

Models: minigpt (examples/minigpt: a causal mask in a buffer), padded-encoder (a model taking a
padding mask as input, `masked_fill(mask == 0, -1e9)` as The Annotated Transformer writes it:
tests/engine/verify/fixtures.py), and with transformers installed BERT (an additive padding mask)
and Swin (a relative position bias as the float mask).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: import the checkout's engine
    sys.path.insert(0, str(ROOT))

from engine.scan import scan_source, select_rules  # noqa: E402
from engine.verify import Verifier, VerifyConfig  # noqa: E402
from engine.verify.mutants import ON_ORIGINAL, mutants  # noqa: E402

SDPA = "torch.nn.functional.scaled_dot_product_attention"

# (model, mutant) -> why the mutant computes what the original does on that model
EQUIVALENT = {
    ("minigpt", "fully masked rows' fix-up dropped"):
        "the causal mask keeps each query's own key, so no row is fully masked and the fix-up is the identity",
}


def _models(scratch: Path) -> dict:
    """name -> (root, the file rewritten, verification settings, targets or None to discover them)"""
    out = {"minigpt": (ROOT / "examples" / "minigpt", "model.py", VerifyConfig(timeout_s=300), None)}
    from tests.engine.verify.fixtures import write_masked_repo

    out["padded-encoder"] = (write_masked_repo(scratch / "padded-encoder"), "model.py",
                             VerifyConfig(timeout_s=300, shapes=({"batch_size": 3, "seq_len": 9},)), None)
    try:
        import transformers
    except ImportError:
        return out
    from engine.verify import HFTarget

    package = Path(transformers.__file__).parent
    out["bert"] = (package / "models" / "bert", "modeling_bert.py",
                   VerifyConfig(timeout_s=300, hf_max_models=1, shapes=({"batch_size": 2, "seq_len": 12},)), None)
    # Swin's sizes are per stage (lists), which the generic small config does not set: two stages of
    # two blocks, 8 x 8 patches in 4 x 4 windows, so that every second block is shifted (its window
    # mask takes the guarded original path) and the others run the kernel with the position bias
    swin = HFTarget(package_dir=package, module="transformers.models.swin.modeling_swin", model_class="SwinModel",
                    shapes=({"batch_size": 2},),
                    config_overrides={"depths": [2, 2], "num_heads": [2, 4], "num_layers": 2, "embed_dim": 32,
                                      "hidden_size": 64, "window_size": 4, "image_size": 32, "patch_size": 4})
    out["swin"] = (package / "models" / "swin", "modeling_swin.py", VerifyConfig(timeout_s=300), [swin])
    return out


def score(name: str, root: Path, rel: str, config: VerifyConfig, targets) -> tuple[int, int]:
    original = (root / rel).read_text()
    _, rewritten = scan_source(original, select_rules("sdpa-attention"), rel, rel[:-3])
    if rewritten == original:
        print(f"{name}: the engine does not rewrite {rel}; nothing to mutate")
        return 0, 0
    caught = total = 0
    with Verifier(root, targets, config=config) as verifier:
        base = verifier.check({rel: rewritten}, (SDPA,))
        print(f"{name}: base rewrite {base.status} ({base.message[:160]})")
        if not base.passed:
            print(f"{name}: the correct rewrite does not pass; its mutants would say nothing")
            return 0, 0
        for label, text in mutants(original, rewritten).items():
            started = time.monotonic()
            result = verifier.check({rel: text}, () if label in ON_ORIGINAL else (SDPA,))
            equivalent = EQUIVALENT.get((name, label))
            if equivalent is None:
                total += 1
                caught += not result.passed
                verdict = "caught" if not result.passed else "MISSED"
            else:
                verdict = "equiv." if result.passed else "REJECTED"  # rejecting a correct program is a false alarm
            print(f"{name}: {label:36s} {verdict:7s} {result.status:14s} {time.monotonic() - started:5.1f}s "
                  f"{(equivalent or result.message)[:140]}")
            sys.stdout.flush()
    return caught, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minigpt,padded-encoder,bert,swin")
    args = parser.parse_args(argv)
    caught = total = 0
    with tempfile.TemporaryDirectory(prefix="adopter-mutants-") as scratch:
        available = _models(Path(scratch))
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
