"""What the engine is doing, in one place: `Activity`, owned by the app and changed by the engine
lifecycle (loading, switching) and by the app around the chat pane's turns.

While a turn streams the garbage collector only looks at objects made since it started (see
`Activity.set`): the UI thread's time is the engine's on a small machine.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from enum import Enum
from typing import Any

COLLECT_AFTER_S = 1.0  # once idle this long, one full collection of what the turn left


class Busy(Enum):
    """What the engine is doing; falsy when idle."""

    IDLE = ""
    LOADING = "loading"
    SWITCHING = "switching"
    GENERATING = "generating"
    RACING = "racing target-only…"
    NOT_LOADED = "model not loaded"

    def __bool__(self) -> bool:
        return self is not Busy.IDLE

    @property
    def streaming(self) -> bool:
        """The engine runs a turn (esc stops it)."""
        return self in (Busy.GENERATING, Busy.RACING)


class Activity:
    """The engine's current `Busy` state and its detail (e.g. the model being loaded).

    changed(): called after every change (the app redraws its status line).
    later(delay, callback): a timer (the app's set_timer), for the collection once idle."""

    def __init__(self, changed: Callable[[], None],
                 later: Callable[[float, Callable[[], None]], Any]) -> None:
        self.state = Busy.LOADING
        self.detail = ""
        self._changed, self._later = changed, later

    @property
    def status(self) -> str:
        """The state with its detail, as the status line and refusals say it."""
        return f"{self.state.value} {self.detail}…" if self.detail else self.state.value

    def set(self, state: Busy, detail: str = "") -> None:
        """Move to `state`. Entering a turn freezes the garbage collector's old objects: a full
        collection scans every widget and style the app holds (100+ ms of UI thread here, in
        one go). Leaving it unfreezes them, and a collection runs once the engine is idle."""
        if state.streaming != self.state.streaming:
            if state.streaming:
                gc.freeze()
            else:
                gc.unfreeze()
                self._later(COLLECT_AFTER_S, self._collect_when_idle)
        self.state, self.detail = state, detail
        self._changed()

    def _collect_when_idle(self) -> None:
        if not self.state.streaming:
            gc.collect()
