"""Choosing a model in the app: `ModelPicker` opens the welcome / model list (models.py), the
download screen when something is missing, and then hands the pair to the engine host to load,
with the drafter the user chose kept (`hub.Launch.spec`)."""

from __future__ import annotations

from typing import Any

from textual.app import App

from mlx_spec import MlxSpecError, hub

from .busy import Activity, Busy
from .engine_host import EngineHost
from .history import History
from .models import DEMO, GGUF, Choice, DownloadScreen, WelcomeScreen


class ModelPicker:
    """The model list, downloads, and what they load; `app` shows the screens and notices."""

    def __init__(self, app: App[Any], host: EngineHost, activity: Activity,
                 history: History) -> None:
        self._app, self._host, self._activity, self._history = app, host, activity, history

    def welcome(self, *, first_run: bool) -> None:
        """The demo and the presets; what is picked loads (downloading it first if needed)."""
        self._app.push_screen(WelcomeScreen(first_run=first_run), self._chosen)

    def _chosen(self, choice: Choice | None) -> None:
        self._history.set("welcomed", True)
        if choice is None:
            if self._host.engine is None:  # closed the welcome: the default, not nothing
                self._host.load_default()
        elif choice.name == DEMO:
            self._host.load_demo()
        elif choice.name.startswith(GGUF):  # a local GGUF: its drafter found as auto finds it
            self._host.load(self._host.requested.completed_by(
                model=choice.name.removeprefix(GGUF)))
        elif choice.downloaded:
            try:
                self.launch(hub.launch_for(choice.name))
            except MlxSpecError as e:  # e.g. removed meanwhile, or a tokenizer mismatch
                self._app.notify(str(e), title="Cannot open", severity="error", timeout=10)
        else:
            self.download(choice.name)

    def download(self, name: str) -> None:
        """The download screen for `name` (a preset or hub repo); then its pair loads."""
        self._activity.set(Busy.LOADING, f"downloading {name}")
        self._app.push_screen(DownloadScreen(name), self._pulled)

    def _pulled(self, launch: hub.Launch | None) -> None:
        if launch is not None:
            self.launch(launch)
        elif self._host.engine is None:
            self._app.notify("Download stopped; what arrived resumes next time.", timeout=8)
            self.welcome(first_run=False)
        else:
            self._activity.set(Busy.IDLE)

    def launch(self, launch: hub.Launch) -> None:
        """Load a downloaded pair: the user's spec on its target, the pair's drafter filling
        only what the user left unset (`mlx-spec chat NAME --drafter ngram` keeps n-gram)."""
        for warning in launch.warnings:
            self._app.notify(warning, severity="warning", timeout=10)
        self._host.load(launch.spec(self._host.requested))
