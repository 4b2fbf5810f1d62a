"""Benchmark of the training step: original against rewritten, interleaved.

Each side runs in its own fresh, sandboxed child process (``engine/verify/child.py`` in ``bench``
mode) that builds the model once and then serves timing requests, so the two sides can be
interleaved without ever importing both versions of the same modules into one interpreter:

  warm-up steps on each side, then rounds; in each round both sides run ``steps_per_repeat``
  training steps (forward, loss, backward, optimizer step), the order of the two alternating between
  rounds so that drift (thermal, other load) hits both alike.

Rounds go on until the 95% confidence interval of the median per-round ratio (``engine.bench.stats``)
is within +/- ``ci_tolerance`` of it (after at least ``repeats`` rounds), or the time budget for
rounds (``budget_s``) is spent, or ``max_repeats`` rounds have run; ``stopped`` says which. The
speedup is that median ratio (each round's ratio compares two steps run moments apart, so drift
cancels within a round) with its interval, and ``verdict`` says whether the interval lies above 1x,
below it, or across it. Step times are the medians over rounds.

Peak memory: ``torch.cuda.max_memory_allocated`` on CUDA; on CPU the peak resident set of the side's
process minus its resident set before the model was built (the torch import is the same on both
sides and would only dilute the difference). Each side starts a new peak before every round (CUDA's
allocator statistics; on Linux the high-water mark of the resident set, reset through
/proc/self/clear_refs) and reports the round's own, so the saving is a median over rounds with the
same distribution-free 95% interval as the speedup; the peaks reported are the medians. Where a peak
cannot be reset it is one measurement per side over the whole run, and its interval is that value.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.bench.stats import Estimate, median_interval, stop_reason, verdict
from engine.verify.messages import MAX_LINE_BYTES, MalformedMessage, bench_message, parent_versions
from engine.verify.sandbox import Limits, SandboxUnavailable, kill, popen
from engine.verify.targets import HFTarget, Target, discover_targets
from engine.verify.workspace import materialize, overlay_from, scratch_dir

CHILD = Path(__file__).resolve().parent.parent / "verify" / "child.py"
DEFAULT_SHAPE = {"batch_size": 8, "seq_len": 512}
DEFAULT_HF_SHAPE = {"batch_size": 4, "seq_len": 512}


@dataclass(frozen=True)
class BenchConfig:
    device: str = "cpu"  # "cpu" or "cuda"
    dtype: str = "float32"  # "float32" or "bfloat16"
    warmup: int = 5  # the first CPU steps are slow (allocator, oneDNN primitive caches, lazy imports)
    repeats: int = 10  # the fewest rounds; more run until the interval is narrow enough
    max_repeats: int = 400
    budget_s: float = 180.0  # time for the rounds; past it the interval is reported as wide as it is
    ci_tolerance: float = 0.05  # stop once the speedup's 95% interval is within +/- 5% of its median
    steps_per_repeat: int = 1
    shape: dict | None = None  # build() arguments; default: the target's bench shape, else DEFAULT_SHAPE
    threads: int | None = None  # torch threads in each side's process
    seed: int = 0
    hf_size: str = "bench"  # config size for Hugging Face models ("bench" or "small")
    timeout_s: float = 1800.0  # for the whole benchmark
    memory_bytes: int | None = None  # address-space limit per side (CPU only)
    allow_network: bool = False
    workdir: Path | None = None


@dataclass
class BenchResult:
    status: str  # "ok", "error", "timeout", "oom", "skipped"
    message: str = ""
    target: str | None = None
    device: str = "cpu"
    device_name: str | None = None
    dtype: str = "float32"
    shape: dict = field(default_factory=dict)
    input_shapes: dict = field(default_factory=dict)
    parameters: int | None = None
    threads: int | None = None
    warmup: int = 0
    repeats: int = 0
    steps_per_repeat: int = 1
    baseline_step_s: float | None = None
    optimized_step_s: float | None = None
    speedup: Estimate | None = None  # median per-round baseline / optimized step time (> 1: faster), 95% CI
    verdict: str = "within-noise"  # "faster", "slower" or "within-noise" (the interval contains 1x)
    stopped: str = ""  # why the rounds stopped: "converged", "budget", "max-rounds"
    pair_ratios: list[float] = field(default_factory=list)  # per-round baseline / optimized
    baseline_times_s: list[float] = field(default_factory=list)
    optimized_times_s: list[float] = field(default_factory=list)
    memory_metric: str = ""
    baseline_peak_bytes: int | None = None
    optimized_peak_bytes: int | None = None
    memory_reduction: float | None = None  # 1 - optimized / baseline (> 0: less memory)
    memory: Estimate | None = None  # the same fraction: median over rounds and its 95% CI
    baseline_peaks_bytes: list[int] = field(default_factory=list)  # each round's peak (where resettable)
    optimized_peaks_bytes: list[int] = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    network_isolated: bool | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        return asdict(self)


class _WorkerError(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class _Worker:
    """One side's child process, spoken to in JSON lines."""

    def __init__(self, name: str, process: subprocess.Popen, stderr_path: Path, deadline: float):
        self.name, self.process, self.stderr_path, self.deadline = name, process, stderr_path, deadline
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        self._selector.register(process.stdout, selectors.EVENT_READ)

    def _stderr_tail(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def read(self, expect: str = "ok") -> dict:
        """The next message, checked as untrusted input (``engine.verify.messages``)."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE_BYTES:
                raise _WorkerError("error", f"{self.name}: a message over the {MAX_LINE_BYTES}-byte limit")
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise _WorkerError("timeout", f"{self.name}: stopped by the time limit")
            if not self._selector.select(timeout=min(remaining, 5.0)):
                continue
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                self.process.wait(timeout=10)
                code = self.process.normalized_returncode()
                if code == -9:
                    raise _WorkerError("oom", f"{self.name}: killed by signal 9 (likely out of memory)")
                raise _WorkerError("error", f"{self.name}: exited with code {code}: {self._stderr_tail()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            message = bench_message(line, expect)
        except MalformedMessage as exc:
            raise _WorkerError("error", f"{self.name}: its message was rejected: {exc}") from None
        if message["status"] in ("error", "oom"):
            raise _WorkerError(message["status"], f"{self.name} ({message['phase']}): {message['message']}")
        return message

    def request(self, expect: str = "ok", **message) -> dict:
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # read() reports why the process went away
        return self.read(expect)

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                self.request("bye", op="quit")
        except (_WorkerError, OSError, ValueError):
            pass
        kill(self.process)
        self._selector.close()


def _start(name: str, side: str, tree, target: Target, shape: dict, config: BenchConfig, base: Path,
           state_file: Path, deadline: float) -> tuple[_Worker, bool]:
    base.mkdir(parents=True, exist_ok=True)
    job = {
        "mode": "bench", "side": side, "sys_path": list(tree.sys_path), "target": target.spec(tree.harness_root),
        "shape": shape, "seed": config.seed, "device": config.device, "dtype": config.dtype,
        "threads": config.threads, "hf_size": config.hf_size, "state_file": str(state_file),
    }
    (base / "job.json").write_text(json.dumps(job))
    stderr_path = base / "stderr.txt"
    limits = Limits(timeout_s=config.timeout_s, memory_bytes=config.memory_bytes, threads=config.threads,
                    network=config.allow_network)
    # the original side writes the weights into its own folder; the rewritten side only reads them
    writable, readable = ([base], []) if side == "original" else ([base], [state_file])
    with open(stderr_path, "wb") as stderr:
        process, isolated = popen(CHILD, [str(base / "job.json")], cwd=tree.cwd, home=base / "home", limits=limits,
                                  cuda=config.device.startswith("cuda"), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=stderr,
                                  writable=[*writable, tree.root], readable=readable)
    return _Worker(name, process, stderr_path, deadline), isolated


def _peak(reply: dict, cuda: bool) -> int | None:
    """The peak a child reports, as the memory metric counts it (on CPU less its RSS before the build)."""
    peak = reply.get("peak_bytes")
    return peak if peak is None or cuda else max(0, peak - reply.get("base_bytes", 0))


def _timed(worker: _Worker, steps: int, cuda: bool) -> tuple[float, int | None]:
    """The round's median step time, and its peak memory (None where the child cannot reset it)."""
    reply = worker.request("steps", op="steps", n=steps, peak=True)
    return statistics.median(reply["times"]), _peak(reply, cuda)


def bench(original_root: Path, rewritten: dict[str, str] | Path, target: Target | None = None, *,
          config: BenchConfig | None = None, rewritten_target: Target | None = None,
          on_round=None) -> BenchResult:
    """Time the training step of the original and the rewritten model; measure their peak memory.

    ``rewritten_target`` makes the rewritten side build another target from the same tree (it must
    load the original's state dict), e.g. the same Hugging Face class with another config setting:
    ``benchmarks/speedup_panel.py`` measures a library's own ``attn_implementation="sdpa"`` that way.
    ``on_round(done, total)`` is called after each interleaved round (a progress display)."""
    config = config or BenchConfig()
    started = time.monotonic()
    root = Path(original_root).resolve()
    overlay = overlay_from(root, rewritten)
    if target is None:
        found = discover_targets(root, overlay, hf_limit=1)
        if not found:
            return BenchResult("skipped", "nothing to build: no harness and no Hugging Face model class",
                               device=config.device, dtype=config.dtype)
        target = found[0]
    default = DEFAULT_HF_SHAPE if isinstance(target, HFTarget) else DEFAULT_SHAPE
    shape = dict(config.shape or target.bench_shape or default)
    result = BenchResult("ok", target=target.label, device=config.device, dtype=config.dtype, shape=shape,
                         warmup=config.warmup, repeats=config.repeats, steps_per_repeat=config.steps_per_repeat)
    own_dir = config.workdir is None
    work = scratch_dir("bench") if own_dir else Path(config.workdir)
    deadline = time.monotonic() + config.timeout_s
    workers: list[_Worker] = []
    try:
        original_tree = materialize(root, {}, work / "original" / "tree", target)
        rewritten_tree = materialize(root, overlay, work / "rewritten" / "tree", target)
        state_file = work / "original" / "job" / "state.pt"
        baseline, isolated = _start("original", "original", original_tree, target, shape, config,
                                    work / "original" / "job", state_file, deadline)
        workers.append(baseline)
        ready = baseline.read("ready")  # the original writes the weights the rewritten side loads
        optimized, _ = _start("rewritten", "rewritten", rewritten_tree, rewritten_target or target, shape, config,
                              work / "rewritten" / "job", state_file, deadline)
        workers.append(optimized)
        optimized.read("ready")
        result.network_isolated = isolated
        result.versions = parent_versions()
        result.device_name = ready["device_name"]
        result.parameters = ready["parameters"]
        result.input_shapes = ready["input_shapes"]
        result.threads = ready["threads"]
        if config.warmup:
            baseline.request("steps", op="steps", n=config.warmup)
            optimized.request("steps", op="steps", n=config.warmup)
        cuda = config.device.startswith("cuda")
        round_peaks: list[tuple[int | None, int | None]] = []
        rounds_started = time.monotonic()
        # Never let the budget run into the whole benchmark's time limit: that would lose every round.
        budget_s = min(config.budget_s, 0.9 * max(0.0, deadline - rounds_started))
        while True:
            order = (baseline, optimized) if len(result.pair_ratios) % 2 == 0 else (optimized, baseline)
            rounds = {worker.name: _timed(worker, config.steps_per_repeat, cuda) for worker in order}
            times = {name: time_s for name, (time_s, _) in rounds.items()}
            result.baseline_times_s.append(times["original"])
            result.optimized_times_s.append(times["rewritten"])
            result.pair_ratios.append(times["original"] / times["rewritten"])
            round_peaks.append((rounds["original"][1], rounds["rewritten"][1]))
            result.stopped = stop_reason(result.pair_ratios, time.monotonic() - rounds_started,
                                         min_rounds=config.repeats, max_rounds=config.max_repeats,
                                         budget_s=budget_s, tolerance=config.ci_tolerance) or ""
            if on_round is not None:  # the fewest rounds, or more once they run past it
                on_round(len(result.pair_ratios), max(config.repeats, len(result.pair_ratios) + (not result.stopped)))
            if result.stopped:
                break
        result.repeats = len(result.pair_ratios)
        result.baseline_step_s = statistics.median(result.baseline_times_s)
        result.optimized_step_s = statistics.median(result.optimized_times_s)
        result.speedup = median_interval(result.pair_ratios)
        result.verdict = verdict(result.speedup)
        result.memory_metric = ("torch.cuda.max_memory_allocated" if cuda else
                                "peak RSS of the side's process minus its RSS before building the model")
        if round_peaks and all(b and o is not None for b, o in round_peaks):
            # each round's peak on both sides: the saving's median and interval over rounds
            result.baseline_peaks_bytes = [b for b, _ in round_peaks]  # type: ignore[misc]
            result.optimized_peaks_bytes = [o for _, o in round_peaks]  # type: ignore[misc]
            result.memory = median_interval([1.0 - o / b for b, o in round_peaks])  # type: ignore[operator]
            result.memory_reduction = result.memory.median
            result.baseline_peak_bytes = int(statistics.median(result.baseline_peaks_bytes))
            result.optimized_peak_bytes = int(statistics.median(result.optimized_peaks_bytes))
        else:  # one peak per side over the whole run: a saving without an interval
            peaks = [_peak(worker.request("memory", op="memory"), cuda) for worker in (baseline, optimized)]
            result.baseline_peak_bytes, result.optimized_peak_bytes = peaks
            if peaks[0]:
                result.memory_reduction = 1.0 - peaks[1] / peaks[0]
                result.memory = Estimate(result.memory_reduction, (result.memory_reduction, result.memory_reduction), 1)
    except _WorkerError as exc:
        result.status, result.message = exc.status, str(exc)
    except SandboxUnavailable as exc:
        result.status, result.message = "error", str(exc)
    except (OSError, ValueError) as exc:
        result.status, result.message = "error", f"{type(exc).__name__}: {exc}"
    except BaseException:  # the caller is stopped (Celery's soft time limit, Ctrl-C): kill, do not ask
        for worker in workers:
            kill(worker.process)
        raise
    finally:
        for worker in workers:
            worker.close()
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
    result.duration_s = time.monotonic() - started
    return result
