"""`python -m benchmarks --group serve`: several concurrent streaming clients against our server and
against `mlx_lm.server`, on the bench's widened f32 target (docs/BENCH-serve.md).

Sides, each behind HTTP on 127.0.0.1: ours with speculation (`auto`, the target's MTP head),
ours target-only (plain steps batched too), ours with the demo draft model (`auto`), and
`mlx_lm.server` with and without that draft model (a subprocess; with a draft it serves one
request at a time). At each concurrency C, C streams start together (stream i on held-out
prompt i); the sides run in mirrored pairs (A B … B A). Also at one stream: served tok/s ÷ the
same turn through `generate` on the same engine (no HTTP). Timings are measured here and never
asserted by tests.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlx_spec.assets import DEMO_DRAFT, DEMO_TARGET_F32, demo_model
from mlx_spec.drafters import DraftModelDrafter
from mlx_spec.engine import Engine
from mlx_spec.events import TokenEvent
from mlx_spec.serve import Server
from mlx_spec.stats import quantiles
from mlx_spec.train.corpus import prompts_from_corpus
from mlx_spec.train.modeldir import save_model_dir

from .parity import mirrored, pair_ratios
from .runners import QUICK, BenchConfig, BenchModels, load_bench_models, machine, new_engine, timed
from .serve_clients import (
    HOST,
    Wave,
    exit_on_sigterm,
    free_ports,
    launched,
    mlx_lm_command,
    run_wave,
    wait_ready,
)
from .serve_report import write_serve
from .widen import parameter_count

Log = Callable[[str], None]
SPEC, PLAIN, DRAFT, MLX_LM, MLX_LM_DRAFT = "spec", "plain", "draft", "mlx_lm", "mlx_lm_draft"
NO_LOOKUP = "no_lookup"  # (a) without prompt lookup (serve --no-lookup)


@dataclass(frozen=True)
class ServeConfig:
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    max_tokens: int = 64  # per request
    pairs: int = 3  # mirrored pairs of all sides at each concurrency
    overhead_pairs: int = 4  # served ÷ generate at one stream
    warmup_tokens: int = 8
    timeout_s: float = 300.0  # one wave, and each of its requests
    mlx_lm: bool = True  # the mlx_lm.server sides (subprocesses)


SERVE = ServeConfig()
SERVE_QUICK = ServeConfig(concurrency=(1, 4), max_tokens=32, pairs=1, overhead_pairs=1)


@dataclass
class Side:
    """One server under load: its key, its row name, its URL, ours or mlx-lm's."""

    key: str
    name: str
    url: str
    engine: str  # "mlx-spec" | "mlx-lm"
    server: Server | None = None  # ours: its verify counters are read around each wave


@dataclass
class Run:
    """One wave on one side, and (ours) how many verify passes ran how many rounds."""

    side: str
    wave: Wave
    prompts: list[int]  # stream i ran held-out prompt prompts[i]
    passes: int | None = None
    rounds: int | None = None


def bench_serve(cfg: BenchConfig, out: Path, log: Log = print,
                serve: ServeConfig | None = None) -> dict[str, Any]:
    """The serve group: every side at every concurrency, the issue's ratios, BENCH-serve.md."""
    serve = serve or (SERVE_QUICK if cfg == QUICK else SERVE)
    started = time.perf_counter()
    models = load_bench_models(cfg)
    tok = models.tokenizer
    prompts = [tok.decode(ids) for ids in prompts_from_corpus(tok, max(serve.concurrency))]
    with ExitStack() as stack:
        stack.enter_context(exit_on_sigterm())  # a `kill` still stops every server it started
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mlx-spec-serve-")))
        engines, sides = start_sides(stack, models, cfg, serve, tmp, log)
        warm_up(sides, prompts, serve)
        reference = solo_texts(engines[PLAIN], prompts, serve.max_tokens)
        overhead = {key: compare_http(next(s for s in sides if s.key == key), engines[key],
                                      prompts, serve, log) for key in (SPEC, PLAIN)}
        levels = {str(c): measure_level(sides, prompts, c, serve, log)
                  for c in serve.concurrency}
    result = {
        "machine": machine(), "config": asdict(cfg), "serve": asdict(serve),
        "target": {"params": parameter_count(models.wide.model), "hidden": cfg.hidden,
                   "layers": cfg.layers, "dtype": "float32"},
        "draft_params": parameter_count(models.draft.model),
        "prompt_tokens": [len(tok.encode(p)) for p in prompts],
        "sides": [{"key": s.key, "name": s.name, "engine": s.engine, "url": s.url}
                  for s in sides],
        "greedy": greedy_check(levels, reference), "levels": levels, "overhead": overhead,
        "goals": goals(levels, overhead, {s.key: s.name for s in sides if s.engine == "mlx-lm"}),
        "minutes": (time.perf_counter() - started) / 60,
    }
    write_serve(result, out)
    return result


def start_sides(stack: ExitStack, models: BenchModels, cfg: BenchConfig, serve: ServeConfig,
                tmp: Path, log: Log) -> tuple[dict[str, Engine], list[Side]]:
    """Our three engines (the `auto` ones calibrated first, as a warm server is) behind a
    Server each, then the mlx-lm servers on the same weights saved to `tmp`; all closed or
    killed when `stack` unwinds."""
    wide, tok, k = models.wide, models.tokenizer, cfg.draft_length
    # the f32 draft model is a lazy cast made on this thread: evaluated here, since an array
    # pending on this thread's stream cannot be evaluated on a server's engine thread
    mx.eval(models.draft.model.parameters(), wide.model.parameters())
    engines = {SPEC: new_engine(wide, tok, models.lookup_on(), "auto"),  # serve's default
               PLAIN: new_engine(wide, tok, None, 1),
               DRAFT: new_engine(wide, tok, DraftModelDrafter(models.draft, wide), "auto"),
               NO_LOOKUP: new_engine(wide, tok, models.mtp_on(), "auto")}
    for key in (SPEC, DRAFT, NO_LOOKUP):
        engines[key].calibrate()
    names = {SPEC: "ours mtp+lookup auto", PLAIN: "ours target-only", DRAFT: "ours draft auto",
             NO_LOOKUP: "ours mtp auto"}
    sides = [serve_ours(stack, key, names[key], engines[key], max(serve.concurrency))
             for key in (SPEC, PLAIN, DRAFT, NO_LOOKUP)]
    if serve.mlx_lm:  # both launched, then waited for: their start-ups overlap
        target_dir, draft_dir = save_pair(models, tmp)
        launches = []
        for (key, name, draft), port in zip(
                ((MLX_LM, "mlx-lm", None), (MLX_LM_DRAFT, f"mlx-lm draft k={k}", draft_dir)),
                free_ports(2), strict=True):
            log_file = tmp / f"{key}.log"
            proc = stack.enter_context(launched(mlx_lm_command(target_dir, draft, k, port),
                                                log_file))
            launches.append((Side(key, name, f"http://{HOST}:{port}", "mlx-lm"), proc, log_file))
        for side, proc, log_file in launches:
            wait_ready(proc, side.url, serve.timeout_s, log_file)
            sides.append(side)
    log("serving: " + ", ".join(f"{s.name} at {s.url}" for s in sides))
    return engines, sides


def serve_ours(stack: ExitStack, key: str, name: str, engine: Engine, streams: int) -> Side:
    """`engine` behind our Server on 127.0.0.1 (a free port), `streams` requests at once."""
    server = Server(engine, host=HOST, port=0, max_concurrency=streams)
    server.start()
    stack.callback(server.close)
    return Side(key, name, server.url, "mlx-spec", server)


def save_pair(models: BenchModels, tmp: Path) -> tuple[Path, Path]:
    """The wide target and the draft model (both f32) as model directories mlx-lm loads."""
    target_dir, draft_dir = tmp / "target", tmp / "draft"
    save_model_dir(target_dir, models.wide.model, models.wide_config,
                   tokenizer_dir=demo_model(DEMO_TARGET_F32))
    draft_config = json.loads((demo_model(DEMO_DRAFT) / "config.json").read_text())
    save_model_dir(draft_dir, models.draft.model, draft_config,
                   tokenizer_dir=demo_model(DEMO_DRAFT))
    return target_dir, draft_dir


def warm_up(sides: list[Side], prompts: list[str], serve: ServeConfig) -> None:
    """A short wave at each concurrency on every side, so no first-call work (the mlx-lm
    model's load, allocations at each batch size) is timed."""
    for side in sides:
        for c in sorted(set(serve.concurrency)):
            run_wave(side.url, prompts[:c], serve.warmup_tokens, serve.timeout_s)


def run_side(side: Side, prompts: list[str], chosen: list[int], serve: ServeConfig) -> Run:
    """One wave on `side`: stream i on prompts[chosen[i]]."""
    metrics = side.server.scheduler.metrics if side.server is not None else None
    before = (metrics.verify_passes, metrics.verify_rows) if metrics else (0, 0)
    wave = run_wave(side.url, [prompts[i] for i in chosen], serve.max_tokens, serve.timeout_s)
    if metrics is None:
        return Run(side.key, wave, chosen)
    return Run(side.key, wave, chosen, metrics.verify_passes - before[0],
               metrics.verify_rows - before[1])


def rotated(n: int, c: int, pair: int) -> list[int]:
    """The prompts of pair `pair` at c streams: the next c of n, so the pairs cover more of
    them (at one stream, pair i runs prompt i) while both runs of a side in a pair share one."""
    return [(pair * c + i) % n for i in range(c)]


def measure_level(sides: list[Side], prompts: list[str], c: int, serve: ServeConfig, log: Log
                  ) -> dict[str, Any]:
    """Every side at c streams in `serve.pairs` mirrored pairs (pair p on its own prompts,
    `rotated`): per side its figures over all its runs, and the ratios of aggregate tok/s in
    pairs; the 1-minute load average after it (2 cores: above ~2, other work shared them)."""
    runs = []
    for pair in range(serve.pairs):
        chosen = rotated(len(prompts), c, pair)
        runs += mirrored([lambda s=s, chosen=chosen: run_side(s, prompts, chosen, serve)
                          for s in sides], 1)
    index = {s.key: i for i, s in enumerate(sides)}
    per_side = {s.key: summarise([r for p in runs for r in p[index[s.key]]]) for s in sides}
    rate = attrgetter("wave.tok_s")
    ratios = {f"{a} ÷ {b}": pair_ratios(runs, index[a], index[b], rate)
              for a, b in RATIOS if a in index and b in index}
    load = load_average()
    log(f"-- {c} stream{'s' if c > 1 else ''}: " + ", ".join(
        f"{s.name} {per_side[s.key]['tok_s']:.1f}" for s in sides) + " tok/s (aggregate)"
        + (f"; load average {load:.1f}" if load is not None else ""))
    for name, p in ratios.items():
        log(f"   {name}: {p['median']:.3f} (pairs: "
            + ", ".join(f"{r:.3f}" for r in p["pairs"]) + ")")
    return {"sides": per_side, "ratios": ratios, "load_average": load,
            "texts": texts_of(runs, sides)}


def load_average() -> float | None:
    """The 1-minute load average, where the platform has one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


RATIOS = ((SPEC, PLAIN), (SPEC, MLX_LM), (SPEC, MLX_LM_DRAFT), (DRAFT, PLAIN),
          (DRAFT, MLX_LM_DRAFT), (PLAIN, MLX_LM), (NO_LOOKUP, PLAIN), (NO_LOOKUP, MLX_LM),
          (SPEC, NO_LOOKUP))


def summarise(runs: list[Run]) -> dict[str, Any]:
    """A side's figures at one concurrency over its runs: aggregate tok/s (median, and each
    run's), per-stream tok/s, TTFT and ITL quantiles over every stream, and (ours) what its
    usage chunks and verify counters say; None where a server does not report it."""
    streams = [s for r in runs for s in r.wave.streams]
    ttft = quantiles([s.ttft_s for s in streams])
    itl = quantiles([g for s in streams for g in s.gaps])
    out: dict[str, Any] = {
        "tok_s": statistics.median(r.wave.tok_s for r in runs),
        "runs_tok_s": [r.wave.tok_s for r in runs],
        "stream_tok_s": statistics.median(s.tok_s for s in streams),
        "ttft_p50_ms": 1e3 * ttft[0], "ttft_p90_ms": 1e3 * ttft[1],
        "itl_p50_ms": 1e3 * itl[0], "itl_p90_ms": 1e3 * itl[1],
        "tokens_per_stream": statistics.mean(s.tokens for s in streams),
        "rounds_per_pass": None, "tokens_per_pass": None, "drafted_per_pass": None,
        "acceptance": None,
    }
    timings = [s.timings for s in streams if s.timings]
    if len(timings) == len(streams):  # ours: every stream's last chunk carried its timings
        passes = sum(t["target_passes"] for t in timings)
        drafted = sum(t.get("draft_n", 0) for t in timings)
        out["tokens_per_pass"] = sum(t["predicted_n"] for t in timings) / max(passes, 1)
        out["drafted_per_pass"] = drafted / max(passes, 1)
        if drafted:
            out["acceptance"] = sum(t.get("draft_n_accepted", 0) for t in timings) / drafted
    verified = [r for r in runs if r.passes]
    if verified:
        out["rounds_per_pass"] = (sum(r.rounds or 0 for r in verified)
                                  / sum(r.passes or 0 for r in verified))
    return out


def texts_of(runs: list[list[tuple[Run, Run]]], sides: list[Side]
             ) -> dict[str, list[tuple[int, str]]]:
    """Each side's (prompt, text) per stream of its first run in each pair."""
    return {s.key: [(i, "".join(st.text)) for pair in runs
                    for i, st in zip(pair[n][0].prompts, pair[n][0].wave.streams, strict=True)]
            for n, s in enumerate(sides)}


def solo_texts(engine: Engine, prompts: list[str], max_tokens: int) -> list[str]:
    """Each prompt's greedy text through `generate` on `engine`, alone (the reference: the
    target's own tokens); its server's engine thread idles meanwhile."""
    out = []
    for prompt in prompts:
        stream = engine.conversation().generate(engine.tokenizer.encode(prompt),
                                                max_tokens=max_tokens)
        out.append("".join(e.text for e in stream if isinstance(e, TokenEvent)))
    return out


def greedy_check(levels: dict[str, Any], reference: list[str]) -> dict[str, Any]:
    """Greedy streams' texts against the target's own on the same prompt (`solo_texts`): how
    many agree, which differ; leading whitespace aside (mlx-lm's detokenizer drops the first
    token's leading space, the same tokens otherwise). The texts are dropped from `levels`."""
    differ, total = [], 0
    for c, level in levels.items():
        for key, texts in level.pop("texts").items():
            total += len(texts)
            differ += sorted({f"{key} at {c} streams, prompt {i}" for i, text in texts
                              if text.lstrip() != reference[i].lstrip()})
    return {"streams": total, "differ": differ}


def compare_http(side: Side, engine: Engine, prompts: list[str], serve: ServeConfig, log: Log
                 ) -> dict[str, Any]:
    """One stream served over HTTP ÷ the same turn through `generate` on the same engine (the
    server's engine thread idles meanwhile), in mirrored pairs, pair i on prompt i: tok/s
    after the first token (the bench's definition) and TTFT."""
    def served(prompt: str) -> Any:
        return run_wave(side.url, [prompt], serve.max_tokens, serve.timeout_s).streams[0]

    def direct(prompt: str) -> Any:  # the server encodes a prompt string just so
        stream = engine.conversation().generate(engine.tokenizer.encode(prompt),
                                                max_tokens=serve.max_tokens)
        return timed(stream, lambda e: isinstance(e, TokenEvent))[1]

    runs = []
    for pair in range(serve.overhead_pairs):
        prompt = prompts[pair % len(prompts)]
        runs += mirrored([lambda p=prompt: served(p), lambda p=prompt: direct(p)], 1)
    tok_s = pair_ratios(runs, 0, 1, attrgetter("tok_s"))
    ttft = pair_ratios(runs, 0, 1, attrgetter("ttft_s"))
    sides = {name: [t for p in runs for t in p[i]] for i, name in enumerate(("served", "direct"))}
    log(f"-- one stream, {side.name}: served ÷ generate tok/s {tok_s['median']:.3f} (pairs: "
        + ", ".join(f"{r:.3f}" for r in tok_s["pairs"]) + f"), TTFT {ttft['median']:.3f}")
    return {"name": side.name, "tok_s": tok_s, "ttft": ttft,
            **{f"{name}_tok_s": statistics.median(t.tok_s for t in ts)
               for name, ts in sides.items()},
            **{f"{name}_ttft_ms": 1e3 * statistics.median(t.ttft_s for t in ts)
               for name, ts in sides.items()}}


def goals(levels: dict[str, Any], overhead: dict[str, Any], mlx_lm: dict[str, str]
          ) -> list[dict[str, Any]]:
    """The issue's goals against this run's pair medians (a goal whose streams were not run
    is left out): met or not."""
    out = []
    for c, level in levels.items():
        p = level["ratios"][f"{SPEC} ÷ {PLAIN}"]["pairs"]
        out.append(goal(f"(a) ÷ max((a), (b)) at {c} stream(s)", [min(1.0, r) for r in p],
                        0.97))
    for c in ("1", "2"):
        if c in levels:
            out.append(goal(f"(a) ÷ (b) at {c} stream(s)",
                            levels[c]["ratios"][f"{SPEC} ÷ {PLAIN}"]["pairs"], 1.3))
    if "4" in levels and mlx_lm:
        best = max(mlx_lm, key=lambda k: levels["4"]["sides"][k]["tok_s"])
        out.append(goal(f"(a) ÷ mlx-lm's best at 4 streams ({mlx_lm[best]})",
                        levels["4"]["ratios"][f"{SPEC} ÷ {best}"]["pairs"], 1.3))
        if f"{NO_LOOKUP} ÷ {best}" in levels["4"]["ratios"]:
            out.append(goal(f"(a) with --no-lookup ÷ mlx-lm's best at 4 streams "
                            f"({mlx_lm[best]})",
                            levels["4"]["ratios"][f"{NO_LOOKUP} ÷ {best}"]["pairs"], 1.3))
    out.append(goal("(a) served ÷ generate, tok/s at 1 stream", overhead[SPEC]["tok_s"]["pairs"],
                    0.95))
    return out


def goal(name: str, pairs: list[float], bar: float) -> dict[str, Any]:
    median = statistics.median(pairs)
    return {"goal": name, "median": median, "pairs": pairs, "bar": bar, "met": median >= bar}
