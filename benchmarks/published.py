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

With MLX_SPEC_BENCH_VLM set (vlm.py), the group also runs mlx-vlm side by side on checkpoints
written to disk in the published layouts (`write_hybrid`, `write_gemma4`): the hybrid bench
target (hybrid.py) as an MLX conversion with its MTP head as an mlx-vlm-style sidecar, an
EAGLE-3 head (speculators format) and a DFlash block drafter (z-lab's layout) constructed for
it, and the Gemma 4 pair above.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlx_spec.assets import DEMO_TARGET_F32, demo_model
from mlx_spec.drafters import Drafter, nextn
from mlx_spec.drafters.assistant import AssistantConfig, AssistantDrafter, Gemma4Assistant
from mlx_spec.drafters.dflash import DFlashConfig, DFlashHead
from mlx_spec.drafters.eagle3 import Eagle3Config, Eagle3Head
from mlx_spec.drafters.mtp import eagle3_drafter
from mlx_spec.engine.costs import as_run
from mlx_spec.model import TargetModel
from mlx_spec.train.modeldir import build_model, save_model_dir

from . import vlm
from .hybrid import SMALL, build_hybrid
from .report import SIDE_BY_SIDE
from .runners import (
    BenchConfig,
    Row,
    Runner,
    against_target_only,
    efficiency,
    verify_costs,
)
from .widen import parameter_count


def gemma4_config(hidden: int = 1024, layers: int = 12, ffn: int = 2816, *,
                  tied: bool = False) -> dict:
    """A Gemma 4 E-size-like text config at the bench's width: sliding layers with a full one
    every sixth (and last), the last third sharing K/V, per-layer inputs; tied: the head is the
    embedding, as every published Gemma 4 (and all mlx-vlm's Gemma 4 class can load)."""
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
        final_logit_softcapping=30.0, use_double_wide_mlp=True, tie_word_embeddings=tied,
        max_position_embeddings=4096)
    return dict(model_type="gemma4", text_config=text, vocab_size=vocab(hidden),
                tie_word_embeddings=tied)


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
                ffn: int = 2816, tied: bool = False) -> tuple[TargetModel, AssistantDrafter]:
    """tied: no bigram head; the target repeats its input token (its embedding is its head),
    up to its scaled branches, and the assistant drafts that."""
    config = gemma4_config(hidden, layers, ffn, tied=tied)
    model = build_model(config, seed=seed)
    text = model.language_model
    _scale(model, GEMMA_BRANCHES, noise)
    emb = np.array(text.model.embed_tokens.weight)
    if not tied:
        text.lm_head.weight = _bigram_head(emb, bigram(len(emb), seed))
    head = text.model.embed_tokens.weight if tied else text.lm_head.weight
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
    module.model.embed_tokens.weight = mx.array(np.array(head[:, :d]))
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
        costs = as_run(verify_costs(target, 8, repeats=5))
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
    if vlm.wanted():
        if vlm.available():
            rows, info[SIDE_BY_SIDE] = side_by_side_rows(cfg, run, log)
            group += rows
        else:
            log(f"{vlm.OPT_IN} is set but mlx-vlm is not installed (uv sync --group bench): "
                "no side-by-side rows")
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


# -- side by side with mlx-vlm: the pairs on disk, in their published layouts ----------------

VLM_HYBRID, VLM_GEMMA4 = "vlm-hybrid", "vlm-gemma4"  # the rows' target column
MASK = 1  # the DFlash mask token: <|im_start|>, never in the bench's prompts
DFLASH_LAYERS = 2  # z-lab's Qwen3.5-4B drafter is 6 layers, 16% of its target's size


def side_by_side_rows(cfg: BenchConfig, run: Runner, log: Callable[[str], None]
                      ) -> tuple[list[Row], dict[str, Any]]:
    """Every drafter both engines run, on the same files, prompts and k, each engine in its own
    process, in mirrored pairs (vlm.side_by_side): the hybrid target with its MTP head, an
    EAGLE-3 head and a DFlash drafter (k = 15: blocks of 16, and at the MTP head's k), and the
    Gemma 4 pair."""
    pairs = vlm.requested_pairs()
    k = cfg.draft_length
    info: dict[str, Any] = {"mlx_vlm": vlm.vlm_version(), "pairs": pairs, "groups": {}}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="mlx-spec-vlm-") as tmp:
        hybrid = write_hybrid(cfg, Path(tmp) / "hybrid")
        gemma4 = write_gemma4(cfg, Path(tmp) / "gemma4")
        groups = {
            "hybrid": (hybrid["target"], VLM_HYBRID, [
                (f"mtp k={k}", "mtp", ("mtp", None), ("mtp", hybrid["mtp"]), k),
                ("eagle3 k=3", "eagle3", ("draft", hybrid["eagle3"]),
                 ("eagle3", hybrid["eagle3"]), 3),
                (f"dflash k={k}", "dflash", ("draft", hybrid["dflash"]),
                 ("dflash", hybrid["dflash"]), k),
                ("dflash k=15", "dflash", ("draft", hybrid["dflash"]),
                 ("dflash", hybrid["dflash"]), 15)]),
            "gemma4 assistant": (gemma4["target"], VLM_GEMMA4, [
                ("assistant k=3", "assistant", ("draft", gemma4["assistant"]),
                 ("mtp", gemma4["assistant"]), 3)])}
        for label, (target, name, specs) in groups.items():
            log(f"-- {label} side by side with mlx-vlm {info['mlx_vlm']}: {pairs} ABBA "
                "pair(s), each engine in its own process")
            sides = [vlm.Side(engine, str(target), name, label, (
                vlm.RowSpec("target-only", "none"),
                *(vlm.RowSpec(n, d, *(ours if engine == "mlx-spec" else theirs), k=kk)
                  for n, d, ours, theirs, kk in specs)), run.prompts, run.max_tokens)
                for engine in vlm.ENGINES]
            result = vlm.side_by_side(sides, pairs)
            table = result.pop("table_rows")
            base = table[0].tok_s  # our target-only row
            for r in table:
                r.speedup_vs_target = r.tok_s / base if base else 0.0
                log(f"{r.name:<44} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}  "
                    f"{r.tokens_per_pass or 0:.2f} tok/pass  acc {r.acceptance_rate or 0:.0%}")
            for spec, entry in result["rows"].items():
                log(f"{label} {spec}: ours ÷ mlx-vlm tok/s {entry['ours_vs_vlm']['median']:.3f}")
            rows += table
            info["groups"][label] = result
        info["dflash_params"] = hybrid["dflash_params"]
        info["eagle3_params"] = hybrid["eagle3_params"]
        info["target_params"] = hybrid["params"]
    return rows, info


def write_hybrid(cfg: BenchConfig, out: Path) -> dict[str, Any]:
    """The hybrid bench target as an MLX conversion (config + MLX tensors, as mlx-community
    publishes Qwen3.5), its MTP head as an mlx-vlm-style sidecar beside it (`DIR-mtp`), and an
    EAGLE-3 head and a DFlash drafter built for it. One change to the target: the mask token's
    embedding row is moved onto a unit the widening left empty (the target never reads that
    token, so every sequence without it decodes as before)."""
    _, wide, mtp = build_hybrid(cfg.hidden, cfg.layers, cfg.ffn, cfg.hybrid_noise)
    text = dict(SMALL["text_config"])
    text.update({key: wide.model.args.text_config[key] for key in (
        "hidden_size", "num_hidden_layers", "intermediate_size", "linear_num_key_heads",
        "linear_num_value_heads")})
    config = dict(SMALL, text_config=text)
    D = wide.hidden_size
    emb = wide.model.language_model.model.embed_tokens
    row = mx.zeros((D,))
    row[D - 1] = 1.0
    emb.weight[MASK] = row
    mx.eval(emb.weight)
    target = out / "target"
    save_model_dir(target, wide.model, config, tokenizer_dir=demo_model(DEMO_TARGET_F32))
    wide.config = config
    nextn.save_sidecar(out / "target-mtp", mtp.head, wide)
    eagle3, dflash = hybrid_eagle3(wide, cfg.ffn), hybrid_dflash(wide, cfg.ffn)
    write_eagle3(out / "eagle3", *eagle3, wide)
    write_dir(out / "dflash", dflash[1], dict(tree_flatten(dflash[0].parameters())))
    return {"target": target, "mtp": out / "target-mtp", "eagle3": out / "eagle3",
            "dflash": out / "dflash", "params": parameter_count(wide.model),
            "eagle3_params": parameter_count(eagle3[0]),
            "dflash_params": parameter_count(dflash[0])}


def hybrid_eagle3(wide: TargetModel, ffn: int) -> tuple[Eagle3Head, dict]:
    """An EAGLE-3 head (speculators format; its draft vocabulary every token but the mask one,
    a d2t map as speculators writes it) that passes the pending
    token's embedding through: its one head of attention matches each entry's token embedding
    to its own (a sharp self-match: same token, same value), fc reads nothing, so the first
    draft is the target's undamped bigram of the pending token; a deeper one adds its draft's
    embedding to the state fed back (right where the walk sits on a fixed point)."""
    D, V, n = wide.hidden_size, wide.vocab_size, len(wide.backbone.layers)
    d = SMALL["text_config"]["hidden_size"]  # the units the embeddings use
    layer = dict(model_type="llama", hidden_size=D, intermediate_size=ffn,
                 num_attention_heads=D // 128, num_key_value_heads=1, head_dim=128,
                 rms_norm_eps=1e-6, vocab_size=V, rope_theta=10000.0, num_hidden_layers=1,
                 max_position_embeddings=4096)
    ids = [2, n // 2, n - 3]
    used = np.array([i for i in range(V) if i != MASK])
    raw = dict(speculators_model_type="eagle3", architectures=["Eagle3Speculator"],
               transformer_layer_config=layer, draft_vocab_size=len(used),
               norm_before_residual=False,
               target_hidden_size=D, eagle_aux_hidden_state_layer_ids=ids,
               speculators_config=dict(algorithm="eagle3", proposal_methods=[
                   dict(proposal_type="greedy", speculative_tokens=3)],
                   verifier=dict(name_or_path="bench/hybrid")))
    head = Eagle3Head(Eagle3Config.from_dict(raw), own_embedding=True)
    attn = head.layers[0].self_attn
    pick = mx.zeros((128, 2 * D))
    pick[:d, :d] = mx.eye(d)
    attn.q_proj.weight = mx.concatenate([pick, mx.zeros((D - 128, 2 * D))])
    attn.k_proj.weight, attn.v_proj.weight = pick, pick
    attn.o_proj.weight = mx.zeros((D, D))
    attn.o_proj.weight[:d, :d] = mx.eye(d)
    head.layers[0].mlp.down_proj.weight = mx.zeros((D, ffn))
    head.fc.weight = mx.zeros((D, 3 * D))
    head.norm.weight = wide.backbone.norm.weight
    head.lm_head.weight = wide.model.language_model.lm_head.weight[mx.array(used)]
    head.d2t = mx.array((used - np.arange(len(used))).astype(np.int32))
    head.embed_tokens.weight = wide.model.language_model.model.embed_tokens.weight
    mx.eval(head.parameters())
    return head, raw


def hybrid_dflash(wide: TargetModel, ffn: int) -> tuple[DFlashHead, dict]:
    """A DFlash drafter (z-lab's layout, bidirectional full-attention layers) whose every slot
    proposes the target's undamped bigram of the pending token b: attention is uniform (q = 0),
    the values read the embedding units, which only b's slot carries (the mask token's
    embedding sits on the empty unit, the context features are zero), so each slot's output is
    its mask embedding plus a multiple of Emb(b), and the target's final norm (zero on that
    unit) and head give nu(b). Slot i is right whenever nu^i(b) = nu(b): on the fixed point the
    walk mostly sits on, every slot; the other layer adds nothing (cost only)."""
    D, V, n = wide.hidden_size, wide.vocab_size, len(wide.backbone.layers)
    d = SMALL["text_config"]["hidden_size"]  # the units the embeddings use
    raw = dict(architectures=["DFlashDraftModel"], model_type="qwen3", hidden_size=D,
               num_hidden_layers=DFLASH_LAYERS, intermediate_size=ffn,
               num_attention_heads=D // 128, num_key_value_heads=1, head_dim=128,
               rms_norm_eps=1e-6, vocab_size=V, rope_theta=10000.0,
               max_position_embeddings=4096, layer_types=["full_attention"] * DFLASH_LAYERS,
               tie_word_embeddings=False, num_target_layers=n, hidden_act="silu",
               dflash_config=dict(block_size=16, mask_token_id=MASK,
                                  target_layer_ids=[1, n // 2, n - 2]))
    head = DFlashHead(DFlashConfig.from_dict(raw), D)
    head.fc.weight = mx.zeros((D, 3 * D))
    for i, layer in enumerate(head.layers):
        attn = layer.self_attn
        attn.q_proj.weight = mx.zeros((D, D))
        attn.v_proj.weight = mx.zeros((128, D))
        attn.o_proj.weight = mx.zeros((D, D))
        if i == 0:
            attn.v_proj.weight[:d, :d] = mx.eye(d)
            attn.o_proj.weight[:d, :d] = mx.eye(d)
        layer.mlp.down_proj.weight = mx.zeros((D, ffn))
    head.norm.weight = wide.backbone.norm.weight
    mx.eval(head.parameters())
    return head, raw


def write_eagle3(out: Path, head: Eagle3Head, raw: dict, wide: TargetModel) -> Path:
    """speculators' tensors: the module tree, d2t as int64 and t2d; embed_tokens included, as
    speculators saves it (mlx-vlm 0.7.10 cannot bind a head without it)."""
    weights = dict(tree_flatten(head.parameters()))
    weights["d2t"] = weights["d2t"].astype(mx.int64)
    t2d = np.ones(wide.vocab_size, bool)
    t2d[MASK] = False
    weights["t2d"] = mx.array(t2d)
    return write_dir(out, raw, weights)


def write_gemma4(cfg: BenchConfig, out: Path) -> dict[str, Path]:
    """The Gemma 4 pair above, tied (gemma4_pair): the target as an MLX conversion, the
    assistant as google
    publishes it (its module tree, `gemma4_assistant` config, the draft length in
    generation_config)."""
    target, drafter = gemma4_pair(0.15, hidden=cfg.hidden, layers=cfg.layers, ffn=cfg.ffn,
                                  tied=True)
    save_model_dir(out / "target", target.model,
                   gemma4_config(cfg.hidden, cfg.layers, cfg.ffn, tied=True),
                   tokenizer_dir=demo_model(DEMO_TARGET_F32))
    raw = dict(model_type="gemma4_assistant", architectures=["Gemma4AssistantForCausalLM"],
               backbone_hidden_size=cfg.hidden, use_ordered_embeddings=False,
               tie_word_embeddings=True, text_config=drafter.cfg.text)
    write_dir(out / "assistant", raw, dict(tree_flatten(drafter.module.parameters())))
    (out / "assistant" / "generation_config.json").write_text(
        json.dumps({"num_assistant_tokens": 3}))
    return {"target": out / "target", "assistant": out / "assistant"}


def write_dir(out: Path, config: dict, weights: dict[str, mx.array]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
