"""Known-wrong rewrites for testing the verifier itself (mutation testing).

Each mutant takes the text of a correct rewrite (one holding a call of
`scaled_dot_product_attention`) and breaks it in one way a rewrite rule could plausibly get wrong:
the scale off by sqrt(d), the mask inverted or turned into the other kind, the mask dropped, the
fix-up of fully masked rows dropped (a boolean mask where the original's finite fill averages v),
an additive bias dropped, dropout left on in eval mode, the output transposed, the kernel hidden
behind a guard that no input takes, and (on the original code) the softmax over the wrong axis,
which ``ON_ORIGINAL`` holds apart: it has no kernel call, so it must be caught by its numbers, not
by coverage. A verifier worth its name
rejects every one; ``benchmarks/mutation_score.py`` reports the share it rejects.

A mutant that does not apply to a text (no mask to invert) returns None.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_CALL = re.compile(r"(?:torch\.nn\.functional|F|nn\.functional)\.scaled_dot_product_attention\(")


def _call_span(text: str) -> tuple[int, int, int] | None:
    """(start of the call, start of its arguments, end after its closing parenthesis)."""
    m = _CALL.search(text)
    if m is None:
        return None
    depth, i = 1, m.end()
    while depth and i < len(text):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    return (m.start(), m.end(), i) if depth == 0 else None


def _split_args(args: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(args):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(args[start:i])
            start = i + 1
    if args[start:].strip():
        parts.append(args[start:])
    return parts


def _edit_args(text: str, edit: Callable[[list[str]], list[str] | None]) -> str | None:
    span = _call_span(text)
    if span is None:
        return None
    start, args_start, end = span
    args = _split_args(text[args_start:end - 1])
    new = edit([a.strip() for a in args])
    if new is None:
        return None
    return text[:args_start] + ", ".join(new) + text[end - 1:]


def _kwarg(args: list[str], name: str) -> int | None:
    return next((i for i, a in enumerate(args) if a.startswith(name + "=")), None)


def scale_off_by_sqrt_d(text: str) -> str | None:
    def edit(args):
        i = _kwarg(args, "scale")
        d = f"{args[0]}.size(-1)"
        if i is None:
            return [*args, f"scale=1.0 / {d}"]  # the default 1/sqrt(d), off by sqrt(d)
        args[i] = f"scale=({args[i][len('scale='):]}) / ({d} ** 0.5)"
        return args
    return _edit_args(text, edit)


def mask_inverted(text: str) -> str | None:
    def edit(args):
        i = _kwarg(args, "attn_mask")
        if i is None:
            return None
        mask = args[i][len("attn_mask="):]
        # a boolean keep mask becomes a drop mask; a float mask 0 where it was very negative, and back
        args[i] = f"attn_mask=_inverted({mask})"
        return args
    out = _edit_args(text, edit)
    return None if out is None else _with_helper(out, _INVERTED)


def mask_wrong_kind(text: str) -> str | None:
    """A boolean keep mask passed as a float (0/1 added to the scores: nothing masked), or a float
    mask passed as a boolean (nonzero = keep: the padded keys kept, the others dropped)."""
    def edit(args):
        i = _kwarg(args, "attn_mask")
        if i is None:
            return None
        args[i] = f"attn_mask=_other_kind({args[i][len('attn_mask='):]})"
        return args
    out = _edit_args(text, edit)
    return None if out is None else _with_helper(out, _OTHER_KIND)


def mask_dropped(text: str) -> str | None:
    def edit(args):
        i = _kwarg(args, "attn_mask")
        return None if i is None else [a for j, a in enumerate(args) if j != i]
    return _edit_args(text, edit)


_ROWS = r"(?P<rows>.+?)\.all\(-1, keepdim=True\)"


def fix_up_dropped(text: str) -> str | None:
    """The exact form of a fully masked row undone: the boolean keep mask passed without the rows'
    unmasking and zeroed queries (`attn_mask=~(mask == 0)` for `masked_fill(mask == 0, -1e9)`), or
    the -inf fill of a float mask without its rows' exemption, and without the NaN put back on rows
    the original leaves NaN. On a fully masked row the original averages v (finite fill) or gives
    NaN (-inf); this gives what the kernel gives for a row with no key to attend to."""
    span = _call_span(text)
    if span is None:
        return None
    start, args_start, end = span
    args = [a.strip() for a in _split_args(text[args_start:end - 1])]
    changed = False
    m = re.fullmatch(r"(?P<q>.+)\.masked_fill\(" + _ROWS + r",\s*0\)", args[0], re.S) if args else None
    if m is not None:
        args[0], changed = m.group("q").strip(), True
    i = _kwarg(args, "attn_mask")
    if i is not None:
        mask = args[i][len("attn_mask="):].strip()
        keep = re.fullmatch(r"(?P<keep>.+?)\s*\|\s*" + _ROWS, mask, re.S)
        where = re.fullmatch(r"torch\.where\(\s*" + _ROWS + r",\s*0\.0,\s*(?P<rest>.+)\)", mask, re.S)
        if keep is not None:
            args[i], changed = f"attn_mask={keep.group('keep').strip()}", True
        elif where is not None:
            args[i], changed = f"attn_mask={where.group('rest').strip()}", True
    after = text[end:]
    tail = re.match(r"\s*\.masked_fill\(" + _ROWS + r",\s*float\((?:'nan'|\"nan\")\)\)", after, re.S)
    if tail is not None:
        after, changed = after[tail.end():], True
    if not changed:
        return None
    return text[:args_start] + ", ".join(args) + text[end - 1:end] + after


def bias_dropped(text: str) -> str | None:
    """An additive term of the float mask lost: the last term of a sum (`keep_fill + attention_mask`
    becomes `keep_fill`), or a bias passed as the whole mask (a relative position bias)."""
    import ast

    def edit(args):
        i = _kwarg(args, "attn_mask")
        if i is None:
            return None
        mask = args[i][len("attn_mask="):].strip()
        try:
            tree = ast.parse(mask, mode="eval").body
        except SyntaxError:
            return None
        if isinstance(tree, ast.BinOp) and isinstance(tree.op, ast.Add):
            args[i] = f"attn_mask={ast.unparse(tree.left)}"
            return args
        boolean = any(isinstance(node, (ast.Invert, ast.BitOr, ast.BitAnd, ast.Compare, ast.Not))
                      for node in ast.walk(tree))
        if "bias" in mask and not boolean:
            return [a for j, a in enumerate(args) if j != i]
        return None
    return _edit_args(text, edit)


def dropout_in_eval(text: str) -> str | None:
    def edit(args):
        i = _kwarg(args, "dropout_p")
        if i is None:
            return None
        value = args[i][len("dropout_p="):].strip()
        m = re.fullmatch(r"\(?\s*(.+?)\s+if\s+.+?\s+else\s+0\.0\s*\)?", value)
        if m is None:
            return None
        args[i] = f"dropout_p={m.group(1)}"
        return args
    return _edit_args(text, edit)


def output_transposed(text: str) -> str | None:
    span = _call_span(text)
    if span is None:
        return None
    _, _, end = span
    return text[:end] + ".transpose(-2, -1)" + text[end:]


def kernel_never_runs(text: str) -> str | None:
    """The kernel call replaced by a hand-written attention that computes the same thing, as a guard
    that sends every call down the original path would: the numbers agree, and only coverage can
    tell that the kernel never ran."""
    span = _call_span(text)
    if span is None:
        return None
    start, args_start, end = span
    return _with_helper(text[:start] + f"_by_hand({text[args_start:end - 1]})" + text[end:], _BY_HAND)


def softmax_axis(original: str) -> str | None:
    """On the original code: the softmax over the query axis instead of the key axis."""
    m = re.search(r"softmax\(([^()]*?)dim\s*=\s*-1", original)
    if m is None:
        return None
    return original[:m.start()] + m.group(0).replace("-1", "-2") + original[m.end():]


_INVERTED = '''
def _inverted(mask):
    import torch
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return ~mask
    return torch.where(mask < -1, torch.zeros((), dtype=mask.dtype), torch.full((), torch.finfo(mask.dtype).min, dtype=mask.dtype))
'''
_OTHER_KIND = '''
def _other_kind(mask):
    import torch
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return mask.float()
    return mask != 0
'''
_BY_HAND = '''
def _by_hand(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    import math
    import torch
    import torch.nn.functional as F
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    p = torch.softmax(s, dim=-1)
    return F.dropout(p, dropout_p, training=dropout_p > 0) @ v
'''


def _with_helper(text: str, helper: str) -> str:
    """Append a module-level helper (the mutated call refers to it at run time)."""
    return text.rstrip("\n") + "\n\n" + helper


MUTANTS: dict[str, Callable[[str], str | None]] = {
    "scale off by sqrt(d)": scale_off_by_sqrt_d,
    "mask inverted": mask_inverted,
    "mask converted to the other kind": mask_wrong_kind,
    "bias dropped": bias_dropped,  # before "mask dropped": a mask that is all bias is named for it
    "mask dropped": mask_dropped,
    "fully masked rows' fix-up dropped": fix_up_dropped,
    "dropout in eval mode": dropout_in_eval,
    "output transposed": output_transposed,
    "kernel never runs": kernel_never_runs,
}
ON_ORIGINAL: dict[str, Callable[[str], str | None]] = {
    "softmax over the query axis": softmax_axis,
}


def mutants(original: str, rewritten: str) -> dict[str, str]:
    """Every mutant that applies, by name; one that only repeats an earlier one's text (a mask that is
    all bias: dropping it is both "mask dropped" and "bias dropped") is kept under the first name."""
    out: dict[str, str] = {}
    for name, make in MUTANTS.items():
        text = make(rewritten)
        if text is not None and text != rewritten and text not in out.values():
            out[name] = text
    for name, make in ON_ORIGINAL.items():
        text = make(original)
        if text is not None and text != original:
            out[name] = text
    return out
