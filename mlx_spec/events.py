"""Typed events yielded by generation, and the per-turn statistics."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum


class Kind(StrEnum):
    """What happened to a token."""

    ACCEPTED = "accepted"  # drafted, and the target agreed
    CORRECTED = "corrected"  # the target's own token at the first rejected draft position
    BONUS = "bonus"  # the target's extra token after all k drafts were accepted
    TARGET = "target"  # produced by the target in a round without drafts


def acceptance_rate(accepted: int, drafted: int) -> float:
    """Accepted drafts over drafted ones (0 when nothing was drafted)."""
    return accepted / drafted if drafted else 0.0


def tokens_per_pass(tokens: int, passes: int) -> float:
    """Emitted tokens per target pass: 1 for plain decoding, up to k + 1 for a round."""
    return tokens / passes if passes else 0.0


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str  # UTF-8 safe fragment: may be "" while a multi-byte character is incomplete
    kind: Kind


@dataclass(frozen=True)
class TurnStats:
    """Everything measured in one turn. Times in seconds, memory in bytes."""

    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens already in the cache from earlier turns
    generated_tokens: int = 0
    target_passes: int = 0  # verify forwards (prefill not counted)
    drafted: int = 0
    accepted: int = 0
    per_position_drafted: tuple[int, ...] = ()
    per_position_accepted: tuple[int, ...] = ()
    prefill_s: float = 0.0
    # until the drafts are handed to the verify pass / until its verdict is read: with one
    # host sync per round the drafter's device work lands in verify_s, except in the rounds
    # `auto` times in parts; plain-decoding steps count as verify
    draft_s: float = 0.0
    verify_s: float = 0.0
    commit_s: float = 0.0  # cutting caches back to the accepted prefix (recurrent: replays)
    ttft_s: float = 0.0
    total_s: float = 0.0
    # inter-token latency, between consecutive tokens as the caller received them: speculation
    # emits a round's tokens in one burst, so the median can be ~0 while the tail is a round
    itl_p50_s: float = 0.0
    itl_p90_s: float = 0.0
    itl_max_s: float = 0.0
    peak_memory: int = 0
    target_bytes: int = 0  # of this machine's part, when the target is split
    drafter_bytes: int = 0
    kv_cache_bytes: int = 0
    drafter: str = "none"
    max_draft: int = 0  # the longest draft a round could use: k, or auto's ceiling
    adaptive: bool = False
    finish_reason: str = ""
    ranks: int = 1  # machines the target is split over
    split: str = ""  # how, e.g. "pipeline over 2 ranks (ring)"

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def produced_tokens(self) -> int:
        """The tokens the target passes produced: the answer's, and the end-of-turn token that
        ended it (its pass is counted; the token is not shown). Without it a short answer read
        below 1 token per pass on target-only decoding ("Paris." in 7 tokens: 7 / 8)."""
        return self.generated_tokens + (self.finish_reason == "stop")

    @property
    def tokens_per_pass(self) -> float:
        return tokens_per_pass(self.produced_tokens, self.target_passes)

    @property
    def per_position_acceptance(self) -> tuple[float, ...]:
        return tuple(
            a / d if d else 0.0
            for a, d in zip(self.per_position_accepted, self.per_position_drafted, strict=True)
        )

    @property
    def mean_draft(self) -> float:
        """Drafted tokens per target pass (the k actually used, on average)."""
        return self.drafted / self.target_passes if self.target_passes else 0.0

    @property
    def generation_s(self) -> float:
        return max(self.total_s - self.prefill_s, 1e-9)

    @property
    def tok_s(self) -> float:
        return self.generated_tokens / self.generation_s if self.generated_tokens else 0.0

    @classmethod
    def from_dict(cls, d: dict) -> TurnStats:
        """Back from to_dict() (saved history does that), ignoring the derived fields; a
        history saved before max_draft had that name calls it num_draft."""
        names = {f.name for f in fields(cls)}
        d = {"max_draft": d["num_draft"], **d} if "num_draft" in d else d
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()
                      if k in names})

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            tokens_per_pass=self.tokens_per_pass,
            mean_draft=self.mean_draft,
            per_position_acceptance=list(self.per_position_acceptance),
            generation_s=self.generation_s,
            tok_s=self.tok_s,
        )
        return d


@dataclass(frozen=True)
class Choice:
    """A token and its probability under one distribution (a top-5 entry)."""

    token: int
    text: str
    prob: float


@dataclass(frozen=True)
class Row:
    """One row of a round's verify pass, as the acceptance test saw it.

    Row i holds the target's distribution p after the round's first i drafts and, for i < k,
    draft i with the drafter's q. p is the distribution the test used: the processed one
    (temperature, top-k / top-p, penalty) when sampling; when greedy the test is the argmax, and
    p is the target's plain softmax (T = 1), so a near-tie shows as one. q is None where the
    drafter reports no distribution (greedy drafting, a copy)."""

    draft: int | None  # the drafted token (None: the last row, which only the target fills)
    draft_text: str
    verdict: str  # "accepted", "rejected", "untested" (after a rejection), "" (no draft)
    p: float | None  # p(draft)
    q: float | None  # q(draft)
    token: int | None  # what this row emitted (accepted draft, correction, bonus), None: nothing
    token_text: str
    p_token: float | None  # p(token)
    top_p: tuple[Choice, ...] = ()
    top_q: tuple[Choice, ...] = ()

    @property
    def chance(self) -> float | None:
        """min(1, p/q): the probability the sampled test accepted the draft with."""
        if self.p is None or not self.q:
            return None
        return min(1.0, self.p / self.q)


@dataclass(frozen=True)
class RoundTrace:
    """What one round did, yielded just before its tokens when a turn is traced (trace=True).

    The round drafted k tokens, the target accepted the first `accepted` and added its own; of
    those, the next `emitted` TokenEvents come from it (the turn may end inside a round). rows
    are its verify pass's rows (empty for a pipelined plain step, whose logits are never read).
    Times in seconds; at_s: when the round started, from the turn's start."""

    index: int
    k: int
    accepted: int
    emitted: int
    drafted: tuple[int, ...]
    copied: bool  # the drafts were a copy of the conversation's own text (lookup)
    rule: str  # "argmax" (greedy), "p/q" (rejection sampling), "gumbel" (seeded, invariant)
    at_s: float
    draft_s: float
    verify_s: float
    commit_s: float
    rows: tuple[Row, ...] = ()

    @property
    def rejected(self) -> tuple[Row, ...]:
        """The drafts the target threw away: the rejected one and the untested ones after it."""
        return tuple(r for r in self.rows if r.verdict in ("rejected", "untested"))


@dataclass(frozen=True)
class TurnEnd:
    """The last event of a turn."""

    stats: TurnStats
    finish_reason: str  # "stop" (end-of-turn token), "length", "context", "cancelled"
    tokens: tuple[int, ...] = field(default=())


Event = TokenEvent | RoundTrace | TurnEnd
