from __future__ import annotations

import pytest

from worker.repo_config import CONFIG_PATHS, ConfigError, RepoConfig, load_config


def write(root, relative, text):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_no_file_means_defaults(tmp_path):
    config, source = load_config(tmp_path)
    assert source is None and config == RepoConfig()
    assert config.max_open_pull_requests == 2 and config.rules == "default"


def test_a_full_file_is_read(tmp_path):
    write(tmp_path, ".github/adopter.yml", """
rules: paper
disable: [gelu-tanh]
paths: {include: ["src/**"], exclude: ["tests/**"]}
harness: {build: harness.py:build, bench: {batch_size: 4}}
min_gain: 1.10
max_open_pull_requests: 1
schedule: weekly
""")
    config, source = load_config(tmp_path)
    assert source == ".github/adopter.yml"
    assert config.disable == ["gelu-tanh"] and config.paths.exclude == ["tests/**"]
    assert config.harness["bench"] == {"batch_size": 4} and config.max_open_pull_requests == 1


@pytest.mark.parametrize("text, message", [
    ("rules: [unclosed", "not valid YAML"),
    ("- a list\n- not a mapping\n", "expected a mapping"),
    ("max_open_pull_requests: many\n", "max_open_pull_requests"),
    ("min_gain: -1\n", "min_gain"),
    ("schedule: hourly\n", "schedule"),
    ("colour: blue\n", "colour"),
])
def test_invalid_files_give_a_message_naming_the_problem(tmp_path, text, message):
    write(tmp_path, ".adopter.yml", text)
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path)
    assert message in str(error.value) and str(error.value).startswith(".adopter.yml: ")


def test_an_empty_file_is_the_defaults(tmp_path):
    write(tmp_path, ".adopter.yml", "# nothing yet\n")
    assert load_config(tmp_path) == (RepoConfig(), ".adopter.yml")


def test_the_worker_reads_the_same_files_as_the_engine():
    targets = pytest.importorskip("engine.verify.targets")
    assert CONFIG_PATHS == targets.CONFIG_FILES
