"""`bench --group distributed`'s own parts, without ranks: the delaying relay (bytes intact, in
order, each direction held the asked delay), the per-rank ring hostfiles that put it between
the ranks, the round-trip count, and the report written from made-up numbers."""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time

from benchmarks.distributed import MLX_LM, PLAIN, goals, greedy_check, summarise
from benchmarks.distributed_ranks import hops
from benchmarks.distributed_report import modelled, relay_precise, write_distributed
from benchmarks.distributed_session import ring_files
from benchmarks.relay import HOST, Relay, echo_server, free_ports, ping_pong


def test_the_relay_forwards_every_byte_in_order_after_the_delay():
    with echo_server() as echo:
        (port,) = free_ports(1)
        relay = Relay([(port, echo)])
        try:
            blob = os.urandom(300_000)  # several chunks each way
            with socket.create_connection((HOST, port)) as c:
                got = bytearray()
                sender = threading.Thread(target=c.sendall, args=(blob,))
                sender.start()
                while len(got) < len(blob):
                    got += c.recv(1 << 16)
                sender.join()
            assert bytes(got) == blob
            base = statistics.median(ping_pong(port, 20))
            relay.set_delay(0.02)
            t0 = time.perf_counter()
            delayed = statistics.median(ping_pong(port, 10))
            assert delayed - base >= 0.04 * 0.95, (base, delayed)  # both directions held 20 ms
            assert delayed - base < 0.04 + 0.03, (base, delayed)
            assert time.perf_counter() - t0 < 5
            stats = relay.stats()
            assert stats["chunks"] >= 20 and stats["late_p50_us"] < 5000
            assert relay.stats()["chunks"] == 0  # read and reset
        finally:
            relay.close()


def test_each_rank_reaches_the_other_through_the_relay(tmp_path):
    direct = [json.loads(p.read_text()) for p in ring_files(tmp_path, [10, 11], None)]
    assert direct[0] == direct[1] == [["127.0.0.1:10"], ["127.0.0.1:11"]]
    relayed = [json.loads(p.read_text()) for p in ring_files(tmp_path, [10, 11], [20, 21])]
    assert relayed[0] == [["127.0.0.1:10"], ["127.0.0.1:21"]]  # binds its own, dials the relay
    assert relayed[1] == [["127.0.0.1:20"], ["127.0.0.1:11"]]


def test_round_trips_per_pass():
    assert hops({"all_sum": 25}) == 50  # tensor: the command and 2 per layer, 12 layers
    assert hops({"all_sum": 1, "recv_like": 1, "all_gather": 1}) == 4  # pipeline, ours
    assert hops({"recv_like": 1, "all_gather": 1}) == 2  # pipeline, mlx-lm


def fake_run(tok_s: float, tpp: float, drafted: float, tokens: list[int]) -> dict:
    return {"tok_s": tok_s, "tokens_per_pass": tpp, "mean_draft": drafted,
            "acceptance_rate": 0.8 if drafted else None, "messages": 10, "forwards": 10,
            "collectives": {"all_sum": 250}, "tokens": tokens}


def fake_level(names: list[str], scale: float) -> dict:
    speed = {PLAIN: (10.0, 1.0, 0.0), "twin auto": (40.0, 6.0, 5.0), "twin k=4": (35.0, 4.8, 4.0),
             MLX_LM: (9.5, 1.0, 0.0)}
    runs = [[(fake_run(speed[n][0] * scale, *speed[n][1:], [1, 2, 3]),
              fake_run(speed[n][0] * scale * 1.02, *speed[n][1:], [1, 2, 3])) for n in names]]
    return summarise(names, runs)


def test_the_report_from_made_up_numbers(tmp_path):
    names = [PLAIN, "twin auto", "twin k=4", MLX_LM]
    one = fake_level(names[:3], 2.0)
    levels = {"0": fake_level(names, 2.0), "0.05": fake_level(names, 1.9),
              "1": fake_level(names, 1.0)}
    for d, level in [("one", one), *levels.items()]:
        level.update(probe={"p50_us": 40.0, "min_us": 30.0, "p90_us": 50.0},
                     host={"busy": 0.9, "others": 0.1}, load_average=2.2,
                     calibration_s={"twin auto": 5.0}, quiet={"waited_s": 0.0, "others": 0.1})
        if d not in ("0", "one"):
            asked = 1e3 * float(d)
            level["relay"] = {"asked_us": asked, "achieved_us": asked + 25, "p90_us": asked + 40}
            level["relay_runs"] = {"chunks": 9, "bytes": 1, "late_p50_us": 1.0,
                                   "late_p90_us": 5.0, "late_p99_us": 30.0, "late_max_us": 90.0}
    case = {"label": "fake tensor", "mode": "tensor", "params": 1e8, "fast": "twin",
            "sides": names, "session": {"split": "tensor over 2 ranks (ring)", "pinned": True,
                                        "target_bytes": 2**28, "relay_scheduling": "SCHED_FIFO"},
            "one": one, "levels": levels}
    case["greedy"] = greedy_check(one, levels)
    assert case["greedy"] == {"runs": 3 + 4 * 3, "differ": []}
    dist = {"delays_ms": [0.0, 0.05, 1.0], "pairs": 1, "one_pairs": 1, "max_tokens": 8,
            "draft_length": 4}

    class D:  # goals() reads the delays only
        delays_ms = (0.0, 0.05, 1.0)

    result = {"machine": {"platform": "test", "cpu_count": 2, "mlx": "0", "device": "cpu",
                          "openblas_preloaded": True, "commit": "abc"},
              "config": {"hidden": 64, "layers": 2}, "dist": dist, "load_before": 1.0,
              "cases": {"tensor": case}, "minutes": 1.0}
    result["goals"] = goals(result["cases"], D())
    names_of = [g["goal"] for g in result["goals"]]
    assert any("÷ (c) mlx-lm at 1 ms" in n for n in names_of)
    assert any("0.9 × tokens/pass" in n for n in names_of)
    write_distributed(result, tmp_path)
    text = (tmp_path / "BENCH-distributed.md").read_text()
    assert "| (a) ours plain |" in text and "model:" in text  # 0.05 ms: 25 µs over, a model
    assert "A model, not a measurement" in text
    assert json.loads((tmp_path / "bench-distributed.json").read_text())["cases"]["tensor"]


def test_the_latency_model_and_the_relay_tolerance():
    base = {"tokens_per_pass": 4.0, "tok_s": 40.0, "hops_per_pass": 50.0}
    assert abs(modelled(base, 1.0) - 4.0 / (0.1 + 0.05)) < 1e-9  # 100 ms a pass + 50 × 1 ms
    assert relay_precise(None) and relay_precise({"asked_us": 1000.0, "achieved_us": 1100.0})
    assert not relay_precise({"asked_us": 50.0, "achieved_us": 75.0})


def test_the_group_is_a_bench_choice():
    from benchmarks.__main__ import parse_args as parse_bench_args
    from benchmarks.scenario import GROUPS

    assert parse_bench_args(["--group", "distributed"]).group == "distributed"
    assert GROUPS["distributed"].__name__ == "bench_distributed"
