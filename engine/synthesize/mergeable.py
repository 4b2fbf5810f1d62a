"""Would a maintainer merge this rewrite as it stands? The checks the suite and the benchmarks run
on every rewritten file, against its original.

  * it compiles;
  * no new ruff finding among E501 (at the repository's line length), F401 (unused import) and
    F841 (unused local), counted by code and line text, so that findings the original already
    had, moved by the edit, are not counted again;
  * no dead branch (`if True:`, `if False:`, `else: pass`) and no `if C:` directly inside an
    `if C:`, beyond those the original already had.

Idempotence (a second scan changes nothing) needs the scanner and is checked by its callers.
"""

from __future__ import annotations

import ast
import json
import subprocess
from collections import Counter
from dataclasses import dataclass, field

from engine.synthesize.style import DEFAULT_LINE_LENGTH, _ruff_binary

LINT_CODES = ("E501", "F401", "F841")


@dataclass
class Verdict:
    compiles: bool = True
    new_lint: list[str] = field(default_factory=list)  # "E501: <line text>"
    dead_branches: list[str] = field(default_factory=list)
    repeated_guards: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.compiles and not self.new_lint and not self.dead_branches and not self.repeated_guards

    def problems(self) -> list[str]:
        out = [] if self.compiles else ["does not compile"]
        out += [f"new lint {x}" for x in self.new_lint]
        out += [f"dead branch {x}" for x in self.dead_branches]
        out += [f"repeated guard {x}" for x in self.repeated_guards]
        return out


def lint(text: str, line_length: int = DEFAULT_LINE_LENGTH) -> Counter:
    """ruff's E501/F401/F841 findings of `text`, as (code, stripped line) counts."""
    binary = _ruff_binary()
    if binary is None:
        raise RuntimeError("ruff is not installed; it is a dependency of adopter")
    done = subprocess.run(
        [binary, "check", "--isolated", "--select", ",".join(LINT_CODES), "--line-length", str(line_length),
         "--output-format", "json", "--exit-zero", "--stdin-filename", "module.py", "-"],
        input=text, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ruff check failed: {done.stderr.strip()[:300]}")
    lines = text.splitlines()
    found: Counter = Counter()
    for item in json.loads(done.stdout or "[]"):
        row = item["location"]["row"]
        found[(item["code"], lines[row - 1].strip() if 0 < row <= len(lines) else "")] += 1
    return found


def _guards(tree: ast.AST) -> tuple[Counter, Counter]:
    dead: Counter = Counter()
    repeated: Counter = Counter()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = ast.unparse(node.test)
        if isinstance(node.test, ast.Constant):
            dead[f"if {test}:"] += 1
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.Pass):
            dead[f"if {test}: ... else: pass"] += 1
        for inner in node.body:
            if isinstance(inner, ast.If) and ast.unparse(inner.test) == test:
                repeated[f"if {test}: inside if {test}:"] += 1
    return dead, repeated


def check(original: str, rewritten: str, line_length: int = DEFAULT_LINE_LENGTH) -> Verdict:
    verdict = Verdict()
    try:
        compile(rewritten, "<rewritten>", "exec", dont_inherit=True)
        new_tree = ast.parse(rewritten)
    except (SyntaxError, ValueError):
        verdict.compiles = False
        return verdict
    before = lint(original, line_length)
    after = lint(rewritten, line_length)
    verdict.new_lint = [f"{code}: {text}" for (code, text), n in (after - before).items() for _ in range(n)]
    try:
        old_dead, old_repeated = _guards(ast.parse(original))
    except SyntaxError:
        old_dead, old_repeated = Counter(), Counter()
    dead, repeated = _guards(new_tree)
    verdict.dead_branches = sorted((dead - old_dead).elements())
    verdict.repeated_guards = sorted((repeated - old_repeated).elements())
    return verdict
