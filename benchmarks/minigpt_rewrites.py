"""Hand-written rewrites of examples/minigpt, as the engine should produce them.

They stand in for the engine's output while it is being written, and serve as test data for the
verification and benchmark stages: four correct rewrites (one per rule) and a wrong one (the
attention scale 1/d instead of 1/sqrt(d)) that verification must reject. Each is an exact text
replacement in the example's current source, so they cannot silently drift from it.
"""

from __future__ import annotations

from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "minigpt"

_ATTENTION = """        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, hs)
"""
_SDPA = """        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0, is_causal=True{scale}
        )  # (B, nh, T, hs)
"""
_GELU = "    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))\n"
_LAYERNORM = """        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        x = (x - mean) / torch.sqrt(var + self.eps)
        x = x * self.weight
        if self.bias is not None:
            x = x + self.bias
        return x
"""
_ADAMW = "torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))"


def _replace(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise ValueError(f"expected exactly one occurrence of {old[:60]!r} in the example")
    return text.replace(old, new)


def rewrites(root: Path = EXAMPLE) -> dict[str, dict[str, str]]:
    """Rule id -> {path: new text} for each correct rewrite, applied alone to the original."""
    model = (root / "model.py").read_text()
    train = (root / "train.py").read_text()
    return {
        "sdpa-attention": {"model.py": _replace(model, _ATTENTION, _SDPA.format(scale=""))},
        "gelu-tanh": {"model.py": _replace(model, _GELU, '    return F.gelu(x, approximate="tanh")\n')},
        "layer-norm": {"model.py": _replace(
            model, _LAYERNORM, "        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)\n")},
        "adamw-fused": {"train.py": _replace(train, _ADAMW, "torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=True)")},
    }


def wrong_scale(root: Path = EXAMPLE) -> dict[str, str]:
    """SDPA with the scale 1/d instead of 1/sqrt(d): looks right, computes something else."""
    model = (root / "model.py").read_text()
    return {"model.py": _replace(model, _ATTENTION, _SDPA.format(scale=", scale=1.0 / k.size(-1)"))}


def all_rewrites(root: Path = EXAMPLE) -> dict[str, str]:
    """Every correct rewrite at once."""
    model = (root / "model.py").read_text()
    model = _replace(model, _ATTENTION, _SDPA.format(scale=""))
    model = _replace(model, _GELU, '    return F.gelu(x, approximate="tanh")\n')
    model = _replace(model, _LAYERNORM,
                     "        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)\n")
    train = _replace((root / "train.py").read_text(), _ADAMW,
                     "torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=True)")
    return {"model.py": model, "train.py": train}
