"""Measurement tools, outside the engine (nothing in mlx_spec's core imports them):

* run.py — `mlx-spec bench`: every decoder side by side on a memory-bound target;
* hybrid.py — its hybrid-target rows and the rollback comparison;
* widen.py — function-preserving widening (the bench's memory-bound targets);
* evaluate.py — acceptance of the demo drafters (`python -m mlx_spec.bench.evaluate`);
* replay.py — the draft-length policy replayed on recorded greedy acceptance (no clock).
"""

from .run import QUICK, BenchConfig, Row, bench, cmd_bench

__all__ = ["QUICK", "BenchConfig", "Row", "bench", "cmd_bench"]
