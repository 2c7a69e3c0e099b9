"""`mlx-spec`: the app (default), `generate`, `models` / `pull` / `rm`, `train-drafter`, `bench`,
`doctor`, `--version`.

Every user error ends as one line on stderr and exit code 2; no tracebacks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from dataclasses import replace

from .cli_bench import add_bench_options
from .cli_models import add_commands as add_hub_commands
from .cli_options import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Parser,
    add_launch_options,
    add_model_options,
    add_sampling_options,
    add_split_options,
    fetched,
    positive_float,
    positive_int,
    sampling_from_args,
    spec_from_args,
    with_launch,
)
from .cli_print import print_fragment, summary_line
from .errors import MlxSpecError, user_message
from .spec import AUTO_MAX_DRAFT


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="mlx-spec", description="Lossless speculative decoding on MLX.")
    ap.add_argument("--version", action="store_true",
                    help="the version of mlx-spec, MLX and mlx-lm, and the device")
    sub = ap.add_subparsers(dest="command", parser_class=Parser)

    g = sub.add_parser("generate", help="generate one answer and print it")
    add_model_options(g)
    add_split_options(g)
    add_sampling_options(g)
    g.add_argument("--prompt", "-p", required=True)
    g.add_argument("--raw", action="store_true", help="no chat template")
    g.add_argument("--max-tokens", type=positive_int, default=256)
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--trace", metavar="FILE", help="save what every round did (drafts, p and q, "
                   "verdicts, times): FILE.json, or FILE.html to open in a browser")
    g.add_argument("--kv-bits", type=int, choices=[4, 8], default=None,
                   help="quantize the target's KV cache (attention layers) to 4 or 8 bits")

    c = sub.add_parser("chat", help="open the chat app (the default command)")
    add_launch_options(c, "a preset (`mlx-spec models`), a hub repo id or a model directory; "
                          "what is missing is downloaded first")

    t = sub.add_parser("train-drafter", help="distil a drafter head for a target")
    t.add_argument("--target", required=True)
    t.add_argument("--data", help="a text file or a directory of text files (default: the "
                                   "target's own continuations of built-in prompts)")
    t.add_argument("--steps", type=positive_int, default=None, help="default 2000")
    t.add_argument("--minutes", type=positive_float, default=None, help="train this long "
                   "instead (data generation included); a resumed run trains this much more")
    t.add_argument("--out", default=None)
    t.add_argument("--kind", choices=["shared-kv", "deepseek", "eagle3"], default=None,
                   help="default: eagle3 where the target's layers can be tapped (the most "
                        "tokens per pass per minute of training, docs/TRAIN.md), else shared-kv")
    t.add_argument("--depth", type=positive_int, help="chained draft steps trained (default 8)")
    t.add_argument("--draft-vocab", type=positive_int, default=None, metavar="N",
                   help="eagle3: a draft vocabulary of the N tokens most frequent in the "
                        "training data (d2t / t2d, as speculators writes them; default: all)")
    t.add_argument("--chat-prompts", type=positive_int, default=None, metavar="N",
                   help="a chat model without --data: answer at most N chat prompts for its "
                        "training data (default: as many as 30%% of --minutes allows, up to "
                        "2048)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--batch-size", type=positive_int, default=8)
    t.add_argument("--seq-len", type=positive_int, default=192)
    t.add_argument("--lr", type=positive_float, default=None,
                   help="peak learning rate (default: 2e-3 for a 192-wide head, falling as "
                        "1/width² to 1e-4; see docs/TRAIN.md)")

    sv = sub.add_parser("serve", help="serve the model over OpenAI-compatible HTTP (several "
                                       "requests at once, speculation on)")
    add_launch_options(sv, "a preset, a hub repo id or a model directory (default: the demo "
                           "pair)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8080)
    sv.add_argument("--api-key", default=None,
                    help="require `Authorization: Bearer KEY` (or x-api-key) on every endpoint "
                         "but /health")
    sv.add_argument("--max-concurrency", type=positive_int, default=4,
                    help="requests generating at once (more wait in a queue)")
    sv.add_argument("--max-queue", type=positive_int, default=64,
                    help="requests waiting at most; more are answered 429 at once")
    sv.add_argument("--kv-memory", type=positive_float, default=None, metavar="GB",
                    help="the memory (GiB) the running requests' caches may take together: a "
                         "request starts when its caches at their longest (prompt + max_tokens) "
                         "fit beside theirs, waiting in the queue till then; one that never can "
                         "is refused 400 (default: half the memory left beside the weights)")

    cal = sub.add_parser("calibrate", help="measure a model's costs and target-only speed on "
                                            "this machine now (saved; `auto` reads them)")
    cal.add_argument("model", nargs="?", help="a preset, a hub repo id or a model directory "
                                              "(default: the demo target)")
    cal.add_argument("--kv-bits", type=int, choices=[4, 8], default=None)

    add_hub_commands(sub)

    d = sub.add_parser("doctor", help="what mlx-spec sees here, and how to fix what is wrong")
    d.add_argument("--json", action="store_true")
    d.add_argument("--hostfile", help="also check every host of this mlx hostfile: reachable, "
                                      "the same versions and model files, the backend joined")
    d.add_argument("--model", help="with --hostfile: the model directory every host needs")

    b = sub.add_parser("bench", help="time a model with and without speculation (A-B-B-A)")
    add_model_options(b)
    add_sampling_options(b)
    add_bench_options(b)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, the bare `mlx-spec` read as `mlx-spec chat`: with chat's defaults
    (--lookup on, among them), not a namespace missing them."""
    args = build_parser().parse_args(argv)
    if args.command is None and not args.version:
        args = build_parser().parse_args(["chat"])
    return args


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a real process (not a test calling main): use OpenBLAS where installed
        from ._platform import maybe_preload_openblas

        maybe_preload_openblas(sys.argv[1:])
    args = parse_args(argv)
    try:
        if args.version:
            from .doctor import version_line

            print(version_line())
            return 0
        if args.command == "doctor":
            from .doctor import cmd_doctor

            return cmd_doctor(args)
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "calibrate":
            return cmd_calibrate(args)
        if args.command == "train-drafter":
            from .train.command import cmd_train_drafter

            return cmd_train_drafter(args)
        if args.command == "bench":
            from .cli_bench import cmd_bench

            return cmd_bench(args)
        if args.command in ("models", "pull", "rm", "import"):
            from . import cli_models

            return getattr(cli_models, f"cmd_{args.command}")(args)
        return cmd_chat(args)
    except MlxSpecError as e:
        print(f"mlx-spec: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as e:  # invalid option values (SamplingConfig and friends)
        print(f"mlx-spec: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nmlx-spec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # a bug or the machine (out of disk, a kernel error): still one line
        if os.environ.get("MLX_SPEC_DEBUG"):
            raise
        print(f"mlx-spec: error: {user_message(e, 'unexpected failure')} "
              "(MLX_SPEC_DEBUG=1 shows where)", file=sys.stderr)
        return EXIT_FAILURE


def cmd_generate(args: argparse.Namespace) -> int:
    from .events import TokenEvent, TurnEnd
    from .loading import load_engine
    from .templates import encode_chat, encode_raw, valid_text
    from .trace import Recorder, engine_fields
    from .trace_html import save_trace

    sampling = sampling_from_args(args)  # validate before the (slow) load
    spec = spec_from_args(args)
    if not args.prompt:
        raise MlxSpecError("the prompt is empty")
    prompt, replaced = valid_text(args.prompt)
    if replaced:
        print("mlx-spec: warning: the prompt had bytes that are not UTF-8; each was replaced "
              "with U+FFFD", file=sys.stderr)
    engine = load_engine(fetched(spec))
    tok = engine.tokenizer
    ids = (encode_raw(tok, prompt) if args.raw
           else encode_chat(tok, [{"role": "user", "content": prompt}]))
    colour = sys.stdout.isatty() and not args.json and "NO_COLOR" not in os.environ
    tokens, kinds, text = [], [], []
    end: TurnEnd | None = None
    stop = threading.Event()
    chat, recorder = engine.conversation(), Recorder()
    with stop_on_interrupt(stop):  # ctrl+c ends the turn between rounds: partial answer + stats
        for ev in chat.generate(ids, max_tokens=args.max_tokens, sampling=sampling, stop=stop,
                                trace=bool(args.trace)):
            recorder.add(ev)
            if isinstance(ev, TokenEvent):
                tokens.append(ev.token)
                kinds.append(ev.kind.value)
                text.append(ev.text)
                if not args.json:
                    print_fragment(ev.text, ev.kind.value, colour)
            elif isinstance(ev, TurnEnd):
                end = ev
    assert end is not None  # generate always ends with its TurnEnd
    code = EXIT_INTERRUPTED if stop.is_set() else 0
    if args.trace:
        drafter = chat.drafter.name if chat.drafter is not None else "none"
        about = engine_fields(engine.target.name, drafter, chat.draft_length,
                              engine.target.split_label)
        where = save_trace(recorder.trace(engine=about, sampling=sampling,
                                    messages=[{"role": "user", "content": prompt}]), args.trace)
        print(f"mlx-spec: trace saved to {where}", file=sys.stderr)
    if args.json:
        out = {"target": engine.target.name, "prompt_ids": ids, "tokens": tokens,
               "kinds": kinds, "text": "".join(text), "finish_reason": end.finish_reason,
               "stats": end.stats.to_dict()}
        print(json.dumps(out))
    else:
        print()
        print(summary_line(end.stats, engine.target.name), file=sys.stderr)
    return code


def cmd_serve(args: argparse.Namespace) -> int:
    """Load, then serve until ctrl+c (in-flight requests end after their round; exit 0)."""
    from .loading import load_engine
    from .serve import Server

    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"mlx-spec: warning: serving on {args.host} without --api-key: anyone who can "
              "reach this machine can use the model", file=sys.stderr)
    engine = load_engine(fetched(spec_from_args(args)))
    try:
        server = Server(engine, host=args.host, port=args.port, api_key=args.api_key,
                        max_concurrency=args.max_concurrency, max_queue=args.max_queue,
                        kv_memory=None if args.kv_memory is None else int(args.kv_memory * 2**30))
    except OSError as e:
        raise MlxSpecError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from None
    drafter = engine.drafter.name if engine.drafter is not None else "none"
    split = f", target split {engine.target.split_label}" if engine.target.ranks > 1 else ""
    print(f"mlx-spec: serving {engine.target.name} (drafter {drafter}, k={engine.draft_length}"
          f"{split}) at {server.url}/v1", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    print("mlx-spec: stopped", file=sys.stderr)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure the target's verify and plain decoding costs and its target-only speed, and
    save them for this model and device (what `auto` and the app's speedup read)."""
    from .engine.calibration import device_name
    from .loading import load_engine
    from .service import measure_baseline

    engine = load_engine(replace(fetched(spec_from_args(args)), drafter="none"))
    print(f"calibrating {engine.target.name} on {device_name()} ...", file=sys.stderr)
    engine.calibrate()
    measured = measure_baseline(engine)
    assert measured is not None  # nothing stops it here
    baseline = engine.keep_baseline(measured)
    costs = engine.costs(AUTO_MAX_DRAFT)
    verify = " ".join(f"{c * 1e3:.1f}" for c in costs.verify)
    where = engine.store.root / f"{engine.key}.json" if engine.key else "(not saved: no files)"
    quoted = ("" if len(baseline.measurements) < 2 else f" (speedups quote {baseline.tok_s:.1f}"
              f", the median of the last {len(baseline.measurements)} measurements)")
    print(f"{engine.target.name}: verify 1..{len(costs.verify)} tokens {verify} ms, plain "
          f"{costs.plain * 1e3:.2f} ms/token, target-only {measured.tok_s:.1f} tok/s{quoted}; "
          f"saved to {where}")
    return 0


@contextlib.contextmanager
def stop_on_interrupt(stop: threading.Event):
    """While generating: the first SIGINT sets `stop` (the engine ends the turn after the round
    in progress, its caches committed); a second one interrupts at once."""

    def handler(signum, frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def cmd_chat(args: argparse.Namespace) -> int:
    """The app, on local paths only: a preset or repo id that is fully cached opens at once;
    one that is not opens the app's download screen first (the user asked for it by name)."""
    try:
        from mlx_spec_app.app import run_app
    except ImportError as e:
        raise MlxSpecError(f"the chat app is not available: {e}") from e
    from .loading import is_local

    spec = spec_from_args(args)
    if spec.model is None or is_local(spec.model):
        return run_app(spec)
    from . import hub
    from .cli_models import warn_if_too_big

    warn_if_too_big(spec.model)
    try:
        launch = hub.launch_for(spec.model)  # an unknown name is one line here, before the app
    except hub.NotDownloaded:
        return run_app(spec.with_model(None), pull=spec.model)
    return run_app(with_launch(spec, launch))


if __name__ == "__main__":
    raise SystemExit(main())
