"""A turn: prefill, then rounds as the planner decides them, yielding typed events.

A round is: draft d_1..d_k; verify [pending, d_1..d_k] in ONE target forward (k+1 next-token
distributions); accept (the sampler keeps the first n drafts and adds the target's own token t);
commit (tokens += d_1..d_n, t; every cache cut back to the committed sequence, so the k - n
rejected positions leave no trace). Because t is always the target's, every round emits at
least one token, and the output is the target's own (greedy: token for token; sampled: in
distribution, see coupling.py). k = 0 is a run of plain decoding (Conversation.decode).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace

import mlx.core as mx

from .. import cache as kv
from ..detok import IncrementalDecoder
from ..drafters import Draft
from ..errors import MlxSpecError, PromptTooLongError
from ..events import Event, Kind, RoundTrace, TokenEvent, TurnEnd, TurnStats
from ..sampling import Sampler, SamplingConfig
from ..stats import Totals, quantiles
from . import inspect
from .conversation import Conversation
from .planner import Next, Planner, Speculate, drive
from .rounds import Due, PrefillDue, Prefilled, Resume, RoundDue, RoundRan

# a round's (or plain step's) tokens, their kinds, and what it did if the turn is traced
Emitted = tuple[list[int], list[Kind], RoundTrace | None]
Turn = Generator[Event | Due, Resume | None, None]  # a turn played in rounds (steps)


def generate(conv: Conversation, prompt: list[int], *, max_tokens: int = 256,
             sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
             ignore_eos: bool = False, trace: bool = False) -> Iterator[Event]:
    """Continue the conversation with `prompt` (the whole token sequence so far: a prefix
    shared with the previous turn is reused from the cache). Yields TokenEvents, then TurnEnd.
    ignore_eos: run to max_tokens through end-of-turn tokens (benchmarks, tests). trace: before
    each round's tokens, a RoundTrace (its drafts, p and q, verdicts, times; inspect.py)."""
    with closing(play(conv, prompt, max_tokens=max_tokens, sampling=sampling, stop=stop,
                      ignore_eos=ignore_eos, trace=trace)) as turn:
        for event in turn:  # (a RoundDue answered by next(): the round runs alone)
            if not isinstance(event, RoundDue | PrefillDue):
                yield event


def steps(conv: Conversation, prompt: list[int], *, max_tokens: int = 256,
          sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
          ignore_eos: bool = False, trace: bool = False) -> Turn:
    """`generate`, with each round and prompt chunk left to the driver (rounds.py): before
    each, a RoundDue or PrefillDue is yielded; send back a Resume with what the driver ran
    (several conversations in one pass: cycle.py), or None to let it run alone. Plain tokens
    (speculation off, or no drafter) come as rounds of no drafts, so they batch too (not
    pipelined)."""
    return play(conv, prompt, max_tokens=max_tokens, sampling=sampling, stop=stop,
                ignore_eos=ignore_eos, rounds_only=True, trace=trace)


@dataclass
class _Turn:
    """A turn in progress: what it emitted, when, its tallies, and the batch's cap on its next
    round's draft length (what the driver's last Resume said)."""

    max_tokens: int
    t0: float
    tally: Totals
    generated: list[int] = field(default_factory=list)
    emitted: list[float] = field(default_factory=list)  # when each token reached the caller
    cap: int | None = None
    trace: bool = False  # record each round (RoundTrace)
    rounds: int = 0  # rounds played (plain steps count as rounds of no drafts)

    def traced(self, **what) -> RoundTrace | None:
        """The next round's record, if the turn is traced (emitted: filled in by play)."""
        if not self.trace:
            return None
        self.rounds += 1
        return RoundTrace(index=self.rounds - 1, emitted=0, **what)

    @property
    def left(self) -> int:
        return self.max_tokens - len(self.generated)

    def resumed(self, resume: Resume | None) -> RoundRan | Prefilled | None:
        """What the driver ran (None: run it alone); its cap holds for the next round."""
        if resume is None:
            return None
        self.cap = resume.cap
        return resume.ran


def play(conv: Conversation, prompt: list[int], *, max_tokens: int = 256,
         sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
         ignore_eos: bool = False, rounds_only: bool = False, trace: bool = False) -> Turn:
    """steps (rounds_only: plain tokens too come as rounds, and the prefill yields between
    chunks) / generate."""
    check_prompt(conv, prompt)
    sampler = Sampler(sampling or SamplingConfig())
    conv.begin_turn(sampler.cfg.greedy)
    planner = Planner(conv.policy, conv.max_draft, drafting=conv.drafter is not None,
                      copies=conv.copy_policy, copy_ready=conv.copy_ready,
                      text=(lambda: conv.tokens) if sampler.cfg.greedy else None)
    planner.new_turn()
    eos = set() if ignore_eos else conv.eos
    decoder = IncrementalDecoder(conv.tokenizer)
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    turn = _Turn(max_tokens, t0, _tally(conv.max_draft), trace=trace)
    if rounds_only:
        chunks, done = conv.prefill_chunks(prompt), None
        while True:
            try:
                due = chunks.send(done)
            except StopIteration as end:
                reused = end.value
                break
            done = turn.resumed((yield due))
    else:
        reused = conv.prefill(prompt)
    prefill_s = time.perf_counter() - t0

    def decide(ahead: int) -> Next:  # ahead: tokens a plain run has built ahead
        """What comes after `ahead` more tokens."""
        return planner.next(left=turn.left - ahead,
                             room=conv.target.context_length - len(conv.tokens) - ahead,
                             stopped=stop is not None and stop.is_set(), cap=turn.cap)

    def plain(more: Callable[[int], bool]):
        return (plain_rounds(conv, sampler, lambda: more(0), planner, turn) if rounds_only
                else plain_run(conv, sampler, more, planner, turn))

    def round_of(step: Speculate):
        return speculate(conv, step.k, step.copy, sampler, planner, turn,
                         lambda new: _stop_point(new, turn.left, eos)[0])

    rounds, reply = drive(decide, plain, round_of), None
    with closing(rounds):  # a turn stopped inside a plain run cuts its extra step back
        while True:
            try:
                item = rounds.send(reply)
            except StopIteration as end:
                finish = end.value
                break
            if isinstance(item, RoundDue):  # up to the driver: batched, or alone (None)
                reply = yield item
                continue
            reply = None
            new, kinds, record = item
            cut, finish = _stop_point(new, turn.left, eos)
            if record is not None:  # first, so a UI can draw a rejected draft before its fix
                yield replace(record, emitted=_shown(new[:cut], eos))
            yield from _emit(turn, new[:cut], kinds[:cut], eos, decoder)
            if finish:
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


def speculate(conv: Conversation, k: int, copy: bool, sampler: Sampler, planner: Planner,
              turn: _Turn, keep: Callable[[list[int]], int]
              ) -> Generator[Emitted | RoundDue, Resume | None, None]:
    """One speculative round: draft, verify (yielding a RoundDue first: the driver may run
    both, batched), accept, commit the first keep(tokens) of its tokens (the turn may end
    inside it); yields them and their kinds. copy: a lookup drafter may copy this round."""
    split = planner.split()  # time draft and verify apart this round
    round_start = time.perf_counter()
    ran = turn.resumed((yield RoundDue(k, sampler, split, copy)))
    draft, logits, hidden, draft_s, verify_s = _ran(conv, ran, k, sampler, split, copy)
    t = time.perf_counter()
    verdict = sampler.verdict(logits, conv.tokens, draft.tokens, draft.probs)
    verify_s += time.perf_counter() - t  # the verdict reads the pass: the host waits here
    n, k = verdict.num_accepted, draft.k
    new = verdict.tokens[: keep(verdict.tokens)]
    t = time.perf_counter()
    conv.commit(new, len(conv.tokens) + min(n, len(new)), hidden)
    commit_s = time.perf_counter() - t
    turn.tally.commit_s += commit_s
    turn.tally.add_pass(k, n, draft_s, verify_s)
    planner.observe_round(k, n, round_s=time.perf_counter() - round_start, fed=draft.fed,
                           draft_s=draft_s if split else None,
                           verify_s=verify_s if split else None, copied=draft.copied,
                           evidence=verdict.evidence)
    last = Kind.TARGET if k == 0 else Kind.BONUS if n == k else Kind.CORRECTED
    record = turn.traced(
        k=k, accepted=n, drafted=verdict.drafted, copied=draft.copied,
        rule=inspect.rule(sampler), at_s=round_start - turn.t0, draft_s=draft_s,
        verify_s=verify_s, commit_s=commit_s,
        rows=inspect.rows(sampler, verdict, draft.probs, new, conv.text_of) if turn.trace else ())
    yield new, ([Kind.ACCEPTED] * n + [last])[: len(new)], record


def _ran(conv: Conversation, ran: RoundRan | Prefilled | None, k: int, sampler: Sampler,
         split: bool, copy: bool):
    """A round's draft, logits, hidden and the seconds its draft and pass took: as the driver
    ran them (RoundRan), the pass alone where its batch's failed, or all of it alone."""
    if isinstance(ran, RoundRan) and ran.logits is not None:
        return ran.draft, ran.logits, ran.hidden, ran.draft_s, ran.verify_s
    if isinstance(ran, RoundRan):
        draft, draft_s = ran.draft, ran.draft_s
    else:
        t = time.perf_counter()
        draft = conv.draft(k, sampler, split=split, copy=copy)
        draft_s = time.perf_counter() - t
    t = time.perf_counter()
    logits, hidden = conv.verify(draft)
    return draft, logits, hidden, draft_s, time.perf_counter() - t


def plain_run(conv: Conversation, sampler: Sampler, more: Callable[[], bool],
              planner: Planner, turn: _Turn) -> Iterator[Emitted]:
    """Plain decoding, one token per target pass, until more() says otherwise. The planner
    learns its cost from the whole run, first step included. (Its steps are pipelined: their
    logits never reach the host, so a traced plain step has no rows.)"""
    try:
        for token, seconds in conv.decode(sampler, more):
            turn.tally.add_pass(0, 0, 0.0, seconds)
            planner.observe_plain(seconds)
            record = turn.traced(k=0, accepted=0, drafted=(), copied=False,
                                 rule=inspect.rule(sampler),
                                 at_s=time.perf_counter() - seconds - turn.t0, draft_s=0.0,
                                 verify_s=seconds, commit_s=0.0)
            yield [token], [Kind.TARGET], record
    finally:
        planner.end_plain_run()


def plain_rounds(conv: Conversation, sampler: Sampler, more: Callable[[], bool],
                 planner: Planner, turn: _Turn
                 ) -> Generator[Emitted | RoundDue, Resume | None, None]:
    """Plain decoding as rounds of no drafts, until more() (asked after each token) says
    otherwise: each token's pass is a RoundDue, so a driver can run it in one pass with other
    conversations' rounds (nothing is built ahead: the pass waits for the batch)."""
    try:
        while True:
            t = time.perf_counter()
            ran = turn.resumed((yield RoundDue(0, sampler, False)))
            _, logits, hidden, _, _ = _ran(conv, ran, 0, sampler, False, False)
            verdict = sampler.verdict(logits, conv.tokens, Draft().tokens, None)
            conv.commit(verdict.tokens, len(conv.tokens), hidden)
            seconds = time.perf_counter() - t
            turn.tally.add_pass(0, 0, 0.0, seconds)
            planner.observe_plain(seconds)
            record = turn.traced(
                k=0, accepted=0, drafted=(), copied=False, rule=inspect.rule(sampler),
                at_s=t - turn.t0, draft_s=0.0, verify_s=seconds, commit_s=0.0,
                rows=(inspect.rows(sampler, verdict, None, verdict.tokens, conv.text_of)
                      if turn.trace else ()))
            yield verdict.tokens, [Kind.TARGET], record
            if not more():
                return
    finally:
        planner.end_plain_run()


def _emit(turn: _Turn, tokens: list[int], kinds: list[Kind], eos: set[int],
          decoder: IncrementalDecoder) -> Iterator[TokenEvent]:
    for tok, kind in zip(tokens, kinds, strict=True):
        if tok in eos:
            return
        turn.generated.append(tok)
        turn.emitted.append(time.perf_counter())
        yield TokenEvent(tok, decoder.add(tok), kind)


def _shown(tokens: list[int], eos: set[int]) -> int:
    """How many of `tokens` _emit yields: those before the first end-of-turn token."""
    return next((i for i, tok in enumerate(tokens) if tok in eos), len(tokens))


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
            conv.max_draft, conv.copy_policy.max_draft if conv.copy_policy is not None else 0),
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
