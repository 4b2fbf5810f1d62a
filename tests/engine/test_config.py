"""engine.config: the one reader of ``.adopter.yml`` (command line and App), safe on hostile files."""

from __future__ import annotations

import json
import os
import re
import tracemalloc
from pathlib import Path

import pytest

from engine.config import (
    CONFIG_FILES,
    MAX_CONFIG_BYTES,
    SCHEMA_PATH,
    ConfigError,
    RepoConfig,
    load_config,
    parse_config,
    schema,
)

ROOT = Path(__file__).resolve().parents[2]

# 551 bytes that a YAML loader with aliases turns into 9**9 (387 million) strings once walked.
ALIAS_BOMB = b"""\
# nine levels of nine aliases: expanded, 9**9 strings (the size of the one that was reported) ...
# stored as JSON by the worker before, it took hundreds of megabytes and killed the Celery main process (pad).
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def write(root: Path, relative: str, content: str | bytes) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def test_no_file_means_the_defaults_and_an_empty_file_too(tmp_path):
    assert load_config(tmp_path) == (RepoConfig(), None)
    write(tmp_path, ".adopter.yml", "# nothing yet\n")
    assert load_config(tmp_path) == (RepoConfig(), ".adopter.yml")


def test_a_full_file_is_read_and_survives_the_round_trip(tmp_path):
    write(tmp_path, ".github/adopter.yml", """
rules: paper
disable: [gelu-tanh]
paths: {include: ["src/**"], exclude: ["tests/**"]}
harness: {build: harness.py:build, shapes: [{batch_size: 2}], bench: {batch_size: 4}}
min_gain: 1.10
max_open_pull_requests: 1
schedule: weekly
""")
    config, source = load_config(tmp_path)
    assert source == ".github/adopter.yml"
    assert config.rules == "paper" and config.disable == ("gelu-tanh",)
    assert config.paths.include == ("src/**",) and config.paths.exclude == ("tests/**",)
    assert config.harness["bench"] == {"batch_size": 4} and config.min_gain == 1.10
    assert config.max_open_pull_requests == 1 and config.schedule == "weekly"
    assert RepoConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_the_first_file_in_order_wins(tmp_path):
    write(tmp_path, ".github/adopter.yml", "rules: paper\n")
    write(tmp_path, ".adopter.yaml", "rules: all\n")
    assert load_config(tmp_path) == (RepoConfig(rules="all"), ".adopter.yaml")


@pytest.mark.parametrize("text, message", [
    ("harnes: harness.py:build\n", "harnes: unknown key (did you mean 'harness'?)"),
    ("min_gian: 0.1\n", "min_gian: unknown key (did you mean 'min_gain'?)"),
    ("paths: {exlude: [tests]}\n", "paths.exlude: unknown key (did you mean 'exclude'?)"),
    ("harness: {build: h.py:build, shape: [{a: 1}]}\n", "harness.shape: unknown key (did you mean 'shapes'?)"),
    ("colour: blue\n", "colour: unknown key (known: disable, harness,"),
    ("harness: model.py\n", None),  # a .py file alone is fine (function defaults to build)
    ("harness: model\n", "harness: 'model' is not 'file.py:function'"),
    ("harness: {shapes: [{a: 1}]}\n", "'build' is a required property"),
    ("harness: {build: h.py, shapes: []}\n", "harness.shapes"),
    ("max_open_pull_requests: many\n", "max_open_pull_requests: 'many' is not of type 'integer'"),
    ("min_gain: -1\n", "min_gain: -1 is less than the minimum of 0"),
    ("schedule: hourly\n", "schedule: 'hourly' is not one of"),
    ("disable: gelu-tanh\n", "disable: 'gelu-tanh' is not of type 'array'"),
    ("rules: [unclosed", "not valid YAML (line 1, column 17)"),
    ("- a list\n- not a mapping\n", "expected a mapping of settings, found a list"),
    ("rules: all\nrules: paper\n", "duplicate key 'rules'"),
    ("base: &base {rules: all}\n<<: *base\n", "anchors and aliases"),
    ("rules: !!python/object:os.system ls\n", "not valid YAML"),
])
def test_each_problem_is_one_line_naming_the_file_and_the_key(tmp_path, text, message):
    write(tmp_path, ".adopter.yml", text)
    if message is None:
        load_config(tmp_path)
        return
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path)
    line = str(error.value)
    assert "\n" not in line and line.startswith(".adopter.yml: ") and message in line, line


def test_the_alias_bomb_fails_fast_in_little_memory(tmp_path):
    assert len(ALIAS_BOMB) == 551
    write(tmp_path, ".adopter.yml", ALIAS_BOMB)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="anchors and aliases") as error:
            load_config(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "(line 3, column 4)" in str(error.value)  # the first anchor
    # a sanity bound, not a measurement: expanding the aliases would need gigabytes
    assert peak < 8 * 1024 * 1024, peak


def test_a_file_over_the_size_limit_is_refused_without_reading_it_all(tmp_path):
    write(tmp_path, ".adopter.yml", "# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        load_config(tmp_path)


def test_invalid_utf8_is_refused_with_where_it_is(tmp_path):
    write(tmp_path, ".adopter.yml", b"rules: default\n# caf\xe9\n")
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path)
    assert str(error.value) == ".adopter.yml: not valid UTF-8 (byte 0xe9 at offset 20, line 2)"


def test_deep_nesting_is_an_error_not_a_crash(tmp_path):
    write(tmp_path, ".adopter.yml", "harness: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply|not valid YAML"):
        load_config(tmp_path)


def test_links_and_special_files_are_not_followed(tmp_path):
    secret = write(tmp_path / "outside", "secret.yml", "rules: all\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".adopter.yml").symlink_to(secret)
    with pytest.raises(ConfigError, match=r"^\.adopter\.yml: \.adopter\.yml is a symbolic link; not followed$"):
        load_config(repo)
    (repo / ".adopter.yml").unlink()
    (repo / ".github").symlink_to(secret.parent, target_is_directory=True)
    (secret.parent / "adopter.yml").write_text("rules: all\n")
    with pytest.raises(ConfigError, match="symbolic link"):
        load_config(repo)
    (repo / ".github").unlink()
    os.mkfifo(repo / ".adopter.yml")  # would block a plain open()
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(repo)


def test_rule_ids_are_checked_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"disable: unknown rule 'gelu-tahn' \(did you mean 'gelu-tanh'\?\)"):
        RepoConfig(disable=("gelu-tahn",)).selected_rules(".adopter.yml")
    with pytest.raises(ConfigError, match="rules: unknown rule id"):
        RepoConfig(rules="sdpa-atention").selected_rules()
    chosen = {r.id for r in RepoConfig(disable=("gelu-tanh",)).selected_rules()}
    assert "gelu-tanh" not in chosen and "sdpa-attention" in chosen


def test_command_line_options_replace_the_files_settings():
    config = RepoConfig(rules="paper", min_gain=0.2).overridden(rules=None, include=[], exclude=["x"], min_gain=None)
    assert (config.rules, config.paths.exclude, config.min_gain) == ("paper", ("x",), 0.2)
    config = config.overridden(rules="all", include=["src"], min_gain=0.0)
    assert (config.rules, config.paths.include, config.min_gain) == ("all", ("src",), 0.0)


def test_the_published_schema_is_the_one_the_reader_uses_and_is_valid():
    from jsonschema import Draft202012Validator

    published = ROOT / "docs" / "config.schema.json"
    assert published.read_bytes() == SCHEMA_PATH.read_bytes(), "cp engine/config.schema.json docs/"
    Draft202012Validator.check_schema(schema())
    defaults = {key: spec.get("default") for key, spec in schema()["properties"].items()}
    expected = RepoConfig().to_dict()
    expected["paths"] = {}
    assert defaults == expected  # the schema's defaults are the reader's
    assert CONFIG_FILES[0] == ".adopter.yml"


def test_docs_describe_every_key_with_its_type_and_default():
    text = (ROOT / "docs" / "config.md").read_text()
    keys = list(schema()["properties"]) + [f"paths.{k}" for k in schema()["properties"]["paths"]["properties"]]
    keys += [f"harness.{k}" for k in ("build", "shapes", "bench")]
    for key in keys:
        row = re.search(rf"^\| `{re.escape(key)}` \|(.+)$", text, re.M)
        assert row, f"docs/config.md has no table row for `{key}`"
        cells = [c.strip() for c in row.group(1).split("|")]
        assert len(cells) >= 4 and all(cells[:3]), f"`{key}`: type, default and meaning must be filled in"
    # the example in the docs is itself a valid file
    example = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    parse_config(example.encode(), "docs/config.md")
