"""`python -m benchmarks --group coupling`: what drafter-invariant sampling costs in acceptance.

A seeded request is decided by the Gumbel coupling (sampling.py: its answer is the target-only
one for that seed, whatever ran it), an unseeded one by Leviathan's rejection sampling. The
invariant coupling accepts a draft with chance P(argmax(log q + g) = argmax(log p + g)), at least
(1 − TV)/(1 + TV) where Leviathan's reaches 1 − TV: this group measures the difference per draft
position on the widened bench target with its MTP head (memory-bound f32: where speculation
pays here), at T = 1 and T = 0.7 with top-p 0.9, k = 4 and auto, and whether seeded requests
still pay (auto ÷ target-only, ABBA pairs). Results: docs/BENCH-coupling.md,
docs/bench-coupling.json. Timings are measured here and never asserted by tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from mlx_spec.engine import Engine
from mlx_spec.events import TurnEnd
from mlx_spec.sampling import Sampler, SamplingConfig
from mlx_spec.train.corpus import prompts_from_corpus

from .parity import abba, describe
from .runners import BenchConfig, Runner, load_bench_models, machine, row_dicts
from .tables import reproduce_line, write_json

Log = Callable[[str], None]
SETTINGS = ((1.0, 1.0), (0.7, 0.9))  # (temperature, top_p)
COUPLINGS = ("leviathan", "gumbel")


def bench_coupling(cfg: BenchConfig, out: Path, log: Log = print) -> dict[str, Any]:
    started = time.perf_counter()
    models = load_bench_models(cfg)
    run = Runner(models.tokenizer, prompts_from_corpus(models.tokenizer, cfg.prompts),
                 cfg.max_tokens)
    wide, name = models.wide, "wide"
    rows, pays = [], {}
    for temperature, top_p in SETTINGS:
        log(f"-- T = {temperature:g}, top-p {top_p:g}")
        plain = run.ours(wide, None, 1, f"target-only T={temperature:g}", "none", name,
                         temperature, top_p)
        rows.append(plain)
        for k in (4, "auto"):
            for coupling in COUPLINGS:
                r = run.ours(wide, models.mtp_on(), k, f"mtp k={k} {coupling} T={temperature:g}",
                             "mtp", name, temperature, top_p, coupling=coupling)
                r.speedup_vs_target = r.tok_s / plain.tok_s if plain.tok_s else 0.0
                rows.append(r)
                log(f"{r.name:<34} {r.tok_s:7.1f} tok/s ×{r.speedup_vs_target:.2f} "
                    f"{r.tokens_per_pass:.2f} tokens/pass, per position "
                    + " ".join(f"{a:.2f}" for a in r.per_position_acceptance))
        pays[f"T={temperature:g}"] = abba(
            lambda t=temperature, p=top_p: run.ours(wide, models.mtp_on(), "auto", "pair", "mtp",
                                                    name, t, p, coupling="gumbel").tok_s,
            lambda t=temperature, p=top_p: run.ours(wide, None, 1, "pair", "none", name, t,
                                                    p).tok_s,
            cfg.parity_pairs)
        log(f"seeded (gumbel) mtp auto ÷ target-only: {describe(pays[f'T={temperature:g}'])}")
    same = {f"T={t:g}": same_contexts(Engine(wide, models.tokenizer, models.mtp_on()),
                                      run.prompts, min(cfg.max_tokens, 48),
                                      SamplingConfig(temperature=t, top_p=p, seed=0), log)
            for t, p in SETTINGS}
    result = {"machine": machine(), "config": asdict(cfg), "rows": row_dicts(rows),
              "seeded_auto_vs_target_only": pays, "first_draft_same_contexts": same,
              "minutes": (time.perf_counter() - started) / 60}
    write_json(result, out / "bench-coupling.json")
    (out / "BENCH-coupling.md").write_text("\n".join(report(result)) + "\n")
    return result


def same_contexts(engine: Engine, prompts: list[list[int]], tokens: int, cfg: SamplingConfig,
                  log: Log, noises: int = 256) -> dict[str, float]:
    """The first draft's acceptance under each coupling on the SAME contexts (the rows above
    sample different texts per coupling): along each prompt's target-only continuation, at
    every position p (the target's processed distribution) and q (the drafter's first draft),
    Leviathan's chance Σ min(p, q) = 1 − TV, the Gumbel coupling's P(argmax(log q + g) =
    argmax(log p + g)) over `noises` draws of g, and its bound (1 − TV)/(1 + TV)."""
    conv, sampler = engine.conversation(draft_length=1), Sampler(cfg)
    lev, gum, bound = [], [], []
    for i, prompt in enumerate(prompts):
        conv.reset()
        end = [e for e in conv.generate(prompt, max_tokens=tokens, ignore_eos=True,
                                        sampling=SamplingConfig(**{**asdict(cfg), "seed": i}))
               if isinstance(e, TurnEnd)][0]
        text = list(end.tokens)
        for t in range(len(text)):
            conv.reset()
            conv.prefill(prompt + text[:t])
            draft = conv.draft(1, sampler)
            logits, _ = conv.verify(draft)
            p = np.array(sampler.distribution(logits[:1], prompt + text[:t], []), np.float64)[0]
            q = np.array(draft.probs, np.float64)[0]
            overlap = np.minimum(p, q).sum()
            tv = 1.0 - overlap
            g = np.random.default_rng((i, t)).gumbel(size=(noises, len(p)))
            with np.errstate(divide="ignore"):
                same = (np.argmax(np.log(p) + g, 1) == np.argmax(np.log(q) + g, 1)).mean()
            lev.append(overlap)
            gum.append(same)
            bound.append((1 - tv) / (1 + tv))
    out = {"positions": len(lev), "leviathan": float(np.mean(lev)),
           "gumbel": float(np.mean(gum)), "gumbel_bound": float(np.mean(bound))}
    log(f"first draft on the same {out['positions']} contexts ({cfg.temperature:g}, top-p "
        f"{cfg.top_p:g}): leviathan {out['leviathan']:.3f}, gumbel {out['gumbel']:.3f} "
        f"(bound {out['gumbel_bound']:.3f})")
    return out


def report(result: dict[str, Any]) -> list[str]:
    lines = ["# Benchmark: drafter-invariant (seeded) vs Leviathan acceptance", "",
             reproduce_line("coupling", result), "",
             "The widened demo target (f32, memory-bound) with its MTP head; the bench's "
             "held-out prompts, prompt i drawn with seed i. `gumbel` is what a seeded request "
             "gets (its answer is the target-only one for its seed), `leviathan` an unseeded "
             "one. Per-position acceptance: the share of rounds whose drafts 1..i were all "
             "accepted." + (f" {result['note']}" if result.get("note") else ""), "",
             "| row | tok/s | × target-only | tokens/pass | acceptance by position |",
             "|---|---|---|---|---|"]
    for r in result["rows"]:
        per = " ".join(f"{a:.2f}" for a in r.get("per_position_acceptance") or [])
        lines.append(f"| {r['name']} | {r['tok_s']:.1f} | "
                     f"{r.get('speedup_vs_target') or 1:.2f} | {r.get('tokens_per_pass') or 1:.2f}"
                     f" | {per} |")
    lines += ["", "Seeded requests still pay? mtp auto (gumbel) ÷ target-only tok/s, ABBA "
              "pairs (median, then each pair):", ""]
    lines += [f"- {k}: {describe(v)}" for k, v in result["seeded_auto_vs_target_only"].items()]
    lines += ["", "The rows above sample a different text per coupling (seeded answers are the "
              "target-only ones; Leviathan's are not), so they differ by text as well as by "
              "coupling. On the same contexts — each prompt's target-only continuation, every "
              "position — the first draft's chance of acceptance:", "",
              "| setting | positions | Leviathan Σ min(p, q) | Gumbel (256 noise draws) | "
              "Gumbel's bound (1 − TV)/(1 + TV) |", "|---|---|---|---|---|"]
    for k, v in result["first_draft_same_contexts"].items():
        lines.append(f"| {k} | {v['positions']} | {v['leviathan']:.3f} | {v['gumbel']:.3f} | "
                     f"{v['gumbel_bound']:.3f} |")
    return lines
