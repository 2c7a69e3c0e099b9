"""The command line's shared parts: option groups, the one-line parser, and what the options
mean (a LoadSpec, a SamplingConfig, the spec on local paths). Below cli.py and its command
modules (cli_bench, cli_models), so each of them can use them without importing cli.py."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from .cli_models import ProgressBar
from .errors import MlxSpecError
from .kinds import DRAFTERS
from .spec import MAX_DRAFT, LoadSpec, parse_draft_length

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # ctrl+c, as shells report SIGINT
EXIT_FAILURE = 1  # anything else that went wrong (not the input)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        print(f"mlx-spec: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
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
    p.add_argument("--draft-length", "-k", "--num-draft", default=None,
                   help=f"tokens drafted per round: an integer 1..{MAX_DRAFT}, or 'auto' "
                        "(chosen each round from measured costs and acceptance). Default: the "
                        "drafter's own length where its files give one (a Gemma 4 "
                        "assistant's), else auto. --num-draft is its former name")
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
    p.add_argument("--draft-length", "-k", "--num-draft", default=None)
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


def spec_from_args(args: argparse.Namespace) -> LoadSpec:
    """The load spec the options name (validated here, once: one line for a bad value)."""
    try:
        draft_length = parse_draft_length(getattr(args, "draft_length", None))
    except MlxSpecError as e:
        raise MlxSpecError(f"--draft-length: {e}") from None
    return LoadSpec(model=getattr(args, "model", None), drafter=getattr(args, "drafter", "auto"),
                    draft_model=getattr(args, "draft_model", None), mtp=getattr(args, "mtp", None),
                    draft_length=draft_length, kv_bits=getattr(args, "kv_bits", None),
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
