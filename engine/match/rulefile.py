"""Load `.rule` files: the lark grammar in rule.lark -> engine.match.rule.Rule."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import LarkError, UnexpectedInput

from engine.match.rule import Example, OpAlt, PArg, Pattern, PStmt, Rule

GRAMMAR = Path(__file__).with_name("rule.lark")


class RuleSyntaxError(ValueError):
    """A rule file that does not parse or does not make sense; the message names file and line."""


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(GRAMMAR.read_text(), parser="earley", propagate_positions=True, maybe_placeholders=False)


def _string(token: Token) -> str:
    return ast.literal_eval(str(token))


class _ToRule(Transformer):
    def number(self, items):  # noqa: D401 - lark callbacks
        text = str(items[0])
        return PArg("lit", float(text) if any(c in text for c in ".eE") else int(text))

    def string(self, items):
        return PArg("lit", _string(items[0]))

    def true(self, _):
        return PArg("lit", True)

    def false(self, _):
        return PArg("lit", False)

    def none(self, _):
        return PArg("lit", None)

    def var(self, items):
        return PArg("var", str(items[0])[1:])

    def any(self, _):
        return PArg("any")

    def kwarg(self, items):
        return ("kw", str(items[0]), items[1])

    def arglist(self, items):
        return items

    def layer_alt(self, items):
        return OpAlt("layer", str(items[0])[1:])

    def op_alt(self, items):
        return OpAlt("op", str(items[0]))

    def ops(self, items):
        return tuple(items)

    def pcall(self, items):
        ops = items[0]
        args: list[PArg] = []
        kwargs: list[tuple[str, PArg]] = []
        open_kwargs = False
        for item in items[1:]:
            if isinstance(item, list):
                for a in item:
                    if isinstance(a, Token) and a.type == "ELLIPSIS":
                        open_kwargs = True
                    elif isinstance(a, tuple) and a[0] == "kw":
                        kwargs.append((a[1], a[2]))
                    else:
                        args.append(a)
        return PStmt(None, ops, tuple(args), tuple(kwargs), False, open_kwargs)

    @v_args(meta=True)
    def pstmt(self, meta, items):
        out = None
        if isinstance(items[0], Token) and items[0].type == "VAR":
            out = str(items[0])[1:]
            items = items[1:]
        calls = [i for i in items if isinstance(i, PStmt)]
        optional = any(isinstance(i, Token) and i.type == "OPTIONAL" for i in items)
        first = calls[0]
        return PStmt(out, first.ops, first.args, first.kwargs, optional, first.open_kwargs, meta.line, tuple(calls[1:]))

    def match(self, items):
        reason = None
        if items and isinstance(items[0], Token) and items[0].type == "STRING":
            reason = _string(items[0])
            items = items[1:]
        return ("match", Pattern(tuple(items), reason))

    def summary(self, items):
        return ("summary", _string(items[0]))

    def kernel(self, items):
        return ("kernel", _string(items[0]))

    def requires(self, items):
        return ("requires", _string(items[0]))

    def import_(self, items):
        return ("import", _string(items[0]))

    def detect_only(self, _):
        return ("detect_only", True)

    def guard(self, _):
        return ("guard", True)

    def ordered(self, _):
        return ("ordered", True)

    def anywhere(self, _):
        return ("anywhere", True)

    def where(self, items):
        return ("where", str(items[0]))

    def rewrite(self, items):
        return ("rewrite", _string(items[0]))

    def doc(self, items):
        return ("doc", _string(items[0]))

    def expect(self, items):
        return ("expect", _string(items[0]))

    def reason(self, items):
        return ("reason", _string(items[0]))

    def count(self, items):
        return ("count", int(items[0]))

    def example(self, items):
        kind = str(items[0])
        extra = dict(items[2:])
        return ("example", Example(kind, _dedent(_string(items[1])), _dedent(extra["expect"]) if "expect" in extra else None,
                                   extra.get("reason"), extra.get("count", 1)))

    def start(self, items):
        return str(items[0]), items[1:]


def _dedent(text: str) -> str:
    import textwrap

    return textwrap.dedent(text).strip("\n") + "\n"


def parse_rule(text: str, path: str = "<rule>") -> Rule:
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise RuleSyntaxError(f"{path}:{exc.line}:{exc.column}: rule syntax error\n{exc.get_context(text)}") from None
    except LarkError as exc:  # pragma: no cover - other parser failures
        raise RuleSyntaxError(f"{path}: {exc}") from None
    rule_id, fields = _ToRule().transform(tree)
    values: dict[str, object] = {}
    requires: list[str] = []
    imports: list[str] = []
    examples: list[Example] = []
    constraints: list[str] = []
    patterns: list[Pattern] = []
    for key, value in fields:
        if key == "match":
            patterns.append(value)
        elif key == "requires":
            requires.append(value)
        elif key == "import":
            imports.append(value)
        elif key == "example":
            examples.append(value)
        elif key == "where":
            constraints.append(value)
        elif key in values:
            raise RuleSyntaxError(f"{path}: `{key}` given twice")
        else:
            values[key] = value
    for needed in ("summary", "kernel"):
        if needed not in values:
            raise RuleSyntaxError(f"{path}: rule {rule_id} has no `{needed}`")
    if not any(p.near_miss is None for p in patterns):
        raise RuleSyntaxError(f"{path}: rule {rule_id} has no `match` block (besides near-miss ones)")
    for pattern in patterns:
        _check_pattern(pattern.stmts, path)
    if not values.get("detect_only") and "rewrite" not in values:
        raise RuleSyntaxError(f"{path}: rule {rule_id} rewrites nothing: give `rewrite` or say `detect-only`")
    from engine.match import constraints as known_constraints

    for name in constraints:
        if name not in known_constraints.CHECKS:
            raise RuleSyntaxError(f"{path}: unknown constraint `{name}` (known: {', '.join(sorted(known_constraints.CHECKS))})")
    return Rule(
        id=rule_id,
        summary=values["summary"],  # type: ignore[arg-type]
        kernel=values["kernel"],  # type: ignore[arg-type]
        patterns=tuple(patterns),
        requires=tuple(requires),
        imports=tuple(imports),
        detect_only=bool(values.get("detect_only")),
        rewrite=values.get("rewrite"),  # type: ignore[arg-type]
        guard=bool(values.get("guard")),
        ordered=bool(values.get("ordered")),
        anywhere=bool(values.get("anywhere")),
        constraints=tuple(constraints),
        examples=tuple(examples),
        doc=values.get("doc", ""),  # type: ignore[arg-type]
        path=path,
    )


def _check_pattern(pattern: tuple[PStmt, ...], path: str) -> None:
    outs = [s.out for s in pattern if s.out]
    if len(outs) != len(set(outs)):
        raise RuleSyntaxError(f"{path}: a pattern variable is defined twice")
    for i, stmt in enumerate(pattern):
        for var in stmt.data_args:
            for later in pattern[i:]:
                if later.out == var:
                    raise RuleSyntaxError(f"{path}:{stmt.line}: ${var} is used before the statement that defines it")
        if stmt.optional and not stmt.data_args:
            raise RuleSyntaxError(f"{path}:{stmt.line}: an optional statement needs a data input to stand for it")
    from engine.dsl import canonical

    for stmt in pattern:
        for call in stmt.alternatives:
            for alt in call.ops:
                if alt.kind == "op" and alt.name in canonical.SIGNATURES:
                    arity = canonical.TENSOR_ARITY.get(alt.name, 1)
                    names = canonical.SIGNATURES[alt.name]
                    if len(call.args) > arity and names:
                        raise RuleSyntaxError(
                            f"{path}:{stmt.line}: `{alt.name}` takes its parameters as keywords after extraction "
                            f"(write {alt.name}(..., {names[0]}=...)); a positional one would never match")
    if pattern[-1].optional:
        raise RuleSyntaxError(f"{path}: the root (last) statement cannot be optional")


def load_rule(path: Path) -> Rule:
    return parse_rule(path.read_text(encoding="utf-8"), str(path))


def load_rules(root: Path) -> list[Rule]:
    rules = [load_rule(p) for p in sorted(root.rglob("*.rule"))]
    seen: dict[str, str] = {}
    for rule in rules:
        if rule.id in seen:
            raise RuleSyntaxError(f"rule id {rule.id} defined in {seen[rule.id]} and {rule.path}")
        seen[rule.id] = rule.path
    return rules
