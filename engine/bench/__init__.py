"""Benchmark of the training step (forward, backward, optimizer step): original against rewritten,
interleaved, in fresh sandboxed processes; step-time medians, ratios and peak memory."""

from engine.bench.runner import BenchConfig, BenchResult, bench

__all__ = ["BenchConfig", "BenchResult", "bench"]
