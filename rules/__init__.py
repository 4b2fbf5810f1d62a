"""The rule library: one rule per `.rule` file, written in the DSL (see docs/dsl.md)."""

from pathlib import Path

RULES_DIR = Path(__file__).resolve().parent
