"""Self-distillation of drafters on a frozen target: an MTP head, or a small draft model.

The teacher signal is the target's own next-token distribution p_t at every position (soft
cross-entropy −Σ p log q), computed on text the target itself generated plus corpus text, so the
drafter learns what the target will say rather than what the corpus said.

Shared-KV MTP heads are trained on `depth` chained steps at once, exactly as they run: step j at
row i reads token x_{i+j} and the previous step's h', queries at position i+j, and sees only the
target K/V of positions < i (what is in the target's cache when drafting starts there).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .. import cache as kv
from ..drafters.mtp import (
    CONFIG_FILE,
    MTPConfig,
    make_head,
    save_mtp,
    target_kv,
)
from ..errors import MlxSpecError
from ..model import TargetModel
from ..sampling import Sampler, SamplingConfig
from .loop import Schedule, train


@dataclass(frozen=True)
class DistillConfig:
    steps: int = 1000
    minutes: float | None = None  # a time budget instead of `steps` (data generation included)
    batch_size: int = 8
    seq_len: int = 192
    lr: float = 2e-3
    warmup: int = 50
    depth: int = 3  # chained draft steps trained at once (shared-kv)
    depth_decay: float = 0.8  # weight of step j is depth_decay ** j
    seed: int = 0
    save_every: int = 100


def soft_ce(logits: mx.array, p: mx.array, valid: mx.array) -> mx.array:
    """Mean over valid rows of −Σ_v p(v) log q(v)."""
    ce = -(p * nn.log_softmax(logits.astype(mx.float32), axis=-1)).sum(-1)
    return (ce * valid).sum() / mx.maximum(valid.sum(), 1)


def teacher(target: TargetModel, x: mx.array, kv_layer: int):
    """Frozen target over a batch: hidden [B,T,D], next-token probs [B,T,V], one layer's K/V."""
    cache = kv.make_cache(target.model, slack=x.shape[1])
    h = target.backbone(x, cache=cache)
    p = mx.softmax(target.head(h).astype(mx.float32), axis=-1)
    k, v, _ = target_kv(cache[kv_layer])  # a fresh cache: never quantized
    return mx.stop_gradient(h), mx.stop_gradient(p), mx.stop_gradient(k), mx.stop_gradient(v)


def _shift(a: mx.array, j: int) -> mx.array:
    """a[:, j:] padded with zeros back to length T."""
    if j == 0:
        return a
    pad = mx.zeros((a.shape[0], j, *a.shape[2:]), a.dtype)
    return mx.concatenate([a[:, j:], pad], axis=1)


def shared_kv_loss(head, target, rope, cfg: MTPConfig, dc: DistillConfig, x, h, p, k, v):
    B, T = x.shape
    emb = target.embed(x) * cfg.embed_scale
    rows = mx.arange(T)
    # row i sees target keys of positions < i (row 0, which has none, sees key 0; not scored)
    mask = (rows[None, :] < rows[:, None]) | ((rows[:, None] == 0) & (rows[None, :] == 0))
    g = mx.concatenate([mx.zeros_like(h[:, :1]), h[:, :-1]], axis=1)  # h_{i-1}
    total = 0.0
    for j in range(dc.depth):
        out = head(_shift(emb, j), g, k, v, rope, j, mask)
        valid = mx.broadcast_to(((rows >= 1) & (rows + j < T)).astype(mx.float32), (B, T))
        total = total + dc.depth_decay**j * soft_ce(target.head(out), _shift(p, j), valid)
        g = out
    return total


def deepseek_loss(head, target, cfg: MTPConfig, x, h, p):
    emb = target.embed(x) * cfg.embed_scale
    g = mx.concatenate([mx.zeros_like(h[:, :1]), h[:, :-1]], axis=1)  # h_{i-1}
    out = head(emb, g, None, "causal")
    valid = mx.ones(x.shape, mx.float32)
    return soft_ce(target.head(out), p, valid)


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


class Progress:
    """A bar with the ETA on a terminal; without one, a line every `every` seconds."""

    def __init__(self, every: float = 10.0):
        import time

        self.every, self.clock, self.last = every, time.perf_counter, -1e9

    def __call__(self, step: int, total: int, loss: float, rate: float) -> None:
        width, total = 30, max(total, step)
        done = int(width * step / total)
        eta = (total - step) / rate if rate > 0 else 0.0
        line = (f"[{'#' * done}{'.' * (width - done)}] {step}/{total} loss {loss:.3f} "
                f"({rate:.1f} it/s, ETA {int(eta) // 60}:{int(eta) % 60:02d})")
        if sys.stderr.isatty():
            print("\r" + line, end="" if step < total else "\n", file=sys.stderr, flush=True)
        elif self.clock() - self.last >= self.every or step == total:
            self.last = self.clock()
            print(line, file=sys.stderr, flush=True)


def _progress(step: int, total: int, loss: float, rate: float) -> None:
    Progress()(step, total, loss, rate)


def _train(module: nn.Module, loss_fn, data: np.ndarray, dc: DistillConfig, workdir: Path,
           progress=_progress, *, seconds: float | None = None, evaluate=None) -> float:
    """Rows of `data` drawn by (seed, step), through the shared loop (loop.py); `seconds`: a
    training-time budget instead of dc.steps."""

    def batch(step: int) -> tuple[mx.array]:
        rng = np.random.default_rng((dc.seed, step))
        return (mx.array(data[rng.integers(0, len(data), dc.batch_size)]),)

    schedule = Schedule(steps=dc.steps if seconds is None else 10**9, lr=dc.lr,
                        warmup=dc.warmup, save_every=dc.save_every, seconds=seconds)
    return train(module, loss_fn, batch, schedule, workdir / "checkpoint.safetensors", progress,
                 evaluate)


def tokens_per_pass(target: TargetModel, tokenizer: Any, head: nn.Module, cfg: MTPConfig,
                    prompts: list[list[int]], *, k: int = 4, max_tokens: int = 48) -> float:
    """Held-out estimate: greedy tokens per target pass at draft length k with `head`."""
    from ..drafters.mtp import MTPDrafter
    from ..engine import Engine

    engine = Engine(target, tokenizer, MTPDrafter(head, cfg, target), draft_length=k).conversation()
    generated = passes = 0
    for p in prompts:
        engine.reset()
        end = list(engine.generate(p, max_tokens=max_tokens, ignore_eos=True))[-1]
        generated += end.stats.generated_tokens
        passes += end.stats.target_passes
    return generated / max(passes, 1)


def distill_mtp(target: TargetModel, data: np.ndarray, cfg: MTPConfig, dc: DistillConfig,
                out: Path, progress=_progress, *, seconds: float | None = None,
                evaluate=None) -> nn.Module:
    """Train an MTP head for `target` on rows of token ids; write `out/` (config + weights).
    evaluate(head) -> a held-out score, called every few minutes: the curve goes into the
    head's config."""
    _check_resume(out, cfg)
    mx.random.seed(dc.seed)
    head = make_head(cfg)
    target.model.freeze()
    rope = target.model.layers[cfg.kv_layer].self_attn.rope

    def loss_fn(x):
        h, p, k, v = teacher(target, x, cfg.kv_layer)
        if cfg.kind == "shared-kv":
            return shared_kv_loss(head, target, rope, cfg, dc, x, h, p, k, v)
        return deepseek_loss(head, target, cfg, x, h, p)

    curve: list[dict] = []
    hook = None
    if evaluate is not None:
        every = max(60.0, (seconds or 600.0) / 5)

        def hook(step: int, trained: float) -> None:
            score = evaluate(head)
            curve.append({"step": step, "minutes": round(trained / 60, 2),
                          "tokens_per_pass": round(score, 3)})
            print(f"held-out after {trained / 60:.1f} min ({step} steps): {score:.2f} tokens "
                  "per target pass at k=4", file=sys.stderr, flush=True)

        hook = (every, hook)
    final = _train(head, loss_fn, data, dc, out / "train", progress, seconds=seconds,
                   evaluate=hook)
    save_mtp(out, head, cfg, extra={"train": {"steps": dc.steps, "final_loss": final,
                                              "depth": dc.depth, "held_out": curve}})
    return head


def distill_draft_model(target: TargetModel, data: np.ndarray, config: dict,
                        dc: DistillConfig, workdir: Path, progress=_progress) -> nn.Module:
    """A small LM of `config` trained to match the target's next-token distributions."""
    from .modeldir import build_model

    student = build_model(config, seed=dc.seed)
    target.model.freeze()

    def loss_fn(x):
        p = mx.stop_gradient(mx.softmax(target.model(x).astype(mx.float32), axis=-1))
        return soft_ce(student(x), p, mx.ones(x.shape, mx.float32))

    _train(student, loss_fn, data, dc, workdir, progress)
    return student


def _check_resume(out: Path, cfg: MTPConfig) -> None:
    """Resuming into a directory that holds a head of another shape would corrupt it."""
    existing = out / CONFIG_FILE
    if not existing.exists() and not (out / "train" / "checkpoint.safetensors").exists():
        return
    if existing.exists():
        old = json.loads(existing.read_text())
        for key in ("target_hidden_size", "vocab_size", "kind", "hidden_size"):
            if old.get(key) != getattr(cfg, key):
                raise MlxSpecError(
                    f"{out} holds an MTP head with {key}={old.get(key)}, this target needs "
                    f"{getattr(cfg, key)}; choose another --out"
                )


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


def cmd_train_drafter(args) -> int:
    import time

    from ..loading import load_target
    from .prompts import HELD_OUT, PROMPTS

    t0 = time.perf_counter()
    if args.minutes is not None and args.steps is not None:
        raise MlxSpecError("give --steps or --minutes, not both")
    budget = args.minutes * 60 if args.minutes is not None else None
    target, tokenizer = load_target(args.target)
    dc = DistillConfig(steps=args.steps or 2000, minutes=args.minutes, seed=args.seed,
                       batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.data:
        ids = _encode(tokenizer, read_text_data(Path(args.data)))
        cut = len(ids) - max(3 * 48, len(ids) // 20)  # the last 5% are held out
        if cut < dc.seq_len + 2:
            raise MlxSpecError(f"training data too short: {len(ids)} tokens, need > "
                               f"{dc.seq_len + 3 * 48 + 1}")
        tokens, held = np.asarray(ids[:cut], dtype=np.int32), ids[cut:]
        held_out = [held[i : i + 32] for i in range(0, 3 * 48, 48)]
        prompts = None
    else:  # the head learns the target itself, from its own continuations of built-in prompts
        encoded = [_encode(tokenizer, [p]) for p in PROMPTS]
        tokens, prompts, held_out = None, encoded[:-HELD_OUT], encoded[-HELD_OUT:]
    out = Path(args.out) if args.out else Path(args.target) / "mtp"
    cfg = MTPConfig.for_target(target, args.kind,
                               **({"hidden_size": max(64, target.hidden_size // 2), "num_layers": 2}
                                  if args.kind == "shared-kv" else {"num_layers": 1}))
    n_gen = 256 if budget else min(256, max(32, dc.steps // 4))
    data = build_training_set(target, tokens, dc, n_gen, log, prompts=prompts,
                              seconds=budget * 0.25 if budget else None)
    seconds = None if budget is None else max(10.0, budget - (time.perf_counter() - t0))

    def evaluate(head) -> float:
        return tokens_per_pass(target, tokenizer, head, cfg, held_out)

    distill_mtp(target, data, cfg, dc, out, Progress(), seconds=seconds, evaluate=evaluate)
    train_info = json.loads((out / CONFIG_FILE).read_text()).get("train", {})
    last = (train_info.get("held_out") or [{}])[-1]
    print(f"mlx-spec: trained {last.get('step', '?')} steps in "
          f"{(time.perf_counter() - t0) / 60:.1f} min: {last.get('tokens_per_pass', 0):.2f} "
          f"tokens per target pass at k=4 on held-out text (greedy); head in {out}",
          file=sys.stderr)
    return 0


def _encode(tokenizer: Any, docs: list[str]) -> list[int]:
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
