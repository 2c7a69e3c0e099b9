"""The full benchmark (`python -m benchmarks`): every decoder side by side, in one process, on
the same prompts.

The target is the bundled demo target widened (function-preserving, see widen.py) into a
memory-bound f32 model of ~110M parameters, so acceptance is real (trained drafters) and the
verify cost behaves as on a Mac. A 4-bit copy adds the compute-bound case. Rows: ours
target-only, mlx-lm generate_step, mlx-lm speculative_generate_step, ours draft-model / MTP /
n-gram / adaptive, at T = 0, T = 1 and T = 0.7 with top-p 0.9; and a conversation's first turn
with `auto` before anything is calibrated (`compare_first_turn`). Results: docs/BENCH.md,
docs/bench.json, docs/bench.png. Timings are measured here and never asserted by tests.

This file says which rows are run and what they are compared with; runners.py measures a row,
report.py writes the results.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlx_spec.drafters import DraftModelDrafter, NgramDrafter
from mlx_spec.engine.costs import LONGEST_TIMED_PASS, as_run
from mlx_spec.train.corpus import long_prompt, prompts_from_corpus

from .coupling import bench_coupling
from .demo import bench_demo
from .distributed import bench_distributed
from .first_turn_report import write_first_turn
from .hybrid import TARGET as HYBRID_TARGET
from .hybrid import build_hybrid, hybrid_rows
from .parity import (
    abba,
    auto_parity,
    describe,
    first_turn_parity,
    speedup_parity,
    target_only_parity,
)
from .published import published_rows
from .report import write_outputs, write_published
from .runners import (
    QUICK,
    BenchConfig,
    BenchModels,
    Row,
    Runner,
    efficiency,
    load_bench_models,
    load_demo,
    load_demo_tokenizer,
    machine,
    new_engine,
    row_dicts,
    timed_calibration,
    verify_costs,
)
from .serve import bench_serve
from .soak import bench_soak
from .tables import cell
from .vocab import vocabulary_cost
from .widen import parameter_count, quantized

Log = Callable[[str], None]
GREEDY_TARGETS = ("f32", "f32-hybrid", "f32-gemma4", "f32-eagle3")  # rows that must agree


def bench(cfg: BenchConfig, out: Path, log: Log = print) -> dict[str, Any]:
    """Run every row group, write BENCH.md / bench.json / bench.png to `out`, return the result."""
    started = time.perf_counter()
    models = load_bench_models(cfg)
    n_params = parameter_count(models.wide.model)
    log(f"target: demo widened to {n_params / 1e6:.0f}M params f32 "
        f"({cfg.hidden}x{cfg.layers}, ffn {cfg.ffn})")
    run = Runner(models.tokenizer, prompts_from_corpus(models.tokenizer, cfg.prompts),
                 cfg.max_tokens)
    raw = verify_costs(models.wide, max(LONGEST_TIMED_PASS - 1, cfg.draft_length))
    costs = as_run(raw)
    log(f"verify cost, q=1..{len(raw)} tokens (×1 token), as run: "
        + " ".join(f"{c / costs[0]:.2f}" for c in costs)
        + "; fastest timings: " + " ".join(f"{1e3 * c:.1f}" for c in raw) + " ms")

    rows: list[Row] = []
    parity: dict[str, dict] = {}  # ABBA medians: what single rows are too noisy to settle
    for temp, top_p in cfg.temperatures:
        group, ratios = compare_at(cfg, run, models, temp, top_p, log)
        rows += group
        parity |= ratios
    if cfg.quantized_rows:
        rows += compare_quantized(cfg, run, models, log)
    group, ratios = compare_demo(cfg, run, log)
    rows += group
    parity |= ratios
    for length in cfg.long_context:
        rows += compare_long_prompt(cfg, run, models, length, log)
    for name, p in parity.items():
        log(f"{name}, median of ABBA pairs: {describe(p)}")
    for r in rows:
        if r.engine == "mlx-spec" and r.drafter != "none" and r.target == "f32":
            r.efficiency = efficiency(r, costs)

    hybrid = None
    if cfg.hybrid_rows:
        group, hybrid = hybrid_rows(cfg, run, log)
        rows += group
    published = None
    if cfg.published_rows:
        group, published = published_rows(cfg, run, log)
        rows += group

    first_turn = compare_first_turn(cfg, run, models, log) if cfg.first_turn else None

    mismatched = greedy_mismatches(rows, GREEDY_TARGETS)
    vocabulary = vocabulary_cost()
    log(f"sampler at V={vocabulary['vocab']}: {vocabulary['ms']:.2f} ms for p and q of a k=4 "
        f"round, ×{vocabulary['ratio']:.2f} the softmax of the same rows")
    result = {
        "machine": machine(),
        "vocabulary": vocabulary,
        "target": {"params": n_params, "hidden": cfg.hidden, "layers": cfg.layers,
                   "dtype": "float32", "verify_cost_ratio": [c / costs[0] for c in costs],
                   "verify_cost_ms": [1e3 * c for c in raw]},
        "auto_vs_best_fixed": auto_vs_best_fixed(rows),
        "config": asdict(cfg),
        "greedy_identical": not mismatched,
        "greedy_mismatched_rows": mismatched,
        "minutes": (time.perf_counter() - started) / 60,
        "parity": parity,
        "hybrid": hybrid,
        "published": published,
        "first_turn": first_turn,
        "rows": row_dicts(rows),
    }
    write_outputs(result, out)
    log(f"greedy rows identical: {not mismatched}" + (f" (differ: {mismatched})"
                                                       if mismatched else ""))
    return result


def compare_at(cfg: BenchConfig, run: Runner, models: BenchModels, temp: float, top_p: float,
               log: Log) -> tuple[list[Row], dict[str, dict]]:
    """Every decoder on the wide target at one temperature (and top-p), and the ratios its
    single rows cannot settle."""
    tag = f"T={temp:g}" + (f" top-p {top_p:g}" if top_p < 1 else "")
    log(f"-- {tag}")
    wide, k = models.wide, cfg.draft_length
    group = [run.ours(wide, None, 1, f"target-only {tag}", "none", "f32", temp, top_p)]
    parity = {}
    if top_p == 1.0:
        group.append(run.mlx_lm(wide, f"mlx-lm generate_step T={temp:g}", "f32", temp))
        # target-only costs the same on any prompt: one, twice the pairs
        parity[f"target-only ÷ mlx-lm generate_step {tag}"] = target_only_parity(
            run, wide, "f32", temp, 2 * cfg.parity_pairs, prompts=run.prompts[:1])
        group.append(run.mlx_lm(wide, f"mlx-lm speculative k={k} {tag}", "f32", temp,
                                draft=models.draft, k=k, top_p=top_p))
        group.append(run.ours(wide, DraftModelDrafter(models.draft, wide), k,
                              f"ours draft k={k} {tag}", "draft", "f32", temp, top_p))
    group += measure_drafters(run, models, k, tag, temp, top_p)
    if top_p == 1.0:
        group += measure_twin(run, models, k, tag, temp)
    if temp == 0.0:
        group += sweep_draft_length(run, models, cfg.sweep, k, tag, top_p)
    else:
        group += sweep_sampled(run, models, k, tag, temp, top_p)
    parity |= compare_auto(run, models, group, temp, top_p, cfg.parity_pairs)
    if top_p == 1.0:  # the MTP head's speedup, which a row reads off one target-only run
        parity[f"ours mtp auto {tag} ÷ target-only {tag}"] = speedup_parity(
            run, wide, models.mtp_on, "f32", temp, top_p, cfg.parity_pairs)
    mlx_lm_base = next((r.tok_s for r in group if r.name.startswith("mlx-lm generate")), None)
    base = group[0].tok_s
    for r in group:
        r.speedup_vs_target = r.tok_s / base if base else 0.0
        r.speedup_vs_mlx_lm = r.tok_s / mlx_lm_base if mlx_lm_base else None
        log(f"{r.name:<36} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}  "
            f"{cell(r.tokens_per_pass, '.2f')} tok/pass  "
            f"acc {cell(r.acceptance_rate, '.0%')}")
    return group, parity


def measure_drafters(run: Runner, models: BenchModels, k: int, tag: str, temp: float,
                     top_p: float) -> list[Row]:
    """The MTP head and the n-gram drafter at k, the MTP head with `auto`, and the MTP head
    behind prompt lookup (--lookup) at k and with `auto`."""
    wide = models.wide
    return [run.ours(wide, models.mtp_on(), k, f"ours mtp k={k} {tag}", "mtp", "f32", temp,
                     top_p),
            run.ours(wide, NgramDrafter(), k, f"ours ngram k={k} {tag}", "ngram", "f32", temp,
                     top_p),
            run.ours(wide, models.mtp_on(), "auto", f"ours mtp auto {tag}", "mtp", "f32", temp,
                     top_p),
            run.ours(wide, models.lookup_on(), k, f"ours mtp+lookup k={k} {tag}", "mtp+lookup",
                     "f32", temp, top_p),
            run.ours(wide, models.lookup_on(), "auto", f"ours mtp+lookup auto {tag}",
                     "mtp+lookup", "f32", temp, top_p)]


def measure_twin(run: Runner, models: BenchModels, k: int, tag: str, temp: float) -> list[Row]:
    """A perfect drafter, the target's own unwidened twin, at k and with `auto`."""
    return [run.ours(models.wide, DraftModelDrafter(models.small, models.wide), kk,
                     f"ours twin draft {'k=' + str(kk) if kk != 'auto' else 'auto'} {tag}",
                     "draft (twin)", "f32", temp, 1.0)
            for kk in (k, "auto")]


def sweep_draft_length(run: Runner, models: BenchModels, sweep: tuple[int, ...], k: int,
                       tag: str, top_p: float) -> list[Row]:
    """The MTP head and the draft model at every other draft length of the sweep, greedy."""
    rows = []
    for kk in sweep:
        if kk == k:
            continue
        rows.append(run.ours(models.wide, models.mtp_on(), kk, f"ours mtp k={kk} {tag}", "mtp",
                             "f32", 0.0, top_p))
        rows.append(run.ours(models.wide, DraftModelDrafter(models.draft, models.wide), kk,
                             f"ours draft k={kk} {tag}", "draft", "f32", 0.0, top_p))
        if kk == max(sweep):  # a copy is as cheap at any depth: the deepest
            rows.append(run.ours(models.wide, models.lookup_on(), kk,
                                 f"ours mtp+lookup k={kk} {tag}", "mtp+lookup", "f32", 0.0,
                                 top_p))
    return rows


def sweep_sampled(run: Runner, models: BenchModels, k: int, tag: str, temp: float,
                  top_p: float) -> list[Row]:
    """Sampled, acceptance decays faster with depth and the best fixed k is shallower than the
    table's k: the MTP head, alone and behind lookup, at k = 2 and 3 too, so each auto row is
    compared with its drafter's best fixed k (compare_auto), not with k alone."""
    return [run.ours(models.wide, make(), kk, f"ours {name} k={kk} {tag}", name, "f32", temp,
                     top_p)
            for name, make in (("mtp", models.mtp_on), ("mtp+lookup", models.lookup_on))
            for kk in (2, 3) if kk != k]


def compare_auto(run: Runner, models: BenchModels, group: list[Row], temp: float, top_p: float,
                 pairs: int) -> dict[str, dict]:
    """Each auto row ÷ the best fixed k of its drafter, in ABBA pairs on the rows' prompts in
    order (the table's single runs vary too much to settle a few per cent either way); at
    T > 0 each pair samples with seeds of its own, the same on both sides (auto_parity)."""
    makers = {"mtp": models.mtp_on, "mtp+lookup": models.lookup_on,
              "draft (twin)": lambda: DraftModelDrafter(models.small, models.wide)}
    parity = {}
    for auto in [r for r in group if r.draft_length == "auto" and r.drafter in makers]:
        fixed = [r for r in group if r.drafter == auto.drafter
                 and r.engine == "mlx-spec" and isinstance(r.draft_length, int)]
        best = max(fixed, key=lambda r: r.tok_s)
        parity[f"{auto.name} ÷ {best.name}"] = auto_parity(
            run, models.wide, makers[auto.drafter], best.draft_length, "f32", temp, top_p, pairs)
    return parity


def compare_quantized(cfg: BenchConfig, run: Runner, models: BenchModels, log: Log
                      ) -> list[Row]:
    """A 4-bit copy of the wide target (compute-bound on this CPU): target-only, MTP k, auto."""
    log("-- 4-bit target (compute-bound on this CPU)")
    q4 = quantized(models.wide, models.wide_config, bits=4)
    k = cfg.draft_length
    group = [run.ours(q4, None, 1, "4-bit target-only T=0", "none", "4bit", 0.0),
             run.ours(q4, models.mtp_on(q4), k, f"4-bit ours mtp k={k} T=0", "mtp", "4bit", 0.0),
             run.ours(q4, models.mtp_on(q4), "auto", "4-bit ours mtp auto T=0", "mtp", "4bit",
                      0.0)]
    against_first(group)
    log_speedups(group, log)
    return group


def compare_demo(cfg: BenchConfig, run: Runner, log: Log) -> tuple[list[Row], dict[str, dict]]:
    """The bundled demo target as the app opens it here (assets.demo_variant): target-only and
    MTP auto, and their ratio in ABBA pairs (the demo group, demo.py, has more)."""
    demo, demo_mtp = load_demo()
    tag = "demo q8" if demo.cast is None else f"demo {demo.cast.replace('float', 'f')}"
    kind = "8bit" if demo.cast is None else "demo-f32"
    log(f"-- the bundled demo target, as the app opens it here: {demo.name}")
    group = [run.ours(demo, None, 1, f"{tag} target-only T=0", "none", kind, 0.0),
             run.ours(demo, demo_mtp, "auto", f"{tag} mtp auto T=0", "mtp", kind, 0.0)]
    against_first(group)
    log_speedups(group, log)
    ratio = abba(lambda: run.ours(demo, demo_mtp, "auto", "parity", "mtp", kind, 0.0).tok_s,
                 lambda: run.ours(demo, None, 1, "parity", "none", kind, 0.0).tok_s,
                 2 * cfg.parity_pairs)
    return group, {f"{tag} mtp auto ÷ {tag} target-only T=0": ratio}


def compare_long_prompt(cfg: BenchConfig, run: Runner, models: BenchModels, length: int,
                        log: Log) -> list[Row]:
    """Target-only, MTP k and MTP auto after one `length`-token prompt, greedy."""
    log(f"-- a {length}-token prompt")
    on = [long_prompt(run.tokenizer, length)]
    wide, k, name = models.wide, cfg.draft_length, f"{length}-token prompt"
    group = [run.ours(wide, None, 1, f"{name} target-only T=0", "none", "f32", 0.0, prompts=on),
             run.ours(wide, models.mtp_on(), k, f"{name} ours mtp k={k} T=0", "mtp", "f32", 0.0,
                      prompts=on),
             run.ours(wide, models.mtp_on(), "auto", f"{name} ours mtp auto T=0", "mtp", "f32",
                      0.0, prompts=on)]
    against_first(group)
    for r in group:
        log(f"{r.name:<40} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}  "
            f"ITL p50/p90 {r.itl_p50_ms:.0f}/{r.itl_p90_ms:.0f} ms")
    return group


def against_first(group: list[Row]) -> None:
    """Set each row's speedup against the group's first row (its target-only)."""
    base = group[0].tok_s
    for r in group:
        r.speedup_vs_target = r.tok_s / base if base else 0.0


def log_speedups(group: list[Row], log: Log) -> None:
    for r in group:
        log(f"{r.name:<36} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}")


def greedy_mismatches(rows: list[Row], targets: tuple[str, ...]) -> list[str]:
    """Names of the greedy rows whose tokens differ from the first greedy row of their target
    (long-prompt rows, on prompts of their own, are left out)."""
    mismatched = []
    for target in targets:
        greedy = [r for r in rows if r.temperature == 0 and r.target == target
                  and "-token prompt" not in r.name]
        mismatched += [r.name for r in greedy if r.tokens != greedy[0].tokens]
    return mismatched


def auto_vs_best_fixed(rows: list[Row]) -> list[dict[str, Any]]:
    """Each auto row ÷ the fastest fixed-k row of the same drafter, target, temperature and
    prompts (a long-prompt row against its own prompt's rows)."""
    def prompts(r: Row) -> str:
        return r.name.split("-token prompt")[0] if "-token prompt" in r.name else ""

    out = []
    for auto in (r for r in rows if r.draft_length == "auto" and r.engine == "mlx-spec"):
        fixed = [r for r in rows if r.engine == "mlx-spec" and r.drafter == auto.drafter
                 and r.target == auto.target and r.temperature == auto.temperature
                 and r.top_p == auto.top_p and isinstance(r.draft_length, int)
                 and prompts(r) == prompts(auto)]
        if fixed:
            best = max(fixed, key=lambda r: r.tok_s)
            out.append({"auto": auto.name, "best": best.name, "ratio": auto.tok_s / best.tok_s})
    return out


def bench_published(cfg: BenchConfig, out: Path, log: Log = print) -> dict[str, Any]:
    """`python -m benchmarks --group published`: only the Gemma 4 assistant and EAGLE-3 rows, each
    against its own target-only row in the same run; written to BENCH-drafters.md / .json."""
    tokenizer = load_demo_tokenizer()
    run = Runner(tokenizer, prompts_from_corpus(tokenizer, cfg.prompts), cfg.max_tokens)
    group, info = published_rows(cfg, run, log)
    greedy: dict[str, list[Row]] = {}
    for r in group:
        if r.temperature == 0:
            greedy.setdefault(r.target, []).append(r)
    mismatched = [r.name for rs in greedy.values() for r in rs if r.tokens != rs[0].tokens]
    result = {"machine": machine(), "config": asdict(cfg), "published": info,
              "greedy_identical": not mismatched, "greedy_mismatched_rows": mismatched,
              "rows": row_dicts(group)}
    write_published(result, cfg.prompts, cfg.max_tokens, out)
    return result


def compare_first_turn(cfg: BenchConfig, run: Runner, models: BenchModels, log: Log
                       ) -> dict[str, Any]:
    """A conversation's first turn on the wide target and on the hybrid one (hybrid.py's pair),
    each with its MTP head, at each of cfg.first_turn_temperatures: `auto` on a fresh engine
    against a fixed k (TTFT) and against `auto` with costs known (tok/s), in cfg.parity_pairs
    mirrored pairs; and the seconds one calibration takes on each target."""
    _, hybrid, hybrid_mtp = build_hybrid(cfg.hidden, cfg.layers, cfg.ffn, cfg.hybrid_noise)
    targets = {"f32": (models.wide, models.mtp_on()), HYBRID_TARGET: (hybrid, hybrid_mtp)}
    info: dict[str, Any] = {"pairs": cfg.parity_pairs, "draft_length": cfg.draft_length,
                            "max_tokens": cfg.max_tokens, "targets": {}}
    for name, (target, mtp) in targets.items():
        known = new_engine(target, run.tokenizer, mtp, "auto")
        seconds = timed_calibration(known)
        log(f"-- first turn on {name}: one calibration takes {seconds:.1f} s")
        ratios = {}
        for temp in cfg.first_turn_temperatures:
            p = first_turn_parity(run, target, mtp, cfg.draft_length, known, temp,
                                  cfg.parity_pairs)
            log(f"T={temp:g}: TTFT prior ÷ k={cfg.draft_length} "
                f"{describe(p['ttft_prior_vs_fixed'])}"
                f"; tok/s prior ÷ known {describe(p['tok_s_prior_vs_known'])}")
            ratios[f"T={temp:g}"] = p
        info["targets"][name] = {"params": parameter_count(target.model),
                                 "calibration_s": seconds, "temperatures": ratios}
    return info


def bench_first_turn(cfg: BenchConfig, out: Path, log: Log = print) -> dict[str, Any]:
    """`python -m benchmarks --group first-turn`: only the first-turn group; written to
    BENCH-first-turn.md / bench-first-turn.json."""
    started = time.perf_counter()
    models = load_bench_models(cfg)
    run = Runner(models.tokenizer, prompts_from_corpus(models.tokenizer, cfg.prompts),
                 cfg.max_tokens)
    info = compare_first_turn(cfg, run, models, log)
    result = {"machine": machine(), "config": asdict(cfg), "first_turn": info,
              "minutes": (time.perf_counter() - started) / 60}
    write_first_turn(result, out)
    return result


def _real(cfg: BenchConfig, out: Path, log) -> dict:
    from .real import REAL, REAL_QUICK, bench_real

    return bench_real(REAL_QUICK if cfg is QUICK else REAL, out, log)


def _smollm2(cfg: BenchConfig, out: Path, log) -> dict:
    from .smollm2 import SMOLLM2, SMOLLM2_QUICK, bench_smollm2

    return bench_smollm2(SMOLLM2_QUICK if cfg is QUICK else SMOLLM2, out, log)


def _trace(cfg: BenchConfig, out: Path, log) -> dict:
    from .trace import TRACE, TRACE_QUICK, bench_trace

    return bench_trace(TRACE_QUICK if cfg is QUICK else TRACE, out, log)


GROUPS = {"all": bench, "published": bench_published, "first-turn": bench_first_turn,
          "serve": bench_serve, "distributed": bench_distributed, "demo": bench_demo,
          "real": _real, "smollm2": _smollm2, "coupling": bench_coupling, "soak": bench_soak,
          "trace": _trace}
