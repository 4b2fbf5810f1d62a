"""Every compared run draws the same random numbers: a model that draws in training mode from
numpy's global generator (Wav2Vec2's SpecAugment picks its masked frames with `np.random`), from
Python's `random` or from torch's generator computes the same function on the original's run and
the rewrite's run, whatever was drawn before."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from engine.verify.child import run_once  # noqa: E402

pytestmark = pytest.mark.torch


class Draws(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        if self.training:
            x = x * torch.as_tensor(np.random.rand(8), dtype=x.dtype)  # SpecAugment-style numpy mask
            x = x + random.random()
            x = x * torch.rand(8, dtype=x.dtype)
        return x * self.w


def _run(dtype: str = "float32") -> dict:
    return run_once(None, Draws(), (torch.ones(2, 8),), dtype=dtype, train=True, step=False,
                    loss_fn=lambda out: out.sum())


def test_runs_draw_the_same_numbers_whatever_came_before():
    first = _run()
    np.random.rand(100)  # what another run, a probe or the model's build drew in between
    random.random()
    torch.rand(5)
    second = _run()
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(second[key], first[key], rtol=0, atol=0)
