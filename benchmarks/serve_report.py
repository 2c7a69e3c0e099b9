"""BENCH-serve.md and bench-serve.json from a `python -m benchmarks --group serve` run: how it was
measured, every side at every concurrency, the issue's goals (met or not) with their pairs, the
other ratios, and the HTTP overhead at one stream. "–" where a server does not report a value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .tables import cell, machine_line, write_json

LABELS = {"spec": "(a)", "plain": "(b)", "draft": "", "mlx_lm": "(c)", "mlx_lm_draft": "(c)",
          "no_lookup": "(a)"}


def write_serve(result: dict[str, Any], out: Path) -> None:
    """bench-serve.json and BENCH-serve.md."""
    write_json(result, out / "bench-serve.json")
    lines = serve_header(result)
    lines += serve_table(result)
    lines += load_line(result["levels"])
    lines += goals_section(result["goals"])
    lines += ratios_section(result)
    lines += overhead_section(result["overhead"])
    lines += serve_notes(result)
    (out / "BENCH-serve.md").write_text("\n".join(lines) + "\n")


def pairs_text(p: dict[str, Any]) -> str:
    return f"**{p['median']:.3f}** (pairs: " + ", ".join(f"{r:.3f}" for r in p["pairs"]) + ")"


def serve_header(result: dict[str, Any]) -> list[str]:
    m, s, cfg = result["machine"], result["serve"], result["config"]
    names = {x["key"]: x["name"] for x in result["sides"]}
    streams = " / ".join(str(c) for c in s["concurrency"])
    tokens = result["prompt_tokens"]
    g = result["greedy"]
    return [
        "# Benchmark: serving concurrent streams", "",
        "Reproduce: `uv run python -m benchmarks --group serve` "
        f"(this run: {result['minutes']:.0f} "
        f"min). {machine_line(m)}" + (f"; code at {m['commit']}" if m.get("commit") else "")
        + ".", "",
        f"Target: the bench's widened demo target ({result['target']['params'] / 1e6:.0f}M "
        f"params, f32, {cfg['hidden']}×{cfg['layers']}), as in [BENCH.md](BENCH.md). Sides, "
        "each an HTTP server on 127.0.0.1: **(a)** "
        f"`{names['spec']}` (serve's default: its MTP head behind prompt lookup, a copy of the "
        "stream's own earlier text where its last 3 tokens appeared before, `--draft-length "
        f"auto`), **(b)** `{names['plain']}` "
        "(no drafter; plain steps of all streams batched in one pass), "
        f"`{names['draft']}` (the demo draft model, {result['draft_params'] / 1e6:.1f}M "
        "params f32, `auto`: the pair mlx-lm can load too)"
        + (f", **(a)** with `--no-lookup` `{names['no_lookup']}` (the MTP head alone)"
           if "no_lookup" in names else "")
        + (f", and **(c)** `mlx_lm.server` on the same weights saved to disk, without and "
           f"with that draft model (`--draft-model`, `--num-draft-tokens {cfg['draft_length']}`; "
           "with a draft it serves one request at a time), `--prompt-cache-size 0` (ours keeps "
           "no cache across requests either)" if "mlx_lm" in names else
           "; the mlx-lm sides were not run")
        + ".", "",
        f"Load: at each concurrency C ({streams}) one wave of C streaming "
        f"`/v1/completions` requests sent together on held-out prompts ({len(tokens)} of "
        f"{min(tokens)}–{max(tokens)} tokens, stdlib source; pair p runs the next C of them "
        "from prompt p·C on, so at one stream pair p is prompt p), greedy (T = 0), "
        f"{s['max_tokens']} tokens each (end of text may end one sooner: tokens/stream says), "
        f"after a {s['warmup_tokens']}-token warm-up wave at each C on every side. The sides "
        f"run in {s['pairs']} mirrored pairs at each C (a b … b a, all sides); each "
        "side's figures are over all its runs. The clients are threads of the bench process "
        "(http.client reading the event stream: no SDK, little CPU), on the same 2 cores as "
        "the servers; our servers run in that process too (their HTTP and engine threads "
        "share its GIL with the clients), mlx-lm's in processes of their own. The tokens per "
        "request and the number of pairs are chosen to keep the group under ~20 min.", "",
        "Greedy texts equal to the target's own on the same prompt (`generate` alone, "
        "target-only; leading whitespace aside: mlx-lm's detokenizer drops the first token's "
        "leading space): "
        f"**{g['streams'] - len(g['differ'])} of {g['streams']}** streams"
        + (f" (differ: {'; '.join(g['differ'])})" if g["differ"] else "") + ".", "",
    ]


def serve_table(result: dict[str, Any]) -> list[str]:
    names = {x["key"]: x["name"] for x in result["sides"]}
    lines = ["| side | streams | aggregate tok/s | per-stream tok/s | TTFT p50/p90 ms | "
             "ITL p50/p90 ms | tokens/stream | rounds per verify pass | tokens/pass | "
             "drafted/pass | acceptance |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, name in names.items():
        for c, level in result["levels"].items():
            r = level["sides"][key]
            label = f"{LABELS.get(key, '')} {name}".strip()
            lines.append(
                f"| {label} | {c} | {r['tok_s']:.1f} | {r['stream_tok_s']:.1f} | "
                f"{r['ttft_p50_ms']:.0f}/{r['ttft_p90_ms']:.0f} | "
                f"{r['itl_p50_ms']:.0f}/{r['itl_p90_ms']:.0f} | {r['tokens_per_stream']:.1f} | "
                f"{cell(r['rounds_per_pass'], '.2f')} | {cell(r['tokens_per_pass'], '.2f')} | "
                f"{cell(r['drafted_per_pass'], '.2f')} | {cell(r['acceptance'], '.0%')} |")
    return lines


def load_line(levels: dict[str, Any]) -> list[str]:
    """The 1-minute load average after each concurrency's runs (2 cores)."""
    loads = [(c, level.get("load_average")) for c, level in levels.items()]
    if any(load is None for _, load in loads):
        return []
    return ["", "1-minute load average after each concurrency's runs (2 cores; the bench's own "
            "threads and servers count, so above ~2 means other work shared the cores): "
            + ", ".join(f"{c} stream(s) {load:.1f}" for c, load in loads) + "."]


def goals_section(goals: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## The issue's goals", "",
             "Medians of mirrored pairs, each (x₁ + x₂) / (y₁ + y₂) of aggregate tok/s "
             "(per-stream tok/s after the first token for served ÷ generate); "
             "(a) ÷ max((a), (b)) is each pair's min(1, (a) ÷ (b)).", "",
             "| goal | measured | bar | met | pairs |", "|---|---|---|---|---|"]
    for g in goals:
        lines.append(f"| {g['goal']} | **{g['median']:.3f}** | ≥ {g['bar']:g} | "
                     f"{'yes' if g['met'] else '**no**'} | "
                     + ", ".join(f"{r:.3f}" for r in g["pairs"]) + " |")
    return lines


def ratios_section(result: dict[str, Any]) -> list[str]:
    names = {x["key"]: x["name"] for x in result["sides"]}
    lines = ["", "## Every ratio, per concurrency (aggregate tok/s, mirrored pairs)", ""]
    for c, level in result["levels"].items():
        for key, p in level["ratios"].items():
            a, b = key.split(" ÷ ")
            lines.append(f"- {c} stream(s): {names[a]} ÷ {names[b]}: {pairs_text(p)}")
    return lines


def overhead_section(overhead: dict[str, Any]) -> list[str]:
    lines = ["", "## HTTP overhead at one stream", "",
             "The same turn (the same engine; pair i on held-out prompt i) streamed over HTTP "
             "and through `generate` directly, in mirrored pairs; tok/s after the first token, "
             "as the bench times `generate` ((tokens − 1) ÷ (last − first token)).", ""]
    for o in overhead.values():
        lines.append(
            f"- {o['name']}: served ÷ generate tok/s {pairs_text(o['tok_s'])}; TTFT served ÷ "
            f"generate {pairs_text(o['ttft'])}; medians served {o['served_tok_s']:.1f} / "
            f"generate {o['direct_tok_s']:.1f} tok/s, TTFT {o['served_ttft_ms']:.0f} / "
            f"{o['direct_ttft_ms']:.0f} ms.")
    return lines


def serve_notes(result: dict[str, Any]) -> list[str]:
    return ["", "Columns: aggregate tok/s = all streams' completion tokens (the servers' "
            "usage chunks) ÷ (last stream's end − first request sent), the median over the "
            "side's runs; per-stream tok/s = (tokens − 1) ÷ (last − first text chunk), the "
            "median over streams; TTFT from sending the request to its first text chunk; ITL "
            "= gaps between consecutive text chunks as the client read them (one chunk per "
            "token on both servers; speculation hands a round's tokens over at once, so its "
            "p50 can be ~0). Ours only (`–` for mlx-lm, which reports none of them): rounds "
            "per verify pass = requests' rounds ÷ target verify passes from the server's "
            "counters (the mean batch of a pass); tokens/pass, drafted/pass and acceptance from "
            "each request's `timings` (its last chunk): tokens, drafted and accepted tokens "
            "÷ its target passes.", ""]
