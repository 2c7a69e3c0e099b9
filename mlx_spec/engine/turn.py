"""A turn: prefill, then rounds as the schedule decides them, yielding typed events.

A round is: draft d_1..d_k; verify [pending, d_1..d_k] in ONE target forward (k+1 next-token
distributions); accept (the sampler keeps the first n drafts and adds the target's own token t);
commit (tokens += d_1..d_n, t; every cache cut back to the committed sequence, so the k - n
rejected positions leave no trace). Because t is always the target's, every round emits at
least one token, and the output is the target's own (greedy: token for token; sampled: in
distribution, see sampling.py). k = 0 is a run of plain decoding (Conversation.decode).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx

from .. import cache as kv
from ..detok import IncrementalDecoder
from ..drafters import Draft
from ..errors import MlxSpecError, PromptTooLongError
from ..events import Event, Kind, TokenEvent, TurnEnd, TurnStats
from ..sampling import Sampler, SamplingConfig
from ..stats import Totals, quantiles
from .batch import Prefilled, Verified
from .schedule import End, Next, Plain, Schedule

if TYPE_CHECKING:
    from .conversation import Conversation

Emitted = tuple[list[int], list[Kind]]  # a round's (or plain step's) tokens and their kinds


@dataclass(frozen=True)
class Verify:
    """A round waiting for its verify pass (only `Conversation.steps` yields these). A driver
    that runs several conversations sends back (logits, hidden) from one pass over all of
    them (batch.verify_together); one that just iterates (next) lets the round verify alone."""

    conv: Conversation
    draft: Draft


@dataclass(frozen=True)
class Drafting:
    """A round about to draft (only `Conversation.steps` yields these). A driver that runs
    several conversations may draft theirs together (batch.draft_together: one step of the
    drafter for all rows per draft position) and send back this round's Draft; one that just
    iterates (next) lets it draft alone. split: the round times its draft apart (synced)."""

    conv: Conversation
    k: int
    sampler: Sampler
    split: bool


@dataclass(frozen=True)
class Pause:
    """A prefill chunk is next (only `Conversation.steps` yields these): a driver of several
    conversations may run the others' rounds first, and may run this chunk in one pass with
    other conversations' chunks (batch.prefill_together: reply its `Prefilled`); replied None,
    the chunk runs alone."""

    conv: Conversation
    chunk: list[int]

    @property
    def tokens(self) -> int:
        return len(self.chunk)


Reply = Draft | Verified | Prefilled | None  # what a driver sends back into a turn


@dataclass
class _Turn:
    """A turn in progress: what it emitted, when, and its tallies."""

    max_tokens: int
    t0: float
    tally: Totals
    generated: list[int] = field(default_factory=list)
    emitted: list[float] = field(default_factory=list)  # when each token reached the caller

    @property
    def left(self) -> int:
        return self.max_tokens - len(self.generated)


def play(conv: Conversation, prompt: list[int], *, max_tokens: int = 256,
         sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
         ignore_eos: bool = False, rounds_only: bool = False
         ) -> Generator[Event | Drafting | Verify | Pause, Reply, None]:
    """Conversation.steps (rounds_only: plain tokens too go through Verify, and the prefill
    pauses between chunks) / generate."""
    check_prompt(conv, prompt)
    sampler = Sampler(sampling or SamplingConfig())
    policy = conv.policy = conv.policy_for(sampler.cfg.greedy)
    conv.copy_policy = conv.policy_for(sampler.cfg.greedy, copies=True)
    schedule = Schedule(policy, conv.max_draft, drafting=conv.drafter is not None,
                        copies=conv.copy_policy, copy_ready=conv.copy_ready,
                        text=(lambda: conv.tokens) if sampler.cfg.greedy else None)
    schedule.new_turn()
    eos = set() if ignore_eos else conv.eos
    decoder = IncrementalDecoder(conv.tokenizer)
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    if rounds_only:
        chunks, done = conv.prefill_chunks(prompt), None
        while True:
            try:
                pause = chunks.send(done)
            except StopIteration as end:
                reused = end.value
                break
            done = yield pause
    else:
        reused = conv.prefill(prompt)
    prefill_s = time.perf_counter() - t0
    turn = _Turn(max_tokens, t0, _tally(conv.max_draft))

    def decide(ahead: int = 0) -> Next:  # ahead: tokens a plain run has built ahead
        """What comes after `ahead` more tokens."""
        return schedule.next(left=turn.left - ahead,
                             room=conv.target.context_length - len(conv.tokens) - ahead,
                             stopped=stop is not None and stop.is_set())

    planned: Next | None = None  # decided at the end of a plain run, for the step after it
    finish = "length"
    while True:
        step = planned or decide()
        planned = None
        if isinstance(step, End):
            finish = step.reason
            break
        if isinstance(step, Plain):
            def more(ahead: int = 1) -> bool:  # asked by the plain run for each token
                nonlocal planned
                planned = decide(ahead=ahead)
                return isinstance(planned, Plain)

            rounds = (plain_rounds(conv, sampler, lambda: more(0), schedule, turn.tally)
                      if rounds_only else plain_run(conv, sampler, more, schedule, turn.tally))
        else:
            conv.may_copy = step.copy
            rounds = speculate(conv, step.k, sampler, schedule, turn.tally,
                               lambda new: _stop_point(new, turn.left, eos)[0])
        reason, reply = "", None
        with closing(rounds):  # a plain run stopped early cuts its extra step back
            while True:
                try:
                    item = rounds.send(reply)
                except StopIteration:
                    break
                if isinstance(item, Drafting | Verify):  # up to the driver: batched, or
                    reply = yield item  # alone (None)
                    continue
                reply = None
                new, kinds = item
                cut, reason = _stop_point(new, turn.left, eos)
                yield from _emit(turn, new[:cut], kinds[:cut], eos, decoder)
                if reason:
                    break
        if reason:
            finish = reason
            break
    conv.materialize()
    stats = turn_stats(conv, prompt, reused, prefill_s, turn, finish)
    yield TurnEnd(stats, finish, tuple(turn.generated))


def check_prompt(conv: Conversation, prompt: list[int]) -> None:
    if not prompt:
        raise MlxSpecError("the prompt is empty")
    if len(prompt) >= conv.target.context_length:
        raise PromptTooLongError(f"prompt has {len(prompt)} tokens; the model's context is "
                                 f"{conv.target.context_length}")


def speculate(conv: Conversation, k: int, sampler: Sampler, schedule: Schedule, tally: Totals,
              keep: Callable[[list[int]], int]
              ) -> Generator[Emitted | Drafting | Verify, Draft | Verified | None, None]:
    """One speculative round: draft, verify (yielding Drafting and Verify first: the driver
    may batch either), accept, commit the first keep(tokens) of its tokens (the turn may end
    inside it); yields them and their kinds."""
    split = schedule.split()  # time draft and verify apart this round
    t = round_start = time.perf_counter()
    draft = yield Drafting(conv, k, sampler, split)
    if draft is None:
        draft = conv.draft(k, sampler, split=split)
    draft_s = time.perf_counter() - t
    t = time.perf_counter()
    logits, hidden = (yield Verify(conv, draft)) or conv.verify(draft)
    verdict = sampler.verify(logits, conv.tokens, draft.tokens, draft.probs)
    verify_s = time.perf_counter() - t
    n, k = verdict.num_accepted, draft.k
    new = verdict.tokens[: keep(verdict.tokens)]
    t = time.perf_counter()
    conv.commit(new, len(conv.tokens) + min(n, len(new)), hidden)
    tally.commit_s += time.perf_counter() - t
    tally.add_pass(k, n, draft_s, verify_s)
    schedule.observe_round(k, n, round_s=time.perf_counter() - round_start, fed=draft.fed,
                           draft_s=draft_s if split else None,
                           verify_s=verify_s if split else None, copied=draft.copied,
                           evidence=verdict.evidence)
    last = Kind.TARGET if k == 0 else Kind.BONUS if n == k else Kind.CORRECTED
    yield new, ([Kind.ACCEPTED] * n + [last])[: len(new)]


def plain_run(conv: Conversation, sampler: Sampler, more: Callable[[], bool],
              schedule: Schedule, tally: Totals) -> Iterator[Emitted]:
    """Plain decoding, one token per target pass, until more() says otherwise. The schedule
    learns its cost from the whole run, first step included."""
    try:
        for token, seconds in conv.decode(sampler, more):
            tally.add_pass(0, 0, 0.0, seconds)
            schedule.observe_plain(seconds)
            yield [token], [Kind.TARGET]
    finally:
        schedule.end_plain_run()


def plain_rounds(conv: Conversation, sampler: Sampler, more: Callable[[], bool],
                 schedule: Schedule, tally: Totals
                 ) -> Generator[Emitted | Verify, Verified | None, None]:
    """Plain decoding as rounds of no drafts, until more() (asked after each token) says
    otherwise: each token's pass goes through Verify, so a driver can run it in one pass with
    other conversations' rounds (nothing is built ahead: the pass waits for the batch)."""
    try:
        while True:
            t = time.perf_counter()
            draft = Draft()
            logits, hidden = (yield Verify(conv, draft)) or conv.verify(draft)
            verdict = sampler.verify(logits, conv.tokens, draft.tokens, None)
            conv.commit(verdict.tokens, len(conv.tokens), hidden)
            seconds = time.perf_counter() - t
            tally.add_pass(0, 0, 0.0, seconds)
            schedule.observe_plain(seconds)
            yield verdict.tokens, [Kind.TARGET]
            if not more():
                return
    finally:
        schedule.end_plain_run()


def _emit(turn: _Turn, tokens: list[int], kinds: list[Kind], eos: set[int],
          decoder: IncrementalDecoder) -> Iterator[TokenEvent]:
    for tok, kind in zip(tokens, kinds, strict=True):
        if tok in eos:
            return
        turn.generated.append(tok)
        turn.emitted.append(time.perf_counter())
        yield TokenEvent(tok, decoder.add(tok), kind)


def turn_stats(conv: Conversation, prompt: list[int], reused: int, prefill_s: float,
               turn: _Turn, finish: str) -> TurnStats:
    s, times = turn.tally, turn.emitted
    p50, p90, worst = quantiles([b - a for a, b in zip(times, times[1:], strict=False)])
    return TurnStats(
        prompt_tokens=len(prompt),
        reused_tokens=reused,
        generated_tokens=len(turn.generated),
        target_passes=s.passes,
        drafted=s.drafted,
        accepted=s.accepted,
        per_position_drafted=tuple(s.pos_drafted),
        per_position_accepted=tuple(s.pos_accepted),
        prefill_s=prefill_s,
        draft_s=s.draft_s,
        verify_s=s.verify_s,
        commit_s=s.commit_s,
        ttft_s=times[0] - turn.t0 if times else 0.0,
        total_s=time.perf_counter() - turn.t0,
        itl_p50_s=p50,
        itl_p90_s=p90,
        itl_max_s=worst,
        peak_memory=mx.get_peak_memory(),
        target_bytes=conv.target.nbytes(),
        drafter_bytes=conv.drafter_bytes(),
        kv_cache_bytes=kv.nbytes(conv.cache),
        drafter=conv.drafter.name if conv.drafter is not None else "none",
        max_draft=0 if conv.drafter is None else max(  # copies may reach further
            conv.max_draft, conv.copy_policy.k_max if conv.copy_policy is not None else 0),
        adaptive=conv.policy is not None,
        finish_reason=finish,
        ranks=conv.target.ranks,
        split=conv.target.split_label,
    )


def _tally(max_draft: int) -> Totals:
    """Per-position tallies as long as the longest draft, whatever the rounds use."""
    return Totals(pos_drafted=[0] * max_draft, pos_accepted=[0] * max_draft)


def _stop_point(new: list[int], remaining: int, eos: set[int]) -> tuple[int, str]:
    """How many of a round's tokens to keep: through an end-of-turn token, or up to max_tokens."""
    for i, tok in enumerate(new):
        if tok in eos:
            return i + 1, "stop"
        if i + 1 == remaining:
            return i + 1, "length"
    return len(new), ""
