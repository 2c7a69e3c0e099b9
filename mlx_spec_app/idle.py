"""Work for an idle engine: measure the target's costs (what `--draft-length auto` reads) when they
are not saved for this model on this device yet, and time the target-only baseline the speedups
are quoted against once per engine (it joins the measurements saved by earlier sessions: one
measurement can be far off, their median holds). The engine saves both.

`IdleWork` runs them in a thread worker while no turn runs and gives way to every engine call
the user starts: `stop()` sets its stop event (the engine checks it between rounds), and
`yield_engine()` also waits until the worker has returned, about one round later. What it
measured comes back as one `IdleDone` message, never a call from its thread per step.
"""

from __future__ import annotations

import threading
from functools import partial

from textual.dom import DOMNode
from textual.message import Message

from mlx_spec import Baseline, EngineService, user_message


class IdleDone(Message):
    """Idle work on `engine` returned. calibrated: its costs are measured; baseline: the one
    measured now (None: not measured this time); stopped: a stop ended it early; error: the one
    line why it failed ("" when it did not)."""

    def __init__(self, engine: EngineService, *, calibrated: bool, baseline: Baseline | None,
                 stopped: bool, error: str = "") -> None:
        super().__init__()
        self.engine, self.calibrated, self.baseline = engine, calibrated, baseline
        self.stopped, self.error = stopped, error


class IdleWork:
    """At most one idle worker at a time on `node` (the app), and the means to stop it."""

    def __init__(self, node: DOMNode) -> None:
        self._node = node
        self._stop = threading.Event()
        self._done = threading.Event()  # set while no worker runs
        self._done.set()

    @property
    def running(self) -> bool:
        """A worker has started and not returned yet."""
        return not self._done.is_set()

    def start(self, engine: EngineService, *, calibrate: bool, baseline: bool) -> bool:
        """Measure what is missing on `engine` (idle now): its costs (calibrate), then its
        baseline. False when there is nothing to measure or a worker already runs."""
        if self.running or not (calibrate or baseline):
            return False
        self._stop = threading.Event()  # one per worker: a stop meant for the last cannot leak
        self._done.clear()
        self._node.run_worker(partial(self._work, engine, self._stop, calibrate, baseline),
                              thread=True, group="idle", exit_on_error=False)
        return True

    def _work(self, engine: EngineService, stop: threading.Event, calibrate: bool,
              baseline: bool) -> None:
        """Worker: calibrate, then measure the baseline, each only if nothing stopped it; post
        an IdleDone with what came of it."""
        calibrated, measured, error = not calibrate, None, ""
        try:
            if calibrate and not stop.is_set():
                calibrated = engine.calibrate(stop=stop)
            if calibrated and baseline and not stop.is_set():
                measured = engine.measure_baseline(stop=stop)
        except Exception as e:  # noqa: BLE001 - one line for the user, never a traceback
            error = user_message(e, "cannot measure the baseline")
        finally:
            self._done.set()
        self._node.post_message(IdleDone(engine, calibrated=calibrated, baseline=measured,
                                         stopped=stop.is_set(), error=error))

    def stop(self) -> None:
        """Ask the worker to stop (it returns within about one round); does not wait."""
        self._stop.set()

    def yield_engine(self, timeout: float | None = None) -> bool:
        """Stop the worker and wait until it has returned: call it in a thread before a user's
        engine call (calls on one engine must not overlap), or at exit with a timeout. True
        when no worker runs any more."""
        self.stop()
        return self._done.wait(timeout)
