"""Rank 0 of a test's split target, as a script (a process joins one mlx.distributed group in
its life, so pytest runs this in a child): load through `load_engine` with a hostfile, run the
asked turns, and print one JSON line with what the test checks.

    python tests/distributed_driver.py '{"hostfile": H, "model": M, "drafter": ..., "turns": [...]}'

Each turn: {"prompt": [...], "max_tokens": n, "k": 1 | 3 | "auto", "seed": s | null,
"check": true} — check: after every round every rank's caches are compared with a fresh
prefill of the committed tokens (ShardedTarget.differences), and the command messages per
target forward are counted. {"batch": [prompt, ...]}: those conversations verified together
(engine/batch.py), checked the same way. {"hang": true}: print the worker pids, then decode
until killed. {"idle": s}: one short turn, the worker pids, s seconds of nothing, then a turn."""

from __future__ import annotations

import json
import sys

from mlx_spec.events import TurnEnd
from mlx_spec.loading import load_engine
from mlx_spec.sampling import SamplingConfig
from mlx_spec.spec import LoadSpec


def checked(conv, worst: list[float]) -> None:
    original, target = conv.commit, conv.target

    def commit(new, valid, hidden, *, ahead=False):
        original(new, valid, hidden, ahead=ahead)
        if ahead:
            return
        fresh = target.make_cache(slack=64)
        committed = conv.tokens[:-1]
        if committed:
            target.forward(committed, fresh)
        diffs = target.differences(conv.cache, fresh)
        worst[:] = [max(a, b) for a, b in zip(worst or [0.0] * len(diffs), diffs, strict=True)]

    conv.commit = commit


def counted(target, tally: dict) -> None:
    original = target.forward_rows

    def forward_rows(x, cache, *, hidden=False):
        before = target.link.messages
        out = original(x, cache, hidden=hidden)
        tally["forwards"] += 1
        tally["messages"] += target.link.messages - before
        return out

    target.forward_rows = forward_rows


def main() -> None:
    job = json.loads(sys.argv[1])
    engine = load_engine(LoadSpec(model=job["model"], drafter=job.get("drafter", "none"),
                                  draft_model=job.get("draft_model"), draft_length=job.get("k"),
                                  hostfile=job["hostfile"], split=job.get("split")))
    target = engine.target
    out = {"ranks": target.ranks, "split": target.split_label, "turns": []}
    if job.get("hang"):
        print(json.dumps({"pids": [p.pid for p in target.link.watch.procs]}), flush=True)
        conv = engine.conversation()
        while True:
            list(conv.generate([5, 6, 7], max_tokens=400, ignore_eos=True))
    if job.get("idle"):  # what a worker does while rank 0 waits (a server between requests)
        import time

        conv = engine.conversation()
        list(conv.generate([5, 6, 7], max_tokens=4, ignore_eos=True))
        print(json.dumps({"pids": [p.pid for p in target.link.watch.procs]}), flush=True)
        time.sleep(job["idle"])
        out["after_idle"] = list(list(conv.generate([8, 9], max_tokens=4, ignore_eos=True))[-1]
                                 .tokens)
    if job.get("batch"):  # conversations verified together (the server's batch), checked
        from helpers import lockstep

        convs = [engine.conversation(draft_length=job.get("k", 3)) for _ in job["batch"]]
        worst: list[float] = []
        for conv in convs:
            checked(conv, worst)
        ends, sizes, _ = lockstep(convs, job["batch"], max_tokens=job["max_tokens"])
        out["batch"] = {"tokens": [list(e.tokens) for e in ends], "sizes": sizes,
                        "worst": worst}
    for turn in job.get("turns", []):
        conv = engine.conversation(draft_length=turn.get("k", 3))
        worst: list[float] = []
        tally = {"forwards": 0, "messages": 0}
        if turn.get("check"):
            checked(conv, worst)
        counted(target, tally)
        cfg = SamplingConfig(temperature=0.0) if turn.get("seed") is None else \
            SamplingConfig(seed=turn["seed"], **turn.get("sampling", {}))
        tokens, stats = [], None
        for _ in range(turn.get("repeat", 1)):
            end = list(conv.generate(turn["prompt"], max_tokens=turn["max_tokens"],
                                     ignore_eos=True, sampling=cfg))[-1]
            assert isinstance(end, TurnEnd)
            tokens.append(list(end.tokens))
            stats = end.stats
            if turn.get("reseed"):
                cfg = SamplingConfig(seed=cfg.seed + 1, **turn.get("sampling", {}))
        del target.forward_rows  # the instance's counting wrapper
        out["turns"].append({"tokens": tokens, "worst": worst, **tally,
                             "passes": stats.target_passes, "drafted": stats.drafted,
                             "accepted": stats.accepted, "stats_ranks": stats.ranks,
                             "stats_split": stats.split, "target_bytes": stats.target_bytes})
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
