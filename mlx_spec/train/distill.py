"""Self-distillation of drafters on a frozen target: an MTP head (shared-KV or DeepSeek-style),
an EAGLE-3 head (train/eagle3.py), or a small draft model.

The teacher signal is the target's own next-token distribution p_t at every position (soft
cross-entropy −Σ p log q), computed on text the target itself generated plus corpus text, so the
drafter learns what the target will say rather than what the corpus said.

Heads are trained on `depth` chained steps at once, exactly as they draft (train/chain.py), each
position weighted by the accepted tokens that ride on it (chain.position_weights), the
acceptance re-estimated on held-out rows as training goes. Every kind runs through the one
training loop (loop.py); they differ only in their chained steps and how they are written.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .. import cache as kv
from ..drafters.mtp import MTPConfig, MTPDrafter, make_head, target_kv
from ..drafters.mtp_files import CONFIG_FILE, WEIGHTS_FILE, save_mtp
from ..errors import MlxSpecError
from ..model import TargetModel
from .chain import (
    ChainCache,
    PositionWeights,
    Step,
    acceptance,
    own_cache_steps,
    shared_kv_steps,
    thinning,
    weighted_loss,
)
from .config import DistillConfig
from .features import TeacherCache
from .loop import Recipe, checkpoint_step, train


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
           progress=_progress, *, seconds: float | None = None, evaluate=None,
           extra: Callable[[int], tuple] | None = None, taught=None, **wall) -> float:
    """Rows of `data` drawn by (seed, step), through the shared loop (loop.py); `seconds`: a
    training-time budget instead of dc.steps; extra(step): more inputs to the loss; taught:
    the target's side of those rows, computed once (features.TeacherCache), last inputs;
    wall: loop.train's deadline, reserve and saved."""

    def batch(step: int) -> tuple[mx.array, ...]:
        rng = np.random.default_rng((dc.seed, step))
        index = rng.integers(0, len(data), dc.batch_size)
        rows = (mx.array(data[index]),) + (extra(step) if extra is not None else ())
        return rows + (taught.get(index) if taught is not None else ())

    recipe = Recipe(steps=dc.steps if seconds is None else 10**9, lr=dc.lr,
                    warmup=dc.warmup, save_every=dc.save_every, seconds=seconds)
    return train(module, loss_fn, batch, recipe, workdir / "checkpoint.safetensors", progress,
                 evaluate, **wall)


def held_out_scores(target: TargetModel, tokenizer: Any, drafter, prompts: list[list[int]], *,
                    max_tokens: int = 48) -> dict:
    """Greedy decoding of the held-out prompts with `drafter`: tokens per target pass at k = 4
    and k = 8, and at k = 8 the acceptance of each draft position (the share of rounds whose
    drafts 1..i were all accepted)."""
    from ..engine import Engine
    from ..engine.acceptance import measure_acceptance

    engine = Engine(target, tokenizer, drafter)
    out = {}
    for k in (4, 8):
        totals = measure_acceptance(engine, prompts, max_tokens=max_tokens, draft_length=k,
                                    ignore_eos=True)
        out["tokens_per_pass" if k == 4 else "tokens_per_pass_k8"] = round(
            totals.tokens / max(totals.passes, 1), 3)
        if k == 8:
            rates = {i: a for i, a, _ in totals.per_position()}
            out["acceptance_k8"] = [round(rates.get(i, 0.0), 3) for i in range(1, k + 1)]
    return out


@dataclass
class Trainee:
    """A head as the distiller sees it: its module, its chained steps over a batch (the
    teacher's pass included), a drafter around it, and how it is written."""

    head: nn.Module
    steps: Callable[..., Iterator[Step]]  # (rows, depth, thin=None) -> chained steps
    drafter: Callable[[], Any]
    save: Callable[[Path, dict], None]  # (out, training metadata)
    info_file: str  # where a finished run's metadata is (resumed curves carry on from it)
    loss: Callable[[mx.array, mx.array, mx.array], mx.array] = soft_ce  # (logits, p, valid)


def mtp_trainee(target: TargetModel, cfg: MTPConfig, seed: int = 0) -> Trainee:
    mx.random.seed(seed)
    head = make_head(cfg)
    rope = target.model.layers[cfg.kv_layer].self_attn.rope

    def steps(x: mx.array, depth: int, thin=None) -> Iterator[Step]:
        h, p, k, v = teacher(target, x, cfg.kv_layer)
        if cfg.kind == "shared-kv":
            return shared_kv_steps(head, target, rope, cfg.embed_scale, x, h, p, k, v, depth,
                                   thin)
        # DeepSeek-style: entry i pairs token i with h_{i-1} (zeros at 0), its own cache
        g = mx.concatenate([mx.zeros_like(h[:, :1]), h[:, :-1]], axis=1)
        return own_cache_steps(lambda e, s, c, m: head(e, s, c[0], m), target.head,
                               target.embed(x) * cfg.embed_scale, g, p, x, depth, 0,
                               [ChainCache()], thin)

    def save(out: Path, info: dict) -> None:
        save_mtp(out, head, cfg, extra={"train": info})

    return Trainee(head, steps, lambda: MTPDrafter(head, cfg, target), save, CONFIG_FILE)


def eagle3_trainee(target: TargetModel, depth: int, seed: int = 0,
                   vocab: np.ndarray | None = None) -> tuple[Trainee, dict]:
    """vocab: a reduced draft vocabulary's target ids (eagle3.draft_vocabulary), or None."""
    from ..drafters.mtp import eagle3_drafter
    from . import eagle3

    config = eagle3.speculators_config(target, depth,
                                       draft_vocab=None if vocab is None else len(vocab))
    head = eagle3.make_head(target, config, seed, ids=vocab)

    def steps(x: mx.array, depth: int, thin=None, taught=None) -> Iterator[Step]:
        return eagle3.chained_steps(head, target, x, depth, thin, taught)

    def save(out: Path, info: dict) -> None:
        eagle3.save_speculators(out, head, config, info)

    return Trainee(head, steps, lambda: eagle3_drafter(head, target), save,
                   eagle3.TRAIN_FILE), config


def distill_head(target: TargetModel, data: np.ndarray, t: Trainee, dc: DistillConfig,
                 out: Path, progress=_progress, *, seconds: float | None = None,
                 evaluate=None, held: np.ndarray | None = None,
                 eval_every: float | None = None, deadline: float | None = None,
                 taught=None) -> dict:
    """Train `t.head` on rows of token ids; write `out/`: the head (config and weights) at
    every checkpoint, so a run killed part-way still leaves one that drafts. held: held-out
    rows the per-position acceptance (hence the loss weights) is estimated on (default: a few
    training rows). evaluate(drafter) -> held-out scores (held_out_scores), before training
    and every `eval_every` training seconds (default: a quarter of the budget, at least a
    minute): the curve goes into the head's metadata. deadline: the wall-clock end
    (time.perf_counter()) the whole of it keeps to, scoring included. taught: the target's
    side of `data`, computed once (features.TeacherCache; None: the target runs in every
    step). Returns the metadata."""
    target.model.freeze()
    rows = mx.array((held if held is not None else data[:4]).astype(np.int32))
    weights = PositionWeights(dc.depth, lambda: acceptance(t.steps(rows, dc.depth)),
                              dc.reweigh_every, dc.weight_floor)

    def loss_fn(x, w, *known):  # len(w) steps; deeper ones scored on a subset of rows
        steps = t.steps(x, w.shape[0], thinning, *([known] if known else []))
        return weighted_loss(steps, w, t.loss)

    resumed = (out / "train" / "checkpoint.safetensors").exists()
    curve: list[dict] = _previous_curve(out / t.info_file) if resumed else []
    hook = None
    if evaluate is not None:
        every = eval_every or max(60.0, (seconds or 600.0) / 4)

        def record(step: int, trained: float) -> None:
            point = {"step": step, "minutes": round(trained / 60, 2), **evaluate(t.drafter())}
            curve.append(point)
            acc = " ".join(f"{a:.2f}" for a in point["acceptance_k8"])
            print(f"held-out after {trained / 60:.1f} min ({step} steps): "
                  f"{point['tokens_per_pass']:.2f} tokens per target pass at k=4, "
                  f"{point['tokens_per_pass_k8']:.2f} at k=8; per position at k=8: {acc}",
                  file=sys.stderr, flush=True)

        hook = (every, record)
    reserve = 0.0
    if hook is not None and not resumed:
        started = time.perf_counter()
        record(0, 0.0)  # the curve starts at the untrained head
        reserve = time.perf_counter() - started  # what each scoring costs, as measured

    def info(steps: int, loss: float, done: bool) -> dict:
        return {"steps": steps, "final_loss": loss, "depth": dc.depth, "complete": done,
                "position_weights": weights.describe(), "held_out": curve}

    final = _train(t.head, loss_fn, data, dc, out / "train", progress, seconds=seconds,
                   evaluate=hook, extra=lambda step: (weights.at(step),), deadline=deadline,
                   taught=taught, reserve=reserve,
                   saved=lambda step, loss: t.save(out, info(step, loss, False)))
    done = info(checkpoint_step(out / "train" / "checkpoint.safetensors"), final, True)
    t.save(out, done)
    return done


def distill_mtp(target: TargetModel, data: np.ndarray, cfg: MTPConfig, dc: DistillConfig,
                out: Path, progress=_progress, *, seconds: float | None = None,
                evaluate=None, held: np.ndarray | None = None,
                eval_every: float | None = None, init: Path | None = None,
                deadline: float | None = None) -> nn.Module:
    """An MTP head of `cfg` for `target` (distill_head); writes `out/` (config + weights).
    init: a head directory of the same config to start from (a fresh run only; a resumed
    one continues from its checkpoint)."""
    _check_resume(out, *_resume_keys(target, cfg, dc.depth))
    t = mtp_trainee(target, cfg, dc.seed)
    if init is not None and not (out / "train" / "checkpoint.safetensors").exists():
        t.head.load_weights(str(Path(init) / WEIGHTS_FILE), strict=True)
    distill_head(target, data, t, dc, out, progress, seconds=seconds, evaluate=evaluate,
                 held=held, eval_every=eval_every, deadline=deadline)
    return t.head


def distill_eagle3(target: TargetModel, data: np.ndarray, dc: DistillConfig, out: Path,
                   progress=_progress, *, seconds: float | None = None, evaluate=None,
                   held: np.ndarray | None = None, eval_every: float | None = None,
                   draft_vocab: int | None = None, deadline: float | None = None) -> nn.Module:
    """An EAGLE-3 head for `target` (distill_head); writes `out/` in the speculators format.
    draft_vocab: a reduced draft vocabulary of the tokens most frequent in `data`."""
    from . import eagle3
    from .eagle3 import draft_vocabulary

    _check_resume(out, *_resume_keys(target, None, dc.depth, draft_vocab))
    vocab = None if draft_vocab is None else draft_vocabulary(data, target.vocab_size,
                                                              draft_vocab)
    t, _ = eagle3_trainee(target, dc.depth, dc.seed, vocab)
    taught, started = None, time.perf_counter()
    if data.size * (draft_vocab or target.vocab_size) * 2 <= teacher_cache_bytes(out):
        taught = TeacherCache(out / "train" / "teacher", target, data,
                              tuple(t.head.cfg.layer_ids), vocab)
        # a sitting spends at most half its time on it; the next one goes on with the rest
        if not taught.fill(seconds=None if seconds is None else seconds / 2,
                           log=lambda s: print(s, file=sys.stderr, flush=True)):
            taught = None  # this sitting trains with the target in every step
        if seconds is not None:
            seconds = max(10.0, seconds - (time.perf_counter() - started))
    # the input norm whitened on a sample of the taps (a resumed run's checkpoint restores
    # the weight it had learnt)
    sample = data[:16]
    taps = (mx.array(taught.a[: len(sample)]) if taught is not None else
            eagle3.teacher(target, mx.array(sample), tuple(t.head.cfg.layer_ids))[0])
    eagle3.whiten_input(t.head, taps)
    distill_head(target, data, t, dc, out, progress, seconds=seconds, evaluate=evaluate,
                 held=held, eval_every=eval_every, deadline=deadline, taught=taught)
    return t.head


def teacher_cache_bytes(out: Path) -> int:
    """How much of the target's side of the rows may be kept on disk: half the free space where
    the head is written (p over the draft vocabulary in f16 is most of it: 512 rows x 192
    tokens x 8192 ids = 1.6 GB)."""
    import shutil

    where = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    return shutil.disk_usage(where).free // 2


def _previous_curve(path: Path) -> list[dict]:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return list((info.get("train", info) if path.name == CONFIG_FILE else info)
                .get("held_out") or [])


def distill_draft_model(target: TargetModel, data: np.ndarray, config: dict,
                        dc: DistillConfig, workdir: Path, progress=_progress, *,
                        seconds: float | None = None, init: Path | None = None) -> nn.Module:
    """A small LM of `config` trained to match the target's next-token distributions.
    seconds: a training-time budget instead of dc.steps; init: a model directory of the same
    config to start from (a fresh run only; a resumed one continues from its checkpoint)."""
    from .modeldir import build_model

    student = build_model(config, seed=dc.seed)
    if init is not None and not (workdir / "checkpoint.safetensors").exists():
        student.load_weights(str(Path(init) / "model.safetensors"), strict=True)
        student.set_dtype(mx.float32)  # a bundled bf16 draft model trains in f32
    target.model.freeze()

    def loss_fn(x):
        p = mx.stop_gradient(mx.softmax(target.model(x).astype(mx.float32), axis=-1))
        return soft_ce(student(x), p, mx.ones(x.shape, mx.float32))

    _train(student, loss_fn, data, dc, workdir, progress, seconds=seconds)
    return student


def _resume_keys(target: TargetModel, cfg: MTPConfig | None, depth: int,
                 draft_vocab: int | None = None) -> tuple[dict, str]:
    """What a head directory must already say to be resumed into: an MTP head's shape (cfg),
    or (None) an EAGLE-3 head's."""
    if cfg is not None:
        keys = ("target_hidden_size", "vocab_size", "kind", "hidden_size")
        return {k: getattr(cfg, k) for k in keys}, CONFIG_FILE
    from .eagle3 import speculators_config

    config = speculators_config(target, depth, draft_vocab=draft_vocab)
    keys = ("target_hidden_size", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids")
    return {k: config[k] for k in keys}, "config.json"


RESUMED_SETTINGS = {"depth": "--depth", "batch_size": "--batch-size", "seq_len": "--seq-len"}


def check_settings(out: Path, dc: DistillConfig) -> None:
    """A checkpoint in `out` resumes only with the settings it was trained with (another
    depth, batch or row length would silently train another recipe on top of it); a fresh run
    records them."""
    path = out / "train" / "settings.json"
    want = {k: getattr(dc, k) for k in RESUMED_SETTINGS}
    if (out / "train" / "checkpoint.safetensors").exists() and path.exists():
        old = json.loads(path.read_text())
        if any(old.get(k) != v for k, v in want.items()):
            was = " ".join(f"{flag} {old.get(k)}" for k, flag in RESUMED_SETTINGS.items())
            raise MlxSpecError(f"{out} was trained with {was}: resume with those, or choose "
                               "another --out")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(want))


def _check_resume(out: Path, want: dict, config_file: str) -> None:
    """Resuming into a directory that holds a head of another kind or shape would corrupt it."""
    other = CONFIG_FILE if config_file == "config.json" else "config.json"
    if (out / other).exists():
        raise MlxSpecError(f"{out} holds another kind of head ({other}); choose another --out")
    existing = out / config_file
    if existing.exists():
        old = json.loads(existing.read_text())
        for key, value in want.items():
            if old.get(key) != value:
                raise MlxSpecError(f"{out} holds a head with {key}={old.get(key)}, this "
                                   f"target needs {value}; choose another --out")


def default_kind(target: TargetModel, log=lambda s: None) -> str:
    """train-drafter's head kind when none is asked for: EAGLE-3 where its taps are reachable
    (it led per minute of training: docs/TRAIN.md), else the shared-KV MTP head."""
    from ..drafters.eagle3 import Eagle3Config, check_fits
    from .eagle3 import speculators_config

    try:
        cfg = Eagle3Config.from_dict(speculators_config(target, DistillConfig.depth))
        check_fits(Eagle3Config(**{**cfg.__dict__, "layer_ids": cfg.taps(
            len(target.backbone.layers))}), target)
    except MlxSpecError as e:
        log(f"head kind: shared-kv ({e})")
        return "shared-kv"
    log("head kind: eagle3 (the default where the target's layers can be tapped)")
    return "eagle3"


def default_lr(width: int) -> float:
    """The peak learning rate for a head `width` wide: 2e-3 at 192 wide, falling as 1/width²,
    between 1e-4 and 2e-3 (why: docs/TRAIN.md, "The learning rate"). An EAGLE-3 head's lm_head
    starts as the target's: a fine-tuning rate, not a from-scratch one."""
    return float(min(2e-3, max(1e-4, 2e-3 * (192 / width) ** 2)))


def default_mtp_config(target: TargetModel, kind: str) -> MTPConfig:
    """train-drafter's MTP head: shared-KV 2 layers at half the target's width, DeepSeek-style
    one layer at its width."""
    return MTPConfig.for_target(target, kind, **(
        {"hidden_size": max(64, target.hidden_size // 2), "num_layers": 2}
        if kind == "shared-kv" else {"num_layers": 1}))
