"""Which head kind wins per minute of training: `python -m mlx_spec.train.compare`.

Every kind trains from scratch on the same target, the same rows (generated once, as
train-drafter makes them) and the same held-out prompts, for the same training time, through
the one distiller (distill.py); its held-out scores (tokens per target pass at k = 4 and 8, the
per-position acceptance at k = 8) are taken before training and every `--every` minutes of
training time. Results go to WORK/results.json and a markdown table on stdout (docs/TRAIN.md).
A kind whose head is already written is read back, not retrained, so a run that stopped goes on
from the kind it was training (that kind's own checkpoint resumes it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ..drafters.mtp import MTPConfig, make_head
from ..drafters.mtp_files import save_mtp
from .command import held_out_split
from .data import build_training_set, held_rows
from .distill import (
    DistillConfig,
    default_mtp_config,
    distill_eagle3,
    distill_mtp,
    held_out_scores,
)

KINDS = ("shared-kv", "eagle3", "last-layer")
INFO = {"shared-kv": ("mtp_config.json", "train"), "eagle3": ("training.json", None),
        "last-layer": ("mtp_config.json", "train")}


def last_layer_head(target) -> tuple[MTPConfig, nn.Module]:
    """A shared-KV head of one layer at the target's width, initialised from the target's own
    last layer: the same norms, query, output and MLP weights, reading that layer's own keys
    and values (kv_layer = -1), so its attention starts as the layer's. Its input projection
    starts as emb + h, its output projection as the identity, its norm as the target's final
    one (the target's lm_head reads it). The layer's q_norm (qwen3) or none (ones)."""
    cfg = MTPConfig.for_target(target, "shared-kv", num_layers=1)
    head = make_head(cfg)
    d, last = cfg.hidden_size, target.model.layers[-1]
    eye = mx.eye(d)
    weights = {"pre_projection.weight": mx.concatenate([eye, eye], axis=1),
               "post_projection.weight": eye, "norm.weight": target.backbone.norm.weight}
    ours = dict(tree_flatten(head.layers[0].parameters()))
    theirs = dict(tree_flatten(last.parameters()))
    for name in ours:  # the attention's weights sit under self_attn in the target's layer
        source = theirs.get(name, theirs.get(f"self_attn.{name}"))
        weights[f"layers.0.{name}"] = source if source is not None else ours[name]
    head.load_weights([(k, v.astype(mx.float32)) for k, v in weights.items()], strict=True)
    mx.eval(head.parameters())
    return cfg, head


def train_kind(kind: str, target, tokenizer, data: np.ndarray, held: np.ndarray,
               held_out: list[list[int]], dc: DistillConfig, out: Path, minutes: float,
               every: float) -> dict:
    """One kind's run (or the run already written in `out`): its training metadata."""
    name, key = INFO[kind]
    if not (out / name).exists():
        run = dict(progress=lambda *a: None, seconds=minutes * 60, held=held,
                   eval_every=every * 60,
                   evaluate=lambda d: held_out_scores(target, tokenizer, d, held_out))
        t0 = time.perf_counter()
        if kind == "eagle3":
            distill_eagle3(target, data, dc, out, **run)
        elif kind == "last-layer":
            cfg, head = last_layer_head(target)
            save_mtp(out.parent / "last-layer-init", head, cfg)
            distill_mtp(target, data, cfg, dc, out, init=out.parent / "last-layer-init", **run)
        else:
            distill_mtp(target, data, default_mtp_config(target, kind), dc, out, **run)
        print(f"{kind}: {(time.perf_counter() - t0) / 60:.1f} min wall", file=sys.stderr)
    info = json.loads((out / name).read_text())
    return info[key] if key else info


def table(results: dict[str, dict], marks: list[float]) -> str:
    """tokens/pass at k = 4 and 8 and the k = 8 curve at each mark (the nearest point)."""
    lines = ["| head | training minutes | steps | tokens/pass k = 4 | k = 8 | "
             "acceptance of draft 1..8 at k = 8 |", "|---|---|---|---|---|---|"]
    for kind, info in results.items():
        curve = info["held_out"]
        for m in [0.0, *marks]:
            p = min(curve, key=lambda c: abs(c["minutes"] - m))
            acc = " ".join(f"{a:.2f}" for a in p["acceptance_k8"])
            lines.append(f"| {kind} | {p['minutes']:.1f} | {p['step']} | "
                         f"{p['tokens_per_pass']:.2f} | {p['tokens_per_pass_k8']:.2f} | {acc} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from ..loading import load_target

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", help="text file or directory (default: the target's own text)")
    ap.add_argument("--minutes", type=float, default=20.0, help="training time per kind")
    ap.add_argument("--every", type=float, default=5.0, help="minutes between held-out checks")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--work", type=Path, default=Path("runs/compare"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    target, tokenizer = load_target(args.target)
    dc = DistillConfig(seed=args.seed)
    args.work.mkdir(parents=True, exist_ok=True)
    rows_path = args.work / "rows.npy"
    tokens, prompts, held_out = held_out_split(tokenizer, args.data, dc)
    if not rows_path.exists():
        np.save(rows_path, build_training_set(target, tokens, dc, 256, lambda s: None,
                                              prompts=prompts))
    data = np.load(rows_path)
    held = held_rows(target, held_out, dc.seq_len, dc.seed)
    results = {kind: train_kind(kind, target, tokenizer, data, held, held_out, dc,
                                args.work / kind, args.minutes, args.every)
               for kind in args.kinds.split(",")}
    marks = [m for m in (5.0, 10.0, 20.0) if m <= args.minutes] or [args.minutes]
    meta = {"target": args.target, "data": args.data, "minutes": args.minutes,
            "rows": int(len(data)), "machine": f"{platform.platform()}, {os.cpu_count()} cores",
            "load_average_end": os.getloadavg()}
    (args.work / "results.json").write_text(json.dumps({"meta": meta, **results}, indent=2))
    print(table(results, marks))


if __name__ == "__main__":
    main()
