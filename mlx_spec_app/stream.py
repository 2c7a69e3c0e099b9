"""What crosses from the engine's worker threads to the UI thread.

Tokens go through `TokenBuffer`, which the UI drains on a timer paced by `FramePacer`: one
`call_from_thread` per token would block the engine on the UI's event loop every token (DESIGN.md,
"Measurements": the ceiling it put on decoding). Rare events (engine ready, turn end, failures) are
posted as messages (engine_host.py, chat_pane.py).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from mlx_spec import RoundTrace, TokenEvent, rejected_text

# Characters Textual's Content strips from text. Removed before spans are computed, so the
# span offsets of coloured tokens stay aligned with the text that is displayed.
_STRIPPED = dict.fromkeys([7, 8, 11, 12, 13])


def clean(text: str) -> str:
    return text.translate(_STRIPPED)


class TokenBuffer:
    """Tokens produced by the worker, waiting for the UI's next flush, as (text, kind) pieces;
    a traced round's rejected drafts come as a piece of kind "rejected" just before the
    target's correction (the round is announced before its tokens: push_round).

    deque.append and deque.popleft are atomic, so the worker never waits for the UI."""

    def __init__(self) -> None:
        self._items: deque[tuple[str, str]] = deque()
        self._ghost: tuple[int, str] | None = None  # (tokens until the correction, its ghost)

    def push_round(self, round_: RoundTrace) -> None:
        """The round whose tokens come next: where it rejected a draft that its correction
        follows, the drafts it threw away go in just before that correction."""
        lost = rejected_text(round_) if round_.accepted < round_.emitted else ""
        self._ghost = (round_.accepted, clean(lost)) if lost else None

    def push(self, event: TokenEvent) -> None:
        if self._ghost is not None:
            ahead, lost = self._ghost
            if ahead == 0:
                self._items.append((lost, "rejected"))
                self._ghost = None
            else:
                self._ghost = (ahead - 1, lost)
        self._items.append((clean(event.text), event.kind.value))

    def reset(self) -> None:
        """Empty, for a new turn."""
        self._items.clear()
        self._ghost = None

    def drain(self) -> list[tuple[str, str]]:
        out = []
        items = self._items
        while items:
            out.append(items.popleft())
        return out

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class FramePacer:
    """How long to wait before the next flush, so that the UI thread's share of one core stays
    under `budget` while an answer streams.

    Every millisecond the UI thread computes is taken from the engine: on a small machine the
    two share the GIL and the cores. A Textual frame (paint, and now and then a layout pass)
    costs several times more CPU on a slow 2-core x86 than on an M-series Mac, so a fixed
    frame rate is either wasteful there or too slow here. The pacer measures instead: if the UI
    thread spent `c` seconds of CPU since the previous flush (the flush itself, the paint and
    layout it caused, any other event), the next flush waits c / budget, which holds the UI's
    average share at `budget`, bounded between `fastest` and `slowest`."""

    budget: float = 0.03
    fastest: float = 1 / 30
    slowest: float = 0.25
    frames: int = 0  # flushes since start(); the UI thread's CPU and wall seconds over them
    cpu_s: float = 0.0
    wall_s: float = 0.0
    _cpu: float = 0.0
    _wall: float = 0.0

    def start(self) -> float:
        """Call on the UI thread when streaming starts; returns the first delay."""
        self._cpu, self._wall = time.thread_time(), time.perf_counter()
        self.frames, self.cpu_s, self.wall_s = 0, 0.0, 0.0
        return self.fastest

    def next_delay(self) -> float:
        """Call on the UI thread at each flush: the delay until the next one."""
        cpu, self._cpu = self._cpu, time.thread_time()
        wall, self._wall = self._wall, time.perf_counter()
        self.frames += 1
        self.cpu_s += self._cpu - cpu
        self.wall_s += self._wall - wall
        return self.delay_for(self._cpu - cpu)

    @property
    def share(self) -> float:
        """The UI thread's share of one core while streaming, so far."""
        return self.cpu_s / self.wall_s if self.wall_s else 0.0

    def delay_for(self, cpu_s: float) -> float:
        return min(self.slowest, max(self.fastest, cpu_s / self.budget))

