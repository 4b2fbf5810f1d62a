"""Every link to Adopter's documentation that a pull request body or a SARIF log carries lands on a
page in docs/ and, where it has an anchor, on a heading or an explicit anchor of that page; the
documentation's URL has one source, ``[project.urls] Documentation`` in pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from urllib.parse import unquote

import pytest

from engine.report import links, render_pr_body
from engine.report.links import default_docs_url, docs_base_url
from engine.sarif import to_sarif
from engine.scan import select_rules

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lowercased, punctuation other
    than `-` and `_` removed, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Heading anchors (a repeated one gets -1, -2, ... as on GitHub) and explicit `<a id/name>`s."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(1))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
        found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return found


def test_slugs_follow_github():
    assert github_slug("Keys") == "keys"
    assert github_slug("Configuration: `.adopter.yml`") == "configuration-adopteryml"
    assert github_slug("Hugging Face-style models (no harness needed)") == "hugging-face-style-models-no-harness-needed"
    assert github_slug("What it does") == "what-it-does"


def docs_links(text: str, base: str) -> list[str]:
    return re.findall(re.escape(base) + r"[^\s)\"'<>`]*", text)


def assert_resolves(url: str, base: str) -> None:
    page, _, anchor = url[len(base):].partition("#")
    target = DOCS / unquote(page)
    if not page:
        assert DOCS.is_dir(), url  # the documentation's own folder
        return
    assert target.is_file(), f"{url}: no {target.relative_to(ROOT)}"
    if anchor:
        assert unquote(anchor) in anchors(target), f"{url}: no heading or anchor {anchor!r} in {page}"


@pytest.fixture
def base(monkeypatch):
    monkeypatch.delenv("ADOPTER_DOCS_URL", raising=False)
    return docs_base_url()


def full_body() -> str:
    rules = select_rules("all")
    findings = [{"rule": rule.id, "file": "model.py", "line": 10 + i, "status": "rewritten"}
                for i, rule in enumerate(rules)]
    bench = {"status": "ok", "baseline_step_s": 2.0, "optimized_step_s": 1.0, "verdict": "faster",
             "speedup": {"median": 2.0, "ci95": [1.9, 2.1], "samples": 20}, "repeats": 20,
             "baseline_peak_bytes": 200, "optimized_peak_bytes": 100, "memory_reduction": 0.5,
             "memory": {"median": 0.5, "ci95": [0.45, 0.55], "samples": 20}, "device": "cpu", "dtype": "float32",
             "versions": {"torch": "2.13.0"}}
    verification = {"per_rewrite": {rule.id: {"status": "passed", "max_abs_err": 1e-6, "max_rel_err": 1e-7}
                                    for rule in rules}, "accepted": [rule.id for rule in rules], "dropped": {},
                    "combined": {"status": "passed"}}
    return render_pr_body({"findings": findings, "verification": verification, "bench": bench,
                           "repository": "acme/models", "identity": "adopter/all", "base_sha": "0" * 40,
                           "config": {"repository": {"min_gain": 0.05}, "source": ".adopter.yml"},
                           "dashboard_url": "https://adopter.example.com/scans/1", "scan_id": 1,
                           "limit": 10**7})


def test_every_docs_link_in_a_full_pull_request_body_resolves(base):
    body = full_body()
    found = docs_links(body, base)
    rules = select_rules("all")
    # each rule's link (twice: the list item and its help), the configuration keys, the footer
    assert len(found) >= 2 * len(rules) + 2, found
    for url in found:
        assert_resolves(url, base)
    assert f"{base}config.md#keys" in found


def test_every_sarif_help_uri_resolves(base):
    uris = [rule["helpUri"] for rule in to_sarif([], select_rules("all"), ".")["runs"][0]["tool"]["driver"]["rules"]]
    assert uris
    for url in uris:
        assert url.startswith(base)
        assert_resolves(url, base)


def test_a_link_to_a_missing_page_or_anchor_is_caught(base):
    with pytest.raises(AssertionError, match="no docs/nowhere.md"):
        assert_resolves(f"{base}nowhere.md", base)
    with pytest.raises(AssertionError, match="no heading or anchor"):
        assert_resolves(f"{base}config.md#no-such-heading", base)


def test_the_configuration_link_goes_where_the_keys_are_documented():
    """The keys table of config.md names every key of the configuration the body shows."""
    from engine.config import RepoConfig

    table = (DOCS / "config.md").read_text().split("## Keys", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", table, flags=re.M))
    shown = RepoConfig.from_dict({}).to_dict()
    assert set(shown) <= documented
    assert {f"paths.{key}" for key in shown["paths"]} <= documented


def test_the_docs_url_comes_from_pyproject(monkeypatch):
    monkeypatch.delenv("ADOPTER_DOCS_URL", raising=False)
    expected = PROJECT["urls"]["Documentation"]
    assert default_docs_url() == expected and docs_base_url() == expected.rstrip("/") + "/"
    assert links._pyproject_docs_url(ROOT / "pyproject.toml") == expected
    monkeypatch.setenv("ADOPTER_DOCS_URL", "https://docs.example.com/a")
    assert docs_base_url() == "https://docs.example.com/a/"  # the setting still wins


def test_the_installed_metadata_comes_first(tmp_path, monkeypatch):
    """An installed distribution's Project-URL (what pip writes from [project.urls]) is read before
    the checkout's file; one without the line (installed before it existed) falls back to the file."""
    monkeypatch.delenv("ADOPTER_DOCS_URL", raising=False)
    info = tmp_path / "adopter-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: adopter\nVersion: 9.9.9\n"
                                   "Project-URL: Homepage, https://example.org/home\n"
                                   "Project-URL: Documentation, https://example.org/adopter/docs/\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    default_docs_url.cache_clear()
    try:
        assert default_docs_url() == "https://example.org/adopter/docs/"
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: adopter\nVersion: 9.9.9\n")
        default_docs_url.cache_clear()
        assert default_docs_url() == PROJECT["urls"]["Documentation"]
        monkeypatch.setattr(links, "PYPROJECT", tmp_path / "pyproject.toml")  # installed, no checkout
        (tmp_path / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
        default_docs_url.cache_clear()
        with pytest.raises(RuntimeError, match="ADOPTER_DOCS_URL"):
            default_docs_url()
    finally:
        default_docs_url.cache_clear()
