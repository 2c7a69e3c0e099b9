"""The distiller's data: the target's own continuations of prompts (self-distillation), corpus
windows beside them, held-out rows, and text read from --data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from .. import cache as kv
from ..errors import MlxSpecError
from ..model import TargetModel
from ..sampling import Sampler, SamplingConfig
from .config import DistillConfig


def generate_pool(target: TargetModel, prompts: np.ndarray, new: int, temperature: float,
                  seed: int) -> np.ndarray:
    """Continue each prompt row with the target itself (batched), for self-distillation data."""
    sampler = Sampler(SamplingConfig(temperature=temperature, seed=seed))
    cache = kv.make_cache(target.model, slack=new)
    x = mx.array(prompts.astype(np.int32))
    out = [x]
    logits = target.model(x, cache=cache)[:, -1]
    for _ in range(new):
        tok = sampler.sample_rows(logits)
        out.append(tok[:, None])
        logits = target.model(tok[:, None], cache=cache)[:, -1]
        mx.eval(logits)
    return np.array(mx.concatenate(out, axis=1))


def build_training_set(target: TargetModel, tokens: np.ndarray | None, dc: DistillConfig,
                       n_generated: int, log=print, *, prompts: list[list[int]] | None = None,
                       seconds: float | None = None) -> np.ndarray:
    """Rows of seq_len tokens. With corpus `tokens`: half corpus windows, half target
    continuations of corpus prompts. Without (`prompts` instead): only the target's own
    continuations of those prompts, mostly sampled so the rows differ. `seconds` caps the time
    spent generating (at least one batch is made)."""
    import time

    rng = np.random.default_rng(dc.seed)
    T, t0 = dc.seq_len, time.perf_counter()
    rows = []
    prompt_len = T // 4 if prompts is None else min(T // 4, min(len(p) for p in prompts))
    for i in range(0, n_generated, 32):
        if rows and seconds is not None and time.perf_counter() - t0 > seconds:
            log(f"generation budget spent after {i} continuations")
            break
        b = min(32, n_generated - i)
        if prompts is None:
            starts = rng.integers(0, len(tokens) - prompt_len - 1, b)
            batch = np.stack([tokens[s : s + prompt_len] for s in starts])
            temp = 0.0 if (i // 32) % 2 == 0 else 0.8  # greedy and sampled continuations
        else:  # the prompts' last prompt_len tokens, so a batch lines up
            batch = np.stack([prompts[j][-prompt_len:] for j in rng.integers(0, len(prompts), b)])
            temp = 0.0 if i == 0 else 0.8 if (i // 32) % 2 else 1.0
        rows.append(generate_pool(target, batch, T - prompt_len, temp, dc.seed + i))
        log(f"generated {i + b}/{n_generated} target continuations")
    gen = np.concatenate(rows) if rows else np.zeros((0, T), np.int32)
    if tokens is None:
        return gen.astype(np.int32)[rng.permutation(len(gen))]
    starts = rng.integers(0, len(tokens) - T - 1, max(len(gen), 64))
    corpus = np.stack([tokens[s : s + T] for s in starts]).astype(np.int32)
    data = np.concatenate([gen.astype(np.int32), corpus])
    return data[rng.permutation(len(data))]


def held_rows(target: TargetModel, prompts: list[list[int]], seq_len: int,
              seed: int = 0) -> np.ndarray:
    """The target's greedy continuations of held-out prompts, seq_len tokens a row (each
    prompt's last common-length tokens first): text drafting will meet, never trained on."""
    plen = max(1, min(min(len(p) for p in prompts), seq_len // 4))
    batch = np.stack([p[-plen:] for p in prompts]).astype(np.int32)
    return generate_pool(target, batch, seq_len - plen, 0.0, seed).astype(np.int32)


def read_text_data(path: Path) -> list[str]:
    path = Path(path)
    if path.is_file():
        return [path.read_text(encoding="utf-8", errors="replace")]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in
                       {".txt", ".py", ".md", ".json", ".jsonl", ".rst"})
        if files:
            return [p.read_text(encoding="utf-8", errors="replace") for p in files]
    raise MlxSpecError(f"no training text found at {path}")


def encode(tokenizer: Any, docs: list[str]) -> list[int]:
    """Token ids of `docs`, without transformers' warning about sequences longer than the
    model's context (these are training text, cut into windows later)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        ids: list[int] = []
        for d in docs:
            ids.extend(tokenizer.encode(d, add_special_tokens=False))
        return ids
    finally:
        hf_logging.set_verbosity(level)
