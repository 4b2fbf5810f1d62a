"""Absolute links to Adopter's documentation, and the version that wrote a report.

A pull request body and a SARIF log are read on someone else's repository, where a relative link
(``docs/rules.md#...``) would point into that repository. Every link is therefore absolute, under one
setting: ``ADOPTER_DOCS_URL`` (the folder that holds ``rules.md``, ``config.md``, ...), by default
the project's own ``Documentation`` URL: ``[project.urls]`` in ``pyproject.toml``, read from the
installed distribution's metadata (``Project-URL``), else from the checkout's ``pyproject.toml`` when
Adopter runs from source (an install made before the key existed has no such line).
"""

from __future__ import annotations

import importlib.metadata
import os
import tomllib
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

DOCS_URL_VARIABLE = "ADOPTER_DOCS_URL"
DISTRIBUTION = "adopter"
DOCS_LABEL = "Documentation"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@lru_cache(maxsize=1)
def default_docs_url() -> str:
    """``[project.urls] Documentation``: the installed metadata's, else the source checkout's."""
    url = _metadata_docs_url() or _pyproject_docs_url(PYPROJECT)
    if not url:
        raise RuntimeError(f"no {DOCS_LABEL} URL: neither the installed {DISTRIBUTION!r} distribution's metadata "
                           f"nor {PYPROJECT} has one in [project.urls]; set {DOCS_URL_VARIABLE}")
    return url


def _metadata_docs_url() -> str | None:
    try:
        lines = importlib.metadata.metadata(DISTRIBUTION).get_all("Project-URL") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in lines:  # "Documentation, https://..."
        label, _, url = line.partition(",")
        if label.strip().lower() == DOCS_LABEL.lower() and url.strip():
            return url.strip()
    return None


def _pyproject_docs_url(path: Path) -> str | None:
    try:
        project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if project.get("name") != DISTRIBUTION:  # some other project's file above an installed copy
        return None
    urls = {label.lower(): url for label, url in (project.get("urls") or {}).items()}
    return urls.get(DOCS_LABEL.lower())


def docs_base_url(base: str | None = None) -> str:
    """The documentation folder's URL, ending in ``/``: ``base`` if given, else the setting, else the
    project's ``Documentation`` URL."""
    url = (base or os.environ.get(DOCS_URL_VARIABLE) or default_docs_url()).strip()
    if "://" not in url:
        raise ValueError(f"{DOCS_URL_VARIABLE} must be an absolute URL (https://...), got {url!r}")
    return url if url.endswith("/") else url + "/"


def doc_url(page: str, base: str | None = None) -> str:
    """The URL of one documentation page, e.g. ``doc_url("config.md#keys")``."""
    return docs_base_url(base) + page


def rule_help_url(rule_id: str, base: str | None = None) -> str:
    """The rule's section in ``rules.md`` (anchored by its id, see ``engine.docs_gen``)."""
    return doc_url("rules.md", base) + "#" + quote(rule_id, safe="/_-.")


def adopter_version() -> str:
    try:
        return importlib.metadata.version("adopter")
    except importlib.metadata.PackageNotFoundError:  # running from a checkout that is not installed
        return "0.0.0"
