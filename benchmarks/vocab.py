"""The sampler at real vocabulary sizes: what processing p and q for one round costs, against
the softmax of the same rows (the least any sampler must do)."""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx

from mlx_spec.sampling import SamplingConfig, probabilities

VOCAB = 151_936  # Qwen's
CFG = SamplingConfig(temperature=0.7, top_p=0.9, top_k=50)


def _time(fn, repeats: int = 20) -> float:
    mx.eval(fn())  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(fn())
        best = min(best, time.perf_counter() - t)
    return best


def vocabulary_cost(k: int = 4, vocab: int = VOCAB, cfg: SamplingConfig = CFG) -> dict[str, Any]:
    """Seconds (fastest of 20) to process the k+1 target rows and k draft rows of a round."""
    mx.random.seed(0)
    p_rows = mx.random.normal((k + 1, vocab)) * 4
    q_rows = mx.random.normal((k, vocab)) * 4
    mx.eval(p_rows, q_rows)
    ours = _time(lambda: [probabilities(p_rows, cfg), probabilities(q_rows, cfg)])
    softmax = _time(lambda: [mx.softmax(p_rows / cfg.temperature, axis=-1),
                             mx.softmax(q_rows / cfg.temperature, axis=-1)])
    return {"vocab": vocab, "k": k, "temperature": cfg.temperature, "top_p": cfg.top_p,
            "top_k": cfg.top_k, "ms": 1e3 * ours, "softmax_ms": 1e3 * softmax,
            "ratio": ours / softmax}
