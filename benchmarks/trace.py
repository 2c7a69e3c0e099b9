"""`python -m benchmarks --group trace`: what recording a turn round by round costs (the app
traces every turn: rejected drafts, inspect, saved traces). The same engine and prompts, traced
and untraced, in mirrored order (A B … B A), with the drafters the app runs: the bundled demo
pair (MTP behind prompt lookup) and SmolLM2-135M-Instruct with its shipped head behind lookup,
at T = 0 and T = 1. The draft length is fixed (K): under `auto` each side's policy learns its
own k from its own timings, and the two would not do the same work (a first measurement here
read tokens per pass 2.25 / 1.58 on the same greedy tokens). Results: docs/BENCH-trace.md,
docs/bench-trace.json."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlx_spec.assets import DEMO_TARGET_F32, demo_model, shipped_head
from mlx_spec.drafters.lookup import LookupFirst
from mlx_spec.loading import find_mtp_head, load_target, make_drafter

from .parity import Log, compare, ratio, real_weights
from .runners import BenchConfig, Row, Runner, fresh_store, machine, row_dicts
from .smollm2 import prompts
from .tables import mirrored, write_group

K = 4  # what a traced round reads grows with k: (k + 1) rows of p, k of q
TRACE = BenchConfig(prompts=4, max_tokens=64, temperatures=((0.0, 1.0), (1.0, 1.0)),
                    parity_pairs=3)
TRACE_QUICK = BenchConfig(prompts=1, max_tokens=16, temperatures=((0.0, 1.0),),
                          parity_pairs=1)


def models(real: bool) -> list[tuple[str, Any, Any, Any]]:
    """(label, target, tokenizer, a maker of the drafter the app runs on it)."""
    path = demo_model(DEMO_TARGET_F32)
    demo, tok = load_target(str(path))
    out = [("demo", demo, tok, lambda: LookupFirst(make_drafter(
        "mtp", demo, mtp=find_mtp_head(str(path), demo))))]
    if real:
        target, tokenizer = load_target(str(real_weights().fetch("smollm2")))
        head = shipped_head(target)
        if head is not None:
            out.append(("SmolLM2", target, tokenizer, lambda: LookupFirst(
                make_drafter("draft", target, draft_model=head))))
    return out


def traced_vs_not(cfg: BenchConfig, log: Log, *, real: bool = True
                  ) -> tuple[list[Row], dict[str, Any]]:
    rows, ratios = [], {}
    for label, target, tokenizer, drafter in models(real):
        run = Runner(tokenizer, prompts(tokenizer, cfg.prompts), cfg.max_tokens, fresh_store())
        for temp, top_p in cfg.temperatures:
            t = f"{label} T={temp:g}"
            sides = {name: _side(run, target, drafter, temp, top_p, f"{t} {name}",
                                 traced=name == "traced") for name in ("untraced", "traced")}
            got, runs = compare(sides, cfg.parity_pairs)
            for r in got:
                log(f"{r.name:<32} {r.tok_s:7.2f} tok/s  {r.tokens_per_pass or 1:.2f} "
                    "tokens/pass")
            ratios[t] = {"traced ÷ untraced": ratio(runs, list(sides), "traced", "untraced")}
            rows += got
    return rows, {"ratios": ratios}


def _side(run: Runner, target: Any, drafter: Any, temp: float, top_p: float, name: str, *,
          traced: bool):
    return lambda: run.ours(target, drafter(), K, name, "lookup first", target.name, temp,
                            top_p, trace=traced)


def bench_trace(cfg: BenchConfig, out: Path, log: Log = print) -> dict[str, Any]:
    started = time.perf_counter()
    rows, info = traced_vs_not(cfg, log)
    result = {"machine": machine(), "config": asdict(cfg), "trace": info,
              "rows": row_dicts(rows), "minutes": (time.perf_counter() - started) / 60}
    c = result["config"]
    write_group(out, "trace", "what tracing a turn costs",
                "The app traces every turn (the rejected drafts it shows, the inspect screen, "
                "the saved trace): each round's p and q at its drafts and their top-5, read on "
                f"the host from what the round evaluated. Same engine, traced and untraced, "
                f"k = {K}: {c['prompts']} chat prompts × {c['max_tokens']} tokens, "
                + mirrored(c), result)
    return result
