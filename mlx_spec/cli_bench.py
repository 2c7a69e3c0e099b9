"""`mlx-spec bench [--model M]`: what speculation buys for one model on this machine.

The same chat prompts are decoded target-only (A) and with the model's drafter (B) on the same
weights, interleaved A-B-B-A per prompt so a machine that speeds up or slows down during the run
weighs on both sides alike. A prompt's speedup is the ratio of the two sides' mean tok/s; the
summary is the geometric mean over prompts (ratios compose by multiplication). At T = 0 it also
says whether every speculative answer equals the target-only one (lossless decoding: it must,
but at a genuine near-tie). The project's full side-by-side benchmark, with mlx-lm and the
published layouts, is `python -m benchmarks` in a checkout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass

from .errors import MlxSpecError

PROMPTS = (
    "Explain what a Python list comprehension is, with a short example.",
    "Write a function that checks whether a string is a palindrome.",
    "Give three tips for writing clear commit messages.",
    "What is the difference between a process and a thread?",
)


@dataclass(frozen=True)
class Run:
    """One decoded answer: its speed and what the target passes produced."""

    tok_s: float
    tokens: tuple[int, ...]
    tokens_per_pass: float
    acceptance: float


@dataclass(frozen=True)
class PromptResult:
    prompt: str
    target_only: tuple[Run, Run]
    speculative: tuple[Run, Run]

    @property
    def speedup(self) -> float:
        return mean(r.tok_s for r in self.speculative) / mean(r.tok_s for r in self.target_only)

    @property
    def identical(self) -> bool:
        return all(s.tokens == self.target_only[0].tokens for s in self.speculative)


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def add_bench_options(b: argparse.ArgumentParser) -> None:
    b.add_argument("--prompt", "-p", action="append", default=None,
                   help="a chat prompt to time (repeatable; default: four built-in ones)")
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--json", action="store_true", help="print one JSON object")


def decode(conv, ids: list[int], *, max_tokens: int, sampling) -> Run:
    """One answer on a reset conversation (the prompt prefilled anew: each run alike)."""
    from .events import TokenEvent, TurnEnd

    conv.reset()
    tokens, end = [], None
    for ev in conv.generate(ids, max_tokens=max_tokens, sampling=sampling):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token)
        elif isinstance(ev, TurnEnd):
            end = ev
    assert end is not None  # generate always ends with its TurnEnd
    s = end.stats
    return Run(s.tok_s, tuple(tokens), s.tokens_per_pass, s.acceptance_rate)


def cmd_bench(args: argparse.Namespace) -> int:
    from .cli_options import fetched, sampling_from_args, spec_from_args
    from .loading import load_engine
    from .templates import encode_chat

    if args.max_tokens < 1:
        raise MlxSpecError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    prompts = args.prompt or list(PROMPTS)
    if any(not p.strip() for p in prompts):
        raise MlxSpecError("--prompt: a prompt is empty")
    sampling = sampling_from_args(args)
    engine = load_engine(fetched(spec_from_args(args)))
    if engine.drafter is None:
        raise MlxSpecError(f"{engine.target.name} has no drafter here (--drafter none, or no "
                           "head or draft model found): nothing to compare")
    say = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    if engine.draft_length == "auto" and not engine.calibrated:
        say(f"calibrating {engine.target.name} (once; `auto` reads the costs) ...")
        engine.calibrate()
    plain, spec = engine.conversation(drafter=None), engine.conversation()
    encoded = [encode_chat(engine.tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    for conv in (plain, spec):  # warm-up: kernels and allocations, not timed
        decode(conv, encoded[0], max_tokens=8, sampling=sampling)
    results = []
    for prompt, ids in zip(prompts, encoded, strict=True):
        a1, b1, b2, a2 = (decode(c, ids, max_tokens=args.max_tokens, sampling=sampling)
                          for c in (plain, spec, spec, plain))
        results.append(PromptResult(prompt, (a1, a2), (b1, b2)))
        say(f"  {prompt[:40]:<40} ×{results[-1].speedup:.2f}")
    report = summarise(engine, results, sampling, args.max_tokens)
    print(json.dumps(report) if args.json else render(report))
    return 0


def summarise(engine, results: list[PromptResult], sampling, max_tokens: int) -> dict:
    speedup = math.exp(mean(math.log(r.speedup) for r in results))
    drafter = engine.drafter.name
    out = {
        "target": engine.target.name, "drafter": drafter,
        "draft_length": engine.draft_length, "temperature": sampling.temperature,
        "max_tokens": max_tokens, "order": "A-B-B-A per prompt (A target-only, B speculative)",
        "speedup": speedup,
        "prompts": [{
            "prompt": r.prompt, "speedup": r.speedup,
            "target_only_tok_s": [x.tok_s for x in r.target_only],
            "speculative_tok_s": [x.tok_s for x in r.speculative],
            "tokens_per_pass": mean(x.tokens_per_pass for x in r.speculative),
            "acceptance": mean(x.acceptance for x in r.speculative),
            "identical": r.identical,
        } for r in results],
    }
    if sampling.temperature == 0:
        out["identical"] = sum(r.identical for r in results)
    return out


def render(report: dict) -> str:
    lines = [f"{report['target']} · drafter {report['drafter']}, k {report['draft_length']} · "
             f"T = {report['temperature']:g} · {len(report['prompts'])} prompts × "
             f"{report['max_tokens']} tokens · {report['order']}",
             f"{'prompt':<42}{'target-only':>12}{'speculative':>12}{'speedup':>9}"
             f"{'tok/pass':>9}{'accept':>8}"]
    for p in report["prompts"]:
        lines.append(f"{p['prompt'][:41]:<42}{mean(p['target_only_tok_s']):>8.1f} t/s"
                     f"{mean(p['speculative_tok_s']):>8.1f} t/s{'×':>4}{p['speedup']:<5.2f}"
                     f"{p['tokens_per_pass']:>9.2f}{p['acceptance']:>8.2f}")
    lines.append(f"speedup (geometric mean over prompts): ×{report['speedup']:.2f}")
    if "identical" in report:
        lines.append(f"greedy answers identical to target-only: {report['identical']}/"
                     f"{len(report['prompts'])}")
    return "\n".join(lines)
