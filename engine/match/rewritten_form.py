"""Whether a match is code that is already in its rule's rewritten form.

A rule that rewrites a call by adding arguments (`$callee($args, fused=torch.cuda.is_available())`)
matches its own output again: the call is still the call the pattern looks for. Such a site is not
an opportunity, nor a near-miss (the constraint that stops a second `fused=` would report one); it
is what the tool wrote, or what a maintainer wrote by hand. The general fact: every argument the
rewrite adds with a fixed value is already there with that value.
"""

from __future__ import annotations

import ast
import re

from engine.dsl.ir import Const, Sym

_PLACEHOLDER = re.compile(r"\$(\w+)")


def _added_keywords(template: str) -> tuple[str | None, dict[str, ast.expr]] | None:
    """The template's callee (a placeholder's name, or a dotted name) and the keyword arguments it
    writes with fixed values; None when the template is not a single call."""
    try:
        tree = ast.parse(_PLACEHOLDER.sub(r"__adopter_\1", template), mode="eval").body
    except SyntaxError:  # optional sections (`[[...]]`): a replacement, not an extension
        return None
    if not isinstance(tree, ast.Call):
        return None
    fixed = {}
    for keyword in tree.keywords:
        if keyword.arg is None:
            continue
        if any(isinstance(n, ast.Name) and n.id.startswith("__adopter_") for n in ast.walk(keyword.value)):
            continue  # the value depends on the match
        fixed[keyword.arg] = keyword.value
    return ast.unparse(tree.func), fixed


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


def in_rewritten_form(match) -> bool:
    template = match.rule.rewrite
    if not template:
        return False
    shape = _added_keywords(template)
    if shape is None or not shape[1]:
        return False
    callee, fixed = shape
    if not callee.startswith("__adopter_") and callee != match.root.op:
        return False  # the rewrite calls something else: its output cannot be this call
    given = {key: value for key, value in match.root.kwargs}
    return all(key in given and _same_value(given[key], value) for key, value in fixed.items())
