"""The benchmark's hybrid row group: a Qwen3.5-layout target (Gated DeltaNet + attention).

No trained Qwen3.5-layout model exists on this machine, so the small model is random, with every
layer's output projections damped to `noise` of their size: the target then mostly predicts from
the current token, and an MTP head in the published layout is *constructed* to agree with that
part (see `agreeing_pair`), so it is accepted often but not always, and rollbacks land mid-round.
Both are widened function-preservingly (widen.py) into a memory-bound f32 target of ≥ 100M
parameters. Rows: target-only, mlx-lm generate_step, the unwidened twin as a (perfect) draft
model, the MTP head, and the MTP head with the other rollback strategy (per-step capture).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlx_spec import cache as kv
from mlx_spec.drafters import Drafter, DraftModelDrafter, nextn
from mlx_spec.drafters.mtp import nextn_drafter
from mlx_spec.engine.costs import as_run
from mlx_spec.model import TargetModel
from mlx_spec.recurrent import rollback_strategy
from mlx_spec.train.modeldir import build_model

from .parity import auto_parity, describe, target_only_parity
from .runners import (
    BenchConfig,
    Row,
    Runner,
    against_target_only,
    efficiency,
    verify_costs,
)
from .widen import parameter_count, widen_hybrid, widen_nextn

SMALL = dict(model_type="qwen3_5", tie_word_embeddings=False, text_config=dict(
    model_type="qwen3_5_text", hidden_size=128, num_hidden_layers=4, intermediate_size=384,
    num_attention_heads=2, num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6,
    vocab_size=4096, max_position_embeddings=4096, tie_word_embeddings=False,
    linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
    mtp_num_hidden_layers=1,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                     "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]}))
OUTPUT_PROJECTIONS = ("o_proj.weight", "out_proj.weight", "down_proj.weight")
# Qwen3.6-27B's published dims, for the per-position memory of each strategy at full size
QWEN36_27B = dict(gdn_layers=48, k_heads=16, v_heads=48, head_k=128, head_v=128, conv=4)
TARGET = "f32-hybrid"  # the rows' target column


def agreeing_pair(config: dict[str, Any], *, seed: int = 0, noise: float = 0.0):
    """(model, NextNHead): the trunk's output projections scaled by `noise`, the head built so
    that it passes norm(Emb(x_{t+1})) through (eh_proj = [I | 0], its block's outputs zero, its
    final norm = the target's): at noise 0 it predicts exactly what the target will."""
    model = build_model(config, seed=seed)
    target = TargetModel(model, 4096)
    lay = nextn.layout_for(target)
    args, d = target.args, target.args.hidden_size
    rng = np.random.default_rng(seed + 100)
    final = mx.array(rng.uniform(0.5, 4.0, d).astype(np.float32))
    target.backbone.norm.weight = final  # sharp and uneven, so a missed norm offset shows
    head = nextn.NextNHead(d, args.rms_norm_eps, lay.block(args), hidden_first=lay.hidden_first)
    head.hnorm.weight = mx.array(rng.uniform(0.5, 2.0, d).astype(np.float32))
    for module, keep in ((model, noise), (head, 0.0)):
        params = [(k, keep * v if k.endswith(OUTPUT_PROJECTIONS) else v)
                  for k, v in tree_flatten(module.parameters())]
        module.update(tree_unflatten(params))
    eye, zero = mx.eye(d), mx.zeros((d, d))
    head.eh_proj.weight = mx.concatenate([zero, eye] if lay.hidden_first else [eye, zero], 1)
    head.enorm.weight = mx.ones(d)
    head.norm.weight = final
    mx.eval(model.parameters(), head.parameters())
    return model, head


def build_hybrid(hidden: int, layers: int, ffn: int, noise: float):
    """(small target, wide target, the MTP head on the wide target)."""
    model, head = agreeing_pair(SMALL, noise=noise)
    small = TargetModel(model, 4096, name="qwen3_5-random")
    wide, _ = widen_hybrid(small, SMALL, hidden=hidden, layers=layers, ffn=ffn, head_factor=2)
    return small, wide, widen_nextn(nextn_drafter(head, small), small, wide)


def tape_bytes(target: TargetModel, prompt: list[int], k: int, strategy: str) -> tuple[int, int]:
    """(bytes per drafted position, bytes per round) a verify of k+1 tokens keeps for rollback."""
    with rollback_strategy(strategy):
        cache = kv.make_cache(target.model)
        target.forward(prompt, cache)
        kv.trim_to(cache, len(prompt), have=len(prompt))
        target.forward(prompt[: k + 1], cache)
        recurrent = [c for c in cache if isinstance(c, kv.RecurrentCache)]
        inputs = sum(u.nbytes for c in recurrent for u in c.tape)
        before = sum(c.tape_nbytes for c in recurrent) - inputs
    return inputs // (k + 1), before


def full_size_bytes_per_position(strategy: str, dims: dict = QWEN36_27B) -> int:
    """Computed (not measured) from published dims: what each strategy keeps per drafted token."""
    kd, vd = dims["k_heads"] * dims["head_k"], dims["v_heads"] * dims["head_v"]
    conv = (2 * kd + vd) * 2  # bf16 pre-conv row
    if strategy == "capture":  # one fp32 state per GDN layer
        per_layer = dims["v_heads"] * dims["head_v"] * dims["head_k"] * 4 + conv
    else:  # the round's q, k, v (bf16), a, b and its conv row
        per_layer = conv + (2 * kd + vd) * 2 + 2 * dims["v_heads"] * 2
    return per_layer * dims["gdn_layers"]


def hybrid_rows(cfg: BenchConfig, run: Runner, log: Callable[[str], None]
                ) -> tuple[list[Row], dict[str, Any]]:
    """The row group and the rollback comparison (measured here, never asserted)."""
    small, wide, mtp = build_hybrid(cfg.hidden, cfg.layers, cfg.ffn, cfg.hybrid_noise)
    n_params = parameter_count(wide.model)
    k = cfg.draft_length
    log(f"-- hybrid: random Qwen3.5-layout target widened to {n_params / 1e6:.0f}M params f32")
    costs = as_run(verify_costs(wide, max(8, k), repeats=7))
    group = measure_rows(run, small, wide, mtp, k)
    against_target_only(group)
    for r in group:
        if r.engine == "mlx-spec" and r.drafter != "none":
            r.efficiency = efficiency(r, costs)
        log_row(r, log)
    rollback = compare_rollbacks(wide, run.prompts[0], group, k, log)
    parity = target_only_parity(run, wide, TARGET, 0.0, pairs=2)
    log(f"hybrid target-only ÷ mlx-lm generate_step, median of ABBA pairs: {describe(parity)}")
    auto = auto_parity(run, wide, lambda: mtp, k, TARGET, 0.0, 1.0, cfg.parity_pairs)
    log(f"hybrid mtp auto ÷ k={k}, median of ABBA pairs: {describe(auto)}")
    info = {"params": n_params, "parity": parity, "auto_parity": auto, "draft_length": k,
            "noise": cfg.hybrid_noise, "rollback": rollback,
            "verify_cost_ratio": [c / costs[0] for c in costs], "costs": costs}
    return group, info


def measure_rows(run: Runner, small: TargetModel, wide: TargetModel, mtp: Drafter, k: int
                 ) -> list[Row]:
    """Target-only, mlx-lm, the twin draft model and the MTP head (both rollbacks) at T=0;
    target-only and the MTP head at T=1."""
    group = [run.ours(wide, None, 1, "hybrid target-only T=0", "none", TARGET, 0.0),
             run.mlx_lm(wide, "hybrid mlx-lm generate_step T=0", TARGET, 0.0),
             run.ours(wide, DraftModelDrafter(small, wide), k,
                      f"hybrid ours draft (twin) k={k} T=0", "draft", TARGET, 0.0),
             run.ours(wide, mtp, k, f"hybrid ours mtp k={k} T=0", "mtp", TARGET, 0.0),
             run.ours(wide, mtp, "auto", "hybrid ours mtp auto T=0", "mtp", TARGET, 0.0)]
    with rollback_strategy("capture"):
        group.append(run.ours(wide, mtp, k, f"hybrid ours mtp k={k} T=0 (capture)", "mtp",
                              TARGET, 0.0))
    group.append(run.ours(wide, None, 1, "hybrid target-only T=1", "none", TARGET, 1.0))
    group.append(run.ours(wide, mtp, k, f"hybrid ours mtp k={k} T=1", "mtp", TARGET, 1.0))
    return group


def log_row(r: Row, log: Callable[[str], None]) -> None:
    if r.engine == "mlx-spec":
        log(f"{r.name:<40} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}  "
            f"{r.tokens_per_pass:.2f} tok/pass  acc {r.acceptance_rate:.0%}  "
            f"commit {r.commit_ms_per_pass:.2f} ms/pass")
    else:
        log(f"{r.name:<40} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}")


def compare_rollbacks(wide: TargetModel, prompt: list[int], group: list[Row], k: int,
                      log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Per strategy: the MTP k row's commit and verify time, and the memory its tape keeps."""
    rollback = {}
    for strategy in ("replay", "capture"):
        per_pos, per_round = tape_bytes(wide, prompt, k, strategy)
        suffix = " (capture)" if strategy == "capture" else ""
        row = next(r for r in group if r.name == f"hybrid ours mtp k={k} T=0{suffix}")
        rollback[strategy] = {
            "commit_ms_per_round": row.commit_ms_per_pass,
            "verify_ms_per_round": row.verify_ms_per_pass,
            "bytes_per_drafted_position": per_pos, "bytes_per_round": per_round,
            "qwen3.6_27b_bytes_per_drafted_position": full_size_bytes_per_position(strategy),
        }
        log(f"rollback {strategy}: commit {row.commit_ms_per_pass:.2f} ms/round, "
            f"{per_pos / 1024:.1f} KiB per drafted position here")
    return rollback
