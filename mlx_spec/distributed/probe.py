"""What `mlx-spec doctor --hostfile` asks of every host, without loading a model:

    python -m mlx_spec.distributed.probe about [MODEL]   # one JSON line: versions, model files
    python -m mlx_spec.distributed.probe join HOSTFILE    # rank 0: start the ranks, join, quit

`about` runs on each host (ssh, or here for 127.0.0.1); `join` starts a worker on every other
host in `join` mode too and joins the group over the hostfile's backend: the real connection
the split target will use, exchanged once and closed."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .hosts import DEFAULT_PORT, read_hostfile


def about(model: str | None) -> dict:
    from .ranks import model_files, versions

    p = Path(model).expanduser() if model else None
    return {"versions": versions(),
            "model": (model_files(p) if p is not None and (p / "config.json").exists()
                      else "missing") if p is not None else "-",
            "python": sys.executable}


def join(hostfile: str) -> int:
    """Rank 0 of a group that only says hello: 0 if every rank answered."""
    import mlx.core as mx

    from .launch import Watch, _temp_file, start_workers, stop
    from .link import gather_text

    hf = read_hostfile(hostfile)
    port = int(os.environ.get("MLX_SPEC_PORT", DEFAULT_PORT))
    procs, logs = start_workers(hf, {"join": True, "backend": hf.backend}, port,
                                module="mlx_spec.distributed.probe")
    watch = Watch(hf, procs, logs)
    env, files = hf.rank_env(0, port=port)
    os.environ.update(env)
    for var, content in files.items():
        os.environ[var] = _temp_file(content)
    t0 = time.perf_counter()
    watch.arm("joining the group", 60)
    group = mx.distributed.init(backend=hf.backend, strict=True)
    answers = gather_text(group, "hello")
    watch.closing = True
    stop(procs)
    ok = answers == ["hello"] * hf.size
    print(json.dumps({"ok": ok, "seconds": round(time.perf_counter() - t0, 2)}))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args and args[0].startswith("{"):  # a worker started by `join`
        import mlx.core as mx

        from .link import gather_text

        group = mx.distributed.init(backend=json.loads(args[0])["backend"], strict=True)
        gather_text(group, "hello")
        return 0
    if args and args[0] == "join":
        return join(args[1])
    print(json.dumps(about(args[1] if len(args) > 1 else None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
