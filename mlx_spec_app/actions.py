"""SpecChatApp's actions that are not a turn: view toggles and copying, settings, history."""

from __future__ import annotations

import re
from dataclasses import replace

from textual import work
from textual.containers import VerticalScroll

from mlx_spec import EngineService, MlxSpecError

from .history import History
from .screens import HelpScreen, HistoryScreen, SettingsScreen
from .settings import Settings
from .stream import EngineSwitched, one_line
from .widgets import Answer, UserMessage, stats_from_dict, stats_line

CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)


class ViewActions:
    """Highlighting, Markdown, copying, help."""

    answer: Answer | None  # the answer being streamed, if any
    highlight: bool

    def action_toggle_highlight(self) -> None:
        self.highlight = not self.highlight
        for answer in self.query(Answer):
            answer.set_highlight(self.highlight)
        self.query_one("#legend").set_class(not self.highlight, "off")

    def _last_answer(self) -> Answer | None:
        answers = [a for a in self.query(Answer) if a is not self.answer]  # finished ones
        return answers[-1] if answers else None

    def action_toggle_markdown(self) -> None:
        answer = self._last_answer()
        if answer is None:
            self.notify("No finished answer yet.", severity="warning")
            return
        answer.toggle_markdown()

    def action_copy_answer(self) -> None:
        answer = self._last_answer()
        if answer is None or not answer.text:
            self.notify("No answer to copy.", severity="warning")
            return
        self.copy_to_clipboard(answer.text)
        self.notify(f"Copied the answer ({len(answer.text)} characters).")

    def action_copy_code(self) -> None:
        answer = self._last_answer()
        blocks = CODE_BLOCK.findall(answer.text) if answer is not None else []
        if not blocks:
            self.notify("No code block in the last answer.", severity="warning")
            return
        self.copy_to_clipboard(blocks[-1])
        self.notify(f"Copied the code block ({len(blocks[-1].splitlines())} lines).")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


class SettingsActions:
    """Sampling, system prompt and answer length apply to the next turn. Drafter and draft
    length change the engine, so they are applied by a worker while the engine is idle."""

    engine: EngineService | None
    settings: Settings
    history: History
    busy: str
    _pending_engine: tuple[int | str, str] | None = None

    def action_settings(self) -> None:
        if self.engine is None:
            self.notify("The model is not loaded yet.", severity="warning")
            return
        self.push_screen(SettingsScreen(self.settings, list(self.engine.info.drafters)),
                         self.apply_settings)

    def _engine_part(self) -> tuple[int | str, str]:
        assert self.engine is not None
        info = self.engine.info
        return info.num_draft, info.drafter

    def apply_settings(self, new: Settings | None) -> None:
        if new is None:
            return
        self.settings = new
        self.history.set("settings", new.saved())
        if new.engine_part() == self._engine_part():
            self.notify("Settings saved.")
        elif self.busy:
            self._pending_engine = new.engine_part()
            self.notify("Drafter / draft length change: after this answer.")
        else:
            self._switch(*new.engine_part())

    def _apply_pending(self) -> None:
        if self._pending_engine is not None:
            pending, self._pending_engine = self._pending_engine, None
            self._switch(*pending)

    def _switch(self, num_draft: int | str, kind: str) -> None:
        self.set_busy(f"switching to {kind}…")
        self._switch_worker(num_draft, kind)

    @work(thread=True, exclusive=True, group="gen")
    def _switch_worker(self, num_draft: int | str, kind: str) -> None:
        assert self.engine is not None
        try:
            self.engine.configure(drafter=kind, num_draft=num_draft)
            self.post_message(EngineSwitched())
        except Exception as e:  # noqa: BLE001 - one line for the user, never a traceback
            self.post_message(EngineSwitched(str(e) if isinstance(e, MlxSpecError)
                                             else one_line(e)))

    def on_engine_switched(self, msg: EngineSwitched) -> None:
        num_draft, kind = self._engine_part()
        self.settings = replace(self.settings, num_draft=num_draft, drafter=kind)
        self._show_engine()
        self.set_busy("")
        if msg.error:
            self.notify(msg.error, title="Drafter not changed", severity="error", timeout=10)
        else:
            self.notify(f"Now: {self._engine_label()}.")


class HistoryActions:
    """Saved conversations: open one (the engine re-prefills it on the next turn by itself),
    or delete."""

    history: History
    busy: str
    engine: EngineService | None
    conversation: int | None
    messages: list[dict[str, str]]
    highlight: bool

    def action_conversations(self) -> None:
        if self.busy and self.engine is not None:
            self.notify("Busy: press esc to stop first.", severity="warning")
            return
        self.push_screen(HistoryScreen(self.history), self.open_conversation)

    def open_conversation(self, conversation: int | None) -> None:
        if conversation is None:
            if self.conversation is not None and not self.history.exists(self.conversation):
                self._clear_chat()  # the open conversation was just deleted
            return
        self._clear_chat()
        self.conversation = conversation
        chat = self.query_one("#chat", VerticalScroll)
        for m in self.history.messages(conversation):
            self.messages.append({"role": m["role"], "content": m["content"]})
            chat.mount(UserMessage(m["content"]) if m["role"] != "assistant"
                       else self._saved_answer(m))
        chat.anchor()

    def _saved_answer(self, m: dict) -> Answer:
        answer = Answer(self.highlight)
        answer.extend([(text, kind) for text, kind in m["kinds"] or [[m["content"], "target"]]])
        stats = stats_from_dict(m["stats"]) if m["stats"] else None
        # no speedup: the baseline measured now is not the one the answer was timed against
        answer.finish(stats, (stats_line(stats, None) + " · saved") if stats else "saved")
        answer.partial = m["partial"]
        return answer
