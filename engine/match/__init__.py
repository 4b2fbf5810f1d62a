"""Matching of DSL rules against extracted structure, and scope analysis."""

from engine.match.matcher import Finding, Match
from engine.match.rulefile import RuleSyntaxError, load_rule, load_rules, parse_rule
from engine.match.scope import find

__all__ = ["Finding", "Match", "RuleSyntaxError", "find", "load_rule", "load_rules", "parse_rule"]
