"""Replaying the draft-length policy on recorded acceptance: k choices judged without a clock.

At T = 0 which drafts the target accepts is a function of the committed text alone: from
committed position t, a greedy drafter proposes the same tokens whatever k the rounds before
chose (its caches hold the committed sequence, semantics 2), and the target keeps the longest
prefix equal to its own greedy continuation. So one number per position, the run length L(t)
(how many of `depth` drafts from t are accepted), decides every round: k drafts from t emit
min(L(t), k) + 1 tokens. `record` measures L on a real engine; `replay` plays a policy (or a
fixed k) over those tables against a round-cost model, with seeded timing noise, feeding the
policy what the engine would (round times, split timings, plain runs, a new turn per prompt).
Rates are in tokens per simulated second, deterministic for a seed: a ratio between two
replays says which choice of k is better on this text and these costs, never how fast a
machine is (`mlx-spec bench` measures that).

At T > 0 a round is a draw, so a table holds its odds: from each position of a sampled
continuation, `record_sampled` drafts `depth` tokens as the drafter would and keeps
r_i = min(1, p_i(x_i) / q_i(x_i)) for each draft x_i, the chance the rejection rule accepts it
once drafts 1..i−1 were (it then reads exactly the context x_i was drafted on). A replayed
round with k drafts accepts draft i with chance r_i while every one before it was accepted:
the count of accepted drafts has the law it has on the engine at that position. (Which
positions a run visits follows its own draws, not the recorded continuation's: as at T = 0,
the text is the record's.)
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlx_spec.coupling import chance_evidence
from mlx_spec.engine import Conversation
from mlx_spec.engine.adaptive import AdaptiveDraftLength
from mlx_spec.engine.planner import Next, Planner, Speculate, drive
from mlx_spec.events import TurnEnd
from mlx_spec.sampling import Sampler, SamplingConfig

# a position's record: the run length L(t) (greedy), or the odds r_1..r_depth (T > 0)
Position = int | Sequence[float]


def record(conv: Conversation, prompt: list[int], tokens: int, *, depth: int = 8,
           text: bool = False) -> list[int] | tuple[list[int], list[int]]:
    """L(t) for t < tokens: the target's greedy continuation of `prompt`, then, from each
    committed prefix, how many of `depth` greedy drafts equal it (one prefill per position:
    slow, a tool's cost, not a test's). text: also the prompt and those `tokens` of its
    continuation (replay's `texts`)."""
    conv.reset()
    end = list(conv.generate(prompt, max_tokens=tokens + depth, ignore_eos=True))[-1]
    assert isinstance(end, TurnEnd)
    out, sampler = list(end.tokens), Sampler(SamplingConfig())
    runs = []
    for t in range(tokens):
        conv.reset()
        conv.prefill(prompt + out[:t])
        drafts = conv.draft(depth, sampler).tokens.tolist()
        n = 0
        while n < depth and drafts[n] == out[t + n]:
            n += 1
        runs.append(n)
    return (runs, prompt + out[:tokens]) if text else runs


def record_sampled(conv: Conversation, prompt: list[int], tokens: int, sampling: SamplingConfig,
                   *, depth: int = 8) -> list[list[float]]:
    """r_1..r_depth for t < tokens, along a continuation of `prompt` sampled with `sampling`
    (its seed gives both the continuation and the drafts: one record, one draw)."""
    conv.reset()
    end = list(conv.generate(prompt, max_tokens=tokens, ignore_eos=True,
                             sampling=sampling))[-1]
    assert isinstance(end, TurnEnd)
    out, sampler = list(end.tokens), Sampler(sampling)
    odds = []
    for t in range(tokens):
        conv.reset()
        conv.prefill(prompt + out[:t])
        draft = conv.draft(depth, sampler)
        logits, _ = conv.verify(draft)
        assert draft.probs is not None  # T > 0: the drafter reports q
        history = prompt + out[:t]
        p = sampler.distribution(logits[:-1], history, draft.tokens)
        rows = mx.arange(draft.k)
        ratio = p[rows, draft.tokens] / mx.maximum(draft.probs[rows, draft.tokens], 1e-30)
        odds.append([round(min(1.0, r), 4) for r in ratio.tolist()])
    return odds


def accepted(position: Position, k: int, rng: random.Random) -> int:
    """How many of k drafts a round from this position accepts: a run length is a fact, odds
    are drawn in order until the first rejection."""
    if isinstance(position, int):
        return min(position, k)
    n = 0
    while n < k and rng.random() < position[n]:
        n += 1
    return n


def evidence(position: Position, k: int) -> list[tuple[float, float]] | None:
    """What a sampled round of k drafts teaches the policy, as the engine's Verdict.evidence
    does: per position the chances it was tested and accepted, Π_{j<i} r_j and Π_{j<=i} r_j
    (each draft's own odds for Σ min(p, q), their mean); None for a run length (greedy)."""
    if isinstance(position, int):
        return None
    return chance_evidence(position[:k], position[:k])


@dataclass(frozen=True)
class RoundCosts:
    """Seconds: a plain token; a round with k drafts = overhead + k·draft + verify[k]
    (verify[k]: the target's pass over k + 1 tokens)."""

    plain: float
    verify: tuple[float, ...]
    draft: float
    overhead: float = 0.0

    def round(self, k: int) -> float:
        return self.plain if k == 0 else self.overhead + k * self.draft + self.verify[k]


def replay(tables: list[list[Position]], costs: RoundCosts, draft_length: int | str, *,
           noise: float = 0.05, seed: int = 0, prior: Sequence[float] | None = None,
           texts: list[list[int]] | None = None, **policy_options) -> list[float]:
    """Tokens per simulated second on each table in turn (one conversation: an `auto` policy
    carries over from prompt to prompt, as in the bench), each rate timed as the bench times
    one: (tokens − 1) / (last arrival − first). Every timing is multiplied by exp(N(0, noise)).
    prior: verify costs an `auto` policy starts from instead of the true ones, not measured (as
    on a fresh engine: calibration.prior), its plain cost their c(1). texts: each table's
    prompt and continuation (`record(..., text=True)`): the planner then reads the text
    committed so far, as a greedy turn's does (Planner.in_phase)."""
    rng = random.Random(seed)
    policy = None
    if draft_length == "auto" and prior is not None:
        policy = AdaptiveDraftLength(prior, plain_cost=prior[0], measured=False,
                                     **policy_options)
    elif draft_length == "auto":
        policy = AdaptiveDraftLength(costs.verify, plain_cost=costs.plain, **policy_options)
    committed: list[int] = []
    planner = Planner(policy, 0 if draft_length == "auto" else int(draft_length), drafting=True,
                      text=(lambda: committed) if texts is not None else None)
    return [_turn(runs, costs, planner, rng, noise, texts[i] if texts else None, committed)
            for i, runs in enumerate(tables)]


def _turn(runs: list[Position], costs: RoundCosts, planner: Planner, rng: random.Random,
          noise: float, text: list[int] | None = None, committed: list[int] | None = None
          ) -> float:
    """One prompt's turn, its steps run by the engine's own loop (planner.drive, as a turn
    plays them), each simulated: a plain token costs costs.plain, a round accepts what the
    record says. text: the prompt and its continuation, kept in `committed` up to the
    position reached."""
    def jitter(seconds: float) -> float:
        return seconds * math.exp(rng.gauss(0.0, noise))

    def decide(ahead: int) -> Next:
        if text is not None and committed is not None:
            committed[:] = text[: len(text) - len(runs) + len(arrivals)]
        return planner.next(left=len(runs) - len(arrivals) - ahead, room=len(runs) + 1)

    def plain(more: Callable[[int], bool]) -> Iterator[None]:
        nonlocal now, fed
        try:
            while True:
                go_on = more(1)  # decided before the token arrives, as a pipelined run does
                seconds = jitter(costs.plain)
                now, fed = now + seconds, fed + 1
                arrivals.append(now)
                planner.observe_plain(seconds)
                yield
                if not go_on:
                    return
        finally:
            planner.end_plain_run()

    def speculate(step: Speculate) -> Iterator[None]:
        nonlocal now, fed
        k, split = step.k, planner.split()
        n = accepted(runs[len(arrivals)], k, rng)
        emitted = min(n + 1, len(runs) - len(arrivals))
        seconds = jitter(costs.round(k))
        now += seconds
        planner.observe_round(k, n, round_s=seconds, fed=fed,
                               draft_s=jitter(k * costs.draft) if split else None,
                               verify_s=jitter(costs.verify[k]) if split else None,
                               evidence=evidence(runs[len(arrivals)], k))
        fed = n + 1
        arrivals.extend([now] * emitted)
        yield

    planner.new_turn()
    now, fed = 0.0, len(runs)  # a new prompt: the drafter catches up
    arrivals: list[float] = []
    for _ in drive(decide, plain, speculate):
        pass
    span = arrivals[-1] - arrivals[0]
    return (len(arrivals) - 1) / span if span > 0 else 0.0
