"""Small repositories written to disk for the verification and benchmark tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

TINY_MODEL = '''
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4, dropout=0.1):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.heads = heads
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        att = att.softmax(dim=-1)
        att = self.drop(att)
        y = att @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


class Net(nn.Module):
    def __init__(self, dim=32, dropout=0.1):
        super().__init__()
        self.attn = Attention(dim, dropout=dropout)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.fc(gelu(x))
'''

ATTENTION_BLOCK = '''        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        att = att.softmax(dim=-1)
        att = self.drop(att)
        y = att @ v
'''
SDPA_BLOCK = '''        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.drop.p if self.training else 0.0{scale})
'''
GELU_LINE = "    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))\n"

HARNESS = '''
import torch

from model import Net


def build(batch_size=2, seq_len=8, dropout=0.1):
    torch.manual_seed(0)
    x = torch.randn(batch_size, seq_len, 32, requires_grad=True)
    return Net(dropout=dropout), (x,)


def optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
'''

CONFIG = '''
harness:
  build: harness.py:build
  shapes:
    - {batch_size: 2, seq_len: 8}
    - {batch_size: 1, seq_len: 5}
  bench: {batch_size: 4, seq_len: 64}
'''


def write_repo(root: Path, *, harness: str = HARNESS, config: str = CONFIG, model: str = TINY_MODEL) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.py").write_text(model)
    (root / "harness.py").write_text(textwrap.dedent(harness))
    (root / ".adopter.yml").write_text(textwrap.dedent(config))
    return root


def sdpa_rewrite(root: Path, scale: str = "") -> dict[str, str]:
    text = (root / "model.py").read_text()
    assert ATTENTION_BLOCK in text
    return {"model.py": text.replace(ATTENTION_BLOCK, SDPA_BLOCK.format(scale=scale))}


def gelu_rewrite(root: Path) -> dict[str, str]:
    text = (root / "model.py").read_text()
    assert GELU_LINE in text
    return {"model.py": text.replace(GELU_LINE, '    return F.gelu(x, approximate="tanh")\n')}


def renamed_parameter_rewrite(root: Path) -> dict[str, str]:
    """Same computation, but a parameter renamed: old checkpoints no longer load."""
    text = (root / "model.py").read_text()
    text = text.replace("self.proj = nn.Linear", "self.out_proj = nn.Linear").replace("self.proj(", "self.out_proj(")
    return {"model.py": text}


BERT_ATTENTION_START = "        # Take the dot product between \"query\" and \"key\" to get the raw attention scores.\n"
BERT_ATTENTION_END = "        context_layer = torch.matmul(attention_probs, value_layer)\n"


def bert_sdpa_patch(source: str, *, wrong_scale: bool = False) -> str:
    """BertSelfAttention on F.scaled_dot_product_attention where the kernel can serve the call; the
    original code stays on the paths it cannot (relative positions, head masks, returned weights)."""
    start = source.index(BERT_ATTENTION_START)
    end = source.index(BERT_ATTENTION_END) + len(BERT_ATTENTION_END)
    original = source[start:end]
    scale = ", scale=1.0 / self.attention_head_size" if wrong_scale else ""
    fast = (
        '        if self.position_embedding_type == "absolute" and head_mask is None and not output_attentions:\n'
        "            context_layer = torch.nn.functional.scaled_dot_product_attention(\n"
        "                query_layer, key_layer, value_layer, attn_mask=attention_mask,\n"
        f"                dropout_p=self.dropout.p if self.training else 0.0{scale},\n"
        "            )\n"
        "        else:\n"
    )
    indented = "".join("    " + line if line.strip() else line for line in original.splitlines(keepends=True))
    return source[:start] + fast + indented + source[end:]


# A model that takes its mask as an input, written as The Annotated Transformer writes it
# (`scores.masked_fill(mask == 0, -1e9)`); its harness pads keys of the last sample, so that no
# query row of the harness's own inputs is fully masked (the verification probes make such rows).
MASKED_MODEL = '''
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        scores = scores.masked_fill(mask == 0, {fill})
        p = F.softmax(scores, dim=-1)
        y = torch.matmul(p, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Net(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.attn = Attention(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x, mask):
        x = x + self.attn(x, mask.unsqueeze(1))
        return x + self.fc(x)
'''

MASKED_HARNESS = '''
import torch

from model import Net


def build(batch_size=2, seq_len=8):
    torch.manual_seed(0)
    x = torch.randn(batch_size, seq_len, 32, requires_grad=True)
    mask = torch.ones(batch_size, seq_len, seq_len, dtype=torch.long)
    mask[-1, :, seq_len - 2:] = 0  # padded keys of the last sample; every query keeps some key
    return Net(), (x, mask)
'''
MASKED_ATTENTION = '''        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        scores = scores.masked_fill(mask == 0, {fill})
        p = F.softmax(scores, dim=-1)
        y = torch.matmul(p, v)
'''


def write_masked_repo(root: Path, fill: str = "-1e9") -> Path:
    return write_repo(root, harness=MASKED_HARNESS, model=MASKED_MODEL.replace("{fill}", fill))


def masked_rewrite(root: Path, replacement: str, fill: str = "-1e9") -> dict[str, str]:
    """The masked attention of ``write_masked_repo`` replaced by ``replacement`` (statements)."""
    text = (root / "model.py").read_text()
    block = MASKED_ATTENTION.replace("{fill}", fill)
    assert block in text
    return {"model.py": text.replace(block, replacement)}
