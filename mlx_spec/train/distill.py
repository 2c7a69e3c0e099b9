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
    k, v = target_kv(cache[kv_layer])
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


def build_training_set(target: TargetModel, tokens: np.ndarray, dc: DistillConfig,
                       n_generated: int, log=print) -> np.ndarray:
    """Rows of seq_len tokens: half corpus windows, half target continuations of corpus prompts."""
    rng = np.random.default_rng(dc.seed)
    T = dc.seq_len
    rows = []
    prompt_len = T // 4
    for i in range(0, n_generated, 32):
        b = min(32, n_generated - i)
        starts = rng.integers(0, len(tokens) - prompt_len - 1, b)
        prompts = np.stack([tokens[s : s + prompt_len] for s in starts])
        temp = 0.0 if (i // 32) % 2 == 0 else 0.8  # greedy and sampled continuations
        rows.append(generate_pool(target, prompts, T - prompt_len, temp, dc.seed + i))
        log(f"generated {i + b}/{n_generated} target continuations")
    gen = np.concatenate(rows) if rows else np.zeros((0, T), np.int32)
    starts = rng.integers(0, len(tokens) - T - 1, max(len(gen), 64))
    corpus = np.stack([tokens[s : s + T] for s in starts]).astype(np.int32)
    data = np.concatenate([gen.astype(np.int32), corpus])
    return data[rng.permutation(len(data))]


def _progress(step: int, total: int, loss: float, rate: float) -> None:
    width = 30
    done = int(width * step / total)
    line = f"[{'#' * done}{'.' * (width - done)}] {step}/{total} loss {loss:.3f} ({rate:.1f} it/s)"
    if sys.stderr.isatty():
        print("\r" + line, end="" if step < total else "\n", file=sys.stderr, flush=True)
    elif step % 50 == 0 or step == total:
        print(line, file=sys.stderr, flush=True)


def _train(module: nn.Module, loss_fn, data: np.ndarray, dc: DistillConfig, workdir: Path,
           progress=_progress) -> float:
    """Rows of `data` drawn by (seed, step), through the shared loop (loop.py)."""

    def batch(step: int) -> tuple[mx.array]:
        rng = np.random.default_rng((dc.seed, step))
        return (mx.array(data[rng.integers(0, len(data), dc.batch_size)]),)

    schedule = Schedule(steps=dc.steps, lr=dc.lr, warmup=dc.warmup, save_every=dc.save_every)
    return train(module, loss_fn, batch, schedule, workdir / "checkpoint.safetensors", progress)


def distill_mtp(target: TargetModel, data: np.ndarray, cfg: MTPConfig, dc: DistillConfig,
                out: Path, progress=_progress) -> nn.Module:
    """Train an MTP head for `target` on rows of token ids; write `out/` (config + weights)."""
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

    final = _train(head, loss_fn, data, dc, out / "train", progress)
    save_mtp(out, head, cfg, extra={"train": {"steps": dc.steps, "final_loss": final,
                                              "depth": dc.depth}})
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
    from ..loading import load_target

    target, tokenizer = load_target(args.target)
    docs = read_text_data(Path(args.data))
    ids: list[int] = []
    for d in docs:
        ids.extend(tokenizer.encode(d, add_special_tokens=False))
    dc = DistillConfig(steps=args.steps, seed=args.seed, batch_size=args.batch_size,
                       seq_len=args.seq_len)
    if len(ids) < dc.seq_len + 2:
        raise MlxSpecError(f"training data too short: {len(ids)} tokens, need > {dc.seq_len + 1}")
    out = Path(args.out) if args.out else Path(args.target) / "mtp"
    cfg = MTPConfig.for_target(target, args.kind,
                               **({"hidden_size": max(64, target.hidden_size // 2), "num_layers": 2}
                                  if args.kind == "shared-kv" else {"num_layers": 1}))
    tokens = np.asarray(ids, dtype=np.int32)
    n_gen = min(256, max(32, args.steps // 4))
    data = build_training_set(target, tokens, dc, n_gen,
                              log=lambda s: print(s, file=sys.stderr, flush=True))
    distill_mtp(target, data, cfg, dc, out)
    print(f"wrote {out}", file=sys.stderr)
    return 0
