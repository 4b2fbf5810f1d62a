"""The kernel calls a rewrite adds, by file and line: coverage per call site.

A file's rewrite can add several kernel calls (a vision tower and a text tower, an encoder and a
decoder attention). That the kernel ran somewhere proves nothing about a call that never ran: a
guard on its path may send every verification input down the original code. Each call the rewrite
adds (a call of the kernel's name whose source text is not already in the original file) must be
seen running at its lines; the child records the file and line each kernel call came from.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Site:
    path: str  # relative to the verified tree's root, as in the overlay
    kernel: str  # the rule's kernel spec, e.g. "torch.nn.functional.scaled_dot_product_attention"
    first_line: int
    last_line: int

    @property
    def label(self) -> str:
        return f"{self.path}:{self.first_line}"


def kernel_name(spec: str) -> str:
    """The name a call of the kernel ends with: `scaled_dot_product_attention`, `AdamW`."""
    return spec.partition("(")[0].rpartition(".")[2]


def _calls(text: str, name: str) -> list[ast.Call]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if called == name:
                out.append(node)
    return out


def _source(text: str, node: ast.AST) -> str:
    return "".join((ast.get_source_segment(text, node) or "").split())


def added_sites(root: Path, overlay: dict[str, str], kernels: tuple[str, ...]) -> list[Site]:
    """Calls of ``kernels`` in the overlay's files that the original files do not already make."""
    sites: list[Site] = []
    for rel, text in sorted(overlay.items()):
        if not rel.endswith(".py"):
            continue
        original_path = Path(root) / rel
        try:
            original = original_path.read_text() if original_path.is_file() else ""
        except (OSError, UnicodeDecodeError):
            original = ""
        for spec in kernels:
            name = kernel_name(spec)
            if name not in text:
                continue
            before = {_source(original, node) for node in _calls(original, name)}
            for node in _calls(text, name):
                if _source(text, node) not in before:
                    sites.append(Site(rel, spec, node.lineno, node.end_lineno or node.lineno))
    return sites


def unexercised(sites: list[Site], hits: dict[str, dict[str, int]], tree: str) -> list[Site]:
    """The sites no recorded call came from. ``hits``: kernel -> "ABSOLUTE_PATH:LINE" -> calls, as
    the rewritten side's child recorded them; only files under ``tree`` (its working copy) count."""
    seen: dict[tuple[str, str], set[int]] = {}
    prefix = tree.rstrip("/") + "/"
    for kernel, where in hits.items():
        for place, n in where.items():
            path, _, line = place.rpartition(":")
            if n > 0 and line.isdigit() and path.startswith(prefix):
                seen.setdefault((kernel, path[len(prefix):]), set()).add(int(line))
    missing = []
    for site in sites:
        lines = set()
        for (kernel, path), found in seen.items():
            if kernel == site.kernel and (path == site.path or path.endswith("/" + site.path)):
                lines |= found
        if not any(site.first_line <= line <= site.last_line for line in lines):
            missing.append(site)
    return missing
