"""How much the app slows the engine down: `uv run python -m tools.app_overhead`.

Greedy decoding of the same prompt and length on one engine, alone (its events read by a plain
thread) vs driven by the app running headless (`App.run_test()`: layout, rendering and the paced
token flush all run; only the terminal writes are skipped). The two kinds of run alternate in
ABBA order, so drift and background load hit both alike; each pair gives a ratio of the engine's
own tok/s (TurnStats, prefill excluded), and the median ratio is reported. Also reported: the UI
thread's CPU share while the answer streamed and the flush rate the pacer settled on (see
stream.FramePacer).

The engine runs in a child process, as in the app (--in-thread: in this process, to see what the
shared GIL costs)."""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from mlx_spec import (
    Baseline,
    EngineInThread,
    EngineProcess,
    EngineService,
    LoadSpec,
    TurnEnd,
    parse_draft_length,
)
from mlx_spec_app.app import SpecChatApp
from mlx_spec_app.history import History
from mlx_spec_app.settings import Settings
from mlx_spec_app.stream import FramePacer
from mlx_spec_app.widgets import PromptInput

PROMPT = "def parse_args(argv):"


@dataclass(frozen=True)
class AppRun:
    end: TurnEnd
    ui_share: float  # UI thread CPU seconds / wall seconds while the answer streamed
    flush_hz: float


def engine_alone(engine: EngineService, tokens: int) -> TurnEnd:
    """One turn straight from the engine, read by a worker thread like the app's."""
    out: list[TurnEnd] = []

    def run() -> None:
        events = engine.chat([{"role": "user", "content": PROMPT}], max_tokens=tokens,
                             stop=threading.Event())
        out.extend(e for e in events if isinstance(e, TurnEnd))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


async def with_app(engine: EngineService, tokens: int, home: Path,
                   budget: float | None = None) -> AppRun:
    """One turn typed into the app, which streams and renders every token."""
    app = SpecChatApp(engine=engine, baseline=Baseline(1.0, 1, "not measured here"),
                      history=History(home / "history.sqlite3"))
    if budget is not None:
        app.chat.pacer = FramePacer(budget=budget)
    app.settings = Settings(max_tokens=tokens)
    async with app.run_test(size=(120, 40)) as pilot:
        app.query_one(PromptInput).text = PROMPT
        await asyncio.sleep(0.5)  # let start-up (compose, first layout, footer) finish first
        await pilot.press("enter")
        while app.busy:  # a plain sleep: polling through the pilot would add UI work
            await asyncio.sleep(0.05)
        assert app.chat.last_turn is not None
        pacer = app.chat.pacer
        return AppRun(app.chat.last_turn.end, pacer.share, pacer.frames / max(pacer.wall_s, 1e-9))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.app_overhead", description=__doc__)
    ap.add_argument("--model", default=None, help="default: the bundled demo pair")
    ap.add_argument("--draft-length", default="4", help="an integer, or auto")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--budget", type=float, default=None,
                    help="the UI's CPU budget while streaming (default: FramePacer's)")
    ap.add_argument("--in-thread", action="store_true",
                    help="the engine in this process (default: a child process, as in the app)")
    args = ap.parse_args(argv)
    k = parse_draft_length(args.draft_length)
    start = EngineInThread.load if args.in_thread else EngineProcess.start
    engine = start(LoadSpec(model=args.model, draft_length=k))
    try:
        return _compare(engine, args.tokens, args.pairs, args.budget)
    finally:
        engine.close()


def _compare(engine: EngineService, tokens: int, pairs: int, budget: float | None) -> int:
    alone, app, ratios, shares, rates = [], [], [], [], []
    with tempfile.TemporaryDirectory() as home:
        engine_alone(engine, tokens)  # warm-up: kernels, allocations
        asyncio.run(with_app(engine, tokens, Path(home), budget))
        for i in range(pairs):
            if i % 2 == 0:  # ABBA: alone first, then app first
                a = engine_alone(engine, tokens)
                b = asyncio.run(with_app(engine, tokens, Path(home), budget))
            else:
                b = asyncio.run(with_app(engine, tokens, Path(home), budget))
                a = engine_alone(engine, tokens)
            alone.append(a.stats.tok_s)
            app.append(b.end.stats.tok_s)
            ratios.append(b.end.stats.tok_s / a.stats.tok_s)
            shares.append(b.ui_share)
            rates.append(b.flush_hz)
            same = "same tokens" if a.tokens == b.end.tokens else "DIFFERENT tokens"
            print(f"pair {i + 1:2}: engine alone {a.stats.tok_s:6.1f} tok/s, with app "
                  f"{b.end.stats.tok_s:6.1f} tok/s, ratio {ratios[-1]:.3f}; UI thread "
                  f"{b.ui_share:5.1%} of a core, {b.flush_hz:4.1f} flushes/s "
                  f"({a.stats.generated_tokens} tokens, {same})")
    ratio = statistics.median(ratios)
    lo, hi = bootstrap_median_ci(ratios)
    print(f"median: engine alone {statistics.median(alone):.1f} tok/s, with app "
          f"{statistics.median(app):.1f} tok/s; median pair ratio {ratio:.3f} "
          f"(overhead {100 * (1 - ratio):+.1f}%, 95% CI of the median {lo:.3f}-{hi:.3f}); "
          f"UI thread {statistics.median(shares):.1%} of a core; "
          f"{statistics.median(rates):.1f} flushes/s")
    return 0


def bootstrap_median_ci(xs: list[float], *, rounds: int = 2000,
                        seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap 95% interval for the median: single runs on a shared machine vary
    by ±10%, so the interval says how far the median itself can be trusted."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


if __name__ == "__main__":
    raise SystemExit(main())
