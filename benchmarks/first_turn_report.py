"""The first-turn group's report: BENCH-first-turn.md / bench-first-turn.json and its section
of BENCH.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .tables import machine_line, write_json


def write_first_turn(result: dict[str, Any], out: Path) -> None:
    """bench-first-turn.json and BENCH-first-turn.md from a `--group first-turn` run."""
    write_json(result, out / "bench-first-turn.json")
    m = result["machine"]
    lines = ["# Benchmark: the first turn", "",
             "Reproduce: `uv run python -m benchmarks --group first-turn` (this run: "
             f"{result['minutes']:.0f} min). {machine_line(m)}"
             + (f"; code at {m['commit']}" if m.get("commit") else "") + "."]
    (out / "BENCH-first-turn.md").write_text("\n".join(lines + first_turn_section(
        result["first_turn"]) + [""]))


def first_turn_section(f: dict[str, Any]) -> list[str]:
    """The first-turn group: how it is measured, a table of its ratios, their pairs, and what
    one calibration costs on each target."""
    k, targets = f["draft_length"], f["targets"]
    lines = [
        "", "## First turn: `auto` before anything is calibrated", "",
        f"Each run is the first turn of a new conversation: {f['max_tokens']} tokens after the "
        "first held-out prompt (T > 0: pair i draws with seed 1000·i, its sides alike), timed "
        "as the caller sees it (TTFT: from the "
        "call to the first token, i.e. prefill and the first round), after a 4-token warm-up in "
        "another conversation of the same engine, so no first-call compilation is timed and the "
        "timed turn's policy is new. Three sides, each with the target's MTP head: **prior**, "
        "`auto` on a fresh engine over an empty calibration store (its costs: the store's "
        "prior, refined from the turn's own rounds); "
        f"**k={k}**, a fixed k on a fresh engine; **known**, `auto` on an engine calibrated "
        "before the turn (not timed). Ratios: the median of "
        f"{f['pairs']} mirrored pairs (prior, k={k}, known, known, k={k}, prior), each "
        "(a₁ + a₂) / (b₁ + b₂) of TTFT or of tok/s; per side, the median of its runs.", "",
        f"| target | T | TTFT prior ÷ k={k} | tok/s prior ÷ known | TTFT ms prior / k={k} / "
        f"known | tok/s prior / k={k} / known | drafts per pass prior / k={k} / known |",
        "|---|---|---|---|---|---|---|"]
    for name, t in targets.items():
        for temp, p in t["temperatures"].items():
            s = [p["sides"][side] for side in ("prior", "fixed", "known")]
            lines.append(
                f"| {first_turn_label(name, t)} | {temp} | "
                f"**{p['ttft_prior_vs_fixed']['median']:.3f}** | "
                f"**{p['tok_s_prior_vs_known']['median']:.3f}** | "
                + " / ".join(f"{x['ttft_ms']:.0f}" for x in s) + " | "
                + " / ".join(f"{x['tok_s']:.1f}" for x in s) + " | "
                + " / ".join(f"{x['drafted_per_pass']:.2f}" for x in s) + " |")
    lines += ["", "Pairs:", ""]
    for name, t in targets.items():
        for temp, p in t["temperatures"].items():
            lines.append(f"- {first_turn_label(name, t)} {temp}: " + "; ".join(
                f"{what} **{p[key]['median']:.3f}** (pairs: "
                + ", ".join(f"{r:.3f}" for r in p[key]["pairs"]) + ")"
                for key, what in (("ttft_prior_vs_fixed", f"TTFT prior ÷ k={k}"),
                                  ("ttft_prior_vs_known", "TTFT prior ÷ known"),
                                  ("tok_s_prior_vs_known", "tok/s prior ÷ known"),
                                  ("tok_s_prior_vs_fixed", f"tok/s prior ÷ k={k}"))))
    lines += ["", "What used to stand before the first token: `engine.calibrate()` (verify "
              "costs for q = 1..9 tokens and plain decoding), timed once per target on a fresh "
              "engine: " + ", ".join(f"{first_turn_label(name, t)} **{t['calibration_s']:.1f} s**"
                                     for name, t in targets.items())
              + ". Before costs were kept, the first `auto` turn ran it inside the turn, so its "
              "TTFT was about that plus the `known` TTFT above."]
    return lines


def first_turn_label(name: str, t: dict[str, Any]) -> str:
    """`wide 114M` / `hybrid 133M`: the first-turn group's name for a target."""
    return f"{'hybrid' if 'hybrid' in name else 'wide'} {t['params'] / 1e6:.0f}M"
