"""What the rule tests share: one source scanned with one rule, and a rewritten source run."""

from __future__ import annotations

from engine.scan import scan_source, select_rules


def scan(source: str, rule: str = "sdpa-attention") -> tuple[list, str]:
    """The findings of `rule` in `source` (a file `case.py`) and the rewritten text."""
    return scan_source(source, select_rules(rule), "case.py", "case")


def statuses(source: str, rule: str = "sdpa-attention") -> tuple[list[tuple[str, str | None]], str]:
    """(status, reason) of each finding, and the rewritten text."""
    findings, new = scan(source, rule)
    return [(f.status, f.reason) for f in findings], new


def rewrite(source: str, rule: str = "sdpa-attention") -> str:
    """The rewritten text, which must differ from `source` (the findings say why where it does not)."""
    findings, new = scan(source, rule)
    assert new != source, [(f.status, f.reason) for f in findings]
    return new


def namespace(source: str) -> dict:
    """The module-level names of `source`, executed (sources written in the tests themselves)."""
    names: dict = {}
    exec(compile(source, "<case>", "exec"), names)  # noqa: S102 - sources written in the tests
    return names


def train_steps(model, opt, steps: int) -> None:
    """`steps` optimizer steps of `model` on a fixed stream of float64 inputs (seeded here), for
    comparing an optimizer the original code builds against the rewritten one's."""
    import torch

    torch.manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 3, dtype=torch.float64)).pow(2).mean().backward()
        opt.step()
