"""The rule model: what a `.rule` file says, as data (parsed by engine.match.rulefile).

A rule's `match` block is a small data-flow pattern: statements `$out = OP(args)` where OP is a
canonical op (`softmax`), a qualified function (`torch.cat`), a tensor method (`.masked_fill`), or a
layer type (`@torch.nn.Linear`; `*` wildcards allowed in the dotted name). Alternatives are written
`a | b`; a trailing `?` makes a statement optional (when absent, its output is its first input).
An argument that names another statement's output is a data-flow edge; any other `$variable`
binds once and must bind the same value everywhere. The last statement is the root: the value the
rewrite replaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PArg:
    """One pattern argument: a `$variable`, a literal, or `_` (anything)."""

    kind: str  # "var", "lit", "any"
    value: object = None  # variable name (without $) or the literal


@dataclass(frozen=True)
class OpAlt:
    """One alternative of an op spec."""

    kind: str  # "op" (canonical/qualified/.method) or "layer" (a layer call of that type)
    name: str  # may contain `*` wildcards for layer types


@dataclass(frozen=True)
class PStmt:
    out: str | None
    ops: tuple[OpAlt, ...]
    args: tuple[PArg, ...]
    kwargs: tuple[tuple[str, PArg], ...]
    optional: bool = False
    open_kwargs: bool = False  # `...` in the argument list: other keywords allowed
    line: int = 0
    more: tuple[PStmt, ...] = ()  # further alternative calls: `$n = div($a, $s) | mul($a, $r)`

    # derived once (the matcher reads them for every node it tries)
    alternatives: tuple[PStmt, ...] = field(init=False, compare=False, repr=False)
    data_args: list[str] = field(init=False, compare=False, repr=False)
    all_ops: tuple[OpAlt, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        alternatives = (self, *self.more)
        seen: dict[str, None] = {}  # `$variables` read by any alternative, first alternative's first
        for alt in alternatives:
            for a in alt.args:
                if a.kind == "var":
                    seen.setdefault(a.value, None)  # type: ignore[arg-type]
        object.__setattr__(self, "alternatives", alternatives)
        object.__setattr__(self, "data_args", list(seen))
        object.__setattr__(self, "all_ops", tuple(op for alt in alternatives for op in alt.ops))


@dataclass(frozen=True)
class Example:
    kind: str  # "fires" or "near-miss"
    code: str
    expect: str | None = None  # expected rewritten code (fires, rewriting rules)
    reason: str | None = None  # expected near-miss reason substring
    count: int = 1  # how many findings the example must produce


@dataclass(frozen=True)
class Pattern:
    """One `match` block. A rule may give several (alternative spellings of one computation); a
    block marked `near-miss "reason"` describes a look-alike that must be reported, never rewritten."""

    stmts: tuple[PStmt, ...]
    near_miss: str | None = None
    definers: dict = field(init=False, compare=False, repr=False)  # output var -> (index, statement)

    def __post_init__(self) -> None:
        object.__setattr__(self, "definers", {st.out: (i, st) for i, st in enumerate(self.stmts) if st.out})

    @property
    def root(self) -> PStmt:
        return self.stmts[-1]

    def definer(self, var: str) -> tuple[int, PStmt] | None:
        for i, stmt in enumerate(self.stmts):
            if stmt.out == var:
                return i, stmt
        return None


@dataclass(frozen=True)
class Rule:
    id: str
    summary: str
    kernel: str
    patterns: tuple[Pattern, ...]
    requires: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    detect_only: bool = False
    rewrite: str | None = None  # Python expression template with $variables
    guard: bool = False  # may keep the original code on paths where intermediates escape
    ordered: bool = False  # `add`/`mul` operands only in the written order (default: either order)
    anywhere: bool = False  # match in every method, not only those that run in the training step
    constraints: tuple[str, ...] = ()  # named checks (see engine.match.constraints)
    examples: tuple[Example, ...] = ()
    doc: str = ""
    path: str = ""
    options: dict[str, str] = field(default_factory=dict)

    @property
    def pattern(self) -> tuple[PStmt, ...]:
        """The first pattern's statements (most rules have one)."""
        return self.patterns[0].stmts
