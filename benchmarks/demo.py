"""`python -m benchmarks --group demo`: the bundled demo pair as a first run opens it.

The app and `generate` with no model open the demo variant `assets.demo_variant()` picks for
this device (a GPU: the 8-bit target; MLX's CPU backend: the bf16 target computed in f32). The
speedup a new user is shown is MTP `auto` ÷ target-only tok/s on that variant: measured here in
mirrored pairs (ABBA) on the held-out prompts, greedy as the app's default, with the fixed
k = 1..4 rows beside it and, on a CPU, the 8-bit target the demo used to open (why it is not
the default there). What limits the ratio is printed with it: one target forward over
q = 1..5 tokens, and the head's draft time per pass. Results: docs/BENCH-demo.md,
docs/bench-demo.json. Timings are measured here and never asserted by tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlx_spec.assets import DEMO_TARGET, demo_model, demo_variant
from mlx_spec.drafters.lookup import LookupFirst
from mlx_spec.drafters.mtp_files import load_mtp_drafter
from mlx_spec.loading import find_mtp_head, load_target
from mlx_spec.train.corpus import prompts_from_corpus

from .parity import abba, describe
from .runners import BenchConfig, Row, Runner, machine, row_dicts, verify_costs
from .tables import POOLED, reproduce_line, write_json

Log = Callable[[str], None]


def load_variant(name: str, dtype: str | None):
    """A demo target as load_engine opens it, and its MTP head."""
    target, tokenizer = load_target(demo_model(name), dtype=dtype)
    return target, load_mtp_drafter(find_mtp_head(demo_model(name), target), target), tokenizer


def variant_rows(cfg: BenchConfig, run: Runner, name: str, dtype: str | None, log: Log
                 ) -> tuple[list[Row], dict[str, Any]]:
    """Target-only, MTP auto and MTP k = 1..4 on one variant; auto ÷ target-only in pairs."""
    target, mtp, _ = load_variant(name, dtype)
    label = target.name
    log(f"-- {label}")
    rows = [run.ours(target, None, 1, f"{label} target-only", "none", label, 0.0),
            run.ours(target, mtp, "auto", f"{label} mtp auto", "mtp", label, 0.0)]
    rows += [run.ours(target, mtp, k, f"{label} mtp k={k}", "mtp", label, 0.0)
             for k in range(1, 5)]
    rows.append(run.ours(target, LookupFirst(mtp), "auto", f"{label} mtp+lookup auto",
                         "mtp+lookup", label, 0.0))
    base = rows[0].tok_s
    for r in rows:
        r.speedup_vs_target = r.tok_s / base if base else 0.0
        log(f"{r.name:<36} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}  "
            f"{r.tokens_per_pass or 1:.2f} tokens/pass")
    ratio = abba(lambda: run.ours(target, mtp, "auto", "pair", "mtp", label, 0.0).tok_s,
                 lambda: run.ours(target, None, 1, "pair", "none", label, 0.0).tok_s,
                 cfg.parity_pairs)
    log(f"{label}: mtp auto ÷ target-only, median of pairs: {describe(ratio)}")
    lookup = abba(lambda: run.ours(target, LookupFirst(mtp), "auto", "pair", "mtp+lookup", label,
                                   0.0).tok_s,
                  lambda: run.ours(target, None, 1, "pair", "none", label, 0.0).tok_s,
                  cfg.parity_pairs)
    log(f"{label}: mtp+lookup auto ÷ target-only, median of pairs: {describe(lookup)}")
    costs = [1e3 * c for c in verify_costs(target, 4)]
    return rows, {"target": label, "dtype": dtype, "directory": name, "auto_vs_target": ratio,
                  "lookup_vs_target": lookup, "verify_ms": costs}


def bench_demo(cfg: BenchConfig, out: Path, log: Log = print) -> dict[str, Any]:
    started = time.perf_counter()
    chosen = demo_variant()
    variants = [(chosen.name, chosen.dtype)]
    if mx.default_device() != mx.gpu:  # the 8-bit target: the CPU backend's compute-bound case
        variants.append((DEMO_TARGET, None))
    _, _, tokenizer = load_variant(*variants[0])
    run = Runner(tokenizer, prompts_from_corpus(tokenizer, cfg.prompts), cfg.max_tokens)
    rows, parts = [], []
    for name, dtype in variants:
        r, info = variant_rows(cfg, run, name, dtype, log)
        rows += r
        parts.append(info)
    result = {"machine": machine(), "config": asdict(cfg), "chosen": parts[0]["target"],
              "variants": parts, "rows": row_dicts(rows),
              "minutes": (time.perf_counter() - started) / 60}
    write_demo(result, out)
    return result


def write_demo(result: dict[str, Any], out: Path) -> None:
    write_json(result, out / "bench-demo.json")
    c = result["config"]
    lines = ["# Benchmark: the demo as a first run opens it", "",
             reproduce_line("demo", result), "",
             f"The app and `generate` open **{result['chosen']}** here (`assets.demo_variant`). "
             f"Greedy, {c['prompts']} held-out prompts × {c['max_tokens']} tokens a row; each row "
             "a fresh engine (auto: calibrated first, as the app does while idle). The speedup "
             "the app shows is its default's: `auto` with prompt lookup first (`--lookup`: a copy "
             "of the turn's own text where its last 3 tokens appeared before, else the MTP head) "
             "÷ target-only tok/s; the MTP head alone (`--no-lookup`) beside it; each the median "
             f"of {c['parity_pairs']} ABBA pairs. The demo target is small and its greedy text "
             "loops; copies are right there to the end, and cost no drafting. " + POOLED, "",
             "| target | app's default: mtp+lookup auto ÷ target-only (pairs) | --no-lookup: "
             "mtp auto ÷ target-only (pairs) | target-only tok/s | mtp+lookup auto tok/s | "
             "tokens/pass | best fixed k, head alone: tok/s (×) | verify ms, q = 1..5 |",
             "|---|---|---|---|---|---|---|---|"]
    rows = result["rows"]

    def pairs(p: dict[str, Any]) -> str:
        return f"**{p['median']:.3f}** ({', '.join(f'{x:.2f}' for x in p['pairs'])})"

    for v in result["variants"]:
        mine = [r for r in rows if r["target"] == v["target"]]
        base = mine[0]
        lookup = next(r for r in mine if r["name"].endswith("mtp+lookup auto"))
        best = max((r for r in mine if " mtp k=" in r["name"]), key=lambda r: r["tok_s"])
        lines.append(
            f"| {v['target']} | {pairs(v['lookup_vs_target'])} | {pairs(v['auto_vs_target'])}"
            f" | {base['tok_s']:.0f} | {lookup['tok_s']:.0f} | "
            f"{lookup['tokens_per_pass'] or 1:.2f} | "
            f"k={best['draft_length']}: {best['tok_s']:.0f} (×{best['speedup_vs_target']:.2f}) | "
            + " / ".join(f"{x:.2f}" for x in v["verify_ms"]) + " |")
    lines += ["", "| row | tok/s | × target-only | tokens/pass | per-position | draft ms / "
              "verify ms per pass |", "|---|---|---|---|---|---|"]
    for r in rows:
        pos = " ".join(f"{a:.2f}" for a in r["per_position_acceptance"]) or "–"
        lines.append(f"| {r['name']} | {r['tok_s']:.0f} | ×{r['speedup_vs_target']:.2f} | "
                     f"{r['tokens_per_pass'] or 1:.2f} | {pos} | "
                     f"{1e3 * r['draft_s_per_pass']:.2f} / {r['verify_ms_per_pass']:.2f} |")
    (out / "BENCH-demo.md").write_text("\n".join(lines + [""]))
