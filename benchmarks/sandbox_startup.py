"""What the sandbox adds to starting a child: median wall time of starting Python (and of
importing torch) in the sandbox against the same unsandboxed, as the verifier starts its children.

    PYTHONPATH=. python benchmarks/sandbox_startup.py [--runs 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.verify import sandbox


def _time(script: Path, *, sandboxed: bool, runs: int) -> float:
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="adopter-startup-") as tmp:
            work, home = Path(tmp) / "work", Path(tmp) / "home"
            work.mkdir()
            started = time.perf_counter()
            if sandboxed:
                process, _ = sandbox.popen(script, [], cwd=work, home=home, limits=sandbox.Limits(),
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            else:
                process = subprocess.Popen([sys.executable, "-I", str(script)], cwd=work,
                                           env=sandbox.scrubbed_env(home), stdout=subprocess.DEVNULL)
            if process.wait() != 0:
                raise SystemExit(f"{script.name} failed (sandboxed={sandboxed})")
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    works, why = sandbox.sandbox_status()
    if not works:
        raise SystemExit(f"no working sandbox here: {why}")
    print(f"sandbox: {why}; {args.runs} runs each, medians")
    with tempfile.TemporaryDirectory() as tmp:
        for name, code in (("python -I (empty script)", "pass\n"), ("python -I, import torch", "import torch\n")):
            script = Path(tmp) / f"{name.split()[-1].strip('()')}.py"
            script.write_text(code)
            plain = _time(script, sandboxed=False, runs=args.runs)
            boxed = _time(script, sandboxed=True, runs=args.runs)
            print(f"{name}: unsandboxed {plain * 1000:.0f} ms, sandboxed {boxed * 1000:.0f} ms, "
                  f"added {(boxed - plain) * 1000:+.0f} ms")


if __name__ == "__main__":
    main()
