"""An EAGLE-3 head of our own for a target, trained by distill.py's one loop and written in the
speculators 0.9 format (config.json + model.safetensors) that our loader reads
(drafters/eagle3.py) and vLLM / SGLang load as `{"method": "eagle3", ...}`.

The head is the inference module itself (drafters/eagle3.Eagle3Head): fc over the inputs of a
low, a middle and a high target layer (the taps the verify pass returns), one llama decoder
layer over concat(norm(Emb(x_{t+1})), norm(fc(taps_t))), speculators' training flags on
(norm_before_fc, norm_before_residual, norm_output: the normed state is fed back across steps).
Its lm_head and final norm start as the target's own, its embedding is the target's (not saved:
vLLM shares the target's when the checkpoint has none). The draft vocabulary is the target's
whole vocabulary (no d2t / t2d maps are written, as speculators writes such a head), or the N
tokens most frequent in the training rows (`draft_vocabulary`): lm_head is then N rows of the
target's, `d2t` maps draft id i to target id i + d2t[i] and `t2d` marks the target ids kept, as
speculators writes them; the loss is the soft cross-entropy against the target's distribution
renormalised over the draft vocabulary (computed there: `teacher`), and q is zero off it, so
rejection sampling stays exact (a token q cannot propose is never accepted as a draft; the
target still emits it as a correction).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ..drafters.eagle3 import OWN_TRAINING, Eagle3Config, Eagle3Head, check_fits
from ..errors import MlxSpecError
from ..model import TargetModel
from .chain import ChainCache, Step, own_cache_steps

SPECULATORS_VERSION = "0.9.0"  # the format written (Eagle3SpeculatorConfig's fields)
TRAIN_FILE = OWN_TRAINING  # our run's metadata beside the head (config.json stays clean)


def default_taps(layers: int) -> tuple[int, ...]:
    """Low / middle / high target layer inputs: speculators' and vLLM's default [2, L/2, L−3]
    where it names three distinct layers (L >= 7); on shallower targets the three around the
    middle (index L is the last layer's output, before the final norm)."""
    if layers >= 7:
        return (2, layers // 2, layers - 3)
    mid = layers // 2
    return (max(0, mid - 1), mid, mid + 1)


def draft_vocabulary(rows: np.ndarray, vocab_size: int, size: int) -> np.ndarray:
    """The `size` target ids most frequent in the training rows (ties: the lower id), in
    increasing order — as speculators builds its draft vocabulary from token counts."""
    if not 0 < size <= vocab_size:
        raise MlxSpecError(f"--draft-vocab {size}: between 1 and the target's vocabulary "
                           f"({vocab_size})")
    counts = np.bincount(np.asarray(rows, np.int64).ravel(), minlength=vocab_size)[:vocab_size]
    order = np.lexsort((np.arange(vocab_size), -counts))  # most frequent first, then by id
    return np.sort(order[:size]).astype(np.int32)


def speculators_config(target: TargetModel, depth: int, *,
                       taps: tuple[int, ...] | None = None,
                       draft_vocab: int | None = None) -> dict:
    """The config.json of a head for `target`, with speculators' keys: a one-layer llama
    decoder of the target's width and attention geometry, `depth` speculative tokens, a draft
    vocabulary of `draft_vocab` tokens (default: the target's whole one)."""
    args = target.args
    layers = len(target.backbone.layers)
    attn = target.backbone.layers[-1].self_attn
    heads = args.num_attention_heads
    head_dim = getattr(args, "head_dim", None) or getattr(attn, "head_dim", None) or (
        args.hidden_size // heads)
    theta = float(getattr(args, "rope_theta", 10000.0) or 10000.0)
    scaling = getattr(args, "rope_scaling", None) or {}
    rope = {**{k: v for k, v in scaling.items() if k != "type"},
            "rope_type": scaling.get("rope_type") or scaling.get("type") or "default",
            "rope_theta": theta}
    layer = dict(
        model_type="llama", vocab_size=target.vocab_size, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_hidden_layers=1,
        num_attention_heads=heads, num_key_value_heads=args.num_key_value_heads or heads,
        head_dim=head_dim, hidden_act="silu",
        max_position_embeddings=int(getattr(args, "max_position_embeddings", 0) or
                                    target.context_length),
        rms_norm_eps=float(args.rms_norm_eps), rope_parameters=rope, attention_bias=False,
        mlp_bias=False, tie_word_embeddings=False)
    verifier = dict(name_or_path=str(target.path) if target.path else target.name,
                    architectures=list(target.config.get("architectures") or []))
    return dict(
        speculators_model_type="eagle3", architectures=["Eagle3Speculator"],
        transformer_layer_config=layer, draft_vocab_size=draft_vocab or target.vocab_size,
        norm_before_residual=True, norm_before_fc=True, fc_norm=False, norm_output=True,
        embed_requires_grad=False, target_hidden_size=args.hidden_size,
        eagle_aux_hidden_state_layer_ids=list(taps or default_taps(layers)),
        speculators_config=dict(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[dict(proposal_type="greedy", speculative_tokens=depth,
                                   accept_tolerance=0.0, verifier_accept_k=1)],
            verifier=verifier),
        speculators_version=SPECULATORS_VERSION, dtype="float32")


def head_weight(target: TargetModel) -> mx.array:
    """The target's LM head matrix [V, d] (its own, or the tied embedding), dequantized."""
    m = target.text.lm_head if "lm_head" in target.text else target.backbone.embed_tokens
    if "scales" in m:
        return mx.dequantize(m.weight, m.scales, m.get("biases"), group_size=m.group_size,
                             bits=m.bits, mode=getattr(m, "mode", "affine"))
    return m.weight


def make_head(target: TargetModel, config: dict, seed: int = 0,
              ids: np.ndarray | None = None) -> Eagle3Head:
    """A fresh head read from `config` exactly as the loader reads it (so what trains is what
    loads); lm_head and the final norm start as the target's (ids: the draft vocabulary's
    target ids, its rows of the target's head)."""
    cfg = Eagle3Config.from_dict(config)
    cfg = Eagle3Config(**{**cfg.__dict__, "layer_ids": cfg.taps(len(target.backbone.layers))})
    check_fits(cfg, target)  # its taps reachable (a llama-style trunk), as the loader checks
    mx.random.seed(seed)
    head = Eagle3Head(cfg)
    # copies (+ 0): an f32 target's own arrays would otherwise be the head's parameters too
    weight = head_weight(target).astype(mx.float32)
    if ids is not None:
        weight = weight[mx.array(ids)]
        head.d2t = mx.array(ids) - mx.arange(len(ids), dtype=mx.int32)
    head.lm_head.weight = weight + 0
    norm = target.backbone.norm
    if isinstance(norm, nn.RMSNorm) and norm.weight.shape == head.norm.weight.shape:
        head.norm.weight = norm.weight.astype(mx.float32) + 0
    head.freeze(recurse=False, keys=["d2t"])  # the vocabulary map is not learnt
    mx.eval(head.parameters())
    return head


def whiten_input(head: Eagle3Head, taps: mx.array) -> None:
    """Set the input norm's weight so that each coordinate of the normed taps has unit RMS
    over `taps` (a sample of the target's, [..., 3·d]).

    Real targets carry "massive activations": a few residual coordinates orders of magnitude
    above the rest in every token. One RMSNorm over the concatenated taps then divides every
    coordinate by an RMS those few set, the rest reach fc at a tiny share, and fc sees nearly
    the same vector at every position: the head learns a bigram of the token alone
    (docs/TRAIN.md, "Massive activations"). With w_i = 1 / RMS_i(x / rms(x)) the normed taps
    are whitened per coordinate at the start — the format is unchanged (speculators'
    `input_norm`), the weight still learns."""
    if "input_norm" not in head:
        return
    x = taps.reshape(-1, taps.shape[-1]).astype(mx.float32)
    normed = x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + head.cfg.rms_norm_eps)
    scale = mx.sqrt(mx.mean(normed * normed, axis=0))
    head.input_norm.weight = 1.0 / mx.maximum(scale, 1e-4)
    mx.eval(head.input_norm.weight)


def teacher(target: TargetModel, x: mx.array, taps: tuple[int, ...],
            ids: mx.array | None = None):
    """The frozen target over a batch, from the one tapped pass the verify pass also runs: its
    taps [B, T, 3·d] and next-token probs [B, T, V]; with a reduced draft vocabulary (`ids`,
    its target ids) p renormalised over it, [B, T, len(ids)] — softmax of the target's logits
    at those ids is exactly p(v) / Σ_{u in ids} p(u) — and the target's argmax (a target id,
    for the acceptance). Nothing then runs at the target's width but its own lm_head."""
    logits, a = target.forward_rows(x, None, hidden=taps)
    logits = logits.astype(mx.float32)
    if ids is None:
        return mx.stop_gradient(a), mx.stop_gradient(mx.softmax(logits, axis=-1)), None
    p = mx.softmax(mx.take(logits, ids, axis=-1), axis=-1)
    return mx.stop_gradient(a), mx.stop_gradient(p), mx.argmax(logits, axis=-1)


def chained_steps(head: Eagle3Head, target: TargetModel, x: mx.array, depth: int,
                  thin=None, taught: tuple[mx.array, ...] | None = None) -> Iterator[Step]:
    """The head's `depth` chained steps over a batch, as it drafts: entry i pairs x_{i+1}
    with the taps at i (step 0, through fc), later steps feed back the state (normed).
    taught: what `teacher` gives for these rows, computed earlier (features.TeacherCache)."""
    cfg = head.cfg
    reduced = cfg.draft_vocab_size < cfg.vocab_size
    ids = head.target_ids() if reduced else None
    taps, p, want = taught or teacher(target, x, tuple(cfg.layer_ids), ids)
    want = want if reduced else None
    emb = target.embed(x)
    caches = [ChainCache() for _ in head.layers]

    def call(e, g, cs, mask):
        return head(e, g, cs, mask=mask)

    def logits(s):  # over the draft vocabulary (the target's whole one, or the reduced one)
        return head.lm_head(s if cfg.norm_output else head.norm(s))

    return own_cache_steps(call, logits, emb, taps, p, x, depth, 1, caches, thin, want=want,
                           ids=ids)


def save_speculators(out: Path, head: Eagle3Head, config: dict, train: dict) -> None:
    """config.json, model.safetensors (speculators' tensor names: fc, input_norm, layers.0.*,
    norm, lm_head; d2t and t2d only for a reduced draft vocabulary, as speculators writes
    them: d2t int64 [draft], t2d bool [target]) and our training metadata beside them."""
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v for k, v in tree_flatten(head.parameters()) if k != "d2t"}
    if head.cfg.draft_vocab_size < head.cfg.vocab_size:
        weights["d2t"] = head.d2t.astype(mx.int64)
        weights["t2d"] = head.drafted()
    # each written aside and renamed into place: a run killed while saving (train-drafter
    # saves at every checkpoint) leaves the last whole head
    tmp = out / ".model.partial.safetensors"
    mx.save_safetensors(str(tmp), weights, metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    for name, value in (("config.json", config), (TRAIN_FILE, train)):
        tmp = out / f".{name}.partial"
        tmp.write_text(json.dumps(value, indent=2))
        tmp.replace(out / name)
