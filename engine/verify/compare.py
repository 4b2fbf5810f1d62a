"""Comparing the tensors of the original and the rewritten model.

Errors are measured relative to the size of each tensor: ``max_abs_err`` is the largest absolute
difference, ``max_rel_err`` that divided by the largest magnitude in the original tensor, or in the
largest tensor of its kind where that is larger (a plain element-wise relative error explodes on
entries near zero and says nothing; so does one taken against a gradient that is itself noise).

A tensor passes when every element is within ``atol * scale + rtol * |original|`` (``scale`` the
tensor's largest magnitude), or, where a float64 run of the original exists, when the rewritten
result is no further from that reference than ``fudge`` times the original's own distance from it
(plus the absolute tolerance). The second test accepts kernels that are *more* precise than the code
they replace (a fused softmax that accumulates differently), and still rejects a wrong rewrite: its
error against the float64 truth is far larger than the original's rounding error.

In bfloat16 and float16 the original's error on one tensor is one draw of rounding noise, not its
precision: a kernel that rounds at other points (the CPU float16 SDPA kernel under OPT's attention)
lands 6x the original's error on one LayerNorm gradient, where a more exact one (softmax of the
float32 upcast) lands 3x below it, and both stay within the original's own worst relative error
over the gradients. So in these dtypes a tensor also passes when its error against float64,
relative to its size, is within ``fudge`` times the original's worst relative error over the
tensors of its kind (``kind_noise``); a wrong rewrite is off by the size of the tensor itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# (rtol, atol relative to the tensor's scale) per dtype the models run in.
TOLERANCES = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "bfloat16": (3e-2, 1e-2),
    "float16": (5e-3, 1e-3),
}
FUDGE = 4.0
# A tensor whose float64 value is this small next to the largest tensor of its kind (gradients, or
# outputs) is zero in exact arithmetic (the gradient of a key bias under softmax): both float32
# results are rounding noise, and comparing noise with noise says nothing. Such a tensor passes when
# the rewritten result stays within atol of the kind's scale.
EXACT_ZERO = 1e-6
LOW_PRECISION = ("bfloat16", "float16")


@dataclass
class TensorCheck:
    key: str
    passed: bool
    max_abs_err: float
    max_rel_err: float
    criterion: str  # "direct", "float64 reference", "missing", "shape", "non-finite"
    message: str = ""


def _scale(t: torch.Tensor) -> float:
    finite = t[torch.isfinite(t)]
    return float(finite.abs().max()) if finite.numel() else 0.0


NAN_ORIGINAL = "original's gradient is NaN"


def check_tensor(key: str, original: torch.Tensor | None, rewritten: torch.Tensor | None, dtype: str,
                 reference64: torch.Tensor | None = None, kind_scale: float = 0.0,
                 nan_original_ok: bool = False, kind_noise: float = 0.0) -> TensorCheck:
    """``kind_noise``: in bfloat16 and float16, the original's worst error against float64 relative
    to tensor size over the tensors of this one's kind (``check_run``).

    ``nan_original_ok``: elements where the original is NaN and the rewrite finite are left out
    (the probes' gradients under a -inf fill: the original's softmax backward multiplies by the NaN
    probabilities of a fully masked row, so v's gradient is NaN for the whole sample, where the
    rewrite's is finite; a training step on the original's would destroy the weights). Everything
    else must agree as usual, and so must every output."""
    if (nan_original_ok and original is not None and rewritten is not None and original.shape == rewritten.shape
            and original.is_floating_point()):
        excused = original.isnan() & torch.isfinite(rewritten)
        if bool(excused.any()):
            keep = ~excused
            ref = reference64[keep] if reference64 is not None and reference64.shape == original.shape else None
            inner = check_tensor(key, original[keep], rewritten[keep], dtype, ref, kind_scale, kind_noise=kind_noise)
            if inner.passed:
                inner.criterion = NAN_ORIGINAL
                inner.message = f"{int(excused.sum())} elements left out ({inner.message or 'the rest agree'})"
            return inner
    if original is None or rewritten is None:
        side = "rewritten" if rewritten is None else "original"
        return TensorCheck(key, False, float("inf"), float("inf"), "missing", f"absent from the {side} model's results")
    if original.shape != rewritten.shape:
        return TensorCheck(key, False, float("inf"), float("inf"), "shape",
                           f"shape {tuple(rewritten.shape)} != original {tuple(original.shape)}")
    a, b = original.double(), rewritten.double()
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(finite_a, finite_b) or not torch.equal(a[~finite_a].nan_to_num(0), b[~finite_b].nan_to_num(0)):
        return TensorCheck(key, False, float("inf"), float("inf"), "non-finite",
                           "non-finite values (nan/inf) differ from the original's")
    a, b = a[finite_a], b[finite_b]
    if a.numel() == 0:
        return TensorCheck(key, True, 0.0, 0.0, "direct")
    rtol, atol = TOLERANCES.get(dtype, TOLERANCES["float32"])
    scale = _scale(a)
    diff = (a - b).abs()
    max_abs = float(diff.max())
    # reported against the larger of the tensor's own scale and its kind's (all gradients, all
    # outputs): a near-zero gradient whose float32 rounding noise is as large as itself would
    # otherwise read as "error 3.4" beside "passed"; whether it passes is decided below as before
    report_scale = max(scale, kind_scale)
    max_rel = max_abs / report_scale if report_scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    if bool((diff <= atol * scale + rtol * a.abs()).all()):
        return TensorCheck(key, True, max_abs, max_rel, "direct")
    if reference64 is not None and reference64.shape == original.shape:
        r = reference64.double()[finite_a]
        judged = torch.isfinite(r)
        if not bool(judged.all()):
            # the float64 run overflowed where the compared one did not (a fill of float64's lowest value
            # added to another: -inf, then a fully masked row's NaN): no reference there, so those
            # elements must agree with the original directly (in half precision, within what the
            # original's own error over its kind allows each side), and the float64 run judges the rest
            unjudged = ~judged
            worst = float(diff[unjudged].max())
            if not (bool((diff[unjudged] <= atol * scale + rtol * a[unjudged].abs()).all())
                    or (kind_noise > 0 and worst <= FUDGE * kind_noise * _scale(a[unjudged]))):
                return TensorCheck(key, False, max_abs, max_rel, "direct",
                                   f"max abs error {worst:.3g} where the float64 reference is not finite "
                                   f"(over tolerance rtol={rtol:g}, atol={atol:g})")
            if not bool(judged.any()):
                return TensorCheck(key, True, max_abs, max_rel, "direct")
            a, b, r = a[judged], b[judged], r[judged]
        err_original = float((a - r).abs().max())
        err_rewritten = float((b - r).abs().max())
        if err_rewritten <= FUDGE * err_original + atol * scale:
            return TensorCheck(key, True, max_abs, max_rel, "float64 reference",
                               f"error vs float64 {err_rewritten:.3g} (original's {err_original:.3g})")
        size = _scale(r)
        if kind_noise > 0 and err_rewritten <= FUDGE * kind_noise * size:
            return TensorCheck(key, True, max_abs, max_rel, "original's precision over its kind",
                               f"error vs float64 {err_rewritten / size:.3g} of its size (original's "
                               f"{err_original / size:.3g}, its worst over the kind {kind_noise:.3g})")
        if kind_scale > 0 and _scale(r) <= EXACT_ZERO * kind_scale and err_rewritten <= atol * kind_scale:
            return TensorCheck(key, True, max_abs, max_rel, "zero in exact arithmetic",
                               f"float64 value {_scale(r):.3g}; error {err_rewritten:.3g} is noise next to "
                               f"the scale {kind_scale:.3g} of its kind")
        return TensorCheck(key, False, max_abs, max_rel, "float64 reference",
                           f"error vs float64 {err_rewritten:.3g} exceeds {FUDGE:g}x the original's {err_original:.3g}")
    return TensorCheck(key, False, max_abs, max_rel, "direct",
                       f"max abs error {max_abs:.3g} (relative {max_rel:.3g}) over tolerance rtol={rtol:g}, atol={atol:g}")


def check_run(original: dict[str, torch.Tensor], rewritten: dict[str, torch.Tensor], dtype: str,
              reference64: dict[str, torch.Tensor] | None = None, *,
              nan_original_grads_ok: bool = False) -> list[TensorCheck]:
    """Every tensor of one run (outputs, loss, gradients, parameters after a step).
    ``nan_original_grads_ok``: see ``check_tensor``, for gradients only."""
    kinds: dict[str, float] = {}
    for key, tensor in (reference64 or original).items():
        kinds[_kind(key)] = max(kinds.get(_kind(key), 0.0), _scale(tensor.double()))
    noise = _kind_noise(original, reference64, dtype, kinds) if reference64 and dtype in LOW_PRECISION else {}
    checks = []
    for key in sorted(set(original) | set(rewritten)):
        checks.append(check_tensor(key, original.get(key), rewritten.get(key), dtype,
                                   (reference64 or {}).get(key), kinds.get(_kind(key), 0.0),
                                   nan_original_ok=nan_original_grads_ok and key.startswith("grad/"),
                                   kind_noise=noise.get(_kind(key), 0.0)))
    return checks


def _kind_noise(original: dict[str, torch.Tensor], reference64: dict[str, torch.Tensor], dtype: str,
                kinds: dict[str, float]) -> dict[str, float]:
    """Per kind, the original's largest error against float64 relative to the tensor's size. Left
    out: tensors below one rounding step of the dtype at the kind's scale (a key bias's gradient,
    zero in exact arithmetic), whose relative error is noise over noise and would excuse anything,
    and elements that are not finite in the original."""
    step = torch.finfo(getattr(torch, dtype)).eps
    noise: dict[str, float] = {}
    for key, tensor in original.items():
        ref = reference64.get(key)
        if ref is None or ref.shape != tensor.shape or not tensor.is_floating_point():
            continue
        a, r = tensor.double(), ref.double()
        finite = torch.isfinite(a) & torch.isfinite(r)
        size = _scale(r[finite])
        if size <= step * kinds.get(_kind(key), 0.0) or size == 0.0:
            continue
        relative = float((a - r)[finite].abs().max()) / size
        noise[_kind(key)] = max(noise.get(_kind(key), 0.0), relative)
    return noise


def _kind(key: str) -> str:
    """``grad/param.x`` -> ``grad``: tensors compared against the scale of their own kind."""
    return key.split("/", 1)[0] if "/" in key else key.split(".", 1)[0]
