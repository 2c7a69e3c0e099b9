"""Smoke test of the benchmark code path on a small widening (timings are never asserted)."""

from __future__ import annotations

import json

import pytest

from benchmarks import BenchConfig, bench, parity
from benchmarks.__main__ import parse_args as parse_bench_args
from benchmarks.demo import bench_demo
from benchmarks.first_turn_report import write_first_turn
from benchmarks.needed import equal_acceptance, needed_section
from benchmarks.parity import first_turn_parity, mirrored
from benchmarks.runners import FirstTurn, Timing, pooled_tok_s
from benchmarks.scenario import GROUPS, bench_first_turn

TINY = BenchConfig(hidden=256, layers=5, ffn=640, prompts=1, max_tokens=10, draft_length=2,
                   sweep=(1,), temperatures=((0.0, 1.0), (1.0, 1.0)), quantized_rows=True,
                   long_context=(200,), parity_pairs=1, first_turn_temperatures=(0.0,))


@pytest.mark.slow
def test_bench_runs_and_greedy_rows_agree(tmp_path):
    result = bench(TINY, tmp_path, log=lambda s: None)
    assert result["greedy_identical"], result["greedy_mismatched_rows"]
    saved = json.loads((tmp_path / "bench.json").read_text())
    names = {r["name"] for r in saved["rows"]}
    assert {"target-only T=0", "mlx-lm generate_step T=0", "mlx-lm speculative k=2 T=0",
            "ours draft k=2 T=0", "ours mtp k=2 T=0", "ours ngram k=2 T=0",
            "ours mtp auto T=0", "4-bit ours mtp auto T=0"} <= names
    for r in saved["rows"]:
        assert {"name", "drafter", "engine", "temperature", "draft_length", "tok_s",
                "speedup_vs_target", "tokens_per_pass", "acceptance_rate"} <= set(r)
        assert r["tok_s"] > 0
    assert "| row |" in (tmp_path / "BENCH.md").read_text()
    assert {"200-token prompt target-only T=0", "200-token prompt ours mtp auto T=0"} <= names
    assert {"ours mtp+lookup k=2 T=0", "ours mtp+lookup auto T=0"} <= names
    # sampled, the MTP head (alone and behind lookup) at a shallower k too (sweep_sampled)
    assert {"ours mtp k=3 T=1", "ours mtp+lookup k=3 T=1"} <= names
    auto_ratios = {f"ours {d} auto T={t} ÷ ours {d} k={k} T={t}"
                   for d in ("mtp", "twin draft", "mtp+lookup") for t in (0, 1)
                   for k in (1, 2, 3)}
    assert set(saved["parity"]) - auto_ratios == {
        "target-only ÷ mlx-lm generate_step T=0", "target-only ÷ mlx-lm generate_step T=1",
        "ours mtp auto T=0 ÷ target-only T=0", "ours mtp auto T=1 ÷ target-only T=1",
        "demo f32 mtp auto ÷ demo f32 target-only T=0"}  # the variant a CPU opens
    assert len(set(saved["parity"]) & auto_ratios) == 6  # each auto row against its best k
    assert all(len(p["pairs"]) >= 1 and p["median"] > 0 for p in saved["parity"].values())
    hybrid = saved["hybrid"]  # the hybrid group: rows, both rollback strategies, parity
    assert {"hybrid target-only T=0", "hybrid ours draft (twin) k=2 T=0",
            "hybrid ours mtp k=2 T=0", "hybrid ours mtp k=2 T=0 (capture)"} <= names
    assert set(hybrid["rollback"]) == {"replay", "capture"}
    assert all(r["bytes_per_drafted_position"] > 0 for r in hybrid["rollback"].values())
    assert hybrid["parity"]["median"] > 0
    assert len(hybrid["auto_parity"]["pairs"]) == 1 and hybrid["auto_parity"]["median"] > 0
    assert "mtp auto ÷ mtp k=2 on the same prompts" in (tmp_path / "BENCH.md").read_text()
    # the published layouts' group (constructed pairs at the bench's width)
    assert {"gemma4 assistant: target-only T=0", "gemma4 assistant: ours k=3 T=0",
            "eagle3: target-only T=0", "eagle3: ours k=auto T=0"} <= names
    assert set(saved["published"]) == {"gemma4 assistant", "eagle3"}
    # the first-turn group: auto on a fresh engine against k and against known costs
    first = saved["first_turn"]
    assert set(first["targets"]) == {"f32", "f32-hybrid"} and first["pairs"] == 1
    for t in first["targets"].values():
        assert t["calibration_s"] > 0 and set(t["temperatures"]) == {"T=0"}
        p = t["temperatures"]["T=0"]
        assert all(p[key]["median"] > 0 for key in ("ttft_prior_vs_fixed", "tok_s_prior_vs_known"))
        assert set(p["sides"]) == {"prior", "fixed", "known"}
    assert "## First turn" in (tmp_path / "BENCH.md").read_text()
    write_first_turn({"machine": saved["machine"], "first_turn": first, "minutes": 1.0}, tmp_path)
    assert "TTFT prior ÷ k=2" in (tmp_path / "BENCH-first-turn.md").read_text()


@pytest.mark.slow
def test_demo_group_measures_the_variant_the_app_opens(tmp_path):
    """On a CPU backend the first run opens the bf16 demo target computed in f32; the group
    measures it (auto ÷ target-only in pairs) and the 8-bit one beside it."""
    result = bench_demo(TINY, tmp_path, log=lambda s: None)
    assert result["chosen"] == "demo-target (f32)"
    assert [v["target"] for v in result["variants"]] == ["demo-target (f32)", "demo-target-q8"]
    for v in result["variants"]:  # the app's default (lookup first) and the head alone
        assert v["auto_vs_target"]["median"] > 0 and v["lookup_vs_target"]["median"] > 0
        assert len(v["verify_ms"]) == 5
    names = [r["name"] for r in result["rows"]]
    assert "demo-target (f32) mtp auto" in names and "demo-target-q8 mtp k=4" in names
    assert "demo-target (f32) mtp+lookup auto" in names
    text = (tmp_path / "BENCH-demo.md").read_text()
    assert "open **demo-target (f32)** here" in text and "| demo-target-q8 |" in text
    assert "app's default: mtp+lookup auto ÷ target-only" in text
    assert parse_bench_args(["--group", "demo"]).group == "demo"


def test_first_turn_group_is_selectable():
    assert parse_bench_args(["--group", "first-turn"]).group == "first-turn"
    assert GROUPS["first-turn"] is bench_first_turn


def test_a_rows_rate_pools_its_prompts_tokens_and_seconds():
    # 10 tokens after the first in 1 s, then 10 in 3 s: the row took 4 s for 20 tokens (5/s),
    # where the mean of the two rates (10/s and 3.3/s) would read 6.7/s
    fast = Timing(0.0, [0.5 + i / 10 for i in range(11)])
    slow = Timing(0.0, [0.5 + 3 * i / 10 for i in range(11)])
    assert abs(fast.tok_s - 10) < 1e-9 and abs(pooled_tok_s([fast, slow]) - 5.0) < 1e-9
    assert pooled_tok_s([Timing(0.0, [1.0])]) == 0.0  # one token: no rate, not a division by 0


def test_what_acceptance_pays_is_solved_from_a_rows_round_cost():
    # target-only 10 tok/s; k = 2 rounds emitting 2 tokens at 10 tok/s take 0.2 s, two target
    # tokens. Breaking even needs 1 + α + α² = 2: α = 0.618 (the golden ratio's inverse);
    # ×1.5 needs 3 tokens, all drafts right (α = 1); ×2 needs 4, more than a round can emit
    row = dict(name="ours mtp k=2 T=0", engine="mlx-spec", draft_length=2, temperature=0.0,
               top_p=1.0, tok_s=10.0, tokens_per_pass=2.0)
    plain = dict(name="target-only T=0", engine="mlx-spec", draft_length=1, temperature=0.0,
                 top_p=1.0, tok_s=10.0, tokens_per_pass=1.0)
    assert abs(equal_acceptance(2.0, 2) - (5 ** 0.5 - 1) / 2) < 1e-9
    assert equal_acceptance(4.0, 2) is None and equal_acceptance(1.0, 3) == 0.0
    table = needed_section([plain, row])
    assert table[-1] == "| ours mtp k=2 T=0 | 2.00 | 0.62 / 1.00 / – / – | 2.00 (0.62) |"
    assert needed_section([row]) == []  # no target-only row at its temperature: nothing


def test_mirrored_runs_each_side_twice_in_mirrored_order():
    order: list[str] = []
    sides = [lambda n=n: order.append(n) or len(order) for n in "abc"]
    runs = mirrored(sides, pairs=2)
    assert order == list("abccba" * 2)
    assert runs[0] == [(1, 6), (2, 5), (3, 4)]


def test_serve_group_streams_our_sides_and_reports_the_goals(tmp_path):
    from benchmarks.serve import ServeConfig, bench_serve
    from benchmarks.serve_clients import healthy

    assert parse_bench_args(["--group", "serve"]).group == "serve"
    assert GROUPS["serve"] is bench_serve
    tiny = BenchConfig(hidden=256, layers=5, ffn=640, draft_length=2)
    serve = ServeConfig(concurrency=(1, 2), max_tokens=6, pairs=1, overhead_pairs=1,
                        warmup_tokens=2, timeout_s=60, mlx_lm=False)  # mlx-lm: the next test
    result = bench_serve(tiny, tmp_path, log=lambda s: None, serve=serve)
    keys = {"spec", "plain", "draft", "no_lookup"}  # spec: serve's default, with lookup
    assert {s["key"] for s in result["sides"]} == keys
    assert not [s["url"] for s in result["sides"] if healthy(s["url"])]  # all closed
    assert result["greedy"] == {"streams": 3 * len(keys), "differ": []}
    for level in result["levels"].values():
        sides = level["sides"]
        assert all(0 < sides[k]["tokens_per_stream"] <= 6 and sides[k]["tok_s"] > 0
                   for k in keys)
        # ours report what each request drafted (every stream's last chunk carried its draft
        # counters; auto may draft nothing on a tiny target), and an acceptance exactly when
        # something was drafted: a fraction of the drafts, never a 0% for none drafted
        for k in keys:
            drafted, acceptance = sides[k]["drafted_per_pass"], sides[k]["acceptance"]
            assert isinstance(drafted, float) and drafted >= 0, (k, drafted)
            assert (acceptance is None) == (drafted == 0), (k, drafted, acceptance)
            assert acceptance is None or 0 <= acceptance <= 1, (k, acceptance)
        assert sides["plain"]["drafted_per_pass"] == 0  # target-only: nothing drafted
        assert set(level["ratios"]) == {"spec ÷ plain", "draft ÷ plain", "no_lookup ÷ plain",
                                        "spec ÷ no_lookup"}
        assert all(len(p["pairs"]) == 1 for p in level["ratios"].values())
    assert sides["plain"]["rounds_per_pass"] >= 1  # the server's verify counters were read
    assert [g["goal"] for g in result["goals"]] == [
        "(a) ÷ max((a), (b)) at 1 stream(s)", "(a) ÷ max((a), (b)) at 2 stream(s)",
        "(a) ÷ (b) at 1 stream(s)", "(a) ÷ (b) at 2 stream(s)",
        "(a) served ÷ generate, tok/s at 1 stream"]
    assert set(result["overhead"]) == {"spec", "plain"}
    md = (tmp_path / "BENCH-serve.md").read_text()
    assert "| (a) ours mtp+lookup auto | 2 |" in md and "| (a) ours mtp auto | 2 |" in md
    assert "## The issue's goals" in md
    assert "the mlx-lm sides were not run" in md
    plain = next(line for line in md.splitlines() if line.startswith("| (b) ours target-only"))
    assert plain.endswith("| 0.00 | – |")  # nothing drafted: no acceptance, never a 0%


def test_a_subprocess_server_is_stopped_on_the_way_out(tmp_path):
    import os
    import signal
    import sys
    import time

    import pytest

    from benchmarks.serve_clients import (
        exit_on_sigterm,
        free_ports,
        healthy,
        launched,
        wait_ready,
    )

    port, other = free_ports(2)
    url, log = f"http://127.0.0.1:{port}", tmp_path / "server.log"
    health = ("import http.server as h, sys\n"
              "class H(h.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              "        self.send_response(200); self.end_headers()\n"
              "h.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
    with pytest.raises(RuntimeError, match="the bench failed"):
        with launched([sys.executable, "-c", health, str(port)], log) as proc:
            wait_ready(proc, url, 30, log)
            assert healthy(url)
            raise RuntimeError("the bench failed")
    assert proc.poll() is not None and not healthy(url)
    gone = [sys.executable, "-c", "print('no such model'); raise SystemExit(3)"]
    with launched(gone, log) as proc:  # it exits before it answers: fails with its output
        with pytest.raises(RuntimeError, match="exit 3.*no such model"):
            wait_ready(proc, f"http://127.0.0.1:{other}", 30, log)
    with pytest.raises(SystemExit):  # a plain `kill` of the bench unwinds, servers and all
        with exit_on_sigterm(), launched([sys.executable, "-c", health, str(port)], log) as proc:
            wait_ready(proc, url, 30, log)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert proc.poll() is not None and not healthy(url)


def test_the_demo_opens_the_variant_that_can_pay_here():
    """No model: the bundled demo, in the variant for this device — on MLX's CPU backend the
    bf16 target computed in f32 (quantized matmul is compute-bound there), which the name
    says and the calibration key tells apart from the same files uncast."""
    import mlx.core as mx

    from mlx_spec.assets import demo_model, demo_variant
    from mlx_spec.engine.calibration import key_of
    from mlx_spec.loading import load_engine, load_target

    assert mx.default_device() == mx.cpu  # this suite's machines
    assert (demo_variant().name, demo_variant().dtype) == ("demo-target", "float32")
    engine = load_engine()
    assert engine.target.name == "demo-target (f32)" and engine.target.cast == "float32"
    assert engine.target.model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
    assert engine.drafter is not None and engine.drafter.name == "mtp"
    plain, _ = load_target(demo_model("demo-target"))
    assert key_of(plain, None) != key_of(engine.target, None)


def test_sampled_auto_parity_draws_new_seeds_each_pair():
    """At T > 0 each ABBA pair is its own draw (both sides the same seeds), so the median is
    over draws, not one draw's luck timed again; greedy pairs need no seeds."""
    from types import SimpleNamespace

    from benchmarks.parity import auto_parity

    class Runner:
        def __init__(self):
            self.calls = []

        def ours(self, target, drafter, draft_length, *args, seed=0):
            self.calls.append((draft_length, seed))
            return SimpleNamespace(tok_s=2.0 if draft_length == "auto" else 1.0)

    run = Runner()
    out = auto_parity(run, None, lambda: None, 4, "t", 1.0, 1.0, 3)
    assert out["pairs"] == [2.0, 2.0, 2.0]
    assert run.calls == [(k, 1000 * pair) for pair in range(3) for k in ("auto", 4, 4, "auto")]
    run = Runner()
    auto_parity(run, None, lambda: None, 4, "t", 0.0, 1.0, 2)
    assert {seed for _, seed in run.calls} == {0}


def test_first_turn_pairs_draw_seeds_of_their_own_at_t_above_0(monkeypatch):
    """At T > 0 a first turn's text is one draw: each pair of first_turn_parity draws its own
    (all three sides the same seed), so the ratios' median is over as many draws as pairs; at
    T = 0 there is nothing to draw."""
    seen: list[tuple[str, int]] = []

    class Run:
        tokenizer = None

        def first_turn(self, engine: str, temperature: float, *, seed: int = 0) -> FirstTurn:
            seen.append((engine, seed))
            return FirstTurn(0.1, 10.0, 2.0, 1.0)

    monkeypatch.setattr(parity, "new_engine", lambda target, tokenizer, drafter, k: f"new {k}")
    first_turn_parity(Run(), None, None, 4, "known", 1.0, 3)
    assert len(seen) == 18 and {e for e, _ in seen} == {"new auto", "new 4", "known"}
    by_pair = [{s for _, s in seen[i : i + 6]} for i in range(0, 18, 6)]
    assert all(len(seeds) == 1 for seeds in by_pair) and len(set.union(*by_pair)) == 3
    seen.clear()
    first_turn_parity(Run(), None, None, 4, "known", 0.0, 2)
    assert {s for _, s in seen} == {0}
