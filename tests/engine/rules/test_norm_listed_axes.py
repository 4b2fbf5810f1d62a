"""LayerNorm over a list of axes the function is given (asteroid's `z_norm(x, dims, eps)`, called with
`1..` or `2..` to the end): the kernel normalizes the last `len(dims)` sizes where the list is those
axes, tested at run time; the original is kept for any other list. Compared with the original in
float64, forward and gradients, on both paths, and scripted with TorchScript as asteroid's callers
are (`script_if_tracing`)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.engine.rules.harness import scan

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

Z_NORM = """
from typing import List

import torch


def z_norm(x, dims: List[int], eps: float = 1e-8):
    mean = x.mean(dim=dims, keepdim=True)
    var2 = torch.var(x, dim=dims, keepdim=True, unbiased=False)
    value = (x - mean) / torch.sqrt((var2 + eps))
    return value


def glob_norm(x, eps: float = 1e-8):
    dims: List[int] = torch.arange(1, len(x.shape)).tolist()
    return z_norm(x, dims, eps)
"""


def _module(tmp_path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(fn, dims, shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    out = fn(x, dims)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    (grad,) = torch.autograd.grad((out * weights).sum(), x)
    return out.detach(), grad


@pytest.mark.parametrize(
    ("dims", "shape"),
    [
        ([1, 2], (2, 6, 5)),  # the trailing axes: the kernel
        ([2, 3], (2, 3, 6, 5)),
        ([1, 2, 3], (2, 3, 6, 5)),
        ([1], (2, 6, 5)),  # not the trailing axes: the original
        ([-2, -1], (2, 6, 5)),  # the trailing axes written negative: the original too
        ([2, 1], (2, 6, 5)),
    ],
)
def test_the_kernel_runs_where_the_list_is_the_trailing_axes(tmp_path, dims, shape):
    findings, new = scan(Z_NORM, "layer-norm")
    assert [f.status for f in findings] == ["guarded"], [(f.status, f.reason) for f in findings]
    assert "if dims != list(range(x.dim() - len(dims), x.dim())):" in new
    assert "value = torch.nn.functional.layer_norm(x, x.shape[-len(dims):], eps=eps)" in new
    old, rewritten = _module(tmp_path, "old_norms", Z_NORM), _module(tmp_path, "new_norms", new)
    (want, want_grad), (got, got_grad) = (_run(m.z_norm, dims, shape) for m in (old, rewritten))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-10, atol=1e-12)


def test_the_rewrite_scripts_as_the_callers_need(tmp_path):
    _, new = scan(Z_NORM, "layer-norm")
    old, rewritten = _module(tmp_path, "old_script", Z_NORM), _module(tmp_path, "new_script", new)
    x = torch.randn(2, 3, 6, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want = torch.jit.script(old.glob_norm)(x)
    got = torch.jit.script(rewritten.glob_norm)(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "change",
    [
        # the list is changed first: a test at the top would read another value than the statistics
        ("    mean = x.mean", "    dims = [d % x.dim() for d in dims]\n    mean = x.mean"),
        # the input is
        ("    mean = x.mean", "    x = x.float()\n    mean = x.mean"),
    ],
)
def test_a_list_or_input_assigned_in_the_function_is_not_rewritten(change):
    source = Z_NORM.replace(*change)
    findings, new = scan(source, "layer-norm")
    assert [f.status for f in findings] == ["near-miss"], [(f.status, f.reason) for f in findings]
    assert "assigned nowhere in it" in findings[0].reason
    assert new == source
