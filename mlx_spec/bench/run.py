"""`mlx-spec bench`: every decoder side by side, in one process, on the same prompts.

The target is the bundled demo target widened (function-preserving, see widen.py) into a
memory-bound f32 model of ~110M parameters, so acceptance is real (trained drafters) and the
verify cost behaves as on a Mac. A 4-bit copy adds the compute-bound case. Rows: ours
target-only, mlx-lm generate_step, mlx-lm speculative_generate_step, ours draft-model / MTP /
n-gram / adaptive, at T = 0, T = 1 and T = 0.7 with top-p 0.9. Results: docs/BENCH.md,
docs/bench.json, docs/bench.png. Timings are measured here and never asserted by tests.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..adaptive import measure_verify_costs, smooth_linear
from ..assets import DEMO_DRAFT, DEMO_TARGET_F32, demo_model
from ..drafters import DraftModelDrafter, NgramDrafter
from ..drafters.mtp import load_mtp_drafter
from ..engine import Engine
from ..events import TokenEvent, TurnEnd
from ..loading import find_mtp_head, load_target
from ..model import TargetModel
from ..sampling import SamplingConfig
from ..stats import Totals, quantiles
from ..train.corpus import long_prompt, prompts_from_corpus
from .parity import abba, describe
from .widen import parameter_count, quantized, widen_mtp, widen_target


@dataclass(frozen=True)
class BenchConfig:
    hidden: int = 1024
    layers: int = 12
    ffn: int = 2816
    prompts: int = 3
    max_tokens: int = 96
    num_draft: int = 4
    sweep: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    temperatures: tuple[tuple[float, float], ...] = ((0.0, 1.0), (1.0, 1.0), (0.7, 0.9))
    quantized_rows: bool = True
    hybrid_rows: bool = True
    hybrid_noise: float = 0.06  # the hybrid target's damped layers (bench/hybrid.py)
    published_rows: bool = True  # Gemma 4 assistant and EAGLE-3 pairs (bench/published.py)
    long_context: tuple[int, ...] = (1024, 3800)  # prompt lengths of the long-context rows
    parity_pairs: int = 8  # ABBA pairs behind each ratio single rows cannot settle (±~3% at 5)


QUICK = BenchConfig(prompts=1, max_tokens=48, sweep=(2, 4), temperatures=((0.0, 1.0), (1.0, 1.0)),
                    long_context=(1024,), parity_pairs=1)


@dataclass
class Row:
    name: str
    drafter: str
    engine: str  # "mlx-spec" | "mlx-lm"
    target: str
    temperature: float
    top_p: float
    num_draft: int | str
    tok_s: float = 0.0
    speedup_vs_target: float = 0.0
    speedup_vs_mlx_lm: float | None = None  # ÷ mlx-lm generate_step at the same temperature
    # None where the engine does not report it (mlx-lm): printed "–", never a default
    tokens_per_pass: float | None = None
    acceptance_rate: float | None = None
    per_position_acceptance: list[float] = field(default_factory=list)
    draft_share: float | None = None
    verify_share: float | None = None
    ttft_s: float | None = None
    itl_p50_ms: float | None = None
    itl_p90_ms: float | None = None
    peak_memory_mb: float = 0.0
    efficiency: float | None = None
    mean_draft: float = 0.0  # drafted tokens per target pass
    draft_s_per_pass: float = 0.0
    verify_ms_per_pass: float = 0.0
    commit_ms_per_pass: float | None = None  # cutting caches back (recurrent: the rollback)
    tokens: list[list[int]] = field(default_factory=list)


@dataclass
class Timing:
    """A token stream as every engine is timed: when it started, when each token arrived."""

    start: float
    arrivals: list[float]

    @property
    def tok_s(self) -> float:
        """(tokens − 1) / (time of last token − time of first token)."""
        a = self.arrivals
        return (len(a) - 1) / (a[-1] - a[0]) if len(a) > 1 and a[-1] > a[0] else 0.0

    @property
    def ttft_s(self) -> float:
        return self.arrivals[0] - self.start if self.arrivals else 0.0

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


def timed(stream: Iterable[Any], is_token: Callable[[Any], bool]) -> tuple[list[Any], Timing]:
    """Consume a token stream; return its items and their Timing."""
    items, timing = [], Timing(time.perf_counter(), [])
    for item in stream:
        items.append(item)
        if is_token(item):
            timing.arrivals.append(time.perf_counter())
    return items, timing


def itl_ms(gaps: list[float]) -> tuple[float, float]:
    p50, p90, _ = quantiles(gaps)
    return 1e3 * p50, 1e3 * p90


def run_ours(engine: Engine, prompts: list[list[int]], max_tokens: int, sampling: SamplingConfig,
             row: Row) -> Row:
    rates, stats, gaps = [], [], []
    for i, ids in enumerate(prompts):
        engine.reset()
        cfg = SamplingConfig(**{**asdict(sampling), "seed": i})
        items, timing = timed(engine.generate(ids, max_tokens=max_tokens, sampling=cfg,
                                              ignore_eos=True),  # fixed-length rows
                              lambda e: isinstance(e, TokenEvent))
        end = items[-1]
        assert isinstance(end, TurnEnd)
        rates.append(timing.tok_s)
        gaps += timing.gaps
        stats.append(end.stats)
        row.tokens.append(list(end.tokens))
    row.tok_s = sum(rates) / len(rates)
    row.itl_p50_ms, row.itl_p90_ms = itl_ms(gaps)
    t = Totals.from_turns(stats)
    passes = max(t.passes, 1)
    row.tokens_per_pass = t.tokens_per_pass
    row.acceptance_rate = t.acceptance_rate
    row.per_position_acceptance = [rate for _, rate, _ in t.per_position()]
    row.draft_share = t.draft_s / t.seconds
    row.verify_share = t.verify_s / t.seconds
    row.ttft_s = sum(s.ttft_s for s in stats) / len(stats)
    row.peak_memory_mb = max(s.peak_memory for s in stats) / 2**20
    row.draft_s_per_pass = t.draft_s / passes
    row.verify_ms_per_pass = 1e3 * t.verify_s / passes
    row.commit_ms_per_pass = 1e3 * t.commit_s / passes
    row.mean_draft = t.drafted / passes
    return row


def run_mlx_lm(target: TargetModel, draft: TargetModel | None, prompts: list[list[int]],
               max_tokens: int, temperature: float, top_p: float, k: int, row: Row) -> Row:
    from mlx_lm.generate import generate_step, speculative_generate_step
    from mlx_lm.sample_utils import make_sampler

    rates, from_draft, total, gaps, ttfts = [], 0, 0, [], []
    for i, ids in enumerate(prompts):
        mx.random.seed(i)
        sampler = make_sampler(temp=temperature, top_p=top_p if top_p < 1 else 0.0)
        prompt = mx.array(ids)
        if draft is None:
            stream: Iterator = generate_step(prompt, target.model, max_tokens=max_tokens,
                                             sampler=sampler)
        else:
            stream = speculative_generate_step(prompt, target.model, draft.model,
                                               num_draft_tokens=k, max_tokens=max_tokens,
                                               sampler=sampler)
        mx.reset_peak_memory()
        items, timing = timed(stream, lambda _: True)
        rates.append(timing.tok_s)
        gaps += timing.gaps
        ttfts.append(timing.ttft_s)
        row.tokens.append([int(it[0]) for it in items])
        if draft is not None:
            from_draft += sum(bool(it[2]) for it in items)
            total += len(items)
        row.peak_memory_mb = max(row.peak_memory_mb, mx.get_peak_memory() / 2**20)
    row.tok_s = sum(rates) / len(rates)
    row.ttft_s = sum(ttfts) / len(ttfts)
    row.itl_p50_ms, row.itl_p90_ms = itl_ms(gaps)
    if draft is None:
        row.tokens_per_pass = 1.0  # one forward per token, by construction
    elif total:
        # each target pass yields its accepted drafts (from_draft) and one token of its own
        row.acceptance_rate = from_draft / total  # share of tokens that came from the draft
        row.tokens_per_pass = total / max(total - from_draft, 1)
    return row


def load_bench_models(cfg: BenchConfig):
    small, tokenizer = load_target(demo_model(DEMO_TARGET_F32))
    small.model.set_dtype(mx.float32)
    config = json.loads((demo_model(DEMO_TARGET_F32) / "config.json").read_text())
    wide, wide_cfg = widen_target(small, config, hidden=cfg.hidden, layers=cfg.layers,
                                  ffn=cfg.ffn)
    mtp_small = load_mtp_drafter(find_mtp_head(demo_model(DEMO_TARGET_F32)), small)
    draft, _ = load_target(demo_model(DEMO_DRAFT))
    draft.model.set_dtype(mx.float32)
    return small, wide, wide_cfg, config, mtp_small, draft, tokenizer


def bench(cfg: BenchConfig, out: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    started = time.perf_counter()
    small, wide, wide_cfg, config, mtp_small, draft, tok = load_bench_models(cfg)
    n_params = parameter_count(wide.model)
    log(f"target: demo widened to {n_params / 1e6:.0f}M params f32 "
        f"({cfg.hidden}x{cfg.layers}, ffn {cfg.ffn})")
    prompts = prompts_from_corpus(tok, cfg.prompts)
    raw = measure_verify_costs(wide, max(8, cfg.num_draft), smooth=False)
    costs = smooth_linear(raw)
    log("verify cost, q=1..9 tokens (×1 token), line fit: "
        + " ".join(f"{c / costs[0]:.2f}" for c in costs)
        + "; fastest timings: " + " ".join(f"{1e3 * c:.1f}" for c in raw) + " ms")
    k = cfg.num_draft

    def mtp():
        return widen_mtp(mtp_small, wide, small_layers=config["num_hidden_layers"])

    def ours(target: TargetModel, drafter, num_draft, name: str, dname: str, tname: str,
             temp: float, top_p: float, on: list[list[int]] | None = None) -> Row:
        engine = Engine(target, tok, drafter, num_draft=num_draft)
        list(engine.generate(prompts[0][:8], max_tokens=4))  # warm-up
        row = Row(name, dname, "mlx-spec", tname, temp, top_p, num_draft)
        return run_ours(engine, on or prompts, cfg.max_tokens,
                        SamplingConfig(temperature=temp, top_p=top_p), row)

    def mlx_lm(target: TargetModel, temp: float, on: list[list[int]] | None = None) -> Row:
        return run_mlx_lm(target, None, on or prompts, cfg.max_tokens, temp, 1.0, 0,
                          Row(f"mlx-lm generate_step T={temp:g}", "none", "mlx-lm", "f32",
                              temp, 1.0, 0))

    parity: dict[str, dict] = {}  # ABBA medians: what single rows are too noisy to settle

    rows: list[Row] = []
    for temp, top_p in cfg.temperatures:
        tag = f"T={temp:g}" + (f" top-p {top_p:g}" if top_p < 1 else "")
        log(f"-- {tag}")
        group = [ours(wide, None, 1, f"target-only {tag}", "none", "f32", temp, top_p)]
        base = group[0].tok_s
        if top_p == 1.0:
            group.append(mlx_lm(wide, temp))
            one = prompts[:1]  # target-only costs the same on any prompt: one, twice the pairs
            parity[f"target-only ÷ mlx-lm generate_step {tag}"] = abba(
                lambda t=temp, o=one: ours(wide, None, 1, "parity", "none", "f32", t, 1.0,
                                           o).tok_s,
                lambda t=temp, o=one: mlx_lm(wide, t, o).tok_s, 2 * cfg.parity_pairs)
            group.append(run_mlx_lm(wide, draft, prompts, cfg.max_tokens, temp, top_p, k,
                                    Row(f"mlx-lm speculative k={k} {tag}", "draft", "mlx-lm",
                                        "f32", temp, top_p, k)))
            group.append(ours(wide, DraftModelDrafter(draft, wide), k, f"ours draft k={k} {tag}",
                              "draft", "f32", temp, top_p))
        group.append(ours(wide, mtp(), k, f"ours mtp k={k} {tag}", "mtp", "f32", temp, top_p))
        group.append(ours(wide, NgramDrafter(), k, f"ours ngram k={k} {tag}", "ngram", "f32",
                          temp, top_p))
        group.append(ours(wide, mtp(), "auto", f"ours mtp auto {tag}", "mtp", "f32", temp,
                          top_p))
        if top_p == 1.0:  # a perfect drafter: the target's own unwidened twin
            for kk in (k, "auto"):
                group.append(ours(wide, DraftModelDrafter(small, wide), kk,
                                  f"ours twin draft {'k=' + str(kk) if kk != 'auto' else 'auto'}"
                                  f" {tag}", "draft (twin)", "f32", temp, top_p))
        if temp == 0.0:
            for kk in cfg.sweep:
                if kk == k:
                    continue
                group.append(ours(wide, mtp(), kk, f"ours mtp k={kk} {tag}", "mtp", "f32",
                                  temp, top_p))
                group.append(ours(wide, DraftModelDrafter(draft, wide), kk,
                                  f"ours draft k={kk} {tag}", "draft", "f32", temp, top_p))
        # auto ÷ the best fixed k of its drafter, in ABBA pairs on the rows' prompts (the
        # table's single runs vary too much to settle a few per cent either way). auto's
        # policy carries over from prompt to prompt as in a conversation, so it is judged on
        # the prompts in order; at T > 0 prompt i is sampled with seed i on both sides
        makers = {"mtp": mtp, "draft (twin)": lambda: DraftModelDrafter(small, wide)}
        for auto in [r for r in group if r.num_draft == "auto" and r.drafter in makers]:
            fixed = [r for r in group if r.drafter == auto.drafter
                     and r.engine == "mlx-spec" and isinstance(r.num_draft, int)]
            best = max(fixed, key=lambda r: r.tok_s)

            def rate(kk, make=makers[auto.drafter], t=temp, p=top_p) -> float:
                return ours(wide, make(), kk, "parity", "", "f32", t, p).tok_s

            parity[f"{auto.name} ÷ {best.name}"] = abba(
                lambda: rate("auto"), lambda b=best.num_draft: rate(b), cfg.parity_pairs)
        mlx_lm_base = next((r.tok_s for r in group if r.name.startswith("mlx-lm generate")),
                           None)
        for r in group:
            r.speedup_vs_target = r.tok_s / base if base else 0.0
            r.speedup_vs_mlx_lm = r.tok_s / mlx_lm_base if mlx_lm_base else None
            log(f"{r.name:<36} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}  "
                f"{_f(r.tokens_per_pass, '.2f')} tok/pass  acc {_f(r.acceptance_rate, '.0%')}")
        rows.extend(group)

    if cfg.quantized_rows:
        log("-- 4-bit target (compute-bound on this CPU)")
        q4 = quantized(wide, wide_cfg, bits=4)
        group = [ours(q4, None, 1, "4-bit target-only T=0", "none", "4bit", 0.0, 1.0),
                 ours(q4, mtp_on(q4, mtp_small, config), k, f"4-bit ours mtp k={k} T=0", "mtp",
                      "4bit", 0.0, 1.0),
                 ours(q4, mtp_on(q4, mtp_small, config), "auto", "4-bit ours mtp auto T=0",
                      "mtp", "4bit", 0.0, 1.0)]
        for r in group:
            r.speedup_vs_target = r.tok_s / group[0].tok_s if group[0].tok_s else 0.0
            log(f"{r.name:<36} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}")
        rows.extend(group)

    log("-- the bundled 8-bit demo target, as the app runs it")
    demo, _ = load_target(demo_model())
    demo_mtp = load_mtp_drafter(find_mtp_head(demo_model(), demo), demo)
    group = [ours(demo, None, 1, "demo q8 target-only T=0", "none", "8bit", 0.0, 1.0),
             ours(demo, demo_mtp, "auto", "demo q8 mtp auto T=0", "mtp", "8bit", 0.0, 1.0)]
    for r in group:
        r.speedup_vs_target = r.tok_s / group[0].tok_s if group[0].tok_s else 0.0
        log(f"{r.name:<36} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}")
    rows.extend(group)
    parity["demo q8 mtp auto ÷ demo q8 target-only T=0"] = abba(
        lambda: ours(demo, demo_mtp, "auto", "parity", "mtp", "8bit", 0.0, 1.0).tok_s,
        lambda: ours(demo, None, 1, "parity", "none", "8bit", 0.0, 1.0).tok_s,
        2 * cfg.parity_pairs)

    for length in cfg.long_context:
        log(f"-- a {length}-token prompt")
        on = [long_prompt(tok, length)]
        group = [ours(wide, None, 1, f"{length}-token prompt target-only T=0", "none", "f32",
                      0.0, 1.0, on),
                 ours(wide, mtp(), k, f"{length}-token prompt ours mtp k={k} T=0", "mtp", "f32",
                      0.0, 1.0, on),
                 ours(wide, mtp(), "auto", f"{length}-token prompt ours mtp auto T=0", "mtp",
                      "f32", 0.0, 1.0, on)]
        for r in group:
            r.speedup_vs_target = r.tok_s / group[0].tok_s if group[0].tok_s else 0.0
            log(f"{r.name:<40} {r.tok_s:7.1f} tok/s  ×{r.speedup_vs_target:.2f}  "
                f"ITL p50/p90 {r.itl_p50_ms:.0f}/{r.itl_p90_ms:.0f} ms")
        rows.extend(group)
    for name, p in parity.items():
        log(f"{name}, median of ABBA pairs: {describe(p)}")

    for r in rows:
        if r.engine == "mlx-spec" and r.drafter != "none" and r.target == "f32":
            r.efficiency = efficiency(r, costs)

    hybrid = None
    if cfg.hybrid_rows:
        from .hybrid import hybrid_rows

        group, hybrid = hybrid_rows(cfg, prompts, ours, run_mlx_lm, Row, efficiency, log)
        rows.extend(group)

    published = None
    if cfg.published_rows:
        from .published import published_rows

        def ours_on(target, drafter, num_draft, name, dname, tname, temp):
            return ours(target, drafter, num_draft, name, dname, tname, temp, 1.0)

        group, published = published_rows(cfg, prompts, ours_on, Row, efficiency, log)
        rows.extend(group)

    mismatched = []
    for target in ("f32", "f32-hybrid", "f32-gemma4", "f32-eagle3"):
        greedy = [r for r in rows if r.temperature == 0 and r.target == target
                  and "-token prompt" not in r.name]
        mismatched += [r.name for r in greedy if r.tokens != greedy[0].tokens]
    from .vocab import vocabulary_cost

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
        "rows": [{k: v for k, v in asdict(r).items() if k != "tokens"} for r in rows],
    }
    write_outputs(result, out)
    log(f"greedy rows identical: {not mismatched}" + (f" (differ: {mismatched})"
                                                       if mismatched else ""))
    return result


def _f(value: float | None, spec: str, prefix: str = "") -> str:
    return "–" if value is None else f"{prefix}{value:{spec}}"


def auto_vs_best_fixed(rows: list[Row]) -> list[dict[str, Any]]:
    """Each auto row ÷ the fastest fixed-k row of the same drafter, target, temperature and
    prompts (a long-prompt row against its own prompt's rows)."""
    def prompts(r: Row) -> str:
        return r.name.split("-token prompt")[0] if "-token prompt" in r.name else ""

    out = []
    for auto in (r for r in rows if r.num_draft == "auto" and r.engine == "mlx-spec"):
        fixed = [r for r in rows if r.engine == "mlx-spec" and r.drafter == auto.drafter
                 and r.target == auto.target and r.temperature == auto.temperature
                 and r.top_p == auto.top_p and isinstance(r.num_draft, int)
                 and prompts(r) == prompts(auto)]
        if fixed:
            best = max(fixed, key=lambda r: r.tok_s)
            out.append({"auto": auto.name, "best": best.name, "ratio": auto.tok_s / best.tok_s})
    return out


def efficiency(r: Row, costs: tuple[float, ...]) -> float | None:
    """Measured speedup ÷ the ideal implied by measured costs: tokens per pass × c(1) /
    (c(k+1) + draft time per pass)."""
    kk = min(round(r.mean_draft), len(costs) - 1)
    ideal = r.tokens_per_pass * costs[0] / (costs[kk] + r.draft_s_per_pass)
    return r.speedup_vs_target / ideal if ideal else None


def mtp_on(target: TargetModel, mtp_small, config: dict) -> Any:
    return widen_mtp(mtp_small, target, small_layers=config["num_hidden_layers"])


def machine() -> dict[str, Any]:
    import mlx_lm

    return {
        "platform": platform.platform(), "processor": platform.machine(),
        "cpu_count": os.cpu_count(), "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
        "openblas_preloaded": "openblas" in os.environ.get("LD_PRELOAD", ""),
        "commit": _commit(),
    }


def _commit() -> str | None:
    """The checkout the numbers come from (`git describe --always --dirty`), if this is one."""
    import subprocess

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=10, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def write_outputs(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    m = result["machine"]
    lines = [
        "# Benchmark",
        "",
        "Reproduce: `uv run mlx-spec bench` or `uv run mlx-spec bench --quick`"
        + (f" (this run: {result['minutes']:.0f} min)." if "minutes" in result else "."),
        f"Machine: {m['platform']}, {m['cpu_count']} cores, MLX {m['mlx']} on {m['device']}, "
        f"mlx-lm {m['mlx_lm']}, OpenBLAS preloaded: {m['openblas_preloaded']}"
        + (f"; code at {m['commit']}" if m.get("commit") else "") + ".",
        f"Target: the demo target widened to {result['target']['params'] / 1e6:.0f}M params "
        f"(f32, function-preserving); verify cost for q = 1..9 tokens relative to 1 "
        f"(a least-squares line through the fastest timings): "
        + ", ".join(f"{x:.2f}" for x in result["target"]["verify_cost_ratio"]) + ".",
        f"Greedy rows produced identical tokens: **{result['greedy_identical']}**.",
        "",
    ]
    lines += row_table(result["rows"])
    lines += ["", "Adaptive draft length (`auto`) against the best fixed k of the same drafter "
              "and temperature in this run:", ""]
    lines += [f"- {a['auto']}: ×{a['ratio']:.2f} of {a['best']}"
              for a in result.get("auto_vs_best_fixed", [])]
    if result.get("parity"):
        lines += ["", "Ratios one run each cannot settle (single runs here vary by ±10%): the "
                  "median of ABBA pairs, each (a₁ + a₂) / (b₁ + b₂) in tok/s. Target-only "
                  "against mlx-lm runs on the first prompt; `auto` against a fixed k on all "
                  "the rows' prompts, in order (auto's policy carries over from one to the "
                  "next, as in a conversation), prompt i at T > 0 with seed i on both sides:",
                  ""]
        lines += [f"- {name}: **{p['median']:.3f}** (pairs: "
                  + ", ".join(f"{r:.3f}" for r in p["pairs"]) + ")"
                  for name, p in result["parity"].items()]
    if long := [r for r in result["rows"] if "-token prompt" in r["name"]]:
        lines += ["", "Long prompts (rows `N-token prompt …`, held-out stdlib source, T = 0): "
                  "speedup against target-only on the same prompt; ITL p50/p90 ms:", ""]
        lines += [f"- {r['name']}: {r['tok_s']:.1f} tok/s, ×{r['speedup_vs_target']:.2f}, "
                  f"{r['tokens_per_pass']:.2f} tokens/pass, ITL {r['itl_p50_ms']:.0f}/"
                  f"{r['itl_p90_ms']:.0f}" for r in long]
    if v := result.get("vocabulary"):
        lines += ["", f"Sampler at a real vocabulary size (V = {v['vocab']:,}, T = "
                  f"{v['temperature']:g}, top-p {v['top_p']:g}, top-k {v['top_k']}): processing "
                  f"the {v['k'] + 1} target rows and {v['k']} draft rows of a k={v['k']} round "
                  f"takes {v['ms']:.2f} ms, ×{v['ratio']:.2f} the softmax of the same rows "
                  f"({v['softmax_ms']:.2f} ms; fastest of 20)."]
    if result.get("hybrid"):
        lines += hybrid_section(result["hybrid"])
    if result.get("published"):
        lines += published_section(result["published"])
    lines += ["", "Speedup is against our target-only row at the same temperature; `vs "
              "mlx-lm` against mlx-lm `generate_step` at the same temperature. mlx-lm's "
              "acceptance column is its share of tokens flagged `from_draft`, its tokens/pass "
              "all tokens ÷ those not from the draft (one per target pass); `–` where an engine "
              "does not report a value. Draft/verify share: time until the draft is handed to the "
              "verify pass / until the verdict is read; the drafter's device work runs inside "
              "the verify wait (one host sync per round) except in the rounds `auto` times in "
              "parts. ITL: gaps between consecutive tokens as the caller got "
              "them (speculation hands over a round's tokens at once). Efficiency = "
              "measured speedup ÷ (tokens per pass × c(1) / (c(k+1) + draft time per pass)), "
              "c from the line fit; the raw verify timings (ms, q = 1..9): "
              + ", ".join(f"{x:.1f}" for x in result["target"].get("verify_cost_ms", [])) + ".",
              "", "![speedup vs draft length](bench.png)", "",
              "Gemma 4 assistant and EAGLE-3 rows: [BENCH-drafters.md](BENCH-drafters.md) "
              "(`mlx-spec bench --group published`; the full run includes them too).", ""]
    (out / "BENCH.md").write_text("\n".join(lines))
    plot(result, out / "bench.png")


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
            f"{_f(r['speedup_vs_mlx_lm'], '.2f', '×')} | {_f(r['tokens_per_pass'], '.2f')} | "
            f"{_f(r['acceptance_rate'], '.0%')} | {pos} | {share} | "
            f"{_f(r['commit_ms_per_pass'], '.2f')} | "
            f"{_f(r['ttft_s'] and r['ttft_s'] * 1000, '.0f')} | "
            f"{_f(r['itl_p50_ms'], '.0f')}/{_f(r['itl_p90_ms'], '.0f')} | "
            f"{r['peak_memory_mb']:.0f} | {_f(r['efficiency'], '.2f')} |")
    return lines


def bench_published(cfg: BenchConfig, out: Path, log: Callable[[str], None] = print) -> dict:
    """`mlx-spec bench --group published`: only the Gemma 4 assistant and EAGLE-3 rows, each
    against its own target-only row in the same run; written to BENCH-drafters.md / .json."""
    from .published import published_rows

    _, tok = load_target(demo_model())
    prompts = prompts_from_corpus(tok, cfg.prompts)

    def ours_on(target, drafter, num_draft, name, dname, tname, temp):
        engine = Engine(target, tok, drafter, num_draft=num_draft)
        list(engine.generate(prompts[0][:8], max_tokens=4))  # warm-up
        row = Row(name, dname, "mlx-spec", tname, temp, 1.0, num_draft)
        return run_ours(engine, prompts, cfg.max_tokens, SamplingConfig(temperature=temp), row)

    group, info = published_rows(cfg, prompts, ours_on, Row, efficiency, log)
    greedy = {}
    for r in group:
        if r.temperature == 0:
            greedy.setdefault(r.target, []).append(r)
    mismatched = [r.name for rs in greedy.values() for r in rs if r.tokens != rs[0].tokens]
    result = {"machine": machine(), "config": asdict(cfg), "published": info,
              "greedy_identical": not mismatched, "greedy_mismatched_rows": mismatched,
              "rows": [{k: v for k, v in asdict(r).items() if k != "tokens"} for r in group]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-drafters.json").write_text(json.dumps(result, indent=2))
    m = result["machine"]
    lines = ["# Benchmark: published drafter layouts", "",
             "Reproduce: `uv run mlx-spec bench --group published`. "
             f"Machine: {m['platform']}, {m['cpu_count']} cores, MLX {m['mlx']} on "
             f"{m['device']}, OpenBLAS preloaded: {m['openblas_preloaded']}. "
             f"{cfg.prompts} held-out prompts × {cfg.max_tokens} tokens per row.",
             f"Greedy rows produced identical tokens: **{not mismatched}**.", ""]
    lines += row_table(result["rows"])
    lines += published_section(info)
    lines += ["", "Speedup is against the target-only row of the same target and temperature. "
              "Efficiency = measured speedup ÷ (tokens per pass × c(1) / (c(k+1) + draft time "
              "per pass)), c the fastest of 5 verify timings per q.", ""]
    (out / "BENCH-drafters.md").write_text("\n".join(lines))
    return result


def hybrid_section(h: dict[str, Any]) -> list[str]:
    lines = [
        "", "## Hybrid target: rolling back recurrent state", "",
        f"Rows `hybrid …`: a random Qwen3.5-layout model (Gated DeltaNet layers 3 of every 4, "
        f"partial-RoPE gated attention in the 4th), its layers' output projections damped to "
        f"{h['noise']:g}, widened to {h['params'] / 1e6:.0f}M params (f32, function-preserving, "
        "GDN heads ×2). Its MTP head is in the published Qwen3.5 layout and *constructed* to "
        "agree with the target's undamped part (bench/hybrid.py), so its acceptance is "
        "synthetic; `draft (twin)` is the unwidened model itself, a perfect drafter. Verify "
        "cost for q = 1..9 tokens relative to 1: "
        + ", ".join(f"{x:.2f}" for x in h["verify_cost_ratio"]) + ".", "",
        f"Target-only on this model ÷ mlx-lm `generate_step` on the same model, median of "
        f"{len(h['parity']['pairs'])} ABBA pairs: **{h['parity']['median']:.3f}** (pairs: "
        + ", ".join(f"{r:.3f}" for r in h["parity"]["pairs"]) + ")"
        + (f"; mtp auto ÷ mtp k={h['num_draft']} on the same prompts: "
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


def published_section(p: dict[str, Any]) -> list[str]:
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
                     f"{info['noise']:g}; verify cost for q = 1..9 tokens relative to 1: "
                     + ", ".join(f"{x:.2f}" for x in info["verify_cost_ratio"]) + ".")
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
        pts = sorted((r["num_draft"], r["speedup_vs_target"]) for r in result["rows"]
                     if r["drafter"] == drafter and r["engine"] == "mlx-spec"
                     and r["temperature"] == 0 and r["target"] == "f32"
                     and isinstance(r["num_draft"], int))
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"ours {drafter}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("draft length k")
    ax.set_ylabel("speedup vs target-only (T=0)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cmd_bench(args) -> int:
    cfg = QUICK if args.quick else BenchConfig()
    log = lambda s: print(s, flush=True)  # noqa: E731
    if getattr(args, "group", "all") == "published":
        bench_published(cfg, Path(args.out), log)
    else:
        bench(cfg, Path(args.out), log)
    return 0
