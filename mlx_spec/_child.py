"""The engine's child process: `python -m mlx_spec._child READ_FD WRITE_FD` (see process.py).

Loads on `Load`, then answers requests one at a time until `Close` or the pipe closes."""

from __future__ import annotations

import signal
import sys
from multiprocessing.connection import Connection

from mlx_spec.errors import MlxSpecError, as_user_error
from mlx_spec.process import (
    Calibrate,
    Close,
    Configure,
    Done,
    Failed,
    Generate,
    Load,
    MeasureBaseline,
    Ok,
    Token,
    TurnStops,
)
from mlx_spec.service import EngineInThread


def serve(recv: Connection, send: Connection, stops: TurnStops) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ctrl+c is the UI's: it stops turns
    service: EngineInThread | None = None
    while True:
        try:
            request = recv.recv()
        except (EOFError, OSError):
            return
        if isinstance(request, Close):
            return
        try:
            if isinstance(request, Load):
                service = EngineInThread.load(request.spec)
                send.send(Ok(service.info))
            elif service is None:
                raise MlxSpecError("no model loaded")
            elif isinstance(request, Generate):
                args = dict(request.__dict__)
                stop = stops.event(args.pop("turn"))
                for event in service.chat(**args, stop=stop):
                    send.send(Token(event))
                send.send(Done())
            elif isinstance(request, MeasureBaseline):
                send.send(Ok(service.measure_baseline(tokens=request.tokens,
                                                      repeats=request.repeats,
                                                      stop=stops.event(request.turn))))
            elif isinstance(request, Calibrate):
                send.send(Ok(service.calibrate(stop=stops.event(request.turn))))
            elif isinstance(request, Configure):
                send.send(Ok(service.configure(**request.__dict__)))
        except Exception as e:  # noqa: BLE001 - the parent shows one line
            what = "cannot load" if isinstance(request, Load) else "engine error"
            try:
                send.send(Failed(as_user_error(e, what)))
            except OSError:
                return


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1]), writable=False),
          Connection(int(sys.argv[2]), readable=False), TurnStops(int(sys.argv[3])))
