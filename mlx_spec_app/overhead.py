"""How much the app slows the engine down: `uv run python -m mlx_spec_app.overhead`.

Greedy decoding of the same prompt and length, engine alone vs the engine driven by the app
running headless (`App.run_test()`: layout, rendering and the 30 Hz token flush all run; only
the terminal writes are skipped). Runs alternate, so background load hits both alike; the engine's
own tok/s (TurnStats, prefill excluded) is compared, median over the repeats."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
from pathlib import Path

from mlx_spec import Baseline, Engine, SamplingConfig, TurnEnd, encode_chat, load_engine

from .app import SpecChatApp
from .history import History
from .settings import Settings
from .widgets import PromptInput

PROMPT = "def parse_args(argv):"


def engine_alone(engine: Engine, tokens: int) -> TurnEnd:
    """One turn straight from the engine, in a worker thread like the app's."""
    ids = encode_chat(engine.tokenizer, [{"role": "user", "content": PROMPT}])
    engine.reset()
    out: list[TurnEnd] = []

    def run() -> None:
        events = engine.generate(ids, max_tokens=tokens, sampling=SamplingConfig(),
                                 stop=threading.Event())
        out.extend(e for e in events if isinstance(e, TurnEnd))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


async def with_app(engine: Engine, tokens: int, home: Path) -> TurnEnd:
    """One turn typed into the app, which streams and renders every token."""
    engine.reset()
    app = SpecChatApp(engine=engine, baseline=Baseline(1.0, 1, "not measured here"),
                      history=History(home / "history.sqlite3"))
    app.settings = Settings(max_tokens=tokens, num_draft=app.settings.num_draft)
    async with app.run_test(size=(120, 40)) as pilot:
        app.query_one(PromptInput).text = PROMPT
        await pilot.press("enter")
        while app.busy:  # a plain sleep: polling through the pilot would add UI work
            await asyncio.sleep(0.05)
        assert app.last_turn is not None
        return app.last_turn.end


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mlx_spec_app.overhead", description=__doc__)
    ap.add_argument("--model", default=None, help="default: the bundled demo pair")
    ap.add_argument("--num-draft", default="4", help="an integer, or auto")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    k = args.num_draft if args.num_draft == "auto" else int(args.num_draft)
    engine = load_engine(args.model, num_draft=k)
    alone, app = [], []
    with tempfile.TemporaryDirectory() as home:
        engine_alone(engine, args.tokens)  # warm-up: kernels, allocations
        asyncio.run(with_app(engine, args.tokens, Path(home)))
        for i in range(args.repeats):  # alternate, so background load hits both alike
            a = engine_alone(engine, args.tokens)
            b = asyncio.run(with_app(engine, args.tokens, Path(home)))
            alone.append(a.stats.tok_s)
            app.append(b.stats.tok_s)
            same = "same tokens" if a.tokens == b.tokens else "DIFFERENT tokens"
            print(f"run {i + 1}: engine alone {a.stats.tok_s:7.1f} tok/s   with app "
                  f"{b.stats.tok_s:7.1f} tok/s   ({a.stats.generated_tokens} tokens, {same})")
    m_alone, m_app = statistics.median(alone), statistics.median(app)
    ratio = m_app / m_alone
    print(f"median: engine alone {m_alone:.1f} tok/s, with app {m_app:.1f} tok/s, "
          f"ratio {ratio:.3f} (overhead {100 * (1 - ratio):+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
