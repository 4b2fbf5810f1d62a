"""The pull request's title and body.

The body is the engine's report (``engine.report``) when the engine provides a renderer; until
then this module renders the same context with its own template. Either way every figure comes
from the stored verification and benchmark results.
"""

from __future__ import annotations

from jinja2 import Environment, StrictUndefined

from worker.engine_adapter import render_pr_body

TEMPLATE = """\
Adopter rewrote {{ sites|length }} site(s) in `{{ repository }}` to use optimized kernels \
({{ rule_ids|join(", ") }}).

### Sites
| Rule | File | Lines |
|---|---|---|
{% for s in sites %}| `{{ s.rule_id }}` | `{{ s.path }}` | {{ s.line }}{% if s.end_line and s.end_line != s.line %}-{{ s.end_line }}{% endif %} |
{% endfor %}
### Verification
{% if result.verified %}Outputs and gradients of the original and the rewritten model match \
(max abs error {{ "%.3g"|format(result.max_abs_error) if result.max_abs_error is not none else "n/a" }}).
{% else %}Verification did not pass.
{% endif %}
### Benchmark (training step)
| | before | after | ratio |
|---|---|---|---|
| median time | {{ fmt_s(result.before_s) }} | {{ fmt_s(result.after_s) }} | {{ "%.2fx"|format(result.speedup) if result.speedup else "n/a" }} |
{% if result.peak_mem_before %}| peak memory | {{ fmt_b(result.peak_mem_before) }} | {{ fmt_b(result.peak_mem_after) }} | {{ "%.2fx"|format(result.peak_mem_before / result.peak_mem_after) if result.peak_mem_after else "n/a" }} |
{% endif %}
Device: {{ result.device or "unknown" }}{% for k, v in result.versions|dictsort %}, {{ k }} {{ v }}{% endfor %}.

### Reproduce
```bash
git checkout {{ base_sha }}          # the commit this pull request starts from
adopter scan . --rules {{ rules }}   # rewrites, verifies and benchmarks on your machine
```

### Commands
Comment on this pull request:
- `{{ mention }} rescan`: scan the default branch again and update this pull request
- `{{ mention }} recreate`: rebuild this branch from scratch, discarding edits made to it
- `{{ mention }} ignore`: close this pull request and stop proposing it until the code changes

<!-- adopter-identity: {{ identity }} scan: {{ scan_id }} -->
"""


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.2f} ms" if value < 1 else f"{value:.3f} s"


def _fmt_bytes(value: int | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 2**20:.1f} MiB"


_env = Environment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)
_template = _env.from_string(TEMPLATE)


def title_for(rule_ids: list[str]) -> str:
    return f"Adopter: use optimized kernels ({', '.join(sorted(rule_ids))})"


def render_body(context: dict) -> str:
    rendered = render_pr_body(context)
    if rendered is not None:
        return rendered
    return _template.render(fmt_s=_fmt_seconds, fmt_b=_fmt_bytes, **context)
