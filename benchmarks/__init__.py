"""Measurement tools, outside the engine (nothing in mlx_spec's core imports them):

* __main__.py — `python -m benchmarks [--group G] [--quick]` from a checkout;
* scenario.py — the full run: which rows run and what they are compared with;
* runners.py — how one row is measured (every engine the benchmark drives is built there);
* report.py — the Markdown tables, the plot and the files a run writes;
* parity.py — ABBA ratios for what single rows cannot settle;
* hybrid.py — the hybrid-target rows and the rollback comparison;
* published.py — the Gemma 4 assistant and EAGLE-3 rows (constructed pairs);
* serve.py — `--group serve`: concurrent streaming clients against our server and
  mlx_lm.server (serve_clients.py: the clients and the subprocess; serve_report.py: the file);
* vocab.py — the sampler's cost at a real vocabulary size;
* widen.py — function-preserving widening (the bench's memory-bound targets);
* evaluate.py — acceptance of the demo drafters (`python -m benchmarks.evaluate`);
* replay.py — the draft-length policy replayed on recorded acceptance (no clock): greedy run
  lengths, or the odds of each draft at T > 0.
"""

from .runners import QUICK, BenchConfig, Row
from .scenario import bench

__all__ = ["QUICK", "BenchConfig", "Row", "bench"]
