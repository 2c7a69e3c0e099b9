"""`python -m benchmarks --group smollm2`: the first run's chat model, SmolLM2-135M-Instruct
(the Q4_1 GGUF `uv sync` installs, converted to f32 here), with the EAGLE-3 head that ships for
it (assets/heads/, trained by `mlx-spec train-drafter`) against target-only, prompt lookup
alone, and mlx-lm's own generate_step on the same weights.

Chat prompts none of the head's training or held-out prompts are (train/chat.py), T = 0 and
T = 1, each side run in mirrored order (A B … B A). Sides: the head at k = 4 (the issue's bar:
tokens per pass), at auto, and behind prompt lookup at auto (what the app runs); at T > 0 also
seeded requests (the drafter-invariant coupling: the same text as seeded target-only).
Results: docs/BENCH-smollm2.md, docs/bench-smollm2.json. Timings are never asserted by tests."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlx_spec.assets import shipped_head
from mlx_spec.drafters import NgramDrafter
from mlx_spec.drafters.lookup import LookupFirst
from mlx_spec.loading import load_target, make_drafter

from .parity import Log, compare, ratio, real_weights
from .runners import BenchConfig, Row, Runner, fresh_store, machine, row_dicts
from .tables import mirrored, write_group

PROMPTS = ["What should I consider when adopting a dog?",
           "Explain how a rainbow forms.",
           "Give me a simple plan for learning to cook.",
           "Write a Python function that counts the vowels in a string.",
           "What is the difference between a lake and a sea?",
           "Write a short note inviting my neighbours to a garden party."]
SMOLLM2 = BenchConfig(prompts=4, max_tokens=64, temperatures=((0.0, 1.0), (1.0, 1.0)),
                      parity_pairs=1)
SMOLLM2_QUICK = BenchConfig(prompts=1, max_tokens=16, temperatures=((0.0, 1.0),),
                            parity_pairs=1)


def prompts(tokenizer, n: int) -> list[list[int]]:
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                               add_generation_prompt=True))
            for p in PROMPTS[:n]]


def smollm2(cfg: BenchConfig, log: Log, *, head: bool = True
            ) -> tuple[list[Row], dict[str, Any]]:
    """Rows and ratios on SmolLM2; head=False: target-only and n-gram only (no shipped head)."""
    target, tokenizer = load_target(str(real_weights().fetch("smollm2")))
    where = shipped_head(target) if head else None
    if head and where is None:
        raise SystemExit("no head ships for SmolLM2-135M-Instruct (assets/heads/)")
    run = Runner(tokenizer, prompts(tokenizer, cfg.prompts), cfg.max_tokens, fresh_store())
    label, rows, ratios = target.name, [], {}

    def eagle():
        return make_drafter("draft", target, draft_model=where)

    for temp, top_p in cfg.temperatures:
        t = f"T={temp:g}"

        def ours(name, drafter, k, kind, temp=temp, top_p=top_p, t=t, coupling="leviathan"):
            return lambda: run.ours(target, drafter() if drafter else None, k,
                                    f"SmolLM2 {name} {t}", kind, label, temp, top_p,
                                    coupling=coupling)

        sides = {"target-only": ours("target-only", None, 1, "none"),
                 "ngram auto": ours("ngram auto", NgramDrafter, "auto", "ngram")}
        if head:
            sides |= {
                "head k=4": ours("head k=4", eagle, 4, "eagle3"),
                "head auto": ours("head auto", eagle, "auto", "eagle3"),
                "head+lookup auto": ours("head+lookup auto", lambda: LookupFirst(eagle()),
                                         "auto", "eagle3+lookup"),
                "mlx-lm target-only": lambda temp=temp, top_p=top_p, t=t: run.mlx_lm(
                    target, f"SmolLM2 mlx-lm generate_step {t}", label, temp, top_p=top_p),
            }
        if head and temp > 0:  # seeded requests: the drafter-invariant coupling (sampling.py)
            sides |= {"target-only seeded": ours("target-only seeded", None, 1, "none",
                                                 coupling="gumbel"),
                      "head+lookup auto seeded": ours(
                          "head+lookup auto seeded", lambda: LookupFirst(eagle()), "auto",
                          "eagle3+lookup", coupling="gumbel")}
        got, runs = compare(sides, cfg.parity_pairs)
        for r in got:
            r.speedup_vs_target = r.tok_s / got[0].tok_s if got[0].tok_s else 0.0
            log(f"{r.name:<36} {r.tok_s:6.2f} tok/s  ×{r.speedup_vs_target:.2f}  "
                f"{r.tokens_per_pass or 1:.2f} tokens/pass")
        names = list(sides)
        ratios[t] = {f"{a} ÷ target-only": ratio(runs, names, a, "target-only")
                     for a in names[1:] if not a.startswith("mlx-lm")}
        if "head+lookup auto seeded" in sides:
            ratios[t]["head+lookup auto seeded ÷ target-only seeded"] = ratio(
                runs, names, "head+lookup auto seeded", "target-only seeded")
        if head:
            ratios[t]["target-only ÷ mlx-lm target-only"] = ratio(
                runs, names, "target-only", "mlx-lm target-only")
        rows += got
    return rows, {"target": label, "head": str(where) if where else None, "ratios": ratios}


def bench_smollm2(cfg: BenchConfig, out: Path, log: Log = print) -> dict[str, Any]:
    started = time.perf_counter()
    rows, info = smollm2(cfg, log)
    result = {"machine": machine(), "config": asdict(cfg), "smollm2": info,
              "rows": row_dicts(rows), "minutes": (time.perf_counter() - started) / 60}
    c = result["config"]
    write_group(out, "smollm2", "SmolLM2-135M-Instruct with its shipped head",
                f"Target **{info['target']}** (the first run's chat model), head "
                f"`{Path(info['head']).name}` (assets/heads/). {c['prompts']} chat prompts × "
                f"{c['max_tokens']} tokens a run, none trained or tuned on; " + mirrored(c),
                result)
    return result
