"""Linux only: MLX's CPU backend bundles a slow reference BLAS. Debian's OpenBLAS, preloaded,
makes f32 matmul faster and memory-bound (the regime where speculation pays), so the CLI
re-executes itself once with LD_PRELOAD set when the library is installed.

OPENBLAS_THREAD_TIMEOUT is left to OpenBLAS: a short spin cost more than it saved (DESIGN.md,
"Measurements")."""

from __future__ import annotations

import os
import sys

OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"


def maybe_preload_openblas(argv: list[str], *, module: str = "mlx_spec.cli") -> None:
    if not sys.platform.startswith("linux") or os.environ.get("MLX_SPEC_NO_PRELOAD"):
        return
    if not os.path.exists(OPENBLAS) or OPENBLAS in os.environ.get("LD_PRELOAD", ""):
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (OPENBLAS, env.get("LD_PRELOAD")) if p)
    env["MLX_SPEC_NO_PRELOAD"] = "1"  # never loop
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)
