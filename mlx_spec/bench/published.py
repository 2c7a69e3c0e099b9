"""The benchmark's rows for the published drafter layouts: a Gemma 4 assistant and an EAGLE-3
head, each on a memory-bound f32 target of the matching family.

No real Gemma 4 or EAGLE-3 weights can be used on this machine, and no trained small model of
either family exists here to widen, so each pair is *constructed* at full bench width (random
weights, every matmul at its real size) so that the drafter agrees with its target:

* Gemma 4: the target is a bigram machine, token x → nu(x) for a fixed permutation nu: its
  layers' branch outputs are scaled by `noise` (0: off; Gemma norms every branch output, so the
  post-norm weights are what is scaled) and its untied head maps x to nu(x). The assistant
  (E2B-like: 4 layers, 256 wide, owning no K/V) reads the first 256 units of the scaled token
  embedding and its tied head holds the same rows, cut to 256: it drafts nu(x) at every depth,
  so with noise 0 every draft is right and with noise > 0 some are not.
* EAGLE-3: the same bigram machine on a llama target; the head reads the low tap (then exactly
  Emb(x_t)) through fc and maps it to nu(nu(x_t)) = x_{t+2}: its first draft is right whenever
  x_{t+2} is in its draft vocabulary (half the target's here), deeper ones (fed its own output)
  mostly not.
Acceptance in these rows is therefore synthetic; what they measure is the cost side: each
drafter's draft time against a verify pass at real widths, and the loop around them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..drafters.assistant import AssistantConfig, AssistantDrafter, Gemma4Assistant
from ..drafters.eagle3 import Eagle3Config, Eagle3Head
from ..drafters.mtp import eagle3_drafter
from ..model import TargetModel
from ..train.modeldir import build_model
from .widen import parameter_count

VOCAB = 32768
GEMMA_TYPES = ["sliding_attention"] * 5 + ["full_attention"]
GEMMA_TEXT = dict(
    model_type="gemma4_text", hidden_size=1024, num_hidden_layers=12, intermediate_size=2816,
    num_attention_heads=4, num_key_value_heads=1, head_dim=256, global_head_dim=512,
    rms_norm_eps=1e-6, vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB,
    num_kv_shared_layers=4, hidden_size_per_layer_input=64, sliding_window=512,
    layer_types=GEMMA_TYPES * 2, final_logit_softcapping=30.0, use_double_wide_mlp=True,
    tie_word_embeddings=False, max_position_embeddings=4096)
GEMMA = dict(model_type="gemma4", text_config=GEMMA_TEXT, vocab_size=VOCAB,
             tie_word_embeddings=False)
ASSISTANT_TEXT = dict(
    model_type="gemma4_text", hidden_size=256, num_hidden_layers=4, intermediate_size=2048,
    num_attention_heads=4, num_key_value_heads=1, head_dim=256, global_head_dim=512,
    rms_norm_eps=1e-6, vocab_size=VOCAB, hidden_size_per_layer_input=0, sliding_window=512,
    layer_types=["sliding_attention"] * 3 + ["full_attention"], num_kv_shared_layers=4,
    use_double_wide_mlp=False, max_position_embeddings=4096)
LLAMA = dict(model_type="llama", hidden_size=1024, num_hidden_layers=12, intermediate_size=2816,
             num_attention_heads=8, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB,
             max_position_embeddings=4096, tie_word_embeddings=False, rope_theta=10000.0)
GEMMA_BRANCHES = (".post_attention_layernorm.weight", ".post_feedforward_layernorm.weight",
                  ".post_per_layer_input_norm.weight")
LLAMA_BRANCHES = (".o_proj.weight", ".down_proj.weight")


def bigram(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + 12).permutation(VOCAB)


def _scale(module, suffixes: tuple[str, ...], by: float) -> None:
    module.update(tree_unflatten([(k, by * v if k.endswith(suffixes) else v)
                                  for k, v in tree_flatten(module.parameters())]))


def _bigram_head(emb: np.ndarray, nu: np.ndarray) -> mx.array:
    """Rows such that the argmax after token x is nu(x): row nu(x) = Emb(x)."""
    head = np.empty_like(emb)
    head[nu] = emb
    return mx.array(head)


def gemma4_pair(noise: float, seed: int = 0) -> tuple[TargetModel, AssistantDrafter]:
    model = build_model(GEMMA, seed=seed)
    text = model.language_model
    _scale(model, GEMMA_BRANCHES, noise)
    emb = np.array(text.model.embed_tokens.weight)
    text.lm_head.weight = _bigram_head(emb, bigram(seed))
    mx.eval(model.parameters())
    target = TargetModel(model, 4096, name="gemma4-bigram")
    cfg = AssistantConfig(backbone_hidden_size=GEMMA_TEXT["hidden_size"], text=ASSISTANT_TEXT)
    module = Gemma4Assistant(cfg)
    d, big = ASSISTANT_TEXT["hidden_size"], GEMMA_TEXT["hidden_size"]
    take = mx.concatenate([mx.eye(d), mx.zeros((d, 2 * big - d))], axis=1)
    module.pre_projection.weight = take  # the scaled token embedding's first d units
    module.post_projection.weight = mx.zeros((big, d))
    module.model.embed_tokens.weight = text.lm_head.weight[:, :d]
    module.model.norm.weight = text.model.norm.weight[:d]
    _scale(module, GEMMA_BRANCHES, 0.0)
    mx.eval(module.parameters())
    return target, AssistantDrafter(module, cfg, target)


def eagle3_pair(noise: float, seed: int = 0) -> tuple[TargetModel, Any]:
    model = build_model(LLAMA, seed=seed)
    _scale(model, LLAMA_BRANCHES, noise)
    emb = np.array(model.model.embed_tokens.weight)
    nu = bigram(seed)
    model.lm_head.weight = _bigram_head(emb, nu)
    mx.eval(model.parameters())
    target = TargetModel(model, 4096, name="llama-bigram")
    d = LLAMA["hidden_size"]
    cfg = Eagle3Config(hidden_size=d, target_hidden_size=d, num_heads=8, num_kv_heads=2,
                       head_dim=128, intermediate_size=2816, vocab_size=VOCAB,
                       draft_vocab_size=VOCAB // 2, layer_ids=(2, 6, 9))
    head = Eagle3Head(cfg)
    used = np.sort(np.random.default_rng(seed + 13).choice(VOCAB, VOCAB // 2, replace=False))
    head.d2t = mx.array((used - np.arange(len(used))).astype(np.int32))
    head.fc.weight = mx.concatenate([mx.eye(d), mx.zeros((d, 2 * d))], axis=1)
    _scale(head, LLAMA_BRANCHES, 0.0)
    twice = np.empty(VOCAB, np.int64)
    twice[nu[nu]] = np.arange(VOCAB)  # twice[y] = x with nu(nu(x)) = y
    head.lm_head.weight = mx.array(emb[twice[used]])
    head.norm.weight = model.model.norm.weight
    mx.eval(head.parameters())
    return target, eagle3_drafter(head, target)


def published_rows(cfg, prompts: list[list[int]], ours_on: Callable, make_row: Callable,
                   efficiency: Callable, log: Callable[[str], None]) -> tuple[list, dict]:
    """Rows for both pairs at T=0 (k=3, auto) and T=1 (k=3), each against its own target-only."""
    from ..adaptive import measure_verify_costs

    group, info = [], {}
    for name, build, noise in (("gemma4 assistant", gemma4_pair, 0.3),
                               ("eagle3", eagle3_pair, 0.0)):
        target, drafter = build(noise)
        n = parameter_count(target.model)
        costs = measure_verify_costs(target, 8, repeats=5, smooth=False)
        log(f"-- {name}: constructed pair on a {n / 1e6:.0f}M-param f32 {target.name} target")
        tag = f"f32-{name.split()[0]}"
        rows = []
        for temp in (0.0, 1.0):
            rows.append(ours_on(target, None, 1, f"{name}: target-only T={temp:g}", "none",
                                tag, temp))
            for k in ((3, "auto") if temp == 0 else (3,)):
                rows.append(ours_on(target, drafter, k, f"{name}: ours k={k} T={temp:g}",
                                    "draft", tag, temp))
        for r in rows:
            base = next(b.tok_s for b in rows if b.drafter == "none"
                        and b.temperature == r.temperature)
            r.speedup_vs_target = r.tok_s / base if base else 0.0
            if r.drafter != "none":
                r.efficiency = efficiency(r, costs)
            log(f"{r.name:<40} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}  "
                f"{r.tokens_per_pass or 0:.2f} tok/pass  acc {r.acceptance_rate or 0:.0%}")
        group += rows
        info[name] = {"params": n, "noise": noise, "draft_params": drafter.nbytes() // 4,
                      "verify_cost_ratio": [c / costs[0] for c in costs]}
    return group, info
