"""The project's contract: which torch it promises to run on, read from its packaging files.

A rewrite that needs a newer torch than the oldest one the project supports would break its users
on that torch. The oldest supported version is the lower bound of the `torch` (or conda `pytorch`)
requirement in `pyproject.toml` (`[project] dependencies` and optional dependencies),
`setup.cfg` (`install_requires`), `setup.py` (its requirement strings, read as text, never run),
`requirements*.txt` and conda `environment*.yml` files at the repository's root. A project that
names torch without a lower bound promises nothing about old versions; one that does not name it
at all (a model folder copied out of its project) gives no contract, and rewrites proceed.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

_REQ_STRING = re.compile(r"""["']\s*((?:torch|pytorch)\s*(?:[<>=~!]=?|===?)[^"']*)["']""")


@dataclass(frozen=True)
class TorchContract:
    floor: Version | None  # the oldest torch the project supports; None: no lower bound
    source: str  # the file that says so

    def refuses(self, requires: tuple[str, ...]) -> str | None:
        """Why a rule requiring `requires` (e.g. ("torch>=2.1",)) must not rewrite this project,
        or None when it may."""
        for text in requires:
            try:
                need = Requirement(text)
            except InvalidRequirement:
                continue
            if need.name not in ("torch", "pytorch"):
                continue
            minimum = _lower_bound(need.specifier)
            if minimum is None:
                continue
            if self.floor is None:
                return (f"the project supports any torch ({self.source} gives no lower bound); "
                        f"the kernel needs {text}")
            if self.floor < minimum:
                return f"the project supports torch>={self.floor} ({self.source}); the kernel needs {text}"
        return None


def _lower_bound(spec: SpecifierSet) -> Version | None:
    bounds = []
    for s in spec:
        if s.operator in (">=", "==", "~=", ">", "==="):
            try:
                bounds.append(Version(s.version.rstrip(".*")))
            except InvalidVersion:
                continue
    return max(bounds) if bounds else None


def _requirements_in(texts: list[str]) -> list[Requirement]:
    out = []
    for text in texts:
        text = text.split("#", 1)[0].strip()
        if not text or text.startswith("-"):
            continue
        if text.startswith("pytorch"):  # conda's name
            text = "torch" + text[len("pytorch"):]
        text = re.sub(r"^(torch)\s*=(?!=)", r"\1==", text)  # conda's single '='
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name == "torch":
            out.append(req)
    return out


def _candidates(root: Path) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            project = {}
        deps = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            deps += list(extra)
        found.append(("pyproject.toml", [str(d) for d in deps]))
    for name in ("setup.cfg", "setup.py"):
        path = root / name
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            if name == "setup.cfg":
                found.append((name, [line.strip() for line in text.splitlines()]))
            else:
                found.append((name, [m.group(1) for m in _REQ_STRING.finditer(text)]))
    for path in sorted(root.glob("requirements*.txt")) + sorted(root.glob("environment*.y*ml")):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        found.append((path.name, [line.strip().lstrip("- ").strip() for line in lines]))
    return found


def torch_contract(root: Path | str) -> TorchContract | None:
    """The project's torch contract, from the packaging files at `root`; None when none names torch."""
    root = Path(root)
    best: TorchContract | None = None
    for source, texts in _candidates(root):
        for req in _requirements_in(texts):
            floor = _lower_bound(req.specifier)
            contract = TorchContract(floor, source)
            # several files: the lowest floor promised anywhere is the contract
            if best is None or (floor is None) or (best.floor is not None and floor < best.floor):
                best = contract
    return best


def project_root(start: Path) -> Path:
    """The repository root above `start`: the nearest folder with .git or packaging metadata (a
    research repository's `requirements.txt` counts: it is where that project states its torch)."""
    here = start.resolve()
    for folder in [here, *here.parents] if here.is_dir() else list(here.parents):
        if (folder / ".git").exists() or any((folder / n).is_file() for n in ("pyproject.toml", "setup.py", "setup.cfg")) \
                or any(folder.glob("requirements*.txt")):
            return folder
    return here if here.is_dir() else here.parent
