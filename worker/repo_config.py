"""Per-repository configuration: ``.adopter.yml`` or ``.github/adopter.yml`` on the default branch.

    rules: default              # the engine's rule set
    disable: [rule-id, ...]     # rules never proposed in this repository
    paths:
      include: ["src/**"]
      exclude: ["tests/**"]
    harness: harness.py:build   # returns (model, inputs); read by the engine's verify and bench
    min_gain: 0.05              # minimum gain (faster step or less peak memory) to open a pull request
    max_open_pull_requests: 2
    schedule: weekly            # none, daily, weekly: rescans besides pushes

An invalid file is reported (``ConfigError`` with a message naming the field), never a crash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

# The same files, in the same order, as the engine reads (engine.verify.targets.CONFIG_FILES).
CONFIG_PATHS = (".adopter.yml", ".adopter.yaml", ".github/adopter.yml", ".github/adopter.yaml")
MAX_CONFIG_BYTES = 64 * 1024


class ConfigError(ValueError):
    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path


class PathsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include: list[str] | None = None
    exclude: list[str] | None = None


class RepoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: str = "default"
    disable: list[str] = Field(default_factory=list)
    paths: PathsConfig = Field(default_factory=PathsConfig)
    # "file.py:function" or {build: ..., shapes: [...], bench: {...}}; read by engine.verify.
    harness: str | dict | None = None
    # Fraction (0.05) or ratio (1.05): 5% faster steps or 5% less peak memory; None: the engine's default.
    min_gain: float | None = Field(default=None, ge=0)
    max_open_pull_requests: int = Field(default=2, ge=0)
    schedule: Literal["none", "daily", "weekly"] = "none"


def load_config(checkout: Path) -> tuple[RepoConfig, str | None]:
    """The repository's config and the file it came from (None: no file, defaults apply)."""
    for relative in CONFIG_PATHS:
        path = checkout / relative
        if path.is_symlink() or not path.is_file():
            continue
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(relative, f"larger than {MAX_CONFIG_BYTES} bytes")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(relative, f"not valid YAML: {exc}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(relative, f"expected a mapping of settings, found {type(data).__name__}")
        try:
            return RepoConfig.model_validate(data), relative
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(relative, problems) from None
    return RepoConfig(), None
