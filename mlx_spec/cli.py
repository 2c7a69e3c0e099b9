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
from typing import Any

from .cli_models import ProgressBar
from .cli_models import add_commands as add_hub_commands
from .cli_print import print_fragment, summary_line
from .errors import MlxSpecError, user_message
from .kinds import DRAFTERS
from .spec import AUTO_MAX_DRAFT, MAX_DRAFT, LoadSpec, parse_draft_length

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # ctrl+c, as shells report SIGINT
EXIT_FAILURE = 1  # anything else that went wrong (not the input)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        print(f"mlx-spec: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", help="target: model dir, .gguf file, hub repo (default: demo)")
    p.add_argument("--drafter", choices=["auto", *DRAFTERS], default="auto",
                   help="auto: the model's own MTP head or one found beside it, else "
                        "--draft-model, else none")
    p.add_argument("--draft-model", help="draft model (same tokenizer as the target)")
    p.add_argument("--mtp", help="MTP head: a directory or hub repo (default: the model's own, "
                                  "or one found beside it)")
    p.add_argument("--num-draft", "-k", default=None,
                   help=f"tokens drafted per round: an integer 1..{MAX_DRAFT}, or 'auto' "
                        "(chosen each round from measured costs and acceptance). Default: the "
                        "drafter's own length where its files give one (a Gemma 4 "
                        "assistant's), else auto")
    add_lookup_option(p)


def add_lookup_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True,
                   help="copy drafts from the conversation's own text first where its last "
                        "tokens appeared before (code, edits, loops), else the drafter drafts "
                        "(default: on; lossless either way)")


def add_launch_options(p: argparse.ArgumentParser, model_help: str) -> None:
    """chat's and serve's options: the model (a preset, repo id or directory), its drafter,
    --lookup and the split over machines."""
    p.add_argument("model", nargs="?", help=model_help)
    p.add_argument("--drafter", choices=["auto", *DRAFTERS], default="auto")
    p.add_argument("--draft-model")
    p.add_argument("--mtp")
    p.add_argument("--num-draft", "-k", default=None)
    add_lookup_option(p)
    add_split_options(p)


def add_split_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hostfile", default=None,
                   help="split the target over the machines of this mlx hostfile "
                        "(mlx.distributed_config writes one; the first host is this one)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--pipeline", dest="split", action="store_const", const="pipeline",
                     help="split by layers (default where mlx-lm can)")
    how.add_argument("--tensor", dest="split", action="store_const", const="tensor",
                     help="split every layer's heads and MLP")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="mlx-spec", description="Lossless speculative decoding on MLX.")
    ap.add_argument("--version", action="store_true",
                    help="the version of mlx-spec, MLX and mlx-lm, and the device")
    sub = ap.add_subparsers(dest="command", parser_class=_Parser)

    g = sub.add_parser("generate", help="generate one answer and print it")
    add_model_options(g)
    add_split_options(g)
    add_sampling_options(g)
    g.add_argument("--prompt", "-p", required=True)
    g.add_argument("--raw", action="store_true", help="no chat template")
    g.add_argument("--max-tokens", type=_positive_int, default=256)
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--kv-bits", type=int, choices=[4, 8], default=None,
                   help="quantize the target's KV cache (attention layers) to 4 or 8 bits")

    c = sub.add_parser("chat", help="open the chat app (the default command)")
    add_launch_options(c, "a preset (`mlx-spec models`), a hub repo id or a model directory; "
                          "what is missing is downloaded first")

    t = sub.add_parser("train-drafter", help="distil a drafter head for a target")
    t.add_argument("--target", required=True)
    t.add_argument("--data", help="a text file or a directory of text files (default: the "
                                   "target's own continuations of built-in prompts)")
    t.add_argument("--steps", type=_positive_int, default=None, help="default 2000")
    t.add_argument("--minutes", type=_positive_float, default=None, help="train this long "
                   "instead (data generation included); a resumed run trains this much more")
    t.add_argument("--out", default=None)
    t.add_argument("--kind", choices=["shared-kv", "deepseek", "eagle3"], default=None,
                   help="default: eagle3 where the target's layers can be tapped (the most "
                        "tokens per pass per minute of training, docs/TRAIN.md), else shared-kv")
    t.add_argument("--depth", type=_positive_int, help="chained draft steps trained (default 8)")
    t.add_argument("--draft-vocab", type=_positive_int, default=None, metavar="N",
                   help="eagle3: a draft vocabulary of the N tokens most frequent in the "
                        "training data (d2t / t2d, as speculators writes them; default: all)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--batch-size", type=_positive_int, default=8)
    t.add_argument("--seq-len", type=_positive_int, default=192)
    t.add_argument("--lr", type=_positive_float, default=2e-3,
                   help="peak learning rate (default 2e-3, see docs/TRAIN.md)")

    sv = sub.add_parser("serve", help="serve the model over OpenAI-compatible HTTP (several "
                                       "requests at once, speculation on)")
    add_launch_options(sv, "a preset, a hub repo id or a model directory (default: the demo "
                           "pair)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8080)
    sv.add_argument("--api-key", default=None,
                    help="require `Authorization: Bearer KEY` (or x-api-key) on every endpoint "
                         "but /health")
    sv.add_argument("--max-concurrency", type=_positive_int, default=4,
                    help="requests generating at once (more wait in a queue)")

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

    b = sub.add_parser("bench", help="side-by-side speed benchmark")
    b.add_argument("--quick", action="store_true")
    b.add_argument("--group", default="all", choices=["all", "published", "first-turn",
                                                      "serve", "distributed", "demo", "real"],
                   help="all: the full run (docs/BENCH.md, with published and first-turn); "
                        "published: Gemma 4 assistant and EAGLE-3 rows (BENCH-drafters.md); "
                        "first-turn: auto's first turn before calibration (BENCH-first-turn.md); "
                        "serve: 1-8 streaming clients, ours and mlx_lm.server (BENCH-serve.md); "
                        "distributed: the target split over 2 ranks as the link slows "
                        "(BENCH-distributed.md); demo: the bundled pair as a first run opens it "
                        "(BENCH-demo.md); real: published GGUF models (BENCH-real.md); serve, "
                        "distributed and real are not part of all")
    b.add_argument("--out", default="docs")
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
            from .train.distill import cmd_train_drafter

            return cmd_train_drafter(args)
        if args.command == "bench":
            from .bench import cmd_bench

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


def spec_from_args(args: argparse.Namespace) -> LoadSpec:
    """The load spec the options name (validated here, once: one line for a bad value)."""
    try:
        num_draft = parse_draft_length(getattr(args, "num_draft", None))
    except MlxSpecError as e:
        raise MlxSpecError(f"--num-draft: {e}") from None
    return LoadSpec(model=getattr(args, "model", None), drafter=getattr(args, "drafter", "auto"),
                    draft_model=getattr(args, "draft_model", None), mtp=getattr(args, "mtp", None),
                    num_draft=num_draft, kv_bits=getattr(args, "kv_bits", None),
                    hostfile=getattr(args, "hostfile", None), split=getattr(args, "split", None),
                    lookup=getattr(args, "lookup", False))


SAMPLING_FLAGS = {"temperature": "--temp", "top-p": "--top-p", "top-k": "--top-k",
                  "min-p": "--min-p", "repetition-penalty": "--repetition-penalty"}


def sampling_from_args(args: argparse.Namespace):
    """A SamplingConfig; a bad value is refused naming the option (NaN and inf included)."""
    from .sampling import SamplingConfig

    try:
        return SamplingConfig(
            temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
            repetition_penalty=args.repetition_penalty, seed=args.seed,
        )
    except ValueError as e:
        field, _, rest = str(e).partition(" ")
        raise MlxSpecError(f"{SAMPLING_FLAGS.get(field, field)} {rest}") from None


def cmd_generate(args: argparse.Namespace) -> int:
    from .events import TokenEvent, TurnEnd
    from .loading import load_engine
    from .templates import encode_chat, encode_raw, valid_text

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
    with stop_on_interrupt(stop):  # ctrl+c ends the turn between rounds: partial answer + stats
        for ev in engine.conversation().generate(ids, max_tokens=args.max_tokens,
                                                 sampling=sampling, stop=stop):
            if isinstance(ev, TokenEvent):
                tokens.append(ev.token)
                kinds.append(ev.kind.value)
                text.append(ev.text)
                if not args.json:
                    print_fragment(ev.text, ev.kind.value, colour)
            else:
                end = ev
    assert end is not None  # generate always ends with its TurnEnd
    code = EXIT_INTERRUPTED if stop.is_set() else 0
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
                        max_concurrency=args.max_concurrency)
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


def fetched(spec: LoadSpec) -> LoadSpec:
    """The spec on local paths: a preset or hub repo id is pulled first (what is cached is not
    fetched again), and its drafter fills what the user left unset."""
    from .loading import is_local

    if spec.draft_model and not is_local(spec.draft_model):
        from .hub import fetch

        spec = replace(spec, draft_model=str(fetch(spec.draft_model, progress=ProgressBar())))
    if spec.model is None or is_local(spec.model):
        return spec
    from . import hub

    return with_launch(spec, hub.pull(spec.model, progress=ProgressBar()))


def with_launch(spec: LoadSpec, launch: Any) -> LoadSpec:
    """The pulled pair's spec, keeping a drafter the user chose; its warnings (a drafter kind
    not loadable yet) go to stderr."""
    for w in launch.warnings:
        print(f"mlx-spec: warning: {w}", file=sys.stderr)
    return launch.spec(spec)


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
