"""The scan stage as the end-to-end tests run it (``ADOPTER_ENGINE_SCAN=tests.worker.engine_hooks:scan_path``).

Two test-only additions around the engine, nothing more:

- a pause: while ``$ADOPTER_TEST_PAUSE_DIR/arm`` exists, a scan writes ``started`` there and waits
  for ``release``, so a test can kill the worker in the middle of a scan;
- a stand-in for ``engine.scan.scan_path`` used ONLY while ``engine/scan.py`` does not exist yet:
  it rewrites the two hand-written blocks of the fixture model (attention, tanh GELU) by text
  replacement and reports them as findings. As soon as ``engine.scan`` is importable, the real
  engine runs instead and the tests check what it produces.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

ATTENTION = (
    "        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)\n"
    "        probs = F.softmax(scores, dim=-1)\n"
    "        y = torch.matmul(probs, v)\n"
)
ATTENTION_NEW = "        y = F.scaled_dot_product_attention(q, k, v)\n"
GELU = "        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))\n"
GELU_NEW = '        h = F.gelu(h, approximate="tanh")\n'
STAND_IN_RULES = {"sdpa-attention": (ATTENTION, ATTENTION_NEW), "gelu-tanh": (GELU, GELU_NEW)}


def real_engine_available() -> bool:
    return importlib.util.find_spec("engine.scan") is not None


@dataclass
class Finding:
    rule_id: str
    path: str
    line: int
    end_line: int
    status: str
    reason: str | None = None
    message: str | None = None


@dataclass
class StandInResult:
    findings: list[Finding] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    diff: str = ""


def _stand_in(root: Path, rules: str) -> StandInResult:
    result = StandInResult()
    selected = {r: v for r, v in STAND_IN_RULES.items() if rules in ("default", r)}
    diffs = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(".git/"):
            continue
        text = new = path.read_text()
        for rule_id, (old, replacement) in selected.items():
            if old in new:
                line = new[: new.index(old)].count("\n") + 1
                result.findings.append(Finding(rule_id, relative, line, line + old.count("\n") - 1, "rewritten",
                                               message=f"stand-in rewrite ({rule_id})"))
                new = new.replace(old, replacement)
        if new != text:
            result.files[relative] = new
            diffs.append("".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                      f"a/{relative}", f"b/{relative}")))
    result.diff = "".join(diffs)
    return result


def _maybe_pause() -> None:
    pause = os.environ.get("ADOPTER_TEST_PAUSE_DIR")
    if not pause or not (Path(pause) / "arm").exists():
        return
    (Path(pause) / "started").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not (Path(pause) / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def scan_path(root: Path, *, rules: str = "default", include=None, exclude=None):
    _maybe_pause()
    if real_engine_available():
        from engine.scan import scan_path as real_scan_path

        return real_scan_path(root, rules=rules, include=include, exclude=exclude)
    return _stand_in(Path(root), rules)
