"""Acceptance of the demo drafters on held-out prompts: `python -m benchmarks.evaluate`.

Prints (and with --out writes as JSON) tokens per target pass and acceptance for the MTP head at
k = 1..8 and the draft model at k = 4, greedy and at T = 0.7, on the 8-bit and bf16 targets.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlx_spec.assets import DEMO_DRAFT, DEMO_TARGET, DEMO_TARGET_F32, demo_model
from mlx_spec.loading import load_target, make_drafter
from mlx_spec.train.corpus import prompts_from_corpus

from .runners import measure_acceptance


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for name in (DEMO_TARGET, DEMO_TARGET_F32):
        path = demo_model(name)
        target, tok = load_target(path)
        prompts = prompts_from_corpus(tok, args.prompts, length=64)
        for temp in (0.0, 0.7):
            ks = range(1, 9) if temp == 0.0 else (4,)
            for drafter in ("mtp", "draft"):
                for k in ks if drafter == "mtp" else (4,):
                    d = make_drafter(drafter, target, model_path=path,
                                     draft_model=demo_model(DEMO_DRAFT))
                    r = {"target": name, "drafter": drafter, "k": k, "temperature": temp,
                         **measure_acceptance(target, tok, d, k, prompts, args.max_tokens,
                                              temp)}
                    print(f"{name:<16} {drafter:<6} k={k} T={temp:<4} "
                          f"{r['tokens_per_pass']:.2f} tokens/pass, "
                          f"acceptance {r['acceptance']:.0%}", flush=True)
                    rows.append(r)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
