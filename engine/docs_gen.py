"""Generate docs/rules.md from the rule files, in the manner of Ruff's rule pages: per rule what it
does, why, the kernel and what it needs, the pattern, an example and what to use instead, and when
it does not apply (its near-miss examples).

    python -m engine.docs_gen            # rewrite docs/rules.md
    python -m engine.docs_gen --check    # exit 1 when docs/rules.md is out of date
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

from engine.match.rule import PArg, PStmt, Rule

REPO_ROOT = Path(__file__).resolve().parents[1]
RULES_MD = REPO_ROOT / "docs" / "rules.md"
REGENERATE = "python -m engine.docs_gen"


# ---------------------------------------------------------------------------------------------
# The match block, back to rule syntax


def render_literal(value: object) -> str:
    if value is True:
        return "True"
    if value is False:
        return "False"
    if value is None:
        return "None"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return repr(value)


def render_arg(arg: PArg) -> str:
    if arg.kind == "var":
        return f"${arg.value}"
    if arg.kind == "any":
        return "_"
    return render_literal(arg.value)


def _render_call(call: PStmt) -> str:
    ops = " | ".join(f"@{alt.name}" if alt.kind == "layer" else alt.name for alt in call.ops)
    args = [render_arg(a) for a in call.args] + [f"{name}={render_arg(a)}" for name, a in call.kwargs]
    if call.open_kwargs:
        args.append("...")
    return f"{ops}({', '.join(args)})"


def render_stmt(stmt: PStmt) -> str:
    out = f"${stmt.out} = " if stmt.out else ""
    calls = " | ".join(_render_call(alt) for alt in stmt.alternatives)
    return f"{out}{calls}{'?' if stmt.optional else ''}"


def render_pattern(pattern: tuple[PStmt, ...], near_miss: str | None = None) -> str:
    """One `match { ... }` block in the rule syntax (parses back to the same statements);
    `near_miss` gives the block's `near-miss "reason"` prefix."""
    body = "".join(f"  {render_stmt(s)}\n" for s in pattern)
    prefix = f"near-miss {render_literal(near_miss)} " if near_miss is not None else ""
    return f"{prefix}match {{\n{body}}}"


def match_blocks(rule: Rule) -> list[tuple[tuple[PStmt, ...], str | None]]:
    """The rule's match blocks as (statements, near-miss reason or None), in file order."""
    patterns = getattr(rule, "patterns", None)
    if patterns is None:  # a Rule with a single `pattern`
        return [(rule.pattern, None)]
    return [(p.stmts, p.near_miss) for p in patterns]


def render_match_blocks(rule: Rule) -> str:
    return "\n".join(render_pattern(stmts, reason) for stmts, reason in match_blocks(rule))


# ---------------------------------------------------------------------------------------------
# Markdown


def _fence(code: str, lang: str = "python") -> str:
    """A fenced block longer than any backtick run inside the code."""
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{code.rstrip()}\n{ticks}\n"


def _code(text: str) -> str:
    """Inline code that survives backticks in the text."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _relative(path: str) -> str:
    try:
        return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except (ValueError, OSError):
        return path


def _mode(rule: Rule) -> str:
    if rule.detect_only:
        return "detect-only"
    return "rewrites, guarded where needed" if rule.guard else "rewrites"


def _constraint_doc(name: str) -> str:
    from engine.match.constraints import CHECKS

    check = CHECKS.get(name)
    doc = inspect.getdoc(check) if check is not None else None
    return " ".join((doc or "").split())


def _what_it_does(rule: Rule) -> str:
    if rule.detect_only:
        text = (f"Reports each place in a model's code that matches the pattern below (status `detected`) as a "
                f"candidate for {_code(rule.kernel)}; it does not change the code.")
    else:
        text = f"Rewrites each place that matches the pattern below to use {_code(rule.kernel)} (status `rewritten`)"
        if rule.guard:
            text += (", or, where some path still needs the original computation, keeps the original code "
                     "behind a guard on that path and uses the kernel on the others (status `guarded`)")
        text += "."
    text += (" A structure that differs from the pattern only in a constant, or that fails the rule's "
             "conditions or scope analysis, is reported as a `near-miss` with the reason and left unchanged. "
             "A match on a path exclusive to a call of the kernel itself (the fallback of a fused path beside it, "
             "under a flag, a version check or an early return) is reported as `already-fused` and left unchanged.")
    return text


def render_rule(rule: Rule) -> str:
    parts: list[str] = [f'<a id="{rule.id}"></a>\n\n### {rule.id}\n\n']
    parts.append(f"{rule.summary}\n\n")
    facts = [f"- **Kernel:** {_code(rule.kernel)}", f"- **Fix:** {_mode(rule)}"]
    if rule.requires:
        facts.append("- **Requires:** " + ", ".join(_code(r) for r in rule.requires))
    if rule.imports:
        facts.append("- **Imports added:** " + ", ".join(_code(i) for i in rule.imports))
    if rule.ordered:
        facts.append("- **Operand order:** `add`/`mul` operands only in the written order")
    if rule.path:
        source = _relative(rule.path)
        facts.append(f"- **Source:** [{source}](../{source})" if not source.startswith("/") else f"- **Source:** {source}")
    parts.append("\n".join(facts) + "\n\n")

    parts.append("#### What it does\n\n" + _what_it_does(rule) + "\n\n")
    if rule.doc.strip():
        parts.append("#### Why\n\n" + rule.doc.strip() + "\n\n")
    if rule.constraints:
        parts.append("#### Conditions\n\nA match counts only where these hold (otherwise it is a near-miss):\n\n")
        parts.append("".join(f"- `{name}`: {_constraint_doc(name)}\n" for name in rule.constraints) + "\n")
    blocks = match_blocks(rule)
    intro = ""
    if len(blocks) > 1:
        intro = ("Any of these match blocks; a block marked `near-miss` describes a look-alike that is reported "
                 "with its reason and never changed:\n\n")
    parts.append("#### Pattern\n\n" + intro + _fence(render_match_blocks(rule), "text") + "\n")
    if not rule.detect_only and rule.rewrite:
        parts.append("Rewritten to (template):\n\n" + _fence(rule.rewrite, "text") + "\n")

    fires = [e for e in rule.examples if e.kind == "fires"]
    if fires:
        example = next((e for e in fires if e.expect is not None), fires[0])
        parts.append("#### Example\n\n" + _fence(example.code) + "\n")
        if example.expect is not None:
            parts.append("#### Use instead\n\n" + _fence(example.expect) + "\n")
        else:
            parts.append(f"#### Use instead\n\n{_code(rule.kernel)}" + (
                " (this rule detects only; the change is made by hand)" if rule.detect_only else "") + ".\n\n")

    misses = [e for e in rule.examples if e.kind == "near-miss"]
    if misses:
        parts.append("#### When it does not apply\n\n")
        for number, example in enumerate(misses, 1):
            if example.reason:
                said = f"Reported as a near-miss, reason: {_code(example.reason)}."
            elif example.count == 0:
                said = "Not matched, and not reported as a near-miss either."
            else:
                said = "Reported as a near-miss."
            parts.append(f"{number}. {said}\n\n" + _indent(_fence(example.code), "   ") + "\n")
    return "".join(parts).rstrip("\n") + "\n"


def _indent(text: str, prefix: str) -> str:
    return "".join(prefix + line if line.strip() else line for line in text.splitlines(keepends=True))


def _ordered(rules: list[Rule]) -> list[Rule]:
    """Current-kernel rules first, then the paper's, each by id (rule_1 ... rule_9 in number order)."""
    def key(rule: Rule):
        return (rule.id.startswith("paper/"), [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", rule.id)])

    return sorted(rules, key=key)


def render_rules_markdown(rules: list[Rule]) -> str:
    """docs/rules.md for `rules`: an index table, then one section per rule anchored by its id."""
    rules = _ordered(rules)
    current = [r for r in rules if not r.id.startswith("paper/")]
    paper = [r for r in rules if r.id.startswith("paper/")]
    out = [
        "# Rules\n\n",
        f"<!-- Generated from rules/**/*.rule by `{REGENERATE}`; do not edit by hand. -->\n\n",
        "Each rule is one `.rule` file under `rules/`, written in the rule syntax of [the DSL](dsl.md#rules). "
        "Its examples are its tests. `adopter scan --rules default` runs the current-kernel rules, "
        "`--rules paper` the paper's nine, `--rules all` both, `--rules ID,...` the named ones.\n\n",
        "| rule | summary | fix |\n|---|---|---|\n",
    ]
    for rule in rules:
        summary = rule.summary.replace("|", "\\|")
        out.append(f"| [{rule.id}](#{rule.id}) | {summary} | {_mode(rule)} |\n")
    out.append("\n")
    for title, group in (("Current kernels", current), ("The paper's rules", paper)):
        if not group:
            continue
        out.append(f"## {title}\n\n")
        out.extend(render_rule(r) + "\n" for r in group)
    return "".join(out).rstrip("\n") + "\n"


def generate() -> str:
    from engine.match import load_rules
    from rules import RULES_DIR

    return render_rules_markdown(load_rules(RULES_DIR))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.docs_gen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that docs/rules.md is up to date")
    parser.add_argument("--output", type=Path, default=RULES_MD)
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date; run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
