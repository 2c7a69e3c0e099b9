"""Tiny random EAGLE-3 heads in the speculators format (and the original yuhuili naming) for a
tiny llama target. `agree=True` builds the known-answer pair: the target is a bigram machine
(its layers add nothing; its head maps token x to nu(x), a permutation of the draft
vocabulary), and the head reads the low tap, which is then exactly Emb(x_t), and maps it to
nu(nu(x_t)) = x_{t+2}: its first draft is always right."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from published import write_dir

from mlx_spec.drafters.eagle3 import Eagle3Config, Eagle3Head
from mlx_spec.train.modeldir import build_model

VOCAB, DRAFT_VOCAB, LAYERS, TAPS = 384, 320, 8, [2, 4, 5]
TARGET = dict(model_type="llama", hidden_size=64, num_hidden_layers=LAYERS, intermediate_size=128,
              num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=VOCAB,
              max_position_embeddings=1024, tie_word_embeddings=False, rope_theta=10000.0)
LAYER = dict(model_type="llama", hidden_size=64, intermediate_size=96, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-5, vocab_size=VOCAB,
             rope_theta=10000.0, num_hidden_layers=1, max_position_embeddings=1024)


# speculators 0.9's eagle3 training defaults (norms on, a sliding-window layer), two layers
FLAGGED = dict(norm_before_fc=False, fc_norm=True, norm_output=True, norm_before_residual=True)
FLAGGED_LAYER = dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                     sliding_window=4, use_sliding_window=True)


def head_config(*, original: bool = False, norm_before_residual: bool = False,
                flagged: bool = False) -> dict:
    if original:  # yuhuili: a plain llama config plus the draft vocabulary, default taps
        return dict(LAYER, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=DRAFT_VOCAB)
    flags = FLAGGED if flagged else dict(norm_before_residual=norm_before_residual)
    return dict(
        speculators_model_type="eagle3", architectures=["Eagle3Speculator"],
        transformer_layer_config=dict(LAYER, **FLAGGED_LAYER) if flagged else LAYER,
        draft_vocab_size=DRAFT_VOCAB, **flags, target_hidden_size=TARGET["hidden_size"],
        eagle_aux_hidden_state_layer_ids=TAPS,
        speculators_config=dict(algorithm="eagle3", proposal_methods=[
            dict(proposal_type="greedy", speculative_tokens=3)],
            verifier=dict(name_or_path="tiny/llama")))


def draft_vocabulary(seed: int = 0) -> np.ndarray:
    """The target ids of the draft vocabulary, ascending (as EAGLE's training builds it)."""
    rng = np.random.default_rng(seed + 11)
    return np.sort(rng.choice(VOCAB, DRAFT_VOCAB, replace=False))


def build_target(seed: int = 0, *, agree: bool = False):
    model = build_model(TARGET, seed=seed)
    rng = np.random.default_rng(seed + 100)
    model.model.norm.weight = mx.array(rng.uniform(0.5, 4.0, 64).astype(np.float32))
    if agree:
        zero = (".o_proj.weight", ".down_proj.weight")
        model.update(tree_unflatten([(k, 0 * v if k.endswith(zero) else v)
                                     for k, v in tree_flatten(model.parameters())]))
        used, nu = draft_vocabulary(seed), bigram(seed)
        emb = np.array(model.model.embed_tokens.weight)
        head = rng.normal(0, 0.01, (VOCAB, 64)).astype(np.float32)
        inverse = {int(nu[x]): x for x in used}
        for j in used:  # row nu(x) is Emb(x): argmax of the logits of x is nu(x)
            head[j] = emb[inverse[int(j)]]
        model.lm_head.weight = mx.array(head)
    mx.eval(model.parameters())
    return model


def bigram(seed: int = 0) -> np.ndarray:
    """nu: a permutation of the draft vocabulary (tokens outside it map into it)."""
    used = draft_vocabulary(seed)
    rng = np.random.default_rng(seed + 12)
    nu = np.zeros(VOCAB, np.int64)
    nu[used] = used[rng.permutation(len(used))]
    outside = np.setdiff1d(np.arange(VOCAB), used)
    nu[outside] = used[: len(outside)]
    return nu


def build_head(config: dict, seed: int = 0, *, target=None) -> Eagle3Head:
    cfg = Eagle3Config.from_dict(config)
    cfg = Eagle3Config(**{**cfg.__dict__, "layer_ids": cfg.taps(LAYERS)})
    mx.random.seed(seed)
    head = Eagle3Head(cfg)
    used = draft_vocabulary(seed)
    head.d2t = mx.array((used - np.arange(DRAFT_VOCAB)).astype(np.int32))
    rng = np.random.default_rng(seed + 5)
    norms = [head.norm, head.layers[0].hidden_norm]
    for layer in head.layers:
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
    if target is None:  # (the known answer reads its low tap as is: per-tap norms stay 1)
        norms += getattr(head, "fc_norm", [])
    for norm in norms:
        norm.weight = mx.array(rng.uniform(0.5, 2.0, 64).astype(np.float32))
    if target is not None:
        d = 64
        head.fc.weight = mx.concatenate([mx.eye(d), mx.zeros((d, 2 * d))], axis=1)
        zero = (".o_proj.weight", ".down_proj.weight")
        head.update(tree_unflatten([(k, 0 * v if k.endswith(zero) else v)
                                    for k, v in tree_flatten(head.parameters())]))
        nu, emb = bigram(seed), np.array(target.model.embed_tokens.weight)
        twice = {int(nu[nu[x]]): x for x in used}  # nu∘nu is a permutation of `used` too
        head.lm_head.weight = mx.array(np.stack([emb[twice[int(t)]] for t in used]))
        head.norm.weight = target.model.norm.weight
    mx.eval(head.parameters())
    return head


def write_target(out: Path, model, tokenizer_dir: Path) -> Path:
    return write_dir(out, TARGET, dict(tree_flatten(model.parameters())), tokenizer_dir, "pt")


def write_head(out: Path, head: Eagle3Head, config: dict, *, original: bool = False) -> Path:
    weights = dict(tree_flatten(head.parameters()))
    weights["d2t"] = weights["d2t"].astype(mx.int64)
    t2d = np.zeros(VOCAB, bool)
    t2d[np.array(weights["d2t"]) + np.arange(DRAFT_VOCAB)] = True
    weights["t2d"] = mx.array(t2d)
    if original:
        weights = {k.replace("layers.0.", "midlayer."): v for k, v in weights.items()}
    return write_dir(out, config, weights, None, "pt")

