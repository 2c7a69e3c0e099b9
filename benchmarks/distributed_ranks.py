"""The two ranks of one `bench --group distributed` session, started by the bench itself (not
by distributed/launch.py), each with a ring hostfile of its own: the bench's relay sits between
them by being the address each rank's file gives for the other (relay.py).

Rank 0 (`leader`) holds rank 0's part of the split target as the product does
(`ShardedTarget` over a `Link`, distributed/target.py) and builds every side's engine on it
(each drafter as `load_engine` builds it). Rank 1 (`follower`) holds its part and runs, one
phase at a time as the bench tells it on stdin: the product's worker loop
(`distributed.worker.follow`, ended by rank 0's QUIT command), mlx-lm's own `generate_step` on
its sharded model (SPMD, as rank 0 runs it: no commands, only the model's collectives), or a
run of tiny all_sums (the link's round trip as MLX sees it). Between phases it waits on stdin,
never in a collective (a ring rank waiting in one spins a core).

One machine (`single`): the leader alone with the whole target, no group, the same requests.

    python -c 'import sys; from benchmarks.distributed_ranks import main; sys.exit(main())' \
        leader|follower|single JOB_JSON
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlx_spec.distributed.link import Link, Op
from mlx_spec.distributed.ranks import agree, load_part
from mlx_spec.distributed.target import ShardedTarget, Split
from mlx_spec.distributed.worker import follow
from mlx_spec.loading import check_split_drafter, load_target, make_drafter
from mlx_spec.sampling import SamplingConfig

from .runners import Row, new_engine, run_mlx_lm, run_ours, warm_up

HOSTS = ["127.0.0.1", "127.0.0.1"]
COLLECTIVES = ("all_sum", "all_gather", "send", "recv", "recv_like")
COUNTS: Counter = Counter()  # collectives this process built into graphs (rank 0's view)


def count_collectives() -> None:
    """Count every collective built here (Link's commands, mlx-lm's layers and pipeline)."""
    for name in COLLECTIVES:
        original = getattr(mx.distributed, name)

        def counted(*args, _f=original, _name=name, **kwargs):
            COUNTS[_name] += 1
            return _f(*args, **kwargs)

        setattr(mx.distributed, name, counted)


def hops(counts: dict[str, int]) -> int:
    """One-way trips on the critical path for these collectives between 2 ranks: an all_sum is
    two (scatter-reduce, then gather), an all_gather one, a send/recv one."""
    return (2 * counts.get("all_sum", 0) + counts.get("all_gather", 0)
            + counts.get("recv", 0) + counts.get("recv_like", 0))


def join(job: dict[str, Any]):
    """Join the group, agree on versions and files, load this rank's part: (group, the model's
    path, the part, its tokenizer)."""
    group = mx.distributed.init(backend="ring", strict=True)
    path = Path(job["model"])
    agree(group, HOSTS, path)
    loaded: list = []

    def load():
        loaded[:] = load_target(path, lazy=True)
        return loaded[0]

    part = load_part(group, HOSTS, load, job["mode"])
    return group, path, part, loaded[1]


def reply(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


class Leader:
    """Rank 0: the split target with its drafters, engines per side, and the runs. single:
    no group, the whole target (one machine), the same requests."""

    def __init__(self, job: dict[str, Any], single: bool = False):
        self.drafter_dirs: dict[str, str | None] = job["drafters"]  # name -> draft model dir
        self.engines: dict[str, Any] = {}
        self.link: Link | None = None
        if single:
            self.path = Path(job["model"])
            self.part, self.tokenizer = load_target(self.path)
            self.target = self.part
            return
        group, self.path, self.part, self.tokenizer = join(job)
        self.link = Link(group)  # no Watch: the bench's timeout ends a hung session
        self.target = ShardedTarget.over(self.part, self.link,
                                         Split(group.size(), job["mode"]))
        count_collectives()

    def drafter(self, name: str | None):
        """A drafter for the split target, built as load_engine builds one."""
        if name is None:
            return None
        kind = "draft" if self.drafter_dirs.get(name) else name  # "ngram" / "mtp"
        d = make_drafter(kind, self.target, model_path=self.path,
                         draft_model=self.drafter_dirs.get(name))
        if self.link is not None:
            check_split_drafter(d)
        return d

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "engines":  # fresh engines, auto ones calibrated here and now
            seconds = {}
            self.engines.clear()
            for side in req["sides"]:
                t0 = time.perf_counter()
                engine = new_engine(self.target, self.tokenizer, self.drafter(side["drafter"]),
                                    side["k"])
                warm_up(engine, engine.conversation(), req["warm_prompt"])
                self.engines[side["name"]] = engine
                seconds[side["name"]] = time.perf_counter() - t0
            return {"seconds": seconds}
        if op == "run":
            return self.run(req)
        if op == "mlx_lm":
            return self.mlx_lm(req)
        if op == "probe":
            return probe(self.link.group, req["n"])
        raise ValueError(f"unknown op {op!r}")

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        """One turn of a side's engine on one prompt (a new conversation), with the command
        messages and collectives per target forward."""
        engine = self.engines[req["side"]]
        target, tally = engine.target, {"forwards": 0}
        original = target.forward_rows

        def forward_rows(x, cache, *, hidden=False):
            tally["forwards"] += 1
            return original(x, cache, hidden=hidden)

        target.forward_rows = forward_rows
        COUNTS.clear()
        messages = self.link.messages if self.link else 0
        row = Row(req["side"], "", "mlx-spec", "split", 0.0, 1.0, engine.draft_length)
        try:
            run_ours(engine.conversation(), [req["prompt"]], req["max_tokens"],
                     SamplingConfig(temperature=0.0), row)
        finally:
            del target.forward_rows
        out = {k: v for k, v in asdict(row).items() if k != "tokens"}
        out["tokens"] = row.tokens[0]
        out["forwards"] = tally["forwards"]
        out["messages"] = self.link.messages - messages if self.link else 0
        out["collectives"] = dict(COUNTS)
        return out

    def mlx_lm(self, req: dict[str, Any]) -> dict[str, Any]:
        """mlx-lm's generate_step on rank 0's part of its own sharded model (rank 1 runs the
        same), greedy; the collectives per token as built here."""
        COUNTS.clear()
        row = mlx_lm_turn(self.part, req)
        # generate_step's forwards: the prompt but its last token, that token, then one per
        # token after the first
        return {"tok_s": row.tok_s, "tokens": row.tokens[0], "collectives": dict(COUNTS),
                "forwards": req["max_tokens"] + 2, "ttft_s": row.ttft_s,
                "itl_p50_ms": row.itl_p50_ms}

    def release(self, req: dict[str, Any]) -> None:
        """End rank 1's worker loop after a phase that used it (QUIT, ops queued before it)."""
        if self.link is not None and req["op"] in ("engines", "run"):
            self.link.queue(Op.QUIT)
            self.link.send()


def mlx_lm_turn(part, run: dict[str, Any]) -> Row:
    """mlx-lm's generate_step over `run`'s prompt on this rank's part (both ranks alike), then
    its stream drained: generate_step leaves its last step evaluating on a stream of its own,
    whose collectives would interleave with the next ones on the default stream."""
    from mlx_lm.generate import generation_stream

    row = run_mlx_lm(part, None, [run["prompt"]], run["max_tokens"], 0.0, 1.0, 0,
                     Row("mlx-lm", "none", "mlx-lm", "split", 0.0, 1.0, 0))
    mx.synchronize(generation_stream)
    return row


def probe(group, n: int) -> dict[str, Any]:
    """n all_sums of 256 int32 (the size of a command): their times (µs), fastest and median."""
    x = mx.zeros((256,), mx.int32)
    mx.eval(mx.distributed.all_sum(x, group=group))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        mx.eval(mx.distributed.all_sum(x, group=group))
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"min_us": 1e6 * times[0], "p50_us": 1e6 * times[len(times) // 2],
            "p90_us": 1e6 * times[int(0.9 * len(times))]}


def leader(job: dict[str, Any], single: bool = False) -> int:
    lead = Leader(job, single)
    reply({"ready": True, "target_bytes": lead.target.nbytes(),
           "split": lead.target.split_label or "one machine"})
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":  # rank 1 waits on its stdin, told by the bench
            break
        try:
            out = lead.handle(req)
        except Exception as e:  # noqa: BLE001 - said to the bench in one line, rank 1 released
            out = {"error": f"{type(e).__name__}: {e}"}
        lead.release(req)
        reply(out)
    return 0


def follower(job: dict[str, Any]) -> int:
    group, _, part, _ = join(job)
    reply({"ready": True})
    for line in sys.stdin:
        phase = json.loads(line)
        if phase["phase"] == "ours":
            follow(part, group)
        elif phase["phase"] == "mlx_lm":
            mlx_lm_turn(part, phase)
        elif phase["phase"] == "probe":
            probe(group, phase["n"])
        else:
            break
        reply({"done": phase["phase"]})
    return 0


def main(argv: list[str] | None = None) -> int:
    role, job = (argv or sys.argv[1:])[-2:]
    roles = {"leader": leader, "follower": follower, "single": lambda j: leader(j, True)}
    return roles[role](json.loads(job))


if __name__ == "__main__":
    sys.exit(main())
