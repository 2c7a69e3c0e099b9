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

from ..drafters import Drafter
from ..drafters.assistant import AssistantConfig, AssistantDrafter, Gemma4Assistant
from ..drafters.eagle3 import Eagle3Config, Eagle3Head
from ..drafters.mtp import eagle3_drafter
from ..model import TargetModel
from ..train.modeldir import build_model
from .runners import BenchConfig, Row, Runner, against_target_only, efficiency, verify_costs
from .widen import parameter_count


def gemma4_config(hidden: int = 1024, layers: int = 12, ffn: int = 2816) -> dict:
    """A Gemma 4 E-size-like text config at the bench's width: sliding layers with a full one
    every sixth (and last), the last third sharing K/V, per-layer inputs."""
    types = ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention"
             for i in range(layers)]
    shared = layers // 3  # a shared layer reads the last earlier layer of its type: need both
    if not {"full_attention", "sliding_attention"} <= set(types[: layers - shared]):
        shared = 0
    text = dict(
        model_type="gemma4_text", hidden_size=hidden, num_hidden_layers=layers,
        intermediate_size=ffn, num_attention_heads=max(1, hidden // 256), num_key_value_heads=1,
        head_dim=256, global_head_dim=512, rms_norm_eps=1e-6, vocab_size=vocab(hidden),
        vocab_size_per_layer_input=vocab(hidden), num_kv_shared_layers=shared,
        hidden_size_per_layer_input=64, sliding_window=512, layer_types=types,
        final_logit_softcapping=30.0, use_double_wide_mlp=True, tie_word_embeddings=False,
        max_position_embeddings=4096)
    return dict(model_type="gemma4", text_config=text, vocab_size=vocab(hidden),
                tie_word_embeddings=False)


def assistant_text(hidden: int) -> dict:
    """E2B's assistant shape: 4 layers, 256 wide (or the target's width, if narrower)."""
    return dict(
        model_type="gemma4_text", hidden_size=min(256, hidden), num_hidden_layers=4,
        intermediate_size=2048, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        global_head_dim=512, rms_norm_eps=1e-6, vocab_size=vocab(hidden),
        hidden_size_per_layer_input=0, sliding_window=512,
        layer_types=["sliding_attention"] * 3 + ["full_attention"], num_kv_shared_layers=4,
        use_double_wide_mlp=False, max_position_embeddings=4096)


def llama_config(hidden: int = 1024, layers: int = 12, ffn: int = 2816) -> dict:
    return dict(model_type="llama", hidden_size=hidden, num_hidden_layers=layers,
                intermediate_size=ffn, num_attention_heads=max(1, hidden // 128),
                num_key_value_heads=max(1, hidden // 512), rms_norm_eps=1e-5,
                vocab_size=vocab(hidden), max_position_embeddings=4096,
                tie_word_embeddings=False, rope_theta=10000.0)


def vocab(hidden: int) -> int:
    """A real-sized head at full width (32k rows); small for the smoke test's widths."""
    return 32768 if hidden >= 1024 else 4096


GEMMA_BRANCHES = (".post_attention_layernorm.weight", ".post_feedforward_layernorm.weight",
                  ".post_per_layer_input_norm.weight")
LLAMA_BRANCHES = (".o_proj.weight", ".down_proj.weight")


def bigram(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + 12).permutation(n)


def _scale(module, suffixes: tuple[str, ...], by: float) -> None:
    module.update(tree_unflatten([(k, by * v if k.endswith(suffixes) else v)
                                  for k, v in tree_flatten(module.parameters())]))


def _bigram_head(emb: np.ndarray, nu: np.ndarray) -> mx.array:
    """Rows such that the argmax after token x is nu(x): row nu(x) = Emb(x)."""
    head = np.empty_like(emb)
    head[nu] = emb
    return mx.array(head)


def gemma4_pair(noise: float, seed: int = 0, *, hidden: int = 1024, layers: int = 12,
                ffn: int = 2816) -> tuple[TargetModel, AssistantDrafter]:
    config = gemma4_config(hidden, layers, ffn)
    model = build_model(config, seed=seed)
    text = model.language_model
    _scale(model, GEMMA_BRANCHES, noise)
    emb = np.array(text.model.embed_tokens.weight)
    text.lm_head.weight = _bigram_head(emb, bigram(len(emb), seed))
    mx.eval(model.parameters())
    target = TargetModel(model, 4096, name="gemma4-bigram")
    small = assistant_text(hidden)
    cfg = AssistantConfig(backbone_hidden_size=hidden, text=small)
    module = Gemma4Assistant(cfg)
    d = small["hidden_size"]
    take = mx.concatenate([mx.eye(d), mx.zeros((d, 2 * hidden - d))], axis=1)
    module.pre_projection.weight = take  # the scaled token embedding's first d units
    module.post_projection.weight = mx.zeros((hidden, d))
    # copies, not strided views: a matmul against a view of a wider array is far slower
    module.model.embed_tokens.weight = mx.array(np.array(text.lm_head.weight[:, :d]))
    # ×D/d: its d units carry d/D of each logit's sum, so this restores the target's scale
    module.model.norm.weight = mx.array(np.array(text.model.norm.weight[:d]) * hidden / d)
    _scale(module, GEMMA_BRANCHES, 0.0)
    mx.eval(module.parameters())
    return target, AssistantDrafter(module, cfg, target)


def eagle3_pair(noise: float, seed: int = 0, *, hidden: int = 1024, layers: int = 12,
                ffn: int = 2816) -> tuple[TargetModel, Any]:
    config = llama_config(hidden, layers, ffn)
    model = build_model(config, seed=seed)
    _scale(model, LLAMA_BRANCHES, noise)
    emb = np.array(model.model.embed_tokens.weight)
    n = len(emb)
    nu = bigram(n, seed)
    model.lm_head.weight = _bigram_head(emb, nu)
    mx.eval(model.parameters())
    target = TargetModel(model, 4096, name="llama-bigram")
    cfg = Eagle3Config(hidden_size=hidden, target_hidden_size=hidden,
                       num_heads=config["num_attention_heads"],
                       num_kv_heads=config["num_key_value_heads"], head_dim=128,
                       intermediate_size=ffn, vocab_size=n, draft_vocab_size=n // 2,
                       layer_ids=(2, layers // 2, layers - 3))
    head = Eagle3Head(cfg)
    used = np.sort(np.random.default_rng(seed + 13).choice(n, n // 2, replace=False))
    head.d2t = mx.array((used - np.arange(len(used))).astype(np.int32))
    head.fc.weight = mx.concatenate([mx.eye(hidden), mx.zeros((hidden, 2 * hidden))], axis=1)
    _scale(head, LLAMA_BRANCHES, 0.0)
    twice = np.empty(n, np.int64)
    twice[nu[nu]] = np.arange(n)  # twice[y] = x with nu(nu(x)) = y
    head.lm_head.weight = mx.array(emb[twice[used]])
    head.norm.weight = model.model.norm.weight
    mx.eval(head.parameters())
    return target, eagle3_drafter(head, target)


def published_rows(cfg: BenchConfig, run: Runner, log: Callable[[str], None]
                   ) -> tuple[list[Row], dict[str, Any]]:
    """Rows for both pairs at T=0 (k=3, auto) and T=1 (k=3), each against its own target-only."""
    group, info = [], {}
    for name, build, noise in (("gemma4 assistant", gemma4_pair, 0.15),
                               ("eagle3", eagle3_pair, 0.0)):
        target, drafter = build(noise, hidden=cfg.hidden, layers=cfg.layers, ffn=cfg.ffn)
        n = parameter_count(target.model)
        costs = verify_costs(target, 8, repeats=5)
        log(f"-- {name}: constructed pair on a {n / 1e6:.0f}M-param f32 {target.name} target")
        rows = measure_pair(run, name, target, drafter)
        against_target_only(rows)
        for r in rows:
            if r.drafter != "none":
                r.efficiency = efficiency(r, costs)
            log(f"{r.name:<40} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}  "
                f"{r.tokens_per_pass or 0:.2f} tok/pass  acc {r.acceptance_rate or 0:.0%}")
        group += rows
        info[name] = {"params": n, "noise": noise, "draft_params": drafter.nbytes() // 4,
                      "verify_cost_ratio": [c / costs[0] for c in costs]}
    return group, info


def measure_pair(run: Runner, name: str, target: TargetModel, drafter: Drafter) -> list[Row]:
    """Target-only and the drafter at k=3 and auto at T=0; target-only and k=3 at T=1."""
    tag = f"f32-{name.split()[0]}"
    rows = []
    for temp in (0.0, 1.0):
        rows.append(run.ours(target, None, 1, f"{name}: target-only T={temp:g}", "none", tag,
                             temp))
        for k in ((3, "auto") if temp == 0 else (3,)):
            rows.append(run.ours(target, drafter, k, f"{name}: ours k={k} T={temp:g}", "draft",
                                 tag, temp))
    return rows
