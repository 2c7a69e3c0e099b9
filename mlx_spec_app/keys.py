"""The one table of the app's actions: it makes the key bindings, the command palette's entries
and the help screen's key list (docs/APP.md repeats it)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class Action:
    key: str
    action: str  # SpecChatApp.action_<action>
    footer: str  # the footer's short label ("" = not in the footer)
    title: str  # the command palette's entry
    help: str  # the help screen's line


ACTIONS = (
    Action("escape", "stop", "stop", "Stop",
           "stop generating: the partial answer is kept, marked [stopped]"),
    Action("ctrl+r", "regenerate", "regenerate", "Regenerate", "regenerate the last answer"),
    Action("ctrl+n", "new_chat", "new chat", "New chat", "new chat"),
    Action("ctrl+o", "conversations", "history", "Conversations",
           "saved conversations: open / delete"),
    Action("ctrl+l", "models", "models", "Models",
           "models: the presets (downloading one if needed) and the offline demo"),
    Action("ctrl+b", "toggle_panel", "panel", "Toggle side panel",
           "side panel on / off (folded away below 100 columns)"),
    Action("ctrl+s", "settings", "settings", "Settings",
           "settings: sampling, draft length, drafter, system prompt"),
    Action("ctrl+t", "toggle_highlight", "highlight", "Toggle highlighting",
           "token highlighting on / off"),
    Action("ctrl+g", "toggle_markdown", "markdown", "Toggle Markdown",
           "last answer as Markdown / as coloured tokens"),
    Action("f5", "race", "race", "Race target-only",
           "race: the last prompt again, target-only; tok/s side by side"),
    Action("f10", "race_drafters", "", "Race another drafter",
           "race another drafter on the last prompt: both answers side by side, coloured"),
    Action("f2", "inspect", "inspect", "Inspect the last answer",
           "inspect the last answer: each token's p, q and round; the round timeline"),
    Action("f3", "toggle_ghosts", "", "Toggle rejected drafts",
           "rejected drafts (struck out before corrections) on / off"),
    Action("f4", "save_trace", "", "Save trace",
           "save the last answer's trace (a page for a browser, and JSON)"),
    Action("f8", "copy_answer", "", "Copy answer", "copy the last answer"),
    Action("f9", "copy_code", "", "Copy code block", "copy the last code block of the last answer"),
    Action("f1", "help", "help", "Keys", "this help"),
)

# keys the table does not bind itself (the prompt's own, Textual's)
OTHER_KEYS = (
    ("enter", "send the message"),
    ("ctrl+j", "new line in the message (also shift+enter where the terminal reports it)"),
    ("ctrl+p", "command palette (every action above)"),
    ("ctrl+q", "quit"),
)


def bindings() -> list[Binding]:
    return [Binding(a.key, a.action, a.footer or a.title.lower(), show=bool(a.footer))
            for a in ACTIONS]


def help_rows() -> list[tuple[str, str]]:
    """(key, what it does), in the order the help screen shows them."""
    return [OTHER_KEYS[0], OTHER_KEYS[1], *((a.key, a.help) for a in ACTIONS), *OTHER_KEYS[2:]]
