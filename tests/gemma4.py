"""Tiny random Gemma 4 checkpoints in the published names and configs: a target with sliding,
full and KV-shared layers (and per-layer inputs, as E2B / E4B), and its `gemma4_assistant`
drafter, dense or with the clustered head. `agree=True` builds the known-answer pair: the
target's layers add nothing, and the assistant passes the token embedding through to the
target's own final norm and embedding, so it predicts exactly what the target will."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from published import write_dir

from mlx_spec.drafters.assistant import AssistantConfig, Gemma4Assistant
from mlx_spec.train.modeldir import build_model

VOCAB = 384
WINDOW = 16
TYPES = ["sliding_attention", "sliding_attention", "full_attention",
         "sliding_attention", "sliding_attention", "full_attention"]
ROPE = {"full_attention": dict(rope_type="proportional", rope_theta=1e6,
                               partial_rotary_factor=0.25),
        "sliding_attention": dict(rope_type="default", rope_theta=1e4)}
TEXT = dict(
    model_type="gemma4_text", hidden_size=64, num_hidden_layers=len(TYPES), intermediate_size=96,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=32,
    rms_norm_eps=1e-6, vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB,
    num_kv_shared_layers=2,  # layers 4, 5 read the K/V of layers 3 (sliding) and 2 (full)
    hidden_size_per_layer_input=8, sliding_window=WINDOW, layer_types=TYPES,
    final_logit_softcapping=30.0, use_double_wide_mlp=True, tie_word_embeddings=True,
    max_position_embeddings=1024, rope_parameters=ROPE)
TARGET = dict(model_type="gemma4", text_config=TEXT, vocab_size=VOCAB, tie_word_embeddings=True)
# what the known-answer pair scales by `noise` (0: off). Gemma norms every branch's output
# before the residual add, so scaling a projection would change nothing: the norms' weights
OUTPUTS = (".post_attention_layernorm.weight", ".post_feedforward_layernorm.weight",
           ".post_per_layer_input_norm.weight")


def assistant_config(*, hidden: int = 32, ordered: bool = False, centroids: int = 16,
                     top_k: int = 4) -> dict:
    text = dict(
        model_type="gemma4_text", hidden_size=hidden, num_hidden_layers=2,
        intermediate_size=2 * hidden, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, global_head_dim=32, rms_norm_eps=1e-6, vocab_size=VOCAB,
        vocab_size_per_layer_input=0, hidden_size_per_layer_input=0, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"], use_double_wide_mlp=False,
        enable_moe_block=False, tie_word_embeddings=True, max_position_embeddings=1024,
        rope_parameters=ROPE)
    return dict(model_type="gemma4_assistant", architectures=["Gemma4AssistantForCausalLM"],
                backbone_hidden_size=TEXT["hidden_size"], use_ordered_embeddings=ordered,
                num_centroids=centroids, centroid_intermediate_top_k=top_k,
                tie_word_embeddings=True, text_config=text)


def build_target(seed: int = 0, *, agree: bool = False, noise: float = 0.0,
                 sharpness: float = 1.0):
    """sharpness scales the final norm: below 1, softer next-token distributions (so that at
    T = 1 a draft is sometimes rejected and sometimes accepted)."""
    model = build_model(TARGET, seed=seed)
    rng = np.random.default_rng(seed + 100)
    text = model.language_model.model
    final = sharpness * rng.uniform(0.5, 4.0, TEXT["hidden_size"])
    text.norm.weight = mx.array(final.astype(np.float32))
    if agree:
        params = [(k, noise * v if k.endswith(OUTPUTS) else v)
                  for k, v in tree_flatten(model.parameters())]
        model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def build_assistant(config: dict, seed: int = 0, *, target=None) -> Gemma4Assistant:
    """Random weights; with `target` (built with agree=True), the known-answer assistant."""
    cfg = AssistantConfig(backbone_hidden_size=config["backbone_hidden_size"],
                          text=dict(config["text_config"], num_kv_shared_layers=2),
                          use_ordered_embeddings=config["use_ordered_embeddings"],
                          num_centroids=config["num_centroids"],
                          centroid_intermediate_top_k=config["centroid_intermediate_top_k"])
    mx.random.seed(seed)
    module = Gemma4Assistant(cfg)
    rng = np.random.default_rng(seed + 7)
    if cfg.use_ordered_embeddings:
        module.masked_embedding.token_ordering = mx.array(
            rng.permutation(VOCAB).astype(np.int32))
    if target is not None:
        d = config["text_config"]["hidden_size"]
        assert d == TEXT["hidden_size"], "the known-answer assistant is as wide as its target"
        text = target.language_model.model
        module.pre_projection.weight = mx.concatenate([mx.eye(d), mx.zeros((d, d))], axis=1)
        module.post_projection.weight = mx.eye(d)
        module.model.embed_tokens.weight = text.embed_tokens.weight
        module.model.norm.weight = text.norm.weight
        params = [(k, 0 * v if k.endswith(OUTPUTS) else v)
                  for k, v in tree_flatten(module.parameters())]
        module.update(tree_unflatten(params))
    else:
        for layer in module.model.layers:  # random norms and scalars, so none is a no-op
            layer.layer_scalar = mx.array(rng.uniform(0.5, 1.5, 1).astype(np.float32))
            layer.self_attn.q_norm.weight = mx.array(
                rng.uniform(0.5, 1.5, layer.self_attn.head_dim).astype(np.float32))
    mx.eval(module.parameters())
    return module


def write_target(out: Path, model, tokenizer_dir: Path) -> Path:
    """HF names: model.language_model.* (the multimodal wrapper), as google publishes."""
    weights = {k.replace("language_model.model.", "model.language_model."): v
               for k, v in tree_flatten(model.parameters())}
    return write_dir(out, TARGET, weights, tokenizer_dir, "pt")


def write_assistant(out: Path, module: Gemma4Assistant, config: dict,
                    num_assistant_tokens: int | None = None) -> Path:
    weights = dict(tree_flatten(module.parameters()))
    if "masked_embedding.token_ordering" in weights:  # torch stores it as int64
        weights["masked_embedding.token_ordering"] = (
            weights["masked_embedding.token_ordering"].astype(mx.int64))
    write_dir(out, config, weights, None, "pt")
    if num_assistant_tokens:
        (out / "generation_config.json").write_text(
            json.dumps({"num_assistant_tokens": num_assistant_tokens}))
    return out

