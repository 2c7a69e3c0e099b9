"""The benchmark's report: Markdown tables and sections, the plot, and the files a run writes
(docs/BENCH.md, docs/bench.json, docs/bench.png; BENCH-drafters.md / .json for the published
group, BENCH-first-turn.md / .json for the first-turn group)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .first_turn_report import first_turn_section
from .needed import needed_section
from .tables import AS_RUN, POOLED, blas, cell, machine_line, row_table, write_json


def write_outputs(result: dict[str, Any], out: Path) -> None:
    """bench.json, BENCH.md and bench.png from one run's result."""
    write_json(result, out / "bench.json")
    lines = header(result)
    lines += row_table(result["rows"])
    lines += auto_section(result.get("auto_vs_best_fixed", []))
    if result.get("parity"):
        lines += parity_section(result["parity"])
    lines += needed_section(result["rows"])
    if long := [r for r in result["rows"] if "-token prompt" in r["name"]]:
        lines += long_prompt_section(long)
    if v := result.get("vocabulary"):
        lines += vocabulary_section(v)
    if result.get("hybrid"):
        lines += hybrid_section(result["hybrid"])
    if result.get("published"):
        lines += published_section(result["published"])
    if result.get("first_turn"):
        lines += first_turn_section(result["first_turn"])
    lines += notes(result["target"].get("verify_cost_ms", []))
    (out / "BENCH.md").write_text("\n".join(lines))
    plot(result, out / "bench.png")


def header(result: dict[str, Any]) -> list[str]:
    """Title, how to reproduce, the machine, the target and whether greedy rows agreed."""
    m, ratio = result["machine"], result["target"]["verify_cost_ratio"]
    return [
        "# Benchmark",
        "",
        "Reproduce: `uv run python -m benchmarks` or `uv run python -m benchmarks --quick`"
        + (f" (this run: {result['minutes']:.0f} min)." if "minutes" in result else "."),
        f"Machine: {m['platform']}, {m['cpu_count']} cores, MLX {m['mlx']} on {m['device']}, "
        f"mlx-lm {m['mlx_lm']}, {blas(m)}"
        + (f"; code at {m['commit']}" if m.get("commit") else "") + ".",
        f"Target: the demo target widened to {result['target']['params'] / 1e6:.0f}M params "
        f"(f32, function-preserving); verify cost for q = 1..{len(ratio)} tokens relative to "
        f"1, {AS_RUN}: " + ", ".join(f"{x:.2f}" for x in ratio) + ".",
        f"Greedy rows produced identical tokens: **{result['greedy_identical']}**. " + POOLED,
        "",
    ]


def auto_section(ratios: list[dict[str, Any]]) -> list[str]:
    lines = ["", "Adaptive draft length (`auto`) against the best fixed k of the same drafter "
             "and temperature in this run:", ""]
    return lines + [f"- {a['auto']}: ×{a['ratio']:.2f} of {a['best']}" for a in ratios]


def parity_section(parity: dict[str, dict]) -> list[str]:
    lines = ["", "Ratios one run each cannot settle (single runs here vary by ±10%): the "
             "median of ABBA pairs, each (a₁ + a₂) / (b₁ + b₂) in tok/s. Target-only "
             "against mlx-lm runs on the first prompt; `auto` against a fixed k (and the MTP "
             "head's auto against target-only) on all the rows' prompts, in order (auto's "
             "policy carries over from one to the next, as in a conversation), at T > 0 each "
             "pair with seeds of its own, the same on both sides:",
             ""]
    return lines + [f"- {name}: **{p['median']:.3f}** (pairs: "
                    + ", ".join(f"{r:.3f}" for r in p["pairs"]) + ")"
                    for name, p in parity.items()]


def long_prompt_section(long: list[dict[str, Any]]) -> list[str]:
    lines = ["", "Long prompts (rows `N-token prompt …`, held-out stdlib source, T = 0): "
             "speedup against target-only on the same prompt; ITL p50/p90 ms:", ""]
    return lines + [f"- {r['name']}: {r['tok_s']:.1f} tok/s, ×{r['speedup_vs_target']:.2f}, "
                    f"{r['tokens_per_pass']:.2f} tokens/pass, ITL {r['itl_p50_ms']:.0f}/"
                    f"{r['itl_p90_ms']:.0f}" for r in long]


def vocabulary_section(v: dict[str, Any]) -> list[str]:
    return ["", f"Sampler at a real vocabulary size (V = {v['vocab']:,}, T = "
            f"{v['temperature']:g}, top-p {v['top_p']:g}, top-k {v['top_k']}): processing "
            f"the {v['k'] + 1} target rows and {v['k']} draft rows of a k={v['k']} round "
            f"takes {v['ms']:.2f} ms, ×{v['ratio']:.2f} the softmax of the same rows "
            f"({v['softmax_ms']:.2f} ms; fastest of 20)."]


def notes(verify_cost_ms: list[float]) -> list[str]:
    """What each column means, the plot, and where the published group's rows are."""
    return ["", "Speedup is against our target-only row at the same temperature; `vs "
            "mlx-lm` against mlx-lm `generate_step` at the same temperature. mlx-lm's "
            "acceptance column is its share of tokens flagged `from_draft`, its tokens/pass "
            "all tokens ÷ those not from the draft (one per target pass); `–` where an engine "
            "does not report a value. Draft/verify share: time until the draft is handed to the "
            "verify pass / until the verdict is read; the drafter's device work runs inside "
            "the verify wait (one host sync per round) except in the rounds `auto` times in "
            "parts. ITL: gaps between consecutive tokens as the caller got "
            "them (speculation hands over a round's tokens at once). Efficiency = "
            "measured speedup ÷ (tokens per pass × c(1) / (c(k+1) + draft time per pass)), "
            f"c {AS_RUN}; the raw verify timings (ms, q = 1..{len(verify_cost_ms)}): "
            + ", ".join(f"{x:.1f}" for x in verify_cost_ms) + ".",
            "", "![speedup vs draft length](bench.png)", "",
            "Gemma 4 assistant and EAGLE-3 rows: [BENCH-drafters.md](BENCH-drafters.md) "
            "(`python -m benchmarks --group published`); the first turn: "
            "[BENCH-first-turn.md](BENCH-first-turn.md) (`--group first-turn`); the full run "
            "includes both.", ""]


def write_published(result: dict[str, Any], prompts: int, max_tokens: int, out: Path) -> None:
    """bench-drafters.json and BENCH-drafters.md from a `--group published` run."""
    write_json(result, out / "bench-drafters.json")
    side = result["published"].get(SIDE_BY_SIDE)
    lines = ["# Benchmark: published drafter layouts", "",
             "Reproduce: `uv run python -m benchmarks --group published`"
             + (" with `MLX_SPEC_BENCH_VLM=1` (the mlx-vlm rows; `uv sync --group bench` "
                "installs mlx-vlm)" if side else "") + ". "
             f"{machine_line(result['machine'])}"
             + (f"; code at {result['machine']['commit']}" if result["machine"].get("commit")
                else "") + ". "
             f"{prompts} held-out prompts × {max_tokens} tokens per row.",
             f"Greedy rows produced identical tokens: **{result['greedy_identical']}**. "
             + POOLED, ""]
    lines += row_table(result["rows"])
    lines += published_section(result["published"])
    lines += ["", "Speedup is against the target-only row of the same target and temperature. "
              "Efficiency = measured speedup ÷ (tokens per pass × c(1) / (c(k+1) + draft time "
              "per pass)), c the fastest of 5 verify timings per q.", ""]
    (out / "BENCH-drafters.md").write_text("\n".join(lines))


def hybrid_section(h: dict[str, Any]) -> list[str]:
    lines = [
        "", "## Hybrid target: rolling back recurrent state", "",
        f"Rows `hybrid …`: a random Qwen3.5-layout model (Gated DeltaNet layers 3 of every 4, "
        f"partial-RoPE gated attention in the 4th), its layers' output projections damped to "
        f"{h['noise']:g}, widened to {h['params'] / 1e6:.0f}M params (f32, function-preserving, "
        "GDN heads ×2). Its MTP head is in the published Qwen3.5 layout and *constructed* to "
        "agree with the target's undamped part (bench/hybrid.py), so its acceptance is "
        "synthetic; `draft (twin)` is the unwidened model itself, a perfect drafter. Verify "
        f"cost for q = 1..9 tokens relative to 1, {AS_RUN}: "
        + ", ".join(f"{x:.2f}" for x in h["verify_cost_ratio"]) + ".", "",
        f"Target-only on this model ÷ mlx-lm `generate_step` on the same model, median of "
        f"{len(h['parity']['pairs'])} ABBA pairs: **{h['parity']['median']:.3f}** (pairs: "
        + ", ".join(f"{r:.3f}" for r in h["parity"]["pairs"]) + ")"
        + (f"; mtp auto ÷ mtp k={h['draft_length']} on the same prompts: "
           f"**{h['auto_parity']['median']:.3f}** (pairs: "
           + ", ".join(f"{r:.3f}" for r in h["auto_parity"]["pairs"]) + ")"
           if h.get("auto_parity") else "")
        + ". The single rows above are one run each. Efficiency here uses the fastest of 7 "
        "timings per q, not a fitted line; values above 1 mean the loop saw a cheaper verify "
        "than that calibration did.", "",
        "| rollback | commit ms/round | verify ms/round | KiB kept per drafted position "
        "(here, measured) | KiB per round (state before it) | MiB per drafted position at "
        "Qwen3.6-27B size (computed from its dims) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in h["rollback"].items():
        lines.append(
            f"| {name} | {r['commit_ms_per_round']:.2f} | {r['verify_ms_per_round']:.1f} | "
            f"{r['bytes_per_drafted_position'] / 1024:.1f} | {r['bytes_per_round'] / 1024:.1f} | "
            f"{r['qwen3.6_27b_bytes_per_drafted_position'] / 2**20:.1f} |")
    return lines


SIDE_BY_SIDE = "side by side with mlx-vlm"  # bench/published.py's key for that group


def published_section(p: dict[str, Any]) -> list[str]:
    side = p.get(SIDE_BY_SIDE)
    p = {name: info for name, info in p.items() if name != SIDE_BY_SIDE}
    lines = ["", "## Published drafter layouts: Gemma 4 assistant, EAGLE-3", "",
             "Rows `gemma4 assistant: …` and `eagle3: …`: no real weights of either can be used "
             "here and no trained small model of either family exists to widen, so each pair is "
             "*constructed* at full bench width (bench/published.py): the target is a bigram "
             "machine (token x → a fixed permutation of x) and the drafter is built to predict "
             "it. Their acceptance is synthetic; the rows measure the cost side (draft time "
             "against verify at real widths) and the loop around it.", ""]
    for name, info in p.items():
        lines.append(f"- {name}: target {info['params'] / 1e6:.0f}M params f32, drafter "
                     f"{info['draft_params'] / 1e6:.1f}M, target branch outputs scaled by "
                     f"{info['noise']:g}; verify cost for q = 1..9 tokens relative to 1, {AS_RUN}: "
                     + ", ".join(f"{x:.2f}" for x in info["verify_cost_ratio"]) + ".")
    return lines + (side_by_side_section(side) if side else [])


def side_by_side_section(s: dict[str, Any]) -> list[str]:
    """The mlx-vlm group: how it was run, ours and mlx-vlm per drafter, the goals."""
    lines = [
        "", f"## Side by side with mlx-vlm {s['mlx_vlm']}", "",
        "Rows `hybrid: …` and `gemma4 assistant: …`: the same checkpoint directories, written "
        "in the published layouts (bench/published.py: the hybrid target as an MLX conversion "
        "with its MTP head as an mlx-vlm-style sidecar, an EAGLE-3 head in speculators' format "
        "and a DFlash drafter in z-lab's, constructed for it; the Gemma 4 target, tied, and its "
        "`gemma4_assistant`), loaded by each engine's own loader, the same prompts and k, "
        "greedy; each engine in a process of its own, the two in "
        f"{s['pairs']} mirrored pair(s) (ours, mlx-vlm, mlx-vlm, ours: bench/vlm.py). A "
        "process measures its target-only row and every drafter row after a warm-up of each. "
        "mlx-vlm runs `generate_step(draft_model=…, draft_kind=…, draft_block_size=k + 1)` with "
        "its DFlash block held at that size (`prefer_requested_block_size`; its MTP and EAGLE-3 "
        "drafters hold it already); its tokens per pass and per-position acceptance come from "
        "its per-round record (`accept_lens`, `draft_lens`). Speedup: each engine ÷ its own "
        "target-only row in the same process (median over runs); ours ÷ mlx-vlm: the median of "
        "the pairs' (a₁ + a₂) / (b₁ + b₂) in tok/s. The constructed drafters' acceptance is "
        "synthetic; "
        f"target {s['target_params'] / 1e6:.0f}M params, EAGLE-3 head "
        f"{s['eagle3_params'] / 1e6:.1f}M, DFlash drafter {s['dflash_params'] / 1e6:.1f}M.", "",
        "| group | drafter | tok/s ours / mlx-vlm | ours ÷ mlx-vlm (pairs) | speedup ours / "
        "mlx-vlm | tokens/pass ours / mlx-vlm | per-position ours / mlx-vlm | ms per target "
        "pass: draft / verify / commit (ours) |",
        "|---|---|---|---|---|---|---|---|"]
    for group, g in s["groups"].items():
        for name, e in g["rows"].items():
            a, b, r = e["mlx-spec"], e["mlx-vlm"], e["ours_vs_vlm"]
            lines.append(
                f"| {group} | {name} | {a['tok_s']:.1f} / {b['tok_s']:.1f} | "
                f"**{r['median']:.3f}** ({', '.join(f'{x:.3f}' for x in r['pairs'])}) | "
                f"{cell(a['speedup_own_target_only'], '.2f', '×')} / "
                f"{cell(b['speedup_own_target_only'], '.2f', '×')} | "
                f"{cell(a['tokens_per_pass'], '.2f')} / {cell(b['tokens_per_pass'], '.2f')} | "
                f"{positions(a['per_position'])} / {positions(b['per_position'])} | "
                f"{cell(a['draft_ms_per_pass'], '.1f')} / {cell(a['verify_ms_per_pass'], '.1f')}"
                f" / {cell(a['commit_ms_per_pass'], '.2f')} |")
    lines.append("")
    for group, g in s["groups"].items():
        lines.append(f"- {group}: greedy tokens of every run (ours and mlx-vlm, target-only and "
                     "each drafter) identical to our target-only: "
                     f"**{g['greedy_identical']}**"
                     + (f" (differ: {', '.join(g['greedy_mismatched_rows'])})"
                        if g["greedy_mismatched_rows"] else "") + ".")
    return lines + goals_lines(s)


def positions(values: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in values) or "–"


def goals_lines(s: dict[str, Any]) -> list[str]:
    """The issue's goals, read off the group: DFlash at blocks of 16 against the MTP head on
    the hybrid target, and ours against mlx-vlm on every shared drafter row."""
    rows = s["groups"].get("hybrid", {}).get("rows", {})
    mtp = next((e for n, e in rows.items() if n.startswith("mtp")), None)
    block = rows.get("dflash k=15")
    lines = [""]
    if mtp and block:
        a, b = block["mlx-spec"], mtp["mlx-spec"]
        n = min(len(a["per_position"]), len(b["per_position"]))
        x, y = a["speedup_own_target_only"], b["speedup_own_target_only"]
        lines.append(
            f"- Goal, DFlash (k = 15) ≥ the MTP head (k = {mtp['k']}) in speedup on the hybrid "
            f"target: ×{x:.2f} against ×{y:.2f}: **{'met' if x >= y else 'not met'}**; "
            f"per-position acceptance over the first {n} positions: "
            f"{positions(a['per_position'][:n])} (DFlash) against "
            f"{positions(b['per_position'][:n])} (MTP). Its recurrent rollback (commit) at "
            "block length 16: "
            f"{a['commit_ms_per_pass']:.2f} ms per target pass (the MTP head's at k = "
            f"{mtp['k']}: {b['commit_ms_per_pass']:.2f}).")
        same_k = rows.get(f"dflash k={mtp['k']}")
        if same_k and same_k["mlx-spec"]["draft_ms_per_pass"] is not None:
            c = same_k["mlx-spec"]
            lines.append(
                f"- At the same k = {mtp['k']} (the same verify pass of {mtp['k'] + 1} tokens): "
                f"×{c['speedup_own_target_only']:.2f} (DFlash, per position "
                f"{positions(c['per_position'])}) against ×{y:.2f}; draft "
                f"{c['draft_ms_per_pass']:.1f} ms per target pass against "
                f"{b['draft_ms_per_pass']:.1f}, verify {c['verify_ms_per_pass']:.1f} against "
                f"{b['verify_ms_per_pass']:.1f}, commit {c['commit_ms_per_pass']:.2f} against "
                f"{b['commit_ms_per_pass']:.2f}.")
    shared = [(g, n, e["ours_vs_vlm"]["median"]) for g, grp in s["groups"].items()
              for n, e in grp["rows"].items() if e["drafter"] != "none"]
    behind = [f"{g} {n} ({r:.3f})" for g, n, r in shared if r < 1]
    lines.append("- Goal, ours ≥ mlx-vlm in tok/s on every shared drafter row: "
                 f"**{'met' if not behind else 'not met'}**"
                 + (f" (behind: {', '.join(behind)})" if behind else
                    f" ({min(r for *_, r in shared):.3f} the lowest ratio)") + ".")
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for drafter in ("mtp", "draft"):
        pts = sorted((r["draft_length"], r["speedup_vs_target"]) for r in result["rows"]
                     if r["drafter"] == drafter and r["engine"] == "mlx-spec"
                     and r["temperature"] == 0 and r["target"] == "f32"
                     and isinstance(r["draft_length"], int))
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"ours {drafter}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("draft length k")
    ax.set_ylabel("speedup vs target-only (T=0)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
