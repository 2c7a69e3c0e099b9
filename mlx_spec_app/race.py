"""The race command: the last prompt again on a drafter-less engine, both speeds side by side."""

from __future__ import annotations

import threading

from textual import work

from mlx_spec import EngineService, MlxSpecError, TurnEnd

from .settings import Settings
from .stream import RaceDone, TurnFailed, one_line
from .widgets import Answer

RACING = "racing target-only…"


class LastTurn:
    """What the race re-runs (the conversation before the answer), and what it compares with."""

    def __init__(self, messages: list[dict[str, str]], end: TurnEnd, answer: Answer) -> None:
        self.messages, self.end, self.answer = messages, end, answer


class RaceMixin:
    """For SpecChatApp. The race runs target-only on an engine that shares the target's weights
    (EngineService.chat(target_only=True)), so the main engine's drafter and caches are never
    touched: nothing to restore afterwards."""

    engine: EngineService | None
    settings: Settings
    last_turn: LastTurn | None
    stop_event: threading.Event

    def action_race(self) -> None:
        if not self._can_start():
            return
        if self.last_turn is None:
            self.notify("Race needs a finished answer first.", severity="warning")
            return
        self.stop_event = threading.Event()
        self.set_busy(RACING)
        self._race(self.last_turn.messages, self.settings,
                   max(self.last_turn.end.stats.generated_tokens, 1), self.stop_event)

    @work(thread=True, exclusive=True, group="gen")
    def _race(self, messages: list[dict[str, str]], settings: Settings, tokens: int,
              stop: threading.Event) -> None:
        engine = self.engine
        assert engine is not None
        try:
            for ev in engine.chat(messages, max_tokens=tokens, sampling=settings.sampling,
                                  stop=stop, target_only=True):
                if isinstance(ev, TurnEnd):
                    self.post_message(RaceDone(ev))
        except Exception as e:  # noqa: BLE001 - one line for the user, never a traceback
            self.post_message(TurnFailed(str(e) if isinstance(e, MlxSpecError)
                                         else one_line(e), title="Race failed"))

    def on_race_done(self, msg: RaceDone) -> None:
        self.set_busy("")
        last = self.last_turn
        if last is None:
            return
        line = race_line(last.end, msg.end, self.settings.sampling.temperature == 0)
        if last.answer.is_attached:
            last.answer.show_race(line)
        self.notify(line, title="Race", timeout=8)


def race_line(spec: TurnEnd, plain: TurnEnd, greedy: bool) -> str:
    """Both runs' speed side by side; for greedy runs, whether the tokens were the same."""
    if plain.finish_reason == "cancelled":
        return "race stopped"
    a, b = spec.stats, plain.stats
    line = (f"race · speculative ({a.drafter}) {a.tok_s:.1f} tok/s │ target-only "
            f"{b.tok_s:.1f} tok/s │ ×{a.tok_s / b.tok_s if b.tok_s else 0:.2f}")
    if greedy:
        n = min(len(spec.tokens), len(plain.tokens))
        same = spec.tokens[:n] == plain.tokens[:n]
        line += " │ same tokens" if same else " │ outputs differ (a near-tie)"
    return line
