"""Tiny random DFlash block drafters in z-lab's published layout (config.json with
`architectures: ["DFlashDraftModel"]`, `dflash_config` {block_size, mask_token_id,
target_layer_ids}, tensors fc / hidden_norm / layers.i.* / norm, no embeddings or head) for the
tiny llama target of eagle3.py. `agree=True` builds the known-answer pair: a target whose next
token is always the same (`CONSTANT`), whatever the context, and a drafter whose every slot
reads so too (its layers add nothing: the slot's own embedding reaches the target's head)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
from eagle3 import LAYERS, TARGET, VOCAB, write_target
from mlx.utils import tree_flatten, tree_unflatten
from published import write_dir

from mlx_spec.drafters.dflash import DFlashConfig, DFlashHead
from mlx_spec.train.modeldir import build_model

MASK = VOCAB - 1
CONSTANT = 17
IDS = [1, 4, 6]  # z-lab's target_layer_ids: outputs of those layers (inputs of 2, 5, 7)


def config(*, window: int = 6, layers: int = 2, block: int = 16, causal=None, ids=IDS,
           target_layers: int = LAYERS) -> dict:
    types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    out = dict(architectures=["DFlashDraftModel"], model_type="qwen3", hidden_size=64,
               num_hidden_layers=layers, intermediate_size=96, num_attention_heads=2,
               num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-5, vocab_size=VOCAB,
               rope_theta=10000.0, layer_types=types, sliding_window=window,
               tie_word_embeddings=True, num_target_layers=target_layers, hidden_act="silu",
               dflash_config=dict(block_size=block, mask_token_id=MASK,
                                  target_layer_ids=list(ids)))
    if causal is not None:
        out["is_causal"] = causal
    return out


def build_target(seed: int = 0, *, agree: bool = False):
    model = build_model(TARGET, seed=seed)
    if agree:  # every embedding leans on one direction, only CONSTANT's head row reads it
        emb = np.array(model.model.embed_tokens.weight)
        emb[:, 0] = 8.0
        model.model.embed_tokens.weight = mx.array(emb)
        zero = (".o_proj.weight", ".down_proj.weight")
        model.update(tree_unflatten([(k, 0 * v if k.endswith(zero) else v)
                                     for k, v in tree_flatten(model.parameters())]))
        head = np.zeros((VOCAB, 64), np.float32)
        head[CONSTANT, 0] = 1.0
        model.lm_head.weight = mx.array(head)
    mx.eval(model.parameters())
    return model


def build_head(raw: dict, seed: int = 0, *, agree: bool = False) -> DFlashHead:
    cfg = DFlashConfig.from_dict(raw)
    mx.random.seed(seed)
    head = DFlashHead(cfg, TARGET["hidden_size"])
    rng = np.random.default_rng(seed + 5)
    params = []
    for k, v in tree_flatten(head.parameters()):
        if v.ndim == 1:  # every norm away from 1, so a norm skipped or doubled shows
            v = mx.array(rng.uniform(0.5, 2.0, v.shape).astype(np.float32))
        else:  # big enough that attention is far from uniform (the window then matters)
            v = mx.array(rng.normal(0, 1.5 / np.sqrt(v.shape[1]), v.shape).astype(np.float32))
        if agree and k.endswith((".o_proj.weight", ".down_proj.weight")):
            v = 0 * v
        params.append((k, v))
    head.update(tree_unflatten(params))
    if agree:
        head.norm.weight = mx.ones(64)
    mx.eval(head.parameters())
    return head


def write_head(out: Path, head: DFlashHead, raw: dict) -> Path:
    return write_dir(out, raw, dict(tree_flatten(head.parameters())), None, "pt")


__all__ = ["write_target", "MASK", "IDS", "config", "build_target", "build_head", "write_head"]
