"""Adopter's harness for this repository (see docs/harness.md in Adopter).

build() returns the model and the positional arguments of its forward call. Adopter calls it with
the shape arguments it accepts (several shapes, batch size 1 among them, when verifying; the `bench`
shape from .adopter.yml when benchmarking) and with dropout=0.0 when comparing outputs.
"""

import torch
from model import GPT, GPTConfig
from train import make_optimizer


def build(batch_size=8, seq_len=256, dropout=0.1):
    config = GPTConfig(block_size=max(512, seq_len), dropout=dropout)
    model = GPT(config)
    generator = torch.Generator().manual_seed(0)
    idx = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
    targets = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
    return model, (idx, targets)


def loss(output, inputs):
    """forward returns (logits, loss)."""
    return output[1]


def optimizer(model):
    """The optimizer the training script uses, so that a rewrite of it is measured too."""
    return make_optimizer(model)
