"""Combining several rewrites of the same files (a line-based three-way merge against the original).

Each candidate carries the full new text of the files it changes. To verify accepted rewrites
together, their edits are laid over the original one hunk at a time; two candidates that edit the
same lines differently conflict (and the later one is left out of the combination).
"""

from __future__ import annotations

import difflib
from pathlib import Path


class MergeConflict(ValueError):
    pass


def _hunks(base: list[str], new: list[str]) -> list[tuple[int, int, tuple[str, ...]]]:
    matcher = difflib.SequenceMatcher(a=base, b=new, autojunk=False)
    return [(i1, i2, tuple(new[j1:j2])) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def _overlap(a: tuple[int, int, tuple[str, ...]], b: tuple[int, int, tuple[str, ...]]) -> bool:
    (a1, a2, _), (b1, b2, _) = a, b
    if max(a1, b1) < min(a2, b2):
        return True
    if a1 == a2 == b1 == b2:  # two insertions at the same place
        return True
    return (a1 == a2 and b1 < a1 < b2) or (b1 == b2 and a1 < b1 < a2)


def merge_texts(base: str, versions: list[str]) -> str:
    base_lines = base.splitlines(keepends=True)
    chosen: list[tuple[int, int, tuple[str, ...]]] = []
    for version in versions:
        for hunk in _hunks(base_lines, version.splitlines(keepends=True)):
            if hunk in chosen:
                continue
            clash = next((other for other in chosen if _overlap(hunk, other)), None)
            if clash is not None:
                raise MergeConflict(f"edits of lines {hunk[0] + 1}-{hunk[1]} and {clash[0] + 1}-{clash[1]} overlap")
            chosen.append(hunk)
    lines = list(base_lines)
    for i1, i2, replacement in sorted(chosen, key=lambda h: (h[0], h[1]), reverse=True):
        lines[i1:i2] = replacement
    return "".join(lines)


def merge_overlays(original_root: Path, overlays: list[dict[str, str]]) -> dict[str, str]:
    """One overlay holding every overlay's edits; ``MergeConflict`` where two touch the same lines."""
    merged: dict[str, str] = {}
    for rel in sorted({rel for overlay in overlays for rel in overlay}):
        versions = [overlay[rel] for overlay in overlays if rel in overlay]
        if len(set(versions)) == 1:
            merged[rel] = versions[0]
            continue
        path = Path(original_root) / rel
        base = path.read_text() if path.is_file() else ""
        try:
            merged[rel] = merge_texts(base, versions)
        except MergeConflict as exc:
            raise MergeConflict(f"{rel}: {exc}") from None
    return merged
