"""`uv run python -m benchmarks [--group G] [--quick] [--out DIR]`: the project's benchmark, run
from a checkout (not part of the wheel; the installed `mlx-spec bench --model M` times one model).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlx_spec._platform import maybe_preload_openblas

from .runners import QUICK, BenchConfig
from .scenario import GROUPS

HELP = ("all: the full run (docs/BENCH.md, with published and first-turn); published: Gemma 4 "
        "assistant and EAGLE-3 rows (BENCH-drafters.md); first-turn: auto's first turn before "
        "calibration (BENCH-first-turn.md); serve: 1-8 streaming clients, ours and mlx_lm.server "
        "(BENCH-serve.md); distributed: the target split over 2 ranks as the link slows "
        "(BENCH-distributed.md); demo: the bundled pair as a first run opens it (BENCH-demo.md); "
        "real: published GGUF models (BENCH-real.md); smollm2: the first run's chat model with its "
        "shipped head (BENCH-smollm2.md); coupling: seeded (drafter-invariant) "
        "against Leviathan acceptance (BENCH-coupling.md); soak: the server held under a mixed "
        "load of SDK clients (BENCH-soak.md); trace: traced turns against untraced "
        "(BENCH-trace.md); serve, distributed, real, smollm2, coupling, soak and trace are "
        "not part of all")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks",
                                 description="side-by-side speed benchmark (writes docs/)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--group", default="all", choices=list(GROUPS), help=HELP)
    ap.add_argument("--out", default="docs")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a real process: OpenBLAS preloaded as the CLI does (memory-bound f32)
        maybe_preload_openblas(sys.argv[1:], module="benchmarks")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = QUICK if args.quick else BenchConfig()
    GROUPS[args.group](cfg, Path(args.out), lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
