"""How the benchmark measures one row: the models it loads, the engines it drives, the numbers a
row carries. Every place the benchmark builds or drives an `Engine` is in this file
(`new_engine`, `warm_up`, `run_ours`, `first_turn`, `measure_acceptance`), and so is every
verify-cost timing (`verify_costs`). Every engine gets an empty calibration store of its own
(`fresh_store`): the bench neither reads nor writes MLX_SPEC_HOME. Timings are measured here and
never asserted by tests.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlx_spec.assets import DEMO_DRAFT, DEMO_TARGET_F32, demo_model
from mlx_spec.drafters import Drafter
from mlx_spec.drafters.lookup import LookupFirst
from mlx_spec.drafters.mtp import MTPDrafter
from mlx_spec.drafters.mtp_files import load_mtp_drafter
from mlx_spec.engine import Conversation, Engine
from mlx_spec.engine.acceptance import measure_acceptance as engine_acceptance
from mlx_spec.engine.calibration import CalibrationStore
from mlx_spec.engine.costs import measure_verify_costs
from mlx_spec.events import TokenEvent, TurnEnd
from mlx_spec.loading import find_mtp_head, load_target
from mlx_spec.model import TargetModel
from mlx_spec.sampling import SamplingConfig
from mlx_spec.spec import DraftLength
from mlx_spec.stats import Totals, quantiles

from .widen import widen_mtp, widen_target


@dataclass(frozen=True)
class BenchConfig:
    hidden: int = 1024
    layers: int = 12
    ffn: int = 2816
    prompts: int = 3
    max_tokens: int = 96
    draft_length: int = 4
    sweep: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    temperatures: tuple[tuple[float, float], ...] = ((0.0, 1.0), (1.0, 1.0), (0.7, 0.9))
    quantized_rows: bool = True
    hybrid_rows: bool = True
    hybrid_noise: float = 0.06  # the hybrid target's damped layers (bench/hybrid.py)
    published_rows: bool = True  # Gemma 4 assistant and EAGLE-3 pairs (bench/published.py)
    long_context: tuple[int, ...] = (1024, 3800)  # prompt lengths of the long-context rows
    parity_pairs: int = 8  # ABBA pairs behind each ratio single rows cannot settle (±~3% at 5)
    first_turn: bool = True  # the first-turn group: auto on a fresh engine (scenario.py)
    first_turn_temperatures: tuple[float, ...] = (0.0, 1.0)


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
    draft_length: int | str
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
        return pooled_tok_s([self])

    @property
    def ttft_s(self) -> float:
        return self.arrivals[0] - self.start if self.arrivals else 0.0

    @property
    def span(self) -> tuple[int, float]:
        """(tokens after the first, seconds from the first token to the last)."""
        a = self.arrivals
        return (len(a) - 1, a[-1] - a[0]) if len(a) > 1 else (0, 0.0)

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


def pooled_tok_s(timings: Iterable[Timing]) -> float:
    """A row's tok/s over all its prompts: their tokens after each one's first ÷ their time
    after it. The mean of the prompts' own rates would weigh a fast prompt's seconds more than
    a slow one's (one prompt at ×3 and one at ×1 read ×2 where the user waits as for ×1.5)."""
    spans = [t.span for t in timings]
    seconds = sum(s for _, s in spans)
    return sum(n for n, _ in spans) / seconds if seconds > 0 else 0.0


def timed(stream: Iterable[Any], is_token: Callable[[Any], bool]) -> tuple[list[Any], Timing]:
    """Consume a token stream; return its items and their Timing."""
    items, timing = [], Timing(time.perf_counter(), [])
    for item in stream:
        items.append(item)
        if is_token(item):
            timing.arrivals.append(time.perf_counter())
    return items, timing


def timed_turn(conv: Conversation, prompt: list[int], max_tokens: int,
               sampling: SamplingConfig, *, trace: bool = False) -> tuple[TurnEnd, Timing]:
    """One turn of exactly `max_tokens` tokens (end of turn ignored): its end and its Timing
    (trace: recorded round by round, as the app's turns are)."""
    items, timing = timed(conv.generate(prompt, max_tokens=max_tokens, sampling=sampling,
                                        ignore_eos=True, trace=trace),
                          lambda e: isinstance(e, TokenEvent))
    end = items[-1]
    assert isinstance(end, TurnEnd)
    return end, timing


def itl_ms(gaps: list[float]) -> tuple[float, float]:
    p50, p90, _ = quantiles(gaps)
    return 1e3 * p50, 1e3 * p90


@cache
def _scratch() -> tempfile.TemporaryDirectory:
    """The process's scratch directory for calibration stores (removed at exit)."""
    return tempfile.TemporaryDirectory(prefix="mlx-spec-bench-")


def fresh_store() -> CalibrationStore:
    """An empty calibration store in a directory of its own: an engine on it reads no saved
    calibration (its prior sees no other engine's) and saves none where the user's are."""
    return CalibrationStore(Path(tempfile.mkdtemp(dir=_scratch().name)))


def new_engine(target: TargetModel, tokenizer: Any, drafter: Drafter | None,
               draft_length: DraftLength, store: CalibrationStore | None = None) -> Engine:
    """A fresh engine over `target`, `drafter` proposing `draft_length` tokens a round, on an
    empty calibration store: nothing calibrated, no policy, nothing carried from another
    (store: one the run shares between its rows instead, so a big target is calibrated once)."""
    return Engine(target, tokenizer, drafter, draft_length=draft_length,
                  store=store or fresh_store())


def warm_up(engine: Engine, conv: Conversation, prompt: list[int]) -> None:
    """Calibrate the engine of a speculative conversation (so a row runs on measured costs, as
    in the app once its idle calibration ran: `auto` reads them, and every verify pass runs at
    the size they found cheapest), then four tokens after the prompt's first eight, so a row
    times no first-call compilation."""
    if conv.drafter is not None and not engine.calibrated:
        engine.calibrate()
    list(conv.generate(prompt[:8], max_tokens=4))


@dataclass(frozen=True)
class FirstTurn:
    """A conversation's first turn as its caller saw it."""

    ttft_s: float  # from the call to the first token: prefill and the first round
    tok_s: float  # after the first token (Timing.tok_s)
    tokens_per_pass: float
    drafted_per_pass: float


def first_turn(engine: Engine, prompt: list[int], max_tokens: int,
               sampling: SamplingConfig) -> FirstTurn:
    """The first turn of a new conversation on `engine`: `max_tokens` fixed-length tokens after
    `prompt`, after four warm-up tokens in a conversation of their own (no first-call
    compilation is timed, and the timed turn's policy starts from the engine's costs alone)."""
    list(engine.conversation().generate(prompt[:8], max_tokens=4))
    end, timing = timed_turn(engine.conversation(), prompt, max_tokens, sampling)
    s = end.stats
    return FirstTurn(timing.ttft_s, timing.tok_s, s.tokens_per_pass,
                     s.drafted / max(s.target_passes, 1))


def timed_calibration(engine: Engine) -> float:
    """Seconds `engine.calibrate()` takes: what a first `auto` turn waited for before its first
    token while costs were measured inside it."""
    t0 = time.perf_counter()
    engine.calibrate()
    return time.perf_counter() - t0


def run_ours(engine: Conversation, prompts: list[list[int]], max_tokens: int,
             sampling: SamplingConfig, row: Row, *, seed: int = 0, trace: bool = False) -> Row:
    """Fill `row` from `max_tokens` fixed-length tokens after each prompt (prompt i drawn with
    seed `seed` + i), each from an empty cache (trace: each turn traced)."""
    timings, stats, gaps = [], [], []
    for i, ids in enumerate(prompts):
        engine.reset()
        # seeded for repeatability; the coupling an unseeded request gets unless the row
        # names one (a seed alone would choose the drafter-invariant coupling)
        coupling = "leviathan" if sampling.coupling == "auto" else sampling.coupling
        cfg = SamplingConfig(**{**asdict(sampling), "seed": seed + i, "coupling": coupling})
        end, timing = timed_turn(engine, ids, max_tokens, cfg, trace=trace)
        timings.append(timing)
        gaps += timing.gaps
        stats.append(end.stats)
        row.tokens.append(list(end.tokens))
    row.tok_s = pooled_tok_s(timings)
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
    """Fill `row` from mlx-lm's generate_step (no draft) or speculative_generate_step with k
    drafts a round, `max_tokens` after each prompt (prompt i with random seed i)."""
    from mlx_lm.generate import generate_step, speculative_generate_step
    from mlx_lm.sample_utils import make_sampler

    timings, from_draft, total, gaps, ttfts = [], 0, 0, [], []
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
        timings.append(timing)
        gaps += timing.gaps
        ttfts.append(timing.ttft_s)
        row.tokens.append([int(it[0]) for it in items])
        if draft is not None:
            from_draft += sum(bool(it[2]) for it in items)
            total += len(items)
        row.peak_memory_mb = max(row.peak_memory_mb, mx.get_peak_memory() / 2**20)
    row.tok_s = pooled_tok_s(timings)
    row.ttft_s = sum(ttfts) / len(ttfts)
    row.itl_p50_ms, row.itl_p90_ms = itl_ms(gaps)
    if draft is None:
        row.tokens_per_pass = 1.0  # one forward per token, by construction
    elif total:
        # each target pass yields its accepted drafts (from_draft) and one token of its own
        row.acceptance_rate = from_draft / total  # share of tokens that came from the draft
        row.tokens_per_pass = total / max(total - from_draft, 1)
    return row


@dataclass(frozen=True)
class Runner:
    """One run's tokenizer, prompts and row length: measures a row of ours or of mlx-lm."""

    tokenizer: Any
    prompts: list[list[int]]
    max_tokens: int
    store: CalibrationStore | None = None  # shared by the run's rows (default: one a row)

    def ours(self, target: TargetModel, drafter: Drafter | None, draft_length: int | str,
             name: str, drafter_name: str, target_name: str, temperature: float,
             top_p: float = 1.0, prompts: list[list[int]] | None = None,
             seed: int = 0, coupling: str = "leviathan", trace: bool = False) -> Row:
        """A row of a fresh, warmed-up engine, on `prompts` (default: the run's), prompt i
        sampled with seed `seed` + i (coupling: how its drafts are accepted at T > 0; trace:
        every turn traced round by round)."""
        engine = new_engine(target, self.tokenizer, drafter, draft_length, self.store)
        conv = engine.conversation()
        warm_up(engine, conv, self.prompts[0])
        row = Row(name, drafter_name, "mlx-spec", target_name, temperature, top_p, draft_length)
        return run_ours(conv, prompts or self.prompts, self.max_tokens,
                        SamplingConfig(temperature=temperature, top_p=top_p,
                                       coupling=coupling), row, seed=seed, trace=trace)

    def first_turn(self, engine: Engine, temperature: float, *, seed: int = 0) -> FirstTurn:
        """The first turn of a new conversation on `engine`, on the run's first prompt."""
        return first_turn(engine, self.prompts[0], self.max_tokens,
                          SamplingConfig(temperature=temperature, seed=seed,
                                         coupling="leviathan"))

    def mlx_lm(self, target: TargetModel, name: str, target_name: str, temperature: float, *,
               draft: TargetModel | None = None, k: int = 0, top_p: float = 1.0,
               prompts: list[list[int]] | None = None) -> Row:
        """A row of mlx-lm: generate_step, or speculative with `draft` and k drafts a round."""
        row = Row(name, "none" if draft is None else "draft", "mlx-lm", target_name,
                  temperature, top_p, k)
        return run_mlx_lm(target, draft, prompts or self.prompts, self.max_tokens, temperature,
                          top_p, k, row)


def measure_acceptance(target: TargetModel, tokenizer: Any, drafter: Drafter | None,
                       draft_length: int, prompts: list[list[int]], max_tokens: int,
                       temperature: float) -> dict[str, float]:
    """Tokens per target pass and acceptance of a fresh engine (engine/acceptance.py, as the
    trainer measures), up to `max_tokens` (or its end of turn) after each prompt, prompt i
    drawn with seed i."""
    t = engine_acceptance(new_engine(target, tokenizer, drafter, draft_length), prompts,
                          max_tokens=max_tokens, temperature=temperature)
    return {"tokens_per_pass": t.tokens_per_pass, "acceptance": t.acceptance_rate}


@dataclass(frozen=True)
class BenchModels:
    """The demo target in f32 (`small`), its widening (`wide`), its MTP head and draft model."""

    small: TargetModel
    wide: TargetModel
    wide_config: dict[str, Any]
    config: dict[str, Any]  # the small target's config.json
    mtp_small: MTPDrafter
    draft: TargetModel
    tokenizer: Any

    def mtp_on(self, target: TargetModel | None = None) -> MTPDrafter:
        """A fresh MTP drafter for `target` (default: the wide one), widened to its width."""
        return widen_mtp(self.mtp_small, target or self.wide,
                         small_layers=self.config["num_hidden_layers"])

    def lookup_on(self, target: TargetModel | None = None) -> LookupFirst:
        """mtp_on behind prompt lookup (--lookup): copies first where the text repeats."""
        return LookupFirst(self.mtp_on(target))


def load_bench_models(cfg: BenchConfig) -> BenchModels:
    small, tokenizer = load_target(demo_model(DEMO_TARGET_F32))
    small.model.set_dtype(mx.float32)
    config = json.loads((demo_model(DEMO_TARGET_F32) / "config.json").read_text())
    wide, wide_cfg = widen_target(small, config, hidden=cfg.hidden, layers=cfg.layers,
                                  ffn=cfg.ffn)
    mtp_small = load_mtp_drafter(find_mtp_head(demo_model(DEMO_TARGET_F32)), small)
    draft, _ = load_target(demo_model(DEMO_DRAFT))
    draft.model.set_dtype(mx.float32)
    return BenchModels(small, wide, wide_cfg, config, mtp_small, draft, tokenizer)


def load_demo() -> tuple[TargetModel, MTPDrafter]:
    """The bundled demo target as the app opens it here (assets.demo_variant), and its MTP
    head."""
    from mlx_spec.assets import demo_variant

    v = demo_variant()
    demo, _ = load_target(demo_model(v.name), dtype=v.dtype)
    return demo, load_mtp_drafter(find_mtp_head(demo_model(v.name), demo), demo)


def load_demo_tokenizer() -> Any:
    _, tokenizer = load_target(demo_model())
    return tokenizer


def verify_costs(target: TargetModel, max_draft: int, *, repeats: int = 5) -> tuple[float, ...]:
    """Seconds for one target forward over q = 1..max_draft+1 tokens: the fastest of `repeats`."""
    return measure_verify_costs(target, max_draft, repeats=repeats, smooth=False)


def efficiency(r: Row, costs: tuple[float, ...]) -> float | None:
    """Measured speedup ÷ the ideal implied by measured costs: tokens per pass × c(1) /
    (c(k+1) + draft time per pass)."""
    kk = min(round(r.mean_draft), len(costs) - 1)
    ideal = r.tokens_per_pass * costs[0] / (costs[kk] + r.draft_s_per_pass)
    return r.speedup_vs_target / ideal if ideal else None


def machine() -> dict[str, Any]:
    import mlx_lm

    return {
        "platform": platform.platform(), "processor": platform.machine(),
        "cpu_count": os.cpu_count(), "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
        "openblas_preloaded": "openblas" in os.environ.get("LD_PRELOAD", ""),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "commit": _commit(),
    }


def _commit() -> str | None:
    """The checkout the numbers come from (`git describe --always --dirty`), if this is one."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=10, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def row_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    """The rows as bench.json holds them: every field but the tokens."""
    return [{k: v for k, v in asdict(r).items() if k != "tokens"} for r in rows]


def against_target_only(rows: list[Row]) -> None:
    """Set each row's speedup against our target-only row of its temperature among `rows`."""
    for r in rows:
        base = next(b.tok_s for b in rows if b.drafter == "none" and b.engine == "mlx-spec"
                    and b.temperature == r.temperature)
        r.speedup_vs_target = r.tok_s / base if base else 0.0
