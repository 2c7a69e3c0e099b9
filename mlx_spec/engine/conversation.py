"""One conversation on an engine's weights: its committed tokens, the target's caches, the
drafter's state for this conversation, the draft-length policy's evidence — and the verbs a
round is made of (prefill, draft, verify, commit, and plain decoding).

State between rounds: `tokens`, the committed sequence. Its last token is *pending*: the target
has not run on it yet, so the target cache holds exactly tokens[:-1] (`cached` counts what the
caches hold; the conversation keeps that count, since recurrent caches have no offset).

Every verb reads and writes this object only (its tokens, caches, drafter state), and a
round's inputs are device arrays, so a batch of conversations is one pass over their stacked
[pending, d_1..d_k] with the caches of each (batch.py), followed by each one's own `commit`.
A conversation does not drive itself: the turn loop (turn.py) and the batch driver (batch.py,
cycle.py) call its verbs; it knows nothing of them, nor of the Engine (what it reads of the
measured costs is a CostBook).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, NamedTuple

import mlx.core as mx

from ..drafters.base import Draft, DraftContext, Drafter
from ..model import TargetModel
from ..sampling import Sampler, Tokens
from ..spec import DraftLength, auto_max_draft, check_draft_length, max_draft_for
from .adaptive import AdaptiveDraftLength
from .costbook import CostBook
from .costs import LONGEST_TIMED_PASS
from .rounds import PrefillDue, Prefilled

PREFILL_CHUNK = 512
# `auto` copies (no drafting cost) as far as passes are timed
COPY_MAX_DRAFT = LONGEST_TIMED_PASS - 1


class Conversation:
    """A conversation's state beside shared weights (made by Engine.conversation())."""

    def __init__(self, target: TargetModel, tokenizer: Any, costbook: CostBook,
                 drafter: Drafter | None, draft_length: DraftLength, *,
                 kv_bits: int | None = None, eos: Iterable[int] = ()):
        check_draft_length(draft_length)
        self.target, self.tokenizer, self.costbook = target, tokenizer, costbook
        self.kv_bits = kv_bits
        self.drafter = drafter
        self.draft_length: DraftLength = draft_length  # k, or "auto" (chosen each round)
        # the longest draft any round may use
        self.max_draft = max_draft_for(draft_length, auto_max_draft(drafter))
        # one policy per drafter, per greedy / sampled (acceptance differs between them) and
        # per source of drafts (a lookup drafter's copies apart from its model's)
        self.policies: dict[tuple[str, bool], AdaptiveDraftLength] = {}
        self.policy: AdaptiveDraftLength | None = None  # the last turn's (None: a fixed k)
        self.copy_policy: AdaptiveDraftLength | None = None  # its copies' (lookup drafters)
        self.eos = set(eos)
        self._texts: dict[int, str] = {}  # text_of's: a traced round reads ~10 per draft
        self.reset()

    # -- state ---------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the conversation: empty caches, a fresh drafter state."""
        slack = max(16, 2 * (self.max_draft + 2))
        self.cache = self.target.make_cache(slack=slack, kv_bits=self.kv_bits)
        self.drafter_state: Any = None
        if self.drafter is not None:
            self.target.check_rollback(self.cache)
            self.drafter_state = self.drafter.new_state()
        self.tokens: list[int] = []
        self.cached = 0  # tokens the target cache holds

    def set_drafter(self, drafter: Drafter | None) -> None:
        """Switch drafters. The conversation is re-prefilled next turn, since a drafter that
        keeps state (an MTP cache) needs the target's hidden states of every position."""
        self.drafter = drafter
        self.max_draft = max_draft_for(self.draft_length, auto_max_draft(drafter))
        self.reset()

    def set_draft_length(self, draft_length: DraftLength) -> None:
        """Draft length for later turns: an int 1..MAX_DRAFT, or "auto"."""
        check_draft_length(draft_length)
        old = self.max_draft
        self.draft_length = draft_length
        self.max_draft = max_draft_for(draft_length, auto_max_draft(self.drafter))
        if self.max_draft > old:  # sliding-window caches need rollback slack for a longer round
            self.reset()

    @property
    def adaptive(self) -> bool:
        return self.draft_length == "auto"

    def policy_for(self, greedy: bool, *, copies: bool = False) -> AdaptiveDraftLength | None:
        """The adaptive draft-length policy for this drafter and this kind of sampling (copies:
        for a lookup drafter's copied rounds, which may copy up to COPY_MAX_DRAFT tokens: a copy
        costs nothing to draft, so how far pays is the verify pass's to say), on the engine's
        costs: measured, or a prior until they are (None with a fixed k, no drafter, or no
        copies to choose for)."""
        if not self.adaptive or self.drafter is None:
            return None
        if copies and not self.drafter.copies:
            return None
        name = self.drafter.name + ("/copies" if copies else "")
        reach = max(self.max_draft, COPY_MAX_DRAFT) if copies else self.max_draft
        key, costs = (name, greedy), self.costbook.costs(reach)
        policy = self.policies.get(key)
        if policy is None:
            policy = self.policies[key] = AdaptiveDraftLength(  # (a copy: no drafting cost)
                costs.verify, plain_cost=costs.plain, measured=costs.measured,
                draft_cost=0.0 if copies else None)
        elif costs.measured and not policy.measured:  # calibrated while idle since last turn
            policy.recalibrate(costs.verify, costs.plain)
        return policy

    def begin_turn(self, greedy: bool) -> None:
        """A turn begins: the draft-length policies it reads (per kind of sampling)."""
        self.policy = self.policy_for(greedy)
        self.copy_policy = self.policy_for(greedy, copies=True)

    def copy_ready(self) -> bool:
        """Would the drafter's next draft be a copy of the conversation's own text?"""
        return self.drafter is not None and self.drafter.copy_ready(self.drafter_state,
                                                                    self.tokens)

    def round_policy(self) -> AdaptiveDraftLength | None:
        """The policy that chooses the next round's k: the copies' where a copy is ready."""
        return self.copy_policy if self.copy_policy is not None and self.copy_ready() \
            else self.policy

    def materialize(self) -> None:
        """Evaluate every cached array before a turn ends. MLX streams are thread-local: a lazy
        array left in a cache would need the stream of the thread that built it, which may be
        gone when the next turn runs on another thread (as in the app)."""
        arrays = [c.state for c in self.cache]
        if self.drafter_state is not None:
            arrays.append(self.drafter_state.arrays())
        mx.eval(arrays)

    def drafter_bytes(self) -> int:
        """The drafter's weights and this conversation's drafter state."""
        if self.drafter is None:
            return 0
        return self.drafter.nbytes() + self.drafter_state.nbytes()

    def _context(self, hidden: mx.array | None = None, start: int = 0, *,
                 copy: bool = True) -> DraftContext:
        return DraftContext(self.target, self.tokens, self.cache, hidden, start, copy,
                            self.max_draft)

    def draft_context(self, *, copy: bool = True) -> DraftContext:
        """What the drafter reads to draft now (batch.draft_together drafts several); copy:
        a lookup drafter may copy this round (False: the planner chose its model)."""
        return self._context(copy=copy)

    @property
    def wants_hidden(self) -> bool | tuple[int, ...]:
        return self.drafter.needs_hidden if self.drafter is not None else False

    # -- the verbs -------------------------------------------------------------------------------

    def prefill(self, prompt: list[int]) -> int:
        """Make the cache hold prompt[:-1], reusing the longest prefix already cached.

        Returns how many prompt tokens were reused."""
        chunks = self.prefill_chunks(prompt)
        while True:
            try:
                next(chunks)  # each chunk runs alone
            except StopIteration as done:
                return done.value

    def prefill_chunks(self, prompt: list[int]) -> Generator[PrefillDue, Prefilled | None, int]:
        """`prefill`, yielding a PrefillDue before each chunk, so a driver of several
        conversations can run others' rounds between them, or run this chunk together with
        theirs (batch.prefill_together) and send back its Prefilled; sent None, the chunk
        runs alone (prefill_chunk). Returns the reused count."""
        reuse = min(_common_prefix(self.tokens, prompt), len(prompt) - 1, self.cached)
        want_hidden = self.wants_hidden
        # a hidden-state drafter next reads the row of the last reused position (the one that
        # predicts the first new token); if it no longer holds it, re-feed that one token
        start = reuse
        if want_hidden and reuse and not self.drafter_state.has_hidden(reuse - 1):
            start = reuse - 1
        if not self.target.can_trim(self.cache, start, have=self.cached):
            self.reset()  # e.g. a rewritten history on a recurrent model: recompute it all
            reuse = start = 0
        self.target.trim(self.cache, start, have=self.cached)
        self.tokens, self.cached = list(prompt), start
        hidden = []
        for i in range(start, len(prompt) - 1, PREFILL_CHUNK):
            chunk = prompt[i : min(i + PREFILL_CHUNK, len(prompt) - 1)]
            done = yield PrefillDue(chunk)
            h = done.hidden if done is not None else self.prefill_chunk(chunk, want_hidden)
            if h is not None:
                hidden.append(h)
        if self.drafter is not None:
            h = mx.concatenate(hidden) if hidden else None
            self.drafter.commit(self.drafter_state, self._context(h, start), reuse)
        return reuse

    def prefill_chunk(self, chunk: list[int], hidden: bool | tuple[int, ...]) -> mx.array | None:
        """One prompt chunk through the target alone; its hidden rows if wanted."""
        _, h = self.target.forward(chunk, self.cache, hidden=hidden)
        return self.prefilled(len(chunk), h)

    def prefilled(self, fed: int, hidden: mx.array | None) -> mx.array | None:
        """The cache took `fed` more prompt tokens (alone or in a batch's pass): sealed, none
        to be taken back, and computed now."""
        self.cached += fed
        self.target.trim(self.cache, self.cached, have=self.cached)
        mx.eval([c.state for c in self.cache] + ([hidden] if hidden is not None else []))
        return hidden

    def draft(self, k: int, sampler: Sampler, *, split: bool = False, copy: bool = True
              ) -> Draft:
        """Propose up to k tokens. They stay lazy: the device starts on them while the host
        builds the verify pass (split: wait for them here, so the draft is timed alone; copy:
        see draft_context)."""
        if k == 0 or self.drafter is None:
            return Draft()
        draft = self.drafter.draft(self.drafter_state, self._context(copy=copy), k, sampler)
        arrays = [draft.tokens] + ([draft.probs] if draft.probs is not None else [])
        (mx.eval if split else mx.async_eval)(arrays)
        return draft

    def text_of(self, token: int) -> str:
        """One token's text on its own (a trace's: a piece of a character may read as �)."""
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode([token])
        return text

    def verify(self, draft: Draft) -> tuple[mx.array, mx.array | None]:
        """One target forward over [pending, d_1..d_k]: logits [k+1, V] (and hidden [k+1, D]).
        The drafts enter as device arrays: no host round trip between drafting and verifying.
        Padded to the pass size measured cheaper (CostBook.pass_size): the padding's
        rows are not read, and the commit cuts their cache entries with the rejected drafts'.
        (batch.verify_together runs several conversations' in one pass.)"""
        inputs = self.pass_input(draft)
        q = inputs.shape[0]
        size = self.costbook.pass_size(q)
        if size > q:  # any token will do: nothing reads what follows it
            inputs = mx.concatenate([inputs, mx.repeat(inputs[-1:], size - q)])
        logits, hidden = self.target.forward(inputs, self.cache, hidden=self.wants_hidden)
        return self.took_pass(size, draft, logits[:q], hidden[:q] if hidden is not None else None)

    def pass_input(self, draft: Draft) -> mx.array:
        """What the verify pass feeds: the pending token(s), then the drafts."""
        pending = mx.array(self.tokens[self.cached :], dtype=mx.int32)
        return mx.concatenate([pending, draft.tokens]) if draft.k else pending

    def took_pass(self, fed: int, draft: Draft, logits: mx.array,
                 hidden: mx.array | None) -> tuple[mx.array, mx.array | None]:
        """The cache took `fed` more tokens (padding included); the k+1 distributions the
        round decides on are the last k+1 of the rows given."""
        self.cached += fed
        n = draft.k + 1
        return logits[-n:], (hidden[-n:] if hidden is not None else None)

    def drop_drafts(self) -> None:
        """Cut the drafter's state back to the committed sequence (a batched draft failed
        part-way: a draft model may have taken some of its steps)."""
        if self.drafter is not None:
            self.drafter.commit(self.drafter_state, self.draft_context(), len(self.tokens) - 1)

    def commit(self, new: list[int], valid: int, hidden: mx.array | None, *,
               ahead: bool = False) -> None:
        """Append the round's kept tokens and cut every cache back to the committed sequence.

        valid: how many leading tokens the drafter saw as they are now committed.
        ahead: a plain step already runs on the new pending token (decode), and the target
        cache keeps it."""
        start = len(self.tokens) - 1  # position of the old pending token
        self.tokens.extend(new)
        if not ahead:  # (decode sealed the cache before its step ahead: nothing to cut)
            cut = self.target.trim(self.cache, len(self.tokens) - 1, have=self.cached)
            if cut:  # evaluated here, so a recurrent rollback's cost is counted as commit time
                mx.eval(cut)
        self.cached = len(self.tokens) - 1 + ahead
        if self.drafter is not None:
            h = hidden[: len(new)] if hidden is not None else None
            self.drafter.commit(self.drafter_state, self._context(h, start), valid)

    def decode(self, sampler: Sampler, plan: Callable[[], bool]) -> Iterator[tuple[int, float]]:
        """Plain decoding (no drafts), pipelined as mlx-lm's generate_step: the next step is
        built on this step's still-lazy token before the host waits for it, so building a
        graph overlaps the device running the one before. Yields (token, seconds it took).

        plan(), asked before each token is read: whether another plain step follows it. A step
        already built past the end (the turn stopped) is cut back, so the caches hold the
        committed sequence again."""
        t = time.perf_counter()  # from before the first step: on MLX's CPU backend a step may
        # run inside the call that builds it, so a clock started after it misses a whole step
        step = self._decode_step(mx.array(self.tokens[-1:], dtype=mx.int32), sampler)
        try:
            while True:
                more = plan()
                ahead = None
                if more:
                    self.target.trim(self.cache, self.cached, have=self.cached)  # seal: it stays
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
            if self.cached > committed and self.target.can_trim(self.cache, committed,
                                                           have=self.cached):
                self.target.trim(self.cache, committed, have=self.cached)
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
        logits, h = self.target.forward(x, self.cache, hidden=self.wants_hidden)
        self.cached += 1  # = the position of the token this step draws
        y, exact = sampler.next_token(logits[-1:], self.tokens if history is None else history,
                                      position=self.cached)
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
        return sampler.redraw(step.logits, self.tokens, position=len(self.tokens)), False


class _Step(NamedTuple):
    """A plain decoding step on the device: its token (lazy), hidden row, the sampler's lazy
    top-p check (None: nothing to check), and the logits a redraw would need."""

    token: mx.array
    hidden: mx.array | None
    exact: mx.array | None
    logits: mx.array


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
