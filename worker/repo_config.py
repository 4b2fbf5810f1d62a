"""The repository's configuration, as the App reads it: the engine's own reader (``engine.config``),
so that the command line and the App agree on every file (docs/config.md)."""

from engine.config import CONFIG_FILES, MAX_CONFIG_BYTES, ConfigError, PathsConfig, RepoConfig, load_config

CONFIG_PATHS = CONFIG_FILES

__all__ = ["CONFIG_PATHS", "MAX_CONFIG_BYTES", "ConfigError", "PathsConfig", "RepoConfig", "load_config"]
