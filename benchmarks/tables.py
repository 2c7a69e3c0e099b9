"""The report's shared pieces: cells, the reproduce and machine lines, the row tables, the ABBA
ratio table and the files an ABBA group writes (every group's report builds on these)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def cell(value: float | None, spec: str, prefix: str = "") -> str:
    """A table cell: `value` formatted with `spec` after `prefix`, "–" where it is None."""
    return "–" if value is None else f"{prefix}{value:{spec}}"


AS_RUN = ("as the engine runs the passes (each at the size it pads to, where a longer pass "
          "was measured cheaper; made non-decreasing)")


POOLED = ("tok/s: a row's tokens after each prompt's first ÷ its time after it, pooled over "
          "the prompts (not the mean of their rates, which weighs a fast prompt's seconds "
          "more).")


def write_json(result: dict[str, Any], path: Path) -> None:
    """`result` as indented JSON at `path` (its folder made where missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))


def reproduce_line(group: str, result: dict[str, Any]) -> str:
    """`Reproduce: …`: the command, how long this run took, the machine and the commit."""
    m = result["machine"]
    return (f"Reproduce: `uv run python -m benchmarks --group {group}` (this run: "
            f"{result['minutes']:.0f} min). {machine_line(m)}"
            + (f"; code at {m['commit']}" if m.get("commit") else "") + ".")


def machine_line(m: dict[str, Any]) -> str:
    """`Machine: …`: platform, cores, MLX and its device, whether OpenBLAS was preloaded."""
    return (f"Machine: {m['platform']}, {m['cpu_count']} cores, MLX {m['mlx']} on "
            f"{m['device']}, {blas(m)}")


def blas(m: dict[str, Any]) -> str:
    """Whether OpenBLAS was preloaded, and the kernels the environment named for it."""
    return (f"OpenBLAS preloaded: {m['openblas_preloaded']}"
            + (f" ({m['openblas_coretype']} kernels)" if m.get("openblas_coretype") else ""))


def row_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| row | engine | tok/s | speedup | vs mlx-lm | tokens/pass | acceptance | "
        "per-position | draft/verify share | commit ms/pass | TTFT ms | ITL p50/p90 ms | "
        "peak MB | efficiency |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pos = " ".join(f"{a:.2f}" for a in r["per_position_acceptance"]) or "–"
        share = (f"{r['draft_share']:.0%}/{r['verify_share']:.0%}"
                 if r["draft_share"] is not None else "–")
        lines.append(
            f"| {r['name']} | {r['engine']} | {r['tok_s']:.1f} | ×{r['speedup_vs_target']:.2f} | "
            f"{cell(r['speedup_vs_mlx_lm'], '.2f', '×')} | {cell(r['tokens_per_pass'], '.2f')} | "
            f"{cell(r['acceptance_rate'], '.0%')} | {pos} | {share} | "
            f"{cell(r['commit_ms_per_pass'], '.2f')} | "
            f"{cell(r['ttft_s'] and r['ttft_s'] * 1000, '.0f')} | "
            f"{cell(r['itl_p50_ms'], '.0f')}/{cell(r['itl_p90_ms'], '.0f')} | "
            f"{r['peak_memory_mb']:.0f} | {cell(r['efficiency'], '.2f')} |")
    return lines


def ratios_table(ratios: dict[str, dict[str, dict]]) -> list[str]:
    """A markdown table of ABBA ratios: a row per comparison, a column per setting (T = 0,
    T = 1 …), each cell the median in bold and the pairs after it ("–" where not run)."""
    lines = ["| comparison | " + " | ".join(ratios) + " |", "|---|" + "---|" * len(ratios)]
    names = list(dict.fromkeys(n for r in ratios.values() for n in r))
    for name in names:
        cells = [f"**{r[name]['median']:.3f}** (" + ", ".join(f"{x:.2f}" for x in
                                                           r[name]["pairs"]) + ")"
                 if name in r else "–" for r in ratios.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def rows_table(rows: list[dict[str, Any]]) -> list[str]:
    """Rows with tok/s, × target-only, tokens per pass and per-position acceptance."""
    lines = ["| row | tok/s | × target-only | tokens/pass | per-position acceptance |",
             "|---|---|---|---|---|"]
    for r in rows:
        pos = " ".join(f"{a:.2f}" for a in r["per_position_acceptance"]) or "–"
        tpp = f"{r['tokens_per_pass']:.2f}" if r["tokens_per_pass"] else "–"
        speedup = f"×{r['speedup_vs_target']:.2f}" if r["speedup_vs_target"] else "–"  # none run
        lines.append(f"| {r['name']} | {r['tok_s']:.2f} | {speedup} | {tpp} | {pos} |")
    return lines


def mirrored(config: dict[str, Any]) -> str:
    """How an ABBA group's sides were run (its config as saved)."""
    return (f"every side run {2 * config['parity_pairs']}× in mirrored order; tok/s is the mean "
            "of a side's runs, ratios the median of ABBA pairs. " + POOLED)


def write_group(out: Path, group: str, title: str, intro: str, result: dict[str, Any]
                ) -> None:
    """bench-GROUP.json and BENCH-GROUP.md: the title, how to reproduce, `intro`, the ratios
    of result[group] and the rows."""
    write_json(result, out / f"bench-{group}.json")
    lines = [f"# Benchmark: {title}", "", reproduce_line(group, result), "", intro, "",
             *ratios_table(result[group]["ratios"]), "", *rows_table(result["rows"])]
    (out / f"BENCH-{group}.md").write_text("\n".join(lines + [""]))
