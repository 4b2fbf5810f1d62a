"""Absolute links to Adopter's documentation, and the version that wrote a report.

A pull request body and a SARIF log are read on someone else's repository, where a relative link
(``docs/rules.md#...``) would point into that repository. Every link is therefore absolute, under one
setting: ``ADOPTER_DOCS_URL`` (the folder that holds ``rules.md``, ``harness.md``, ...), by default
the documentation published with the project's source on GitHub.
"""

from __future__ import annotations

import importlib.metadata
import os
from urllib.parse import quote

DEFAULT_DOCS_URL = "https://github.com/adopter-dev/adopter/blob/main/docs/"
DOCS_URL_VARIABLE = "ADOPTER_DOCS_URL"


def docs_base_url(base: str | None = None) -> str:
    """The documentation folder's URL, ending in ``/``: ``base`` if given, else the setting, else the default."""
    url = (base or os.environ.get(DOCS_URL_VARIABLE) or DEFAULT_DOCS_URL).strip()
    if "://" not in url:
        raise ValueError(f"{DOCS_URL_VARIABLE} must be an absolute URL (https://...), got {url!r}")
    return url if url.endswith("/") else url + "/"


def doc_url(page: str, base: str | None = None) -> str:
    """The URL of one documentation page, e.g. ``doc_url("harness.md")``."""
    return docs_base_url(base) + page


def rule_help_url(rule_id: str, base: str | None = None) -> str:
    """The rule's section in ``rules.md`` (anchored by its id, see ``engine.docs_gen``)."""
    return doc_url("rules.md", base) + "#" + quote(rule_id, safe="/_-.")


def adopter_version() -> str:
    try:
        return importlib.metadata.version("adopter")
    except importlib.metadata.PackageNotFoundError:  # running from a checkout that is not installed
        return "0.0.0"
