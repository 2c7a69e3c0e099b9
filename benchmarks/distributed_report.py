"""BENCH-distributed.md and bench-distributed.json from a `python -m benchmarks --group distributed`
run: how it was measured, the relay's precision, tok/s per side and delay (measured, and the
model built from the 0 ms run and the counted round trips), the ratios in mirrored pairs, the
messages per pass, the issue's goals, and a labelled model for several Macs on a 400B MoE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .serve_report import pairs_text
from .tables import cell, machine_line, write_json

PLAIN, MLX_LM = "plain", "mlx-lm"
TOLERANCE = 0.15  # a delay the relay adds within 15% (or 10 µs) of the asked one is "precise"


def relay_precise(precision: dict[str, float] | None) -> bool:
    """Did the relay add the asked one-way delay within the tolerance, as MLX saw it (the
    all_sum's time over 0 ms's, halved) where measured, else as a ping-pong through it?"""
    if not precision:
        return True  # 0 ms: no relay
    asked = precision["asked_us"]
    got = precision.get("mlx_us", precision["achieved_us"])
    return abs(got - asked) <= max(TOLERANCE * asked, 10.0)


def modelled(base: dict[str, Any], delay_ms: float) -> float:
    """tok/s a side would reach with `delay_ms` added to each one-way trip: its 0 ms time per
    pass plus its counted one-way trips per pass times the delay, over its tokens per pass."""
    tpp = base["tokens_per_pass"] or 1.0
    seconds = tpp / base["tok_s"] + base["hops_per_pass"] * delay_ms / 1e3
    return tpp / seconds


def write_distributed(result: dict[str, Any], out: Path) -> None:
    write_json(result, out / "bench-distributed.json")
    lines = header(result)
    for key, case in result["cases"].items():
        lines += case_section(key, case, result["dist"])
    lines += goals_section(result["goals"])
    lines += limits_section()
    lines += moe_section(result)
    (out / "BENCH-distributed.md").write_text("\n".join(lines) + "\n")


def header(result: dict[str, Any]) -> list[str]:
    m, d, cfg = result["machine"], result["dist"], result["config"]
    delays = " / ".join(f"{x:g}" for x in d["delays_ms"])
    return [
        "# Benchmark: the target split over two ranks, as the link slows", "",
        f"Reproduce: `uv run python -m benchmarks --group distributed` (this run: "
        f"{result['minutes']:.0f} min). {machine_line(m)}"
        + (f"; code at {m['commit']}" if m.get("commit") else "") + ".", "",
        "Two ranks on this machine (mlx.distributed's ring backend over TCP on 127.0.0.1), "
        "each pinned to a CPU of its own with one BLAS thread, as if each had a machine (a "
        "ring rank waiting in a collective spins a core: unpinned, the two ranks time each "
        "other's spinning). Rank 0 runs the product's split target (`ShardedTarget`, one "
        "command message per target forward, distributed/link.py) and every drafter; rank 1 "
        "runs the product's worker loop. Targets: the bench's widened f32 targets "
        f"({cfg['hidden']}×{cfg['layers']}), saved to disk and loaded by each rank in part. "
        "Sides: **(a)** ours plain (no drafter), **(b)** ours with each drafter at `auto` "
        f"and at k = {d['draft_length']}, **(c)** mlx-lm's own sharded model driven by "
        "`mlx_lm.generate.generate_step` on both ranks (SPMD, greedy: what a user of mlx-lm "
        "can run, as `mlx_lm.generate` has no distributed path).", "",
        f"Link: one-way delays of {delays} ms. 0 is loopback, the ranks connected directly; "
        "every other delay is added by a relay in a process of its own (bench/relay.py: a "
        "reader and a writer thread per direction, each chunk sent when due, real-time "
        "scheduled so it preempts the ranks' spinning), which each rank reaches through a "
        "ring hostfile of its own (its own port, the relay's for the other rank). At each "
        "delay every side's engines are new and the `auto` ones calibrated over that link, "
        f"then all sides run in {d['pairs']} mirrored pairs (a b … b a), pair p on held-out "
        f"prompt p (48 tokens of stdlib source), {d['max_tokens']} tokens each, greedy; tok/s "
        "after the first token. One machine: the same sides on the whole target in one "
        "process, pinned to one CPU with one BLAS thread as each rank is (a machine like "
        f"each rank's, holding all of the target), {d['one_pairs']} mirrored pairs. Ratios "
        "are medians of pairs, each (x₁ + x₂) / (y₁ + y₂).", "",
        "**model** = tok/s built from the 0 ms run and the counted round trips: each side's "
        "0 ms time per pass + its one-way trips per pass × the delay, over its tokens per "
        "pass (an all_sum between 2 ranks is 2 one-way trips, an all_gather or a send 1).",
        "",
        f"Host: shared, 2 cores; 1-minute load average {result['load_before']:.1f} before the "
        "run. Each level's line below says what share of all CPU time went to processes other "
        "than the bench's own (its ranks spin while they wait, so they keep ~2 cores busy).",
        "",
    ]


def case_section(key: str, case: dict[str, Any], dist: dict[str, Any]) -> list[str]:
    levels, names = case["levels"], case["sides"]
    delays = list(levels)
    s, g = case["session"], case["greedy"]
    lines = [f"## {case['label']}", "",
             f"{s.get('split', case['mode'])}, rank 0 holds "
             f"{s.get('target_bytes', 0) / 2**20:.0f} MiB of the target "
             f"({case['params'] / 1e6:.0f}M params f32); ranks pinned: {s.get('pinned')}; relay "
             f"scheduling: {s.get('relay_scheduling', '–')}. Greedy tokens equal to one "
             f"machine's target-only: **{g['runs'] - len(g['differ'])} of {g['runs']}** runs"
             + (f" (differ: {'; '.join(case['greedy']['differ'][:8])})"
                if case["greedy"]["differ"] else "") + ".", ""]
    lines += precision_table(levels)
    lines += ["", "tok/s, measured (model); a column whose delay the relay did not add "
              "precisely is the model's (`model:` first):", "",
              "| side | one machine | " + " | ".join(f"{d} ms" for d in delays) + " |",
              "|---|---|" + "---|" * len(delays)]
    base = levels.get("0", {}).get("sides", {})
    for n in names:
        one = case["one"]["sides"].get(n)
        cells = []
        for d in delays:
            r = levels[d]["sides"][n]
            model = modelled(base[n], float(d)) if n in base else None
            precise = relay_precise(levels[d].get("relay"))
            if d == "0" or model is None:
                cells.append(f"{r['tok_s']:.1f}")
            elif precise:
                cells.append(f"{r['tok_s']:.1f} ({model:.1f})")
            else:
                cells.append(f"model: {model:.1f} (relay: {r['tok_s']:.1f})")
        lines.append(f"| {label(n)} | {cell(one and one['tok_s'], '.1f')} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Ratios (medians of mirrored pairs; one machine: the same ratio there):", "",
              "| ratio | one machine | " + " | ".join(f"{d} ms" for d in delays) + " |",
              "|---|---|" + "---|" * len(delays)]
    for name in levels[delays[0]]["ratios"]:
        one = case["one"]["ratios"].get(name)
        lines.append(f"| {name} | {cell(one and one['median'], '.3f')} | " + " | ".join(
            f"{levels[d]['ratios'][name]['median']:.3f}" for d in delays) + " |")
    lines += ["", "Round trips per target pass (rank 0's view, at 1 ms or the slowest delay "
              "run): they do not grow with k.", "",
              "| side | drafted / pass | tokens / pass | command messages / pass | "
              "collectives / pass | one-way trips / pass | trips per token |",
              "|---|---|---|---|---|---|---|"]
    at = "1" if "1" in levels else delays[-1]
    for n in names:
        r = levels[at]["sides"][n]
        coll = ", ".join(f"{c} {v:.1f}" for c, v in sorted(r["collectives_per_pass"].items()))
        tpp = r["tokens_per_pass"] or 1.0
        lines.append(f"| {label(n)} | {r['drafted_per_pass']:.2f} | {tpp:.2f} | "
                     f"{r['messages_per_pass']:.2f} | {coll} | {r['hops_per_pass']:.1f} | "
                     f"{r['hops_per_pass'] / tpp:.1f} |")
    lines += ["", "Pairs:", ""]
    for d in delays:
        lines.append(f"- {d} ms: " + "; ".join(f"{name} {pairs_text(p)}"
                                               for name, p in levels[d]["ratios"].items()))
    lines += ["", "Host during each level's runs (others' share of all CPU time; the wait for it "
              f"to fall below {dist.get('quiet_share', 0.25):.0%} before the level, at most "
              f"{dist.get('quiet_wait_s', 45):.0f} s) and the `auto` engines' calibration: "
              + "; ".join(
                  f"{d}: {host_text(x)}" for d, x in [("one machine", case["one"])]
                  + [(f"{d} ms", levels[d]) for d in delays]) + ".", ""]
    return lines


def host_text(level: dict[str, Any]) -> str:
    q = level.get("quiet") or {}
    return (f"others {level['host']['others']:.0%} (waited {q.get('waited_s', 0):.0f} s), "
            "calibration " + ", ".join(f"{v:.0f} s" for n, v in level["calibration_s"].items()
                                       if "auto" in n))


def label(name: str) -> str:
    return {PLAIN: "(a) ours plain", MLX_LM: "(c) mlx-lm generate_step"}.get(name,
                                                                         f"(b) ours {name}")


def precision_table(levels: dict[str, Any]) -> list[str]:
    lines = ["The link: the one-way delay asked of the relay; as MLX saw it (its all_sum of a "
             "command's size is 2 one-way trips: its median time over 0 ms's, halved); as a "
             "ping-pong through the relay measured it (median and p90 over a direct one, ranks "
             "idle); how late the relay's chunks left during the runs. Precise: within "
             f"{TOLERANCE:.0%} (or 10 µs) as MLX saw it.", "",
             "| delay | one-way µs asked / MLX / ping-pong median / p90 | all_sum µs p50 / min "
             "| chunks late µs p50 / p99 / max (during runs) | precise |",
             "|---|---|---|---|---|"]
    for d, level in levels.items():
        r, runs, probe = level.get("relay"), level.get("relay_runs"), level["probe"]
        lines.append(
            f"| {d} ms | " + (f"{r['asked_us']:.0f} / {cell(r.get('mlx_us'), '.0f')} / "
                              f"{r['achieved_us']:.0f} / {r['p90_us']:.0f}"
                              if r else "direct (no relay)")
            + f" | {probe['p50_us']:.0f} / {probe['min_us']:.0f} | "
            + (f"{cell(runs['late_p50_us'], '.0f')} / {cell(runs['late_p99_us'], '.0f')} / "
               f"{cell(runs['late_max_us'], '.0f')}" if runs else "–")
            + " | " + ("yes" if relay_precise(r) else "**no**") + " |")
    return lines


def goals_section(goals: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## The issue's goals", "", "| goal | measured | bar | met | pairs |",
             "|---|---|---|---|---|"]
    for g in goals:
        lines.append(f"| {g['goal']} | **{g['median']:.3f}** | ≥ {g['bar']:.3f} | "
                     f"{'yes' if g['met'] else '**no**'} | "
                     + ", ".join(f"{r:.3f}" for r in g["pairs"]) + " |")
    met = sum(g["met"] for g in goals)
    return lines + ["", f"Met: {met} of {len(goals)}."]


def limits_section() -> list[str]:
    return ["", "## What limits these numbers here", "",
            "- Two ranks share one 2-core host: each is pinned to a core as if it were a "
            "machine, so a split is two 1-core machines and \"one machine\" is one such core "
            "holding the whole target. MLX's ring backend busy-polls its sockets while a "
            "collective waits (a rank idle in `receive` keeps its core at 100%), so nothing "
            "else here runs beside a rank without taking from it, and other processes on "
            "the host get little CPU during a split's runs and much during one machine's.",
            "- The link is loopback plus a userspace relay: its own hop (a thread handoff "
            "each way, tens of µs on a busy host) adds to every delay asked, which is why the "
            "smallest delay is read off the model rather than the relay where it is not "
            "precise; chunks are also occasionally late by milliseconds (the max column).",
            "- The targets are small (0.1 B params, f32 on a CPU): a tensor split's 25 "
            "all_sums per forward cost ~40 µs each even on loopback, a visible share of a "
            "~50 ms token; on real Macs the compute per token is far larger and the link's "
            "share smaller at the same latency.",
            "- The hybrid target has 8 layers here (the main bench's has 12), so each rank's "
            "last layer is an attention layer: with a Gated DeltaNet layer last on rank 1 "
            "(12 layers split 6/6), the split crashes rank 1 at its first rollback or "
            "calibration (see the notes).",
            "- Acceptance is what these drafters give on these prompts: the twin is a perfect "
            "drafter, the hybrid's MTP head is constructed (synthetic acceptance), the demo "
            "draft model and n-gram are real but weak here."]


# -- a model, not a measurement: several Macs on a 400B MoE ------------------------------------

LINKS_US = {"JACCL (RDMA over Thunderbolt 5)": 30.0, "ring over Thunderbolt / Ethernet": 300.0}
MOE_MS = 16.0  # per token, one pass over the active weights (see moe_section's assumptions)


def pass_ratio(case: dict[str, Any], name: str) -> tuple[float, float, float] | None:
    """(tokens per pass, drafted per pass, time per pass ÷ plain's time per token) of side
    `name` at 0 ms."""
    sides = case["levels"].get("0", {}).get("sides", {})
    if name not in sides or PLAIN not in sides:
        return None
    tpp = sides[name]["tokens_per_pass"]
    return (tpp, sides[name]["drafted_per_pass"],
            (tpp / sides[name]["tok_s"]) / (1 / sides[PLAIN]["tok_s"]))


def moe_rows(tau: float, r: float, ranks: int, link_us: float) -> tuple[float, float, float]:
    """(mlx-lm, ours plain, ours speculative) tok/s of a pipeline split over `ranks` Macs:
    mlx-lm 2(N−1) one-way trips per token (the sends along the pipeline, the all_gather), ours
    2(N−1) more (the command all_sum), once per pass of tau tokens costing r plain tokens."""
    link = link_us / 1e3
    return (1e3 / (MOE_MS + 2 * (ranks - 1) * link), 1e3 / (MOE_MS + 4 * (ranks - 1) * link),
            1e3 * tau / (r * MOE_MS + 4 * (ranks - 1) * link))


def moe_section(result: dict[str, Any]) -> list[str]:
    measured = {f"{key} {n}": x for key, c in result["cases"].items() for n in c["sides"]
                if n.endswith("auto") and (x := pass_ratio(c, n))}
    if not measured:
        return []
    lines = ["", "## A model, not a measurement: 2 and 4 Macs on a 400B MoE", "",
             "Assumptions: a Qwen3.5-397B-A17B-class MoE at 4 bits reads ~17B active "
             "parameters (~9.5 GB) per token, ~16 ms on a Mac Studio's ~800 GB/s at ~70% of "
             "it; split by pipeline (mlx-lm's split for qwen3_5), whose layers run one after "
             "another, so the compute per token stays ~16 ms on 2 or 4 Macs. One-way link "
             "latency: " + ", ".join(f"{n} ~{v:.0f} µs" for n, v in LINKS_US.items())
             + " (published: JACCL tens of µs, ring hundreds). Trips per token: mlx-lm "
             "2(N−1), ours 4(N−1) per pass (the counts measured above for N = 2: 2 and 4). "
             "Speculation: tokens per pass τ and a pass's cost r (÷ a plain token's), measured "
             "here at 0 ms by each `auto` side: " + ", ".join(
                 f"{n}: τ {x[0]:.2f}, r {x[2]:.2f}" for n, x in measured.items())
             + ". These targets are dense; an MoE pays more per verified token (each may "
             "route to other experts), so the MoE columns take r = 1 + 0.8·k̄ (every drafted "
             "token reading experts of its own, 80% of a token's bytes; k̄ the drafts per "
             "pass): a pessimistic bound, correlated routing shares experts.", ""]
    for n, (tau, k, r) in measured.items():
        if not n.startswith(("pipeline mtp", "tensor twin")):
            continue
        what = "the constructed MTP head" if "mtp" in n else "a perfect drafter (the twin)"
        lines += [f"With {what}'s τ = {tau:.2f}, r = {r:.2f} (dense) / {1 + 0.8 * k:.2f} "
                  "(MoE):", "",
                  "| Macs | link | mlx-lm plain tok/s | ours plain | ours speculative | "
                  "÷ mlx-lm | ours speculative, MoE r | ÷ mlx-lm |",
                  "|---|---|---|---|---|---|---|---|"]
        for ranks in (2, 4):
            for name, us in LINKS_US.items():
                c, a, b = moe_rows(tau, r, ranks, us)
                bm = moe_rows(tau, 1 + 0.8 * k, ranks, us)[2]
                lines.append(f"| {ranks} | {name} | {c:.1f} | {a:.1f} | {b:.1f} | "
                             f"×{b / c:.2f} | {bm:.1f} | ×{bm / c:.2f} |")
        lines.append("")
    lines += ["On a pipeline split the link is a small part of a 16 ms token even over a "
              "ring (4 trips × 300 µs = 1.2 ms on 2 Macs), so what speculation buys there is "
              "mostly what it buys on one Mac, and our command costs a plain token as much "
              "link as mlx-lm's whole forward; speculation divides the link's share by τ, "
              "which matters where the link is large: a tensor split pays 2 all_sums per layer "
              "(the 24 per pass counted above for 12 layers; 2·L·2(N−1) trips for L layers), "
              "e.g. L = 60 over a 300 µs ring on 2 Macs is 72 ms of link per pass, which "
              "speculation divides by τ and plain decoding cannot."]
    return lines
