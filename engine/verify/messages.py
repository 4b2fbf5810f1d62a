"""What a child reports, read as untrusted input.

The child runs repository code, so everything it writes (the verification result file, the
benchmark's JSON lines) may be forged: too large, not JSON, of the wrong shape, or carrying text
meant for a pull request (a secret in ``torch.__version__``). Each reader here bounds the size,
checks the shape and the value types, and raises ``MalformedMessage`` with a one-line reason; the
caller turns that into a clean failure of the one run. Text that reaches a report is cut to a
length, and versions are never taken from the child at all (``parent_versions``).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import platform
import re
from pathlib import Path

MAX_RESULT_BYTES = 32 * 1024 * 1024  # a verification result file (per-case messages and tracebacks)
MAX_LINE_BYTES = 1024 * 1024  # one benchmark protocol line
MAX_TEXT = 4000  # characters of a child's message kept
_STATUSES = {"ok", "error", "oom", "skipped"}
_NAME = re.compile(r"^[\w .,:=\[\]()|/+\-]{1,300}$")
_DEVICE_NAME = re.compile(r"^[\w .,:()@/+\-]{1,120}$")


class MalformedMessage(ValueError):
    pass


def text(value, limit: int = MAX_TEXT) -> str:
    """A child's free text (an error message): a string, printable, bounded."""
    if not isinstance(value, str):
        return ""
    return "".join(ch if ch.isprintable() or ch in "\n\t" else "?" for ch in value[:limit])


def parse(raw: bytes, limit: int, what: str) -> dict:
    if len(raw) > limit:
        raise MalformedMessage(f"{what} is {len(raw)} bytes, over the {limit}-byte limit")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedMessage(f"{what} is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise MalformedMessage(f"{what} is not a JSON object")
    return data


def read_result_file(path: Path) -> dict:
    """The verification child's result file, checked (see ``child.run_cases``)."""
    try:
        size = path.stat().st_size
        if size > MAX_RESULT_BYTES:
            raise MalformedMessage(f"the result file is {size} bytes, over the {MAX_RESULT_BYTES}-byte limit")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_RESULT_BYTES + 1)
    except OSError as exc:
        raise MalformedMessage(f"the result file cannot be read: {exc.strerror}") from None
    data = parse(raw, MAX_RESULT_BYTES, "the result file")
    status = data.get("status")
    if status not in _STATUSES:
        raise MalformedMessage(f"the result has an unknown status {text(repr(status), 60)}")
    out = {"status": status, "message": text(data.get("message", "")), "phase": text(data.get("phase", ""), 200)}
    if status != "ok":
        return out
    cases = data.get("cases")
    if not isinstance(cases, dict) or len(cases) > 10_000:
        raise MalformedMessage("the result's cases are not a mapping")
    out["cases"] = {}
    for name, case in cases.items():
        if not isinstance(name, str) or not _NAME.match(name) or not isinstance(case, dict):
            raise MalformedMessage(f"the result has a malformed case {text(repr(name), 80)}")
        if case.get("status") not in _STATUSES:
            raise MalformedMessage(f"case {name}: unknown status")
        checked = {"status": case["status"], "message": text(case.get("message", "")),
                   "phase": text(case.get("phase", ""), 200)}
        if case["status"] == "ok":
            runs = case.get("runs")
            if not isinstance(runs, list) or not all(
                    isinstance(r, str) and re.fullmatch(r"(eval|train)\|(float32|float64|bfloat16|float16)", r)
                    for r in runs):
                raise MalformedMessage(f"case {name}: malformed runs")
            checked["runs"] = runs
            checked["train_smoke_finite"] = case.get("train_smoke_finite") is True
            checked["kernel_calls"] = _kernel_calls(case.get("kernel_calls"), name)
            checked["shipped"] = _shipped(case.get("shipped"), name)
            checked["kernel_eligibility"] = _eligibility(case.get("kernel_eligibility"), name)
            checked["probes"] = _probes(case.get("probes"), name)
            checked["kernel_sites"] = _kernel_sites(case.get("kernel_sites"), name)
        out["cases"][name] = checked
    return out


# a kernel as the rules name it: a qualified name, optionally with the keyword it must be given
# (`torch.optim.AdamW(fused=True)`)
_KERNEL = re.compile(r"[A-Za-z_][\w.]{0,199}(\(\w{1,40}=\w{1,40}\))?")
_RUN = re.compile(r"(eval|train)\|(float32|float64|bfloat16|float16)")


def _count(value, what: str) -> int:
    return int(_number(value, what, integer=True))


def _kernel_calls(value, case: str) -> dict:
    """run ("eval|float32") -> kernel's qualified name -> calls counted in that run (coverage)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 16:
        raise MalformedMessage(f"case {case}: malformed kernel calls")
    out: dict = {}
    for run, calls in value.items():
        if not isinstance(run, str) or not _RUN.fullmatch(run) or not isinstance(calls, dict) or len(calls) > 64:
            raise MalformedMessage(f"case {case}: malformed kernel calls")
        out[run] = {}
        for kernel, n in calls.items():
            if not isinstance(kernel, str) or not _KERNEL.fullmatch(kernel):
                raise MalformedMessage(f"case {case}: malformed kernel name")
            out[run][kernel] = _count(n, f"case {case}: a kernel's call count")
    return out


def _shipped(value, case: str) -> dict | None:
    """Whether the model as shipped (its own dropout) drops in eval and in train mode."""
    if value is None:
        return None
    drops = value.get("drops") if isinstance(value, dict) else None
    if not isinstance(drops, dict) or set(drops) - {"eval", "train"} or not all(isinstance(v, bool) for v in drops.values()):
        raise MalformedMessage(f"case {case}: malformed dropout probe")
    return {"drops": dict(drops)}


def _eligibility(value, case: str) -> dict:
    """kernel -> calls a fused backend took, calls only the math path could, the kernel's reason, and
    "ABSOLUTE_PATH:LINE" each refused call came from -> calls."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 64:
        raise MalformedMessage(f"case {case}: malformed kernel eligibility")
    out: dict = {}
    for kernel, entry in value.items():
        if not isinstance(kernel, str) or not _KERNEL.fullmatch(kernel) or not isinstance(entry, dict):
            raise MalformedMessage(f"case {case}: malformed kernel eligibility")
        out[kernel] = {"fused": _count(entry.get("fused", 0), f"case {case}: fused calls"),
                       "math only": _count(entry.get("math only", 0), f"case {case}: math-only calls"),
                       "why": text(entry.get("why", ""), 500),
                       "on": text(entry.get("on", ""), 40),  # the device (and dtype) the backends were asked on
                       "sites": _places(entry.get("sites"), case)}
    return out


def _places(value, case: str) -> dict:
    """"ABSOLUTE_PATH:LINE" -> calls."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 256:
        raise MalformedMessage(f"case {case}: malformed kernel sites")
    out: dict = {}
    for place, n in value.items():
        if not isinstance(place, str) or not _PLACE.fullmatch(place):
            raise MalformedMessage(f"case {case}: malformed kernel site {text(repr(place), 80)}")
        out[place] = _count(n, f"case {case}: a kernel site's call count")
    return out


_PLACE = re.compile(r"/[^\x00-\x1f:]{1,1000}:\d{1,7}")


def _kernel_sites(value, case: str) -> dict:
    """kernel -> "ABSOLUTE_PATH:LINE" a call came from -> calls (coverage per call site)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 64:
        raise MalformedMessage(f"case {case}: malformed kernel sites")
    out: dict = {}
    for kernel, where in value.items():
        if not isinstance(kernel, str) or not _KERNEL.fullmatch(kernel) or not isinstance(where, dict) or len(where) > 256:
            raise MalformedMessage(f"case {case}: malformed kernel sites")
        out[kernel] = _places(where, case)
    return out


def _probes(value, case: str) -> dict:
    """probe label -> whether this side could run it ("ok", "error", "oom") and why not."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 64:
        raise MalformedMessage(f"case {case}: malformed probes")
    out: dict = {}
    for label, entry in value.items():
        if (not isinstance(label, str) or not _NAME.match(label) or not isinstance(entry, dict)
                or entry.get("status") not in _STATUSES):
            raise MalformedMessage(f"case {case}: malformed probe {text(repr(label), 80)}")
        out[label] = {"status": entry["status"], "message": text(entry.get("message", ""), 1000)}
    return out


def _number(value, what: str, *, integer: bool = False, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise MalformedMessage(f"{what} is not a number")
    if not math.isfinite(value) or value < 0 or (positive and value <= 0):
        raise MalformedMessage(f"{what} is out of range ({value!r})")
    return value


def bench_message(raw: bytes, expect: str) -> dict:
    """One benchmark line: ``ready`` (after the build), ``steps``, ``memory`` or ``bye``."""
    data = parse(raw, MAX_LINE_BYTES, "a benchmark message")
    status = data.get("status")
    if status in ("error", "oom"):
        return {"status": status, "phase": text(data.get("phase", ""), 200), "message": text(data.get("message", ""))}
    if expect == "ready":
        if status != "ready":
            raise MalformedMessage(f"expected the ready message, got status {text(repr(status), 60)}")
        shapes = data.get("input_shapes")
        if not isinstance(shapes, dict) or len(shapes) > 1000 or not all(
                isinstance(k, str) and len(k) < 300 and isinstance(v, list) and len(v) <= 16
                and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in v)
                for k, v in shapes.items()):
            raise MalformedMessage("the input shapes are malformed")
        name = data.get("device_name")
        return {
            "status": "ready",
            "parameters": int(_number(data.get("parameters"), "the parameter count", integer=True)),
            "input_shapes": shapes,
            "threads": int(_number(data.get("threads"), "the thread count", integer=True)),
            # shown in the pull request: only a plausible hardware name gets through
            "device_name": name if isinstance(name, str) and _DEVICE_NAME.match(name) else None,
        }
    if expect == "bye":
        return {"status": "bye"}
    if status != "ok":
        raise MalformedMessage(f"expected an ok message, got status {text(repr(status), 60)}")
    if expect == "steps":
        times = data.get("times")
        if not isinstance(times, list) or not times or len(times) > 100_000:
            raise MalformedMessage("the step times are malformed")
        steps = {"status": "ok", "times": [float(_number(t, "a step time", positive=True)) for t in times]}
        if "peak_bytes" in data:  # the round's own peak (a child that could reset it)
            steps.update({key: int(_number(data.get(key, 0), key, integer=True)) for key in ("peak_bytes", "base_bytes")})
        return steps
    if expect == "memory":
        return {"status": "ok", **{key: int(_number(data.get(key, 0), key, integer=True))
                                   for key in ("peak_bytes", "base_bytes", "ready_bytes")}}
    raise MalformedMessage(f"unexpected message for {expect}")


def _installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def parent_versions() -> dict:
    """The versions a report states. The child imports the same read-only environment, so the
    parent reads them itself instead of believing the child (whose ``torch.__version__`` the
    repository's code can overwrite)."""
    return {"python": platform.python_version(), "torch": _installed("torch"),
            "transformers": _installed("transformers"), "platform": platform.platform()}
