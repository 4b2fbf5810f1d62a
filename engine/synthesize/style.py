"""The repository's code style, read from its configuration, and the formatter that applies it.

Changed statements are laid out by `ruff format` (a real formatter, not our own printer) with the
repository's line length and quote style; the rest of the file is never reformatted. The settings
come from the nearest `pyproject.toml` (`[tool.ruff]`, `[tool.black]`), `ruff.toml`/`.ruff.toml`
or `setup.cfg`/`tox.ini`/`.flake8` (`max-line-length`) above the scanned path. Without any, the
file itself says what its project accepts: the smallest common limit (88, 100, 119, 120) that 99%
of its lines keep to (a file written to 119 columns is not wrapped at 88), and the quotes that
nine in ten of its one-line strings use (else quotes as written): a template's `'params'` is then
written `"params"` in a file of double-quoted strings, and the other way round.
"""

from __future__ import annotations

import configparser
import functools
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

DEFAULT_LINE_LENGTH = 88
COMMON_LIMITS = (88, 100, 119, 120)


@dataclass(frozen=True)
class Style:
    line_length: int = DEFAULT_LINE_LENGTH
    quote_style: str = "preserve"  # ruff's format.quote-style: "double", "single" or "preserve"
    source: str | None = None  # the file the settings came from

    def for_text(self, text: str) -> Style:
        """This style, or where no configuration was found, the one `text` is evidently written to."""
        if self.source is not None:
            return self
        lengths = sorted(len(line) for line in text.splitlines() if line.strip())
        if not lengths:
            return self
        typical = lengths[min(len(lengths) - 1, int(len(lengths) * 0.99))]
        limit = next((n for n in COMMON_LIMITS if typical <= n), COMMON_LIMITS[-1])
        return Style(max(limit, self.line_length), _quotes_of(text) or self.quote_style, None)

    def format_statement(self, code: str, indent: int) -> str:
        """`code` (one statement, not indented) laid out for a line length of the repository's
        minus `indent` columns; unchanged when it already fits on one line or ruff cannot run."""
        width = max(self.line_length - indent, 20)
        one_line = "\n" not in code.rstrip("\n")
        trailing_comma = ",)" in code.replace(" ", "")  # the author's exploded call: laid out again
        other_quote = {"double": "'", "single": '"'}.get(self.quote_style)
        if one_line and len(code.rstrip("\n")) <= width and not trailing_comma \
                and (other_quote is None or other_quote not in code):
            return code
        return _ruff_format(code, width, self.quote_style)


QUOTE_SHARE = 0.9  # of a file's one-line strings, what makes their quote the file's style
# what Python's tokenizer reads as a comment or a string literal (the prefix letters before a quote
# do not matter here), scanned left to right: a quote inside a comment or inside another string is
# never the start of one
_LEXEME = re.compile("|".join((
    r"#[^\n]*",  # a comment
    r'"""(?:\\.|[^\\])*?"""', r"'''(?:\\.|[^\\])*?'''",  # triple-quoted strings
    r'"(?:\\.|[^"\\\n])*"', r"'(?:\\.|[^'\\\n])*'",  # one-line strings
)), re.DOTALL)


def _quotes_of(text: str) -> str | None:
    """"double" or "single" where at least nine in ten of the file's one-line string literals
    (those that could be written either way: no quote of the other kind inside) use that quote."""
    counts = {'"': 0, "'": 0}
    for match in _LEXEME.finditer(text):
        body = match.group()
        if body[0] == "#" or body[:3] in ('"""', "'''"):
            continue
        quote, other = body[0], "'" if body[0] == '"' else '"'
        if other not in body:
            counts[quote] += 1
    total = counts['"'] + counts["'"]
    if total == 0:
        return None
    if counts['"'] >= QUOTE_SHARE * total:
        return "double"
    if counts["'"] >= QUOTE_SHARE * total:
        return "single"
    return None


@functools.lru_cache(maxsize=1)
def _ruff_binary() -> str | None:
    try:
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        return None
    try:
        return str(find_ruff_bin())
    except FileNotFoundError:
        return None


@functools.lru_cache(maxsize=4096)
def _ruff_format(code: str, width: int, quote_style: str) -> str:
    binary = _ruff_binary()
    if binary is None:
        return code
    done = subprocess.run(
        [binary, "format", "--isolated", "--config", f"line-length={width}",
         "--config", f'format.quote-style="{quote_style}"', "--stdin-filename", "stmt.py", "-"],
        input=code, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        return code
    return done.stdout


def _from_pyproject(path: Path) -> Style | None:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    tool = data.get("tool", {})
    ruff = tool.get("ruff")
    if isinstance(ruff, dict):
        return _from_ruff(ruff, str(path))
    black = tool.get("black")
    if isinstance(black, dict):
        length = black.get("line-length", DEFAULT_LINE_LENGTH)
        quotes = "preserve" if black.get("skip-string-normalization") else "double"
        return Style(int(length), quotes, str(path))
    return None


def _from_ruff(ruff: dict, source: str) -> Style:
    length = ruff.get("line-length", DEFAULT_LINE_LENGTH)
    fmt = ruff.get("format", {})
    quotes = fmt.get("quote-style", "double") if isinstance(fmt, dict) else "double"
    return Style(int(length), str(quotes), source)


def _from_cfg(path: Path) -> Style | None:
    parser = configparser.ConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return None
    for section in ("flake8", "pycodestyle", "tool:pycodestyle"):
        if parser.has_option(section, "max-line-length"):
            try:
                return Style(int(parser.get(section, "max-line-length")), "preserve", str(path))
            except ValueError:
                return None
    return None


def find_style(start: Path | str) -> Style:
    """The style configured for `start` (a file or folder): the nearest configuration above it."""
    here = Path(start).resolve()
    folders = [here] if here.is_dir() else []
    folders += list(here.parents)
    for folder in folders:
        for name in ("ruff.toml", ".ruff.toml"):
            candidate = folder / name
            if candidate.is_file():
                try:
                    return _from_ruff(tomllib.loads(candidate.read_text(encoding="utf-8")), str(candidate))
                except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
                    pass
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            found = _from_pyproject(candidate)
            if found is not None:
                return found
        for name in ("setup.cfg", "tox.ini", ".flake8"):
            candidate = folder / name
            if candidate.is_file():
                found = _from_cfg(candidate)
                if found is not None:
                    return found
        if (folder / ".git").exists():
            break  # the repository's root: configuration above it is someone else's
    return Style()
