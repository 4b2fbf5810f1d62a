"""Building blocks of hostile repositories: a valid tiny model whose harness also attacks, and
reports what it saw into its own working copy (the one place the sandbox lets it write), so that
a test can read the report from a kept working folder afterwards."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from engine.bench import BenchConfig
from engine.verify import VerifyConfig
from tests.engine.verify.fixtures import write_repo

# The harness of tests/engine/verify/fixtures with an attack run inside build(); the attack's
# findings go to probe-<pid>.json in the working directory (the copy of the repository).
_HARNESS = '''
import json, os, socket, subprocess, sys, time
import torch
from model import Net

def _report(seen):
    with open(f"probe-{{os.getpid()}}.json", "w") as handle:
        json.dump(seen, handle)

def _attack(batch_size, seq_len):
{attack}

def build(batch_size=2, seq_len=8, dropout=0.1):
    seen = _attack(batch_size, seq_len) or {{}}
    _report(seen)
    torch.manual_seed(0)
    x = torch.randn(batch_size, seq_len, 32, requires_grad=True)
    return Net(dropout=dropout), (x,)
'''

CONFIG = '''
harness:
  build: harness.py:build
  shapes:
    - {batch_size: 1, seq_len: 4}
  bench: {batch_size: 1, seq_len: 4}
'''


def hostile_repo(root: Path, attack: str) -> Path:
    """A repository whose model is valid (the sdpa rewrite applies) and whose harness runs ``attack``
    (the body of a function of ``batch_size, seq_len`` returning a dict of observations)."""
    body = textwrap.indent(textwrap.dedent(attack).strip("\n"), "    ")
    return write_repo(root, harness=_HARNESS.format(attack=body), config=CONFIG)


def probes(workdir: Path) -> list[dict]:
    """Every report a harness wrote, over all sides and runs in ``workdir``."""
    return [json.loads(p.read_text()) for p in sorted(workdir.rglob("probe-*.json"))]


def verify_config(workdir: Path | None, **kwargs) -> VerifyConfig:
    """Verification of one tiny case; a given ``workdir`` is kept for the test to read."""
    return VerifyConfig(**{"timeout_s": 90, "threads": 1, "workdir": workdir, "keep_workdir": workdir is not None,
                           "fp64_reference": False, **kwargs})


def bench_config(workdir: Path, **kwargs) -> BenchConfig:
    return BenchConfig(**{"warmup": 0, "repeats": 1, "threads": 1, "timeout_s": 120, "workdir": workdir, **kwargs})
