"""Whether a match is code that is already in its rule's rewritten form.

A rule that rewrites a call by adding arguments (`$callee($args, fused=torch.cuda.is_available())`)
matches its own output again: the call is still the call the pattern looks for. Such a site is not
an opportunity, nor a near-miss (the constraint that stops a second `fused=` would report one); it
is what the tool wrote, or what a maintainer wrote by hand. The general fact: every argument the
rewrite adds is already there with the value the rewrite would give it (a fixed value, or one the
match's bindings and the rule's constraints compute).
"""

from __future__ import annotations

import ast
import functools
import re

from engine.dsl.ir import Const, Sym, Var

_PLACEHOLDER = re.compile(r"\$(\w+)")
_SINGLE_SEGMENT = re.compile(r"\[\[((?:(?!\|\||\]\]).)*)\]\]")


@functools.lru_cache(maxsize=256)  # a rule's template: read for every match of the rule, never changed
def _added_keywords(template: str) -> tuple[str, dict[str, ast.expr], dict[str, ast.expr]] | None:
    """The template's callee (a placeholder's name, or a dotted name), the keyword arguments it writes
    with fixed values, and those whose values depend on the match; None when the template is not a
    single call."""
    # an optional segment with one alternative (`[[, fused=$fused]]`) extends the call where its
    # placeholders are bound: read it as written; one with alternatives is a choice, not an extension
    template = _SINGLE_SEGMENT.sub(r"\1", template)
    try:
        tree = ast.parse(_PLACEHOLDER.sub(r"__adopter_\1", template), mode="eval").body
    except SyntaxError:  # segments with alternatives (`[[a || b]]`): a replacement, not an extension
        return None
    if not isinstance(tree, ast.Call):
        return None
    fixed, dependent = {}, {}
    for keyword in tree.keywords:
        if keyword.arg is None:
            continue
        if any(isinstance(n, ast.Name) and n.id.startswith("__adopter_") for n in ast.walk(keyword.value)):
            dependent[keyword.arg] = keyword.value
        else:
            fixed[keyword.arg] = keyword.value
    return ast.unparse(tree.func), fixed, dependent


def _same_value(operand, expected: ast.expr) -> bool:
    if isinstance(operand, Const):
        try:
            return ast.literal_eval(expected) == operand.value
        except ValueError:
            return False
    if isinstance(operand, Sym):
        try:
            return ast.dump(ast.parse(operand.text, mode="eval").body) == ast.dump(expected)
        except SyntaxError:
            return False
    return False


def _operand_text(operand, ix, depth: int = 0) -> str | None:
    """Python text for an operand of the DSL, rebuilt from the nodes that compute it (calls, method
    calls, generator expressions), or None where it cannot be rebuilt plainly."""
    if isinstance(operand, (Sym, Const)):
        return _binding_text(operand)
    if not isinstance(operand, Var) or ix is None or depth > 8:
        return None
    node = ix.defs.get(operand.name)
    if node is None:
        return operand.name  # a parameter or a name bound outside the method
    if node.op in ("generatorexp", "listcomp", "setcomp", "dictcomp"):  # a comprehension keeps its source
        text = node.kwarg("text")
        return text.text if isinstance(text, Sym) else None
    if node.op.startswith("compare:"):  # `a == b` (the fused= test's count of distinct tensors)
        return _compare_text(node, ix, depth)
    if node.kind != "op" or not node.op.replace(".", "").replace("_", "").isalnum():
        return None
    args = [_operand_text(i, ix, depth + 1) for i in node.inputs]
    kwargs = [(k, _operand_text(v, ix, depth + 1)) for k, v in node.kwargs]
    if any(a is None for a in args) or any(v is None for _, v in kwargs):
        return None
    if node.op in ("or", "and"):  # a boolean operator (the fused= test `all(...) or None`)
        return f" {node.op} ".join(f"({a})" for a in args) if len(args) >= 2 and not kwargs else None
    if node.op.startswith("."):
        if not args:
            return None
        head, args = args[0], args[1:]
        return f"({head}){node.op}({', '.join([*args, *(f'{k}={v}' for k, v in kwargs)])})"
    return f"{node.op}({', '.join([*args, *(f'{k}={v}' for k, v in kwargs)])})"


_COMPARE_OPS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _compare_text(node, ix, depth: int) -> str | None:
    symbol = _COMPARE_OPS.get(node.op.partition(":")[2])
    if symbol is None or len(node.inputs) != 2 or node.kwargs:
        return None
    left, right = (_operand_text(i, ix, depth + 1) for i in node.inputs)
    return None if left is None or right is None else f"({left}) {symbol} ({right})"


def _binding_text(value) -> str | None:
    if isinstance(value, Sym):
        return value.text
    if isinstance(value, Const):
        return repr(value.value)
    return None


def _rendered(template_value: ast.expr, match, ix) -> ast.expr | None:
    """A match-dependent keyword value of the template as this match would write it: its placeholders
    replaced by what the pattern and the rule's constraints bind (constraints may bind values, such
    as fused-adamw's device test). None when a placeholder stays unbound or is not an expression."""
    saved = dict(match.bindings)
    try:
        if ix is not None:
            from engine.match import constraints

            for name in match.rule.constraints:
                constraints.CHECKS[name](match, ix)  # only for what they bind; their verdicts do not matter here
        texts = {name: _binding_text(value) for name, value in match.bindings.items()}
    finally:
        match.bindings.clear()
        match.bindings.update(saved)
    source = ast.unparse(template_value)
    for name in {n.id for n in ast.walk(template_value) if isinstance(n, ast.Name) and n.id.startswith("__adopter_")}:
        text = texts.get(name.removeprefix("__adopter_"))
        if text is None:
            return None
        source = re.sub(rf"\b{name}\b", lambda _m, t=text: f"({t})", source)
    try:
        return ast.parse(source, mode="eval").body
    except SyntaxError:
        return None


def in_rewritten_form(match, ix=None) -> bool:
    """Whether every argument the rewrite adds is already there with the value this match's rewrite
    would give it (``ix``, the method's index, lets the rule's constraints bind computed values)."""
    template = match.rule.rewrite
    if not template:
        return False
    shape = _added_keywords(template)
    if shape is None or not (shape[1] or shape[2]):
        return False
    callee, fixed, dependent = shape
    if not callee.startswith("__adopter_") and callee != match.root.op:
        return False  # the rewrite calls something else: its output cannot be this call
    given = {key: value for key, value in match.root.kwargs}
    if not all(key in given for key in fixed) or not all(_same_value(given[key], value) for key, value in fixed.items()):
        return False
    missing = [key for key in dependent if key not in given]
    if len(missing) > 1 or missing and not _merged_into_kwargs(missing[0], dependent[missing[0]], match, ix):
        return False
    for key, value in dependent.items():
        if key in missing:
            continue
        expected = _rendered(value, match, ix)
        text = _operand_text(given[key], ix)
        if expected is None or text is None or not _same_value(Sym(text), expected):
            return False
    return True


def _merged_into_kwargs(key: str, template_value: ast.expr, match, ix) -> bool:
    """Whether a `**` argument of the call is the dict a rule passes `key=` in under a `**` dict
    whose keys are not known (`**{"fused": {...}.isdisjoint(cfg.adam.keys()) and <test> or None,
    **cfg.adam}`, `constraints.merged_under`), with the test this match would write."""
    from engine.match.constraints import merged_under

    for name, value in match.root.kwargs:
        if name != "**":
            continue
        producer = ix.defs.get(value.name) if isinstance(value, Var) and ix is not None else None
        if producer is not None and producer.op == "dict":  # a dict literal: its source is kept as `text`
            value = producer.kwarg("text")
        if not isinstance(value, Sym):
            continue
        try:
            d = ast.parse(value.text, mode="eval").body
        except SyntaxError:
            continue
        if not (isinstance(d, ast.Dict) and len(d.keys) == 2 and d.keys[1] is None
                and isinstance(d.keys[0], ast.Constant) and d.keys[0].value == key):
            continue
        test = _rendered(template_value, match, ix)
        if test is None:
            return False
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) and isinstance(test.values[-1], ast.Constant) \
                and test.values[-1].value is None:  # `<test> or None`: the merged dict writes its own
            test = test.values[0] if len(test.values) == 2 else ast.BoolOp(op=ast.Or(), values=test.values[:-1])
        expected = merged_under(ast.unparse(d.values[1]), key, ast.unparse(test))
        return ast.dump(ast.parse(expected, mode="eval").body) == ast.dump(d)
    return False
