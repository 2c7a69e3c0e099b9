"""The engine's lifecycle in the app: `EngineHost` loads it (the remembered model, a picked or
pulled one, the demo; again after a crash), switches its drafter, measures while it is idle
(idle.py: its costs when they are not saved, the baseline once per engine) and closes it.
Each engine call runs in a thread worker on the app, one at a time; results come back to the
app as messages (EngineReady, LoadFailed, EngineSwitched, IdleDone), which it hands back to
the host.

The engine runs in a child process (mlx_spec.EngineProcess: its own GIL, so the UI's Python never
stalls it); MLX_SPEC_ENGINE=thread keeps it in this process instead (debugging).
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from textual.dom import DOMNode
from textual.message import Message

from mlx_spec import (
    Baseline,
    EngineInThread,
    EngineProcess,
    EngineService,
    LoadSpec,
    MlxSpecError,
    user_message,
)

from .busy import Activity, Busy
from .history import History
from .idle import IdleDone, IdleWork
from .settings import EngineChoice

LAST_MODEL = "last_model"  # the history preference that remembers the model to reopen
CLOSE_WAIT_S = 5.0  # at exit, how long idle work may take to stop (about one round)


class EngineReady(Message):
    """An engine is loaded. baseline: the one saved for it (None: not measured yet, idle work
    will). spec: what was loaded (None: the engine was handed to the app)."""

    def __init__(self, engine: EngineService, baseline: Baseline | None,
                 spec: LoadSpec | None = None) -> None:
        super().__init__()
        self.engine, self.baseline, self.spec = engine, baseline, spec


class LoadFailed(Message):
    """Loading `spec` failed: `text` is the one line the user reads."""

    def __init__(self, text: str, spec: LoadSpec) -> None:
        super().__init__()
        self.text, self.spec = text, spec


class EngineSwitched(Message):
    """Drafter / draft length changed (or failed to, with a message)."""

    def __init__(self, error: str | None = None) -> None:
        super().__init__()
        self.error = error


def start_engine(spec: LoadSpec) -> EngineService:
    """A new engine for `spec`: in a child process, or here with MLX_SPEC_ENGINE=thread."""
    if os.environ.get("MLX_SPEC_ENGINE") == "thread":
        return EngineInThread.load(spec)
    return EngineProcess.start(spec)


def demo_spec(user: LoadSpec) -> LoadSpec:
    """The bundled demo pair with the user's drafter kind and draft length (their draft model
    and MTP head belong to their own model)."""
    return replace(user, model=None, draft_model=None, mtp=None)


def default_spec(user: LoadSpec) -> LoadSpec:
    """What opens when nothing is named: the chat model installed with the app (SmolLM2-135M-
    Instruct's GGUF, from the `chat-model` dependency group; its head ships with mlx-spec and
    `auto` finds it) where it is here, else the bundled demo pair."""
    from mlx_spec.gguf import find_packaged

    packaged = find_packaged()
    if not packaged:
        return demo_spec(user)
    return replace(user, model=packaged[0].name, draft_model=None, mtp=None)


def remembered(spec: LoadSpec) -> dict[str, str | None]:
    """What reopens `spec`'s model next time: its files (local paths made absolute, hub ids as
    given). The drafter kind and draft length come from the command line each run."""

    def absolute(p: str | None) -> str | None:
        return str(Path(p).expanduser().resolve()) if p and Path(p).expanduser().exists() else p

    return {"model": absolute(spec.model), "draft_model": absolute(spec.draft_model),
            "mtp": absolute(spec.mtp)}


def recalled(saved: Any, user: LoadSpec) -> LoadSpec | None:
    """The saved last model (`remembered`'s dict, the one form the app has ever written) as
    `user`'s spec on it: a drafter the user chose is kept. None when nothing usable is saved."""
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), str):
        return None

    def path(key: str) -> str | None:
        value = saved.get(key)
        return value if isinstance(value, str) else None

    try:
        return user.completed_by(model=saved["model"], draft_model=path("draft_model"),
                                 mtp=path("mtp"))
    except MlxSpecError:  # a hand-edited record
        return None


class EngineHost:
    """The app's engine: which one runs, its baseline, what loaded it, a drafter change waiting
    for the engine to be idle, the idle work measuring it. `node` (the
    app) runs the workers and receives their messages."""

    def __init__(self, node: DOMNode, history: History, activity: Activity, requested: LoadSpec,
                 *, engine: EngineService | None = None,
                 baseline: Baseline | None = None) -> None:
        """requested: the user's spec (the command line's). engine / baseline: ones already
        loaded (tests, tools): used as they are, never closed here."""
        self._node, self._history, self._activity = node, history, activity
        self.requested = requested
        self.given = engine
        self.engine: EngineService | None = None
        self.baseline = baseline  # None: not measured yet (speedups read "estimating…")
        self._fixed = baseline is not None  # given with the engine: used as it is
        self._baseline_timed = False  # timed on the running engine (a saved one is, once more)
        self.calibrated = False  # the running engine's costs are measured
        self.idle = IdleWork(node)
        self._idle_failed = False  # idle work failed on this engine: not tried again
        self._closed = False
        self.loaded: LoadSpec | None = None  # what the running engine was loaded from
        self.pending: EngineChoice | None = None  # applied once the engine is idle

    def label(self) -> str:
        """The drafter and draft length, as the status line and the panel show them."""
        assert self.engine is not None
        info = self.engine.info
        if info.drafter == "none":
            return "no drafter"
        return f"{info.drafter}{'+lookup' if info.lookup else ''} k={info.draft_length}"

    def first_run(self) -> bool:
        """Nothing named, nothing remembered, never welcomed: the welcome screen opens."""
        return (self.requested.model is None and self._history.get(LAST_MODEL) is None
                and not self._history.get("welcomed"))

    # -- loading -------------------------------------------------------------------------------

    def load(self, spec: LoadSpec, *, remembered_ok: bool = False) -> None:
        """Start loading `spec` (with no model and remembered_ok: the last model used, if any;
        the demo pair if that one is gone)."""
        last = (recalled(self._history.get(LAST_MODEL), spec)
                if spec.model is None and remembered_ok else None)
        spec = last or (default_spec(spec) if spec.model is None and remembered_ok else spec)
        self._activity.set(Busy.LOADING, spec.label)
        self._node.run_worker(partial(self._load, spec, last is not None), thread=True,
                              exclusive=True, group="load")

    def load_demo(self) -> None:
        self.load(demo_spec(self.requested))

    def load_default(self) -> None:
        """The chat model installed with the app, else the demo (default_spec)."""
        self.load(default_spec(self.requested))

    def _load(self, spec: LoadSpec, remembered_model: bool) -> None:
        """Worker: start the engine and post EngineReady with its saved baseline, if any (or
        LoadFailed). Nothing is measured first: the user can type once the model is loaded."""
        self.idle.yield_engine()  # the engine being replaced stops its idle work
        try:
            try:
                engine = start_engine(spec)
            except MlxSpecError:
                if not remembered_model:
                    raise
                spec = default_spec(replace(spec, model=None))  # the remembered one is gone
                engine = start_engine(spec)
            self._node.post_message(EngineReady(engine, engine.info.baseline, spec))
        except Exception as e:  # noqa: BLE001 - the user gets one line, never a traceback
            self._node.post_message(LoadFailed(user_message(e, "cannot load"), spec))

    def adopt(self, ready: EngineReady) -> bool:
        """Take the engine that just loaded; True when it replaced another (now closed)."""
        replaced = self.engine is not None and self.engine is not ready.engine
        if replaced:
            self._close(self.engine)
            self.pending = None  # chosen for the old engine
        self.engine, self.baseline = ready.engine, ready.baseline
        self.calibrated, self._idle_failed = ready.engine.info.calibrated, False
        self._baseline_timed = self._fixed and ready.engine is self.given
        if ready.spec is not None:  # remember what loaded (None: the demo pair)
            self.loaded = ready.spec
            self._history.set(LAST_MODEL, remembered(ready.spec) if ready.spec.model else None)
        return replaced

    def restart_if_dead(self) -> bool:
        """After a failed turn: if the engine process died (out of memory, killed), start a new
        one from the same spec, so the chat goes on without restarting the app."""
        dead = self.engine
        if dead is None or getattr(dead, "alive", True):
            return False
        self.engine = None
        self._close(dead)
        self.load(self.loaded or self.requested)
        return True

    def _close(self, engine: EngineService | None) -> None:
        if engine is not None and engine is not self.given:
            engine.close()

    def close(self) -> None:
        """The app ends: stop idle work (waiting a little for it), close the engine it started."""
        self._closed = True
        self.idle.yield_engine(CLOSE_WAIT_S)
        self._close(self.engine)

    # -- idle work -------------------------------------------------------------------------------

    def work_while_idle(self) -> None:
        """The engine is idle: measure its costs if they are not saved, then time its baseline
        once (a saved one is joined by this session's: see Baseline) until a user's call stops
        it. Nothing when busy, closed or already failed."""
        if self.engine is None or self._activity.state or self._closed or self._idle_failed:
            return
        self.idle.start(self.engine, calibrate=not self.calibrated,
                        baseline=not self._baseline_timed)

    def took(self, done: IdleDone) -> bool:
        """Keep what idle work measured on the running engine; True when a baseline came."""
        if done.engine is not self.engine:
            return False  # an engine closed since
        self.calibrated = self.calibrated or done.calibrated
        self._idle_failed = bool(done.error)
        if done.baseline is None and done.error and self.baseline is None:
            # not tried again on this engine: speedups say "not measured", never estimating
            # forever (a baseline of 0 tok/s whose method is the reason)
            self.baseline = Baseline(0.0, 0, done.error)
            return True
        if done.baseline is None:
            return False
        self.baseline, self._baseline_timed = done.baseline, True
        return True

    # -- drafter and draft length ------------------------------------------------------------

    def switch(self, choice: EngineChoice) -> None:
        """Change drafter / draft length now (the engine is idle)."""
        self._activity.set(Busy.SWITCHING, f"to {choice.drafter}")
        assert self.engine is not None
        self._node.run_worker(partial(self._configure, self.engine, choice), thread=True,
                              exclusive=True, group="gen")

    def switch_pending(self) -> None:
        """The engine is idle again: apply a change chosen while it was busy."""
        if self.pending is not None:
            choice, self.pending = self.pending, None
            self.switch(choice)

    def _configure(self, engine: EngineService, choice: EngineChoice) -> None:
        self.idle.yield_engine()
        try:
            engine.configure(drafter=choice.drafter, draft_length=choice.draft_length)
            self._node.post_message(EngineSwitched())
        except Exception as e:  # noqa: BLE001 - one line for the user, never a traceback
            self._node.post_message(EngineSwitched(user_message(e, "cannot switch")))
