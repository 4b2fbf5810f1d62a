"""A rule's help as the pull request embeds it: summary, why, and its own before/after example."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class RuleHelp:
    summary: str
    why: str = ""
    example: str = ""  # the rule's own "fires" example: code it rewrites
    use_instead: str = ""  # what that example becomes


def help_for(rule) -> RuleHelp:
    """From an ``engine.match.rule.Rule``."""
    fires = [e for e in rule.examples if e.kind == "fires"]
    example = next((e for e in fires if e.expect is not None), fires[0] if fires else None)
    return RuleHelp(summary=rule.summary, why=rule.doc.strip(),
                    example=example.code.strip() if example is not None else "",
                    use_instead=(example.expect or "").strip() if example is not None else "")


@lru_cache(maxsize=1)
def library_help() -> dict[str, RuleHelp]:
    """Help for every rule in the library (empty when the rules cannot be loaded: the body then
    links to the documentation only)."""
    try:
        from engine.scan import select_rules

        return {rule.id: help_for(rule) for rule in select_rules("all")}
    except Exception:  # noqa: BLE001 - a body without embedded help still links to it
        return {}
