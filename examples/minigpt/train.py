"""Train the small GPT on characters of its own source code (a corpus that is always at hand).

    python train.py --steps 200 --seq-len 256
"""

import argparse
import time
from pathlib import Path

import torch
from model import GPT, GPTConfig


def make_optimizer(model, lr=3e-4, weight_decay=0.1):
    # no weight decay on biases and norm weights (the usual GPT recipe)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def char_corpus():
    text = "".join(path.read_text() for path in sorted(Path(__file__).parent.glob("*.py")))
    return torch.tensor([min(ord(c), 255) for c in text], dtype=torch.long)


def batches(data, batch_size, seq_len, generator):
    while True:
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=generator)
        x = torch.stack([data[s:s + seq_len] for s in starts])
        y = torch.stack([data[s + 1:s + seq_len + 1] for s in starts])
        yield x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=max(args.seq_len, 512)))
    optimizer = make_optimizer(model)
    data = char_corpus()
    started = time.perf_counter()
    stream = batches(data, args.batch_size, args.seq_len, torch.Generator().manual_seed(0))
    for step in range(args.steps):
        x, y = next(stream)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step:4d}  loss {loss.item():.3f}  {(time.perf_counter() - started) / (step + 1):.3f}s/step")


if __name__ == "__main__":
    main()
