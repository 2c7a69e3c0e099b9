"""The speculative decoding loop: prefill → draft → verify → commit, yielding typed events.

State between rounds: `tokens`, the committed sequence. Its last token is *pending*: the target
has not run on it yet, so the target cache holds exactly tokens[:-1] (`cached` counts what the
caches hold; the engine keeps that count, since recurrent caches have no offset). A round

  1. draft:  the drafter proposes d_1..d_k after tokens (k may be 0: plain decoding);
  2. verify: ONE target forward over [pending, d_1..d_k] gives k+1 next-token distributions;
  3. accept: the sampler keeps the first n drafts and adds the target's own token t;
  4. commit: tokens += d_1..d_n, t; target and drafter caches are cut back to the new committed
             sequence (the k - n rejected positions leave no trace).

Because t is always the target's, every round emits at least one token, and the output is the
target's own (greedy: token for token; sampled: in distribution, see sampling.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any, NamedTuple

import mlx.core as mx

from . import cache as kv
from .adaptive import AdaptiveDraftLength, measure_plain_cost, measure_verify_costs
from .detok import IncrementalDecoder
from .drafters.base import Draft, DraftContext, Drafter
from .errors import MlxSpecError, PromptTooLongError
from .events import Event, Kind, TokenEvent, TurnEnd, TurnStats
from .model import TargetModel
from .sampling import Sampler, SamplingConfig, Tokens
from .stats import quantiles

PREFILL_CHUNK = 512


class Engine:
    """Holds a target, an optional drafter and the conversation's committed caches."""

    def __init__(
        self,
        target: TargetModel,
        tokenizer: Any,
        drafter: Drafter | None = None,
        *,
        num_draft: int | str = 4,
        max_draft: int = 8,
        kv_bits: int | None = None,
    ):
        """num_draft: tokens drafted per round, or "auto" (chosen each round, up to max_draft,
        from measured verify costs and online acceptance; see adaptive.py)."""
        if num_draft != "auto" and (not isinstance(num_draft, int) or num_draft < 1):
            raise MlxSpecError(f"draft length must be >= 1 or 'auto', got {num_draft}")
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.adaptive = num_draft == "auto"
        self.num_draft = max_draft if self.adaptive else int(num_draft)
        # one policy per drafter and per greedy / sampled (acceptance differs between them),
        # on verify costs calibrated once
        self.policies: dict[tuple[str, bool], AdaptiveDraftLength] = {}
        self.verify_costs: tuple[float, ...] | None = None
        self.plain_cost: float | None = None  # seconds per pipelined plain token, calibrated
        self._last_policy: AdaptiveDraftLength | None = None
        self.kv_bits = kv_bits
        self.eos = set(getattr(tokenizer, "eos_token_ids", None) or [])
        self.reset()

    # -- conversation state ------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the conversation: empty caches."""
        slack = max(16, 2 * (self.num_draft + 2))
        self.cache = kv.make_cache(self.target.model, slack=slack, kv_bits=self.kv_bits)
        if self.drafter is not None:
            kv.check_rollback(self.cache)
            self.drafter.reset()
        self.tokens: list[int] = []
        self.cached = 0  # tokens the target cache holds

    def set_drafter(self, drafter: Drafter | None) -> None:
        """Switch drafters. The conversation is re-prefilled next turn, since a drafter that
        keeps state (an MTP cache) needs the target's hidden states of every position."""
        self.drafter = drafter
        self.reset()

    def _context(self, hidden: mx.array | None = None, start: int = 0) -> DraftContext:
        return DraftContext(self.target, self.tokens, self.cache, hidden, start)

    def _materialize(self) -> None:
        """Evaluate every cached array before the turn ends. MLX streams are thread-local: a
        lazy array left in a cache would need the stream of the thread that built it, which may
        be gone when the next turn runs on another thread (as in the app)."""
        arrays = [c.state for c in self.cache]
        if self.drafter is not None:
            arrays.append(self.drafter.arrays())
        mx.eval(arrays)

    def set_num_draft(self, num_draft: int | str, *, max_draft: int = 8) -> None:
        """Draft length for later turns: an int >= 1, or "auto"."""
        if num_draft != "auto" and (not isinstance(num_draft, int) or num_draft < 1):
            raise MlxSpecError(f"draft length must be >= 1 or 'auto', got {num_draft}")
        old = self.num_draft
        self.adaptive = num_draft == "auto"
        if self.verify_costs is not None and len(self.verify_costs) != max_draft + 1:
            self.verify_costs, self.policies = None, {}
        self.num_draft = max_draft if self.adaptive else int(num_draft)
        if self.num_draft > old:  # sliding-window caches need rollback slack for a longer round
            self.reset()

    def _policy(self, greedy: bool) -> AdaptiveDraftLength | None:
        """The adaptive draft-length policy for this drafter and this kind of sampling; the
        verify costs are calibrated once (a few timed target passes)."""
        if not self.adaptive or self.drafter is None:
            return None
        if self.verify_costs is None:
            self.verify_costs = measure_verify_costs(self.target, self.num_draft)
            self.plain_cost = measure_plain_cost(self.target)
        key = (self.drafter.name, greedy)
        if key not in self.policies:
            self.policies[key] = AdaptiveDraftLength(self.verify_costs,
                                                     plain_cost=self.plain_cost)
        return self.policies[key]

    @property
    def policy(self) -> AdaptiveDraftLength | None:
        """The policy the last turn used (None before any, or with a fixed k)."""
        return self._last_policy

    # -- the loop, as verbs --------------------------------------------------------------------

    def prefill(self, prompt: list[int]) -> int:
        """Make the cache hold prompt[:-1], reusing the longest prefix already cached.

        Returns how many prompt tokens were reused."""
        reuse = _common_prefix(self.tokens, prompt)
        reuse = min(reuse, len(prompt) - 1, self.cached)
        want_hidden = self.drafter.needs_hidden if self.drafter is not None else False
        # a hidden-state drafter next reads the row of the last reused position (the one that
        # predicts the first new token); if it no longer holds it, re-feed that one token
        start = reuse
        if want_hidden and reuse and not self.drafter.has_hidden(reuse - 1):
            start = reuse - 1
        if not kv.can_trim_to(self.cache, start, have=self.cached):
            self.reset()  # e.g. a rewritten history on a recurrent model: recompute it all
            reuse = start = 0
        kv.trim_to(self.cache, start, have=self.cached)
        self.tokens, self.cached = list(prompt), start
        hidden = []
        for i in range(start, len(prompt) - 1, PREFILL_CHUNK):
            chunk = prompt[i : min(i + PREFILL_CHUNK, len(prompt) - 1)]
            _, h = self.target.forward(chunk, self.cache, hidden=want_hidden)
            self.cached += len(chunk)
            kv.trim_to(self.cache, self.cached, have=self.cached)  # seal: nothing to take back
            mx.eval([c.state for c in self.cache] + ([h] if h is not None else []))
            if h is not None:
                hidden.append(h)
        if self.drafter is not None:
            h = mx.concatenate(hidden) if hidden else None
            self.drafter.commit(self._context(h, start), reuse)
        return reuse

    def draft(self, k: int, sampler: Sampler, *, split: bool = False) -> Draft:
        """Propose up to k tokens. They stay lazy: the device starts on them while the host
        builds the verify pass (split: wait for them here, so the draft is timed alone)."""
        if k == 0 or self.drafter is None:
            return Draft()
        draft = self.drafter.draft(self._context(), k, sampler)
        arrays = [draft.tokens] + ([draft.probs] if draft.probs is not None else [])
        (mx.eval if split else mx.async_eval)(arrays)
        return draft

    def verify(self, draft: Draft) -> tuple[mx.array, mx.array | None]:
        """One target forward over [pending, d_1..d_k]: logits [k+1, V] (and hidden [k+1, D]).
        The drafts enter as device arrays: no host round trip between drafting and verifying."""
        pending = mx.array(self.tokens[self.cached :], dtype=mx.int32)
        inputs = mx.concatenate([pending, draft.tokens]) if draft.k else pending
        logits, hidden = self.target.forward(inputs, self.cache, hidden=self._want_hidden)
        self.cached += inputs.shape[0]
        n = draft.k + 1
        return logits[-n:], (hidden[-n:] if hidden is not None else None)

    def commit(self, new: list[int], valid: int, hidden: mx.array | None, *,
               ahead: int = 0) -> None:
        """Append the round's kept tokens and cut every cache back to the committed sequence.

        valid: how many leading tokens the drafter saw as they are now committed.
        ahead: a plain step already running on the new pending token (decode), which the
        target cache keeps."""
        start = len(self.tokens) - 1  # position of the old pending token
        self.tokens.extend(new)
        if not ahead:  # (decode sealed the cache before its step ahead: nothing to cut)
            cut = kv.trim_to(self.cache, len(self.tokens) - 1, have=self.cached)
            if cut:  # evaluated here, so a recurrent rollback's cost is counted as commit time
                mx.eval(cut)
        self.cached = len(self.tokens) - 1 + ahead
        if self.drafter is not None:
            h = hidden[: len(new)] if hidden is not None else None
            self.drafter.commit(self._context(h, start), valid)

    @property
    def _want_hidden(self) -> bool | tuple[int, ...]:
        return self.drafter.needs_hidden if self.drafter is not None else False

    def decode(self, sampler: Sampler, plan: Callable[[], int]) -> Iterator[tuple[int, float]]:
        """Plain decoding (no drafts), pipelined as mlx-lm's generate_step: the next step is
        built on this step's still-lazy token before the host waits for it, so building a
        graph overlaps the device running the one before. Yields (token, seconds it took).

        plan(), asked before each token is read: what comes after it — 0 another plain step,
        anything else the end of the run. A step already built past the end (the turn
        stopped) is cut back, so the caches hold the committed sequence again."""
        t = time.perf_counter()  # from before the first step: on MLX's CPU backend a step may
        # run inside the call that builds it, so a clock started after it misses a whole step
        step = self._decode_step(mx.array(self.tokens[-1:], dtype=mx.int32), sampler)
        try:
            while True:
                more = plan() == 0
                ahead = None
                if more:
                    kv.trim_to(self.cache, self.cached, have=self.cached)  # seal: this step stays
                    ahead = self._decode_step(step.token, sampler, self._history(sampler, step))
                token, stands = self._read(step, sampler)
                if not stands:  # built on a discarded draw: commit cuts it back
                    ahead = None
                self.commit([token], len(self.tokens), step.hidden, ahead=ahead is not None)
                now = time.perf_counter()
                yield token, now - t
                if not more:
                    return
                t = time.perf_counter()
                if ahead is None:
                    ahead = self._decode_step(mx.array([token], dtype=mx.int32), sampler)
                step = ahead
        finally:
            committed = len(self.tokens) - 1
            if self.cached > committed and kv.can_trim_to(self.cache, committed,
                                                           have=self.cached):
                kv.trim_to(self.cache, committed, have=self.cached)
                self.cached = committed
            # else (a recurrent model without rollback) the cache holds one token more than
            # the invariant says; `cached` counts it, and the next prefill reuses or resets

    def _history(self, sampler: Sampler, step: _Step) -> Tokens:
        """What the step built ahead of `step` conditions on: the committed tokens, then
        step's own token, still lazy (only a repetition penalty reads it)."""
        if not sampler.uses_history:
            return []
        recent = self.tokens[max(0, len(self.tokens) - sampler.cfg.repetition_context + 1) :]
        return mx.concatenate([mx.array(recent, dtype=mx.int32), step.token.reshape(1)])

    def _decode_step(self, x: mx.array, sampler: Sampler, history: Tokens | None = None) -> _Step:
        """One target step on token x (lazy or not), after `history` (default: the committed
        tokens): the next token, lazy, started on the device; the step's hidden row for a
        hidden-state drafter; the sampler's check."""
        logits, h = self.target.forward(x, self.cache, hidden=self._want_hidden)
        self.cached += 1
        y, exact = sampler.next_token(logits[-1:], self.tokens if history is None else history)
        mx.async_eval([a for a in (y, h, exact) if a is not None])
        return _Step(y, h, exact, logits[-1:])

    def _read(self, step: _Step, sampler: Sampler) -> tuple[int, bool]:
        """The host reads a step's token (one sync, its check included): (token, whether it is
        the token the next step was built on). A token whose top-p candidates fell short is
        redrawn from the exact p; commit then cuts back a step built on the first draw. (The
        history is the step's own: a step is read before its token is committed.)"""
        if step.exact is None:
            return int(step.token.item()), True
        token, exact = mx.stack([step.token, step.exact.astype(mx.int32)]).tolist()
        if exact:
            return token, True
        return sampler.redraw(step.logits, self.tokens), False

    def _round(self, k: int, sampler: Sampler, s: _Counters, policy: AdaptiveDraftLength | None,
               keep: Callable[[list[int]], int]) -> Iterator[tuple[list[int], list[Kind]]]:
        """One speculative round: draft, verify, accept, commit the first keep(tokens) of its
        tokens (the turn may end inside it); yields them and their kinds."""
        split = policy is not None and policy.split()  # time draft and verify apart this round
        t = round_start = time.perf_counter()
        draft = self.draft(k, sampler, split=split)
        draft_s = time.perf_counter() - t
        t = time.perf_counter()
        logits, hidden = self.verify(draft)
        verdict = sampler.verify(logits, self.tokens, draft.tokens, draft.probs)
        verify_s = time.perf_counter() - t
        n, k = verdict.num_accepted, draft.k
        new = verdict.tokens[: keep(verdict.tokens)]
        t = time.perf_counter()
        self.commit(new, len(self.tokens) + min(n, len(new)), hidden)
        s.commit_s += time.perf_counter() - t
        s.add(k, n, draft_s, verify_s)
        if policy is not None:
            policy.observe(k, n, draft_s if split else None,
                           verify_seconds=verify_s if split else None,
                           round_seconds=time.perf_counter() - round_start, fed=draft.fed)
        last = Kind.TARGET if k == 0 else Kind.BONUS if n == k else Kind.CORRECTED
        yield new, ([Kind.ACCEPTED] * n + [last])[: len(new)]

    def _plain(self, sampler: Sampler, plan: Callable[[], int], s: _Counters,
               policy: AdaptiveDraftLength | None) -> Iterator[tuple[list[int], list[Kind]]]:
        """A run of plain decoding (decode), one token per target pass, until plan() ends it.
        The policy learns its cost from the whole run, first step included (see
        AdaptiveDraftLength.observe_plain), and each token ages its acceptance evidence."""
        total, tokens = 0.0, 0
        try:
            for token, seconds in self.decode(sampler, plan):
                s.add(0, 0, 0.0, seconds)
                total, tokens = total + seconds, tokens + 1
                if policy is not None:
                    policy.age()
                    if tokens == 64:  # a long run (speculation off) keeps r0 current too
                        policy.observe_plain(total, tokens)
                        total, tokens = 0.0, 0
                yield [token], [Kind.TARGET]
        finally:
            if policy is not None:
                policy.observe_plain(total, tokens)

    # -- a turn ----------------------------------------------------------------------------------

    def generate(
        self,
        prompt: list[int],
        *,
        max_tokens: int = 256,
        sampling: SamplingConfig | None = None,
        stop: threading.Event | None = None,
        ignore_eos: bool = False,
    ) -> Iterator[Event]:
        """Continue the conversation with `prompt` (the whole token sequence so far: a prefix
        shared with the previous turn is reused from the cache). Yields TokenEvents, then TurnEnd.
        ignore_eos: run to max_tokens through end-of-turn tokens (benchmarks, tests)."""
        if not prompt:
            raise MlxSpecError("the prompt is empty")
        if len(prompt) >= self.target.context_length:
            raise PromptTooLongError(
                f"prompt has {len(prompt)} tokens; the model's context is "
                f"{self.target.context_length}"
            )
        sampler = Sampler(sampling or SamplingConfig())
        k_max = self.num_draft
        policy = self._last_policy = self._policy(sampler.cfg.greedy)
        if policy is not None:
            policy.new_turn()  # a new prompt: the last turn's acceptance says less about it
        eos = set() if ignore_eos else self.eos
        decoder = IncrementalDecoder(self.tokenizer)
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        reused = self.prefill(prompt)
        prefill_s = time.perf_counter() - t0
        s = _Counters(k_max)
        generated: list[int] = []
        emitted: list[float] = []  # when each token was handed to the caller
        finish = "length"
        ttft = 0.0
        planned: int | None = None  # k chosen at the end of a plain run, for the round after

        def choose(ahead: int = 0) -> int:
            """k for the round after `ahead` more tokens; -1: the turn is over by then."""
            left = max_tokens - len(generated) - ahead
            length = len(self.tokens) + ahead
            if left <= 0 or length >= self.target.context_length or (
                    stop is not None and stop.is_set()):
                return -1
            limit = min(left - 1, self.target.context_length - length - 1)
            if self.drafter is None or limit <= 0:
                return 0
            return policy.choose(limit) if policy else min(k_max, limit)

        def plan() -> int:  # asked by a plain run before it reads each token
            nonlocal planned
            planned = choose(ahead=1)
            return planned

        while True:
            k = planned if planned is not None else choose()
            planned = None
            if k < 0:
                if stop is not None and stop.is_set():
                    finish = "cancelled"
                elif len(generated) < max_tokens:
                    finish = "context"
                break
            rounds = (self._plain(sampler, plan, s, policy) if k == 0 else self._round(
                k, sampler, s, policy, lambda new: _stop_point(new, max_tokens - len(generated),
                                                               eos)[0]))
            reason = ""
            with closing(rounds):  # a plain run stopped early cuts its extra step back
                for new, kinds in rounds:
                    cut, reason = _stop_point(new, max_tokens - len(generated), eos)
                    for tok, kind in zip(new[:cut], kinds[:cut], strict=True):
                        if tok in eos:
                            break
                        generated.append(tok)
                        emitted.append(time.perf_counter())
                        if not ttft:
                            ttft = emitted[-1] - t0
                        yield TokenEvent(tok, decoder.add(tok), kind)
                    if reason:
                        break
            if reason:
                finish = reason
                break

        self._materialize()
        p50, p90, worst = quantiles([b - a for a, b in zip(emitted, emitted[1:], strict=False)])
        stats = TurnStats(
            prompt_tokens=len(prompt),
            reused_tokens=reused,
            generated_tokens=len(generated),
            target_passes=s.passes,
            drafted=s.drafted,
            accepted=s.accepted,
            per_position_drafted=tuple(s.pos_drafted),
            per_position_accepted=tuple(s.pos_accepted),
            prefill_s=prefill_s,
            draft_s=s.draft_s,
            verify_s=s.verify_s,
            commit_s=s.commit_s,
            ttft_s=ttft,
            total_s=time.perf_counter() - t0,
            itl_p50_s=p50,
            itl_p90_s=p90,
            itl_max_s=worst,
            peak_memory=mx.get_peak_memory(),
            target_bytes=self.target.nbytes(),
            drafter_bytes=self.drafter.nbytes() if self.drafter is not None else 0,
            kv_cache_bytes=kv.nbytes(self.cache),
            drafter=self.drafter.name if self.drafter is not None else "none",
            num_draft=k_max if self.drafter is not None else 0,
            adaptive=policy is not None,
            finish_reason=finish,
        )
        yield TurnEnd(stats, finish, tuple(generated))


class _Step(NamedTuple):
    """A plain decoding step on the device: its token (lazy), hidden row, the sampler's lazy
    top-p check (None: nothing to check), and the logits a redraw would need."""

    token: mx.array
    hidden: mx.array | None
    exact: mx.array | None
    logits: mx.array


class _Counters:
    """Mutable tallies of a turn (frozen into TurnStats at its end)."""

    def __init__(self, k_max: int):
        self.passes = self.drafted = self.accepted = 0
        self.draft_s = self.verify_s = self.commit_s = 0.0
        self.pos_drafted = [0] * k_max
        self.pos_accepted = [0] * k_max

    def add(self, k: int, n: int, draft_s: float, verify_s: float) -> None:
        """A target pass that verified k drafts and accepted n."""
        self.passes += 1
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.drafted += k
        self.accepted += n
        for i in range(k):
            self.pos_drafted[i] += 1
            self.pos_accepted[i] += i < n


def _stop_point(new: list[int], remaining: int, eos: set[int]) -> tuple[int, str]:
    """How many of a round's tokens to keep: through an end-of-turn token, or up to max_tokens."""
    for i, tok in enumerate(new):
        if tok in eos:
            return i + 1, "stop"
        if i + 1 == remaining:
            return i + 1, "length"
    return len(new), ""


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
