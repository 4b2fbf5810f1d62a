"""The pull request's title (deterministic from the rules: it is part of the identity)."""

from __future__ import annotations


def title_for(rule_ids: list[str]) -> str:
    return f"Adopter: use optimized kernels ({', '.join(sorted(rule_ids))})"
