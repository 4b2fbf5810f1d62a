"""The repository's configuration, ``.adopter.yml``: one reader for the command line and the App.

The file is untrusted input (the App reads it from any repository that installs it), so it is read
with a size limit, without following links, as strict UTF-8, by a YAML loader that refuses
anchors and aliases (an alias bomb of a few hundred bytes expands to gigabytes once anything walks
it) and duplicate keys, and then validated against the published JSON Schema
(``config.schema.json``, copied to ``docs/config.schema.json``). Every problem is one
``ConfigError`` line naming the file and the key, with a suggestion for a misspelt key.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

import yaml

# The first one found wins.
CONFIG_FILES = (".adopter.yml", ".adopter.yaml", ".github/adopter.yml", ".github/adopter.yaml")
MAX_CONFIG_BYTES = 64 * 1024
SCHEMA_PATH = Path(__file__).with_name("config.schema.json")


class ConfigError(ValueError):
    """The configuration file cannot be used; ``str()`` is one line: ``FILE: problem``."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.problem = message


@dataclass(frozen=True)
class PathsConfig:
    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RepoConfig:
    """The settings, defaults filled in (the defaults are the schema's)."""

    rules: str = "default"
    disable: tuple[str, ...] = ()
    paths: PathsConfig = field(default_factory=PathsConfig)
    harness: str | dict | None = None
    min_gain: float | None = None
    max_open_pull_requests: int = 2
    schedule: str = "none"

    @classmethod
    def from_dict(cls, data: dict, source: str | None = None) -> RepoConfig:
        """Validate a mapping (a parsed file, or the worker's stored copy) and build the settings."""
        validate(data, source)
        paths = data.get("paths") or {}
        return cls(
            rules=data.get("rules", "default"),
            disable=tuple(data.get("disable") or ()),
            paths=PathsConfig(include=_tuple_or_none(paths.get("include")),
                              exclude=_tuple_or_none(paths.get("exclude"))),
            harness=data.get("harness"),
            min_gain=data.get("min_gain"),
            max_open_pull_requests=data.get("max_open_pull_requests", 2),
            schedule=data.get("schedule", "none"),
        )

    def to_dict(self) -> dict:
        """JSON-ready; ``from_dict(to_dict())`` gives the same settings."""
        return {
            "rules": self.rules,
            "disable": list(self.disable),
            "paths": {"include": _list_or_none(self.paths.include), "exclude": _list_or_none(self.paths.exclude)},
            "harness": self.harness,
            "min_gain": self.min_gain,
            "max_open_pull_requests": self.max_open_pull_requests,
            "schedule": self.schedule,
        }

    def overridden(self, *, rules: str | None = None, include: list[str] | None = None,
                   exclude: list[str] | None = None, min_gain: float | None = None) -> RepoConfig:
        """These settings with the command line's options (those given) in place of the file's."""
        return replace(
            self,
            rules=rules if rules is not None else self.rules,
            paths=PathsConfig(include=tuple(include) if include else self.paths.include,
                              exclude=tuple(exclude) if exclude else self.paths.exclude),
            min_gain=min_gain if min_gain is not None else self.min_gain,
        )

    def selected_rules(self, source: str | None = None, rules_from: str | None = None):
        """The engine's rules for ``rules`` less ``disable``; an unknown id is a ``ConfigError``
        naming ``source`` (the file), or ``rules_from`` for ``rules`` (``--rules`` on the command line)."""
        from engine.scan import RuleSelectionError, select_rules

        try:
            chosen = select_rules(self.rules)
        except RuleSelectionError as exc:
            raise ConfigError(f"{rules_from or 'rules'}: {exc}", None if rules_from else source) from None
        known = {r.id for r in chosen}
        if not known.issuperset(self.disable):  # a rule outside the selection, or a typo
            known = {r.id for r in select_rules("all")}
        for rule_id in self.disable:
            if rule_id not in known:
                raise ConfigError(f"disable: unknown rule {rule_id!r}{_suggest(rule_id, known)}", source)
        return [r for r in chosen if r.id not in set(self.disable)]


def _tuple_or_none(value) -> tuple[str, ...] | None:
    return tuple(value) if value else None


def _list_or_none(value) -> list[str] | None:
    return list(value) if value else None


# --- reading the file ----------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without anchors, aliases (and so merge keys) or duplicate keys."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.MarkedYAMLError(problem="YAML anchors and aliases (&name, *name) are not allowed",
                                       problem_mark=event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_config(raw: bytes, source: str = ".adopter.yml") -> RepoConfig:
    """The settings in a config file's bytes."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"larger than {MAX_CONFIG_BYTES} bytes", source)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}, line {line})",
                          source) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - _StrictLoader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"not valid YAML{where}: {exc.problem or exc.context}", source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {' '.join(str(exc).split())}", source) from None
    except RecursionError:
        raise ConfigError("not valid YAML: nested too deeply", source) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of settings, found {_kind(data)}", source)
    return RepoConfig.from_dict(data, source)


def find_config(root: Path) -> str | None:
    """The relative name of the first config file present under ``root`` (links count as present:
    reading one is then an error, not a silent fallback to the next name)."""
    for relative in CONFIG_FILES:
        if os.path.lexists(root / relative):
            return relative
    return None


def load_config(root: Path | str) -> tuple[RepoConfig, str | None]:
    """The settings of the repository at ``root`` and the file they came from (None: no file,
    defaults apply)."""
    root = Path(root)
    relative = find_config(root)
    if relative is None:
        return RepoConfig(), None
    return parse_config(_read_regular_file(root, relative), relative), relative


def _read_regular_file(root: Path, relative: str) -> bytes:
    """At most MAX_CONFIG_BYTES + 1 bytes of a plain file inside ``root``, never through a link."""
    path = root / relative
    for part in (path.parent, path):
        if part != root and part.is_symlink():
            raise ConfigError(f"{part.relative_to(root).as_posix()} is a symbolic link; not followed", relative)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror}", relative) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError("not a regular file", relative)
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# --- validation ----------------------------------------------------------------------------------


@cache
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


@cache
def _validator():
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema())


def validate(data: dict, source: str | None = None) -> None:
    """Raise a one-line ``ConfigError`` for the first problem of ``data`` against the schema."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(data))
    if error is None:
        return
    raise ConfigError(_describe(error), source)


def _describe(error) -> str:
    where = ".".join(str(p) for p in error.absolute_path)
    prefix = f"{where}." if where else ""
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        unknown = [k for k in error.instance if k not in known]
        return "; ".join(f"{prefix}{key}: unknown key{_suggest(str(key), known)}" for key in unknown)
    if error.validator == "oneOf" and error.context:
        # the branch for the value's own kind says what is wrong inside it
        from jsonschema.exceptions import best_match

        inner = best_match(e for e in error.context if e.validator != "type")
        if inner is not None:
            return _describe(inner)
        return f"{where or '(top level)'}: expected 'file.py:function' or a mapping with build, shapes and bench"
    if error.validator == "pattern" and where.endswith("build") or where == "harness" and error.validator == "pattern":
        return f"{where}: {error.instance!r} is not 'file.py:function' (a .py file and a function name)"
    return f"{where or '(top level)'}: {error.message}"


def _suggest(word: str, known) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (known: {', '.join(sorted(known))})"


def _kind(value) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__)

