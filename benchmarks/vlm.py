"""Side by side with mlx-vlm (0.7.10, the `bench` dependency group): the same checkpoint on
disk, the same prompts and draft length, each engine in a process of its own, the two in
mirrored (ABBA) pairs.

A *side* is one engine over one target directory and a list of rows (target-only, then each
drafter at its k). `run_side` starts a Python child (`main(SPEC, OUT)`); the child loads
the target once, measures every row (each after a warm-up of its own) and writes the rows
(runners.Row, tokens included) to OUT. Our child drives the product's loader and the bench's
own row runner (runners.Runner.ours: a fresh engine per row). mlx-vlm's child drives
`mlx_vlm.generate.ar.generate_step` with `draft_model` / `draft_kind` / `draft_block_size = k + 1`
and reads its per-round record (`accept_lens`, `draft_lens`) for the tokens per target pass and
the per-position acceptance; its DFlash block is held at the requested size
(`prefer_requested_block_size`, as its MTP and EAGLE-3 drafters already are) so both sides run
the same k. mlx-vlm is imported only in that child: nothing in mlx_spec imports it otherwise.
Timings are measured here and never asserted by tests.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx

from .parity import mirrored, pair_ratios
from .runners import Row, Runner, itl_ms, pooled_tok_s, timed

ENGINES = ("mlx-spec", "mlx-vlm")
OPT_IN = "MLX_SPEC_BENCH_VLM"  # =1: the published group runs the side-by-side rows too
CHILD = "import sys; from benchmarks.vlm import main; sys.exit(main(sys.argv[1:]))"


def wanted() -> bool:
    """The side-by-side rows are asked for (the env var) — they need mlx-vlm installed."""
    return os.environ.get(OPT_IN, "") not in ("", "0")


def requested_pairs() -> int:
    """MLX_SPEC_BENCH_VLM=N: N mirrored pairs (1 for any other value)."""
    raw = os.environ.get(OPT_IN, "1")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def available() -> bool:
    """mlx-vlm importable here (a dev-side dependency: `uv sync --group bench`)."""
    import importlib.util

    return importlib.util.find_spec("mlx_vlm") is not None


def vlm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlx-vlm")
    except PackageNotFoundError:
        return None


@dataclass(frozen=True)
class RowSpec:
    """One row of a side: `kind` None is target-only; else ours: a make_drafter kind ("mtp",
    "draft"), mlx-vlm: a draft_kind ("mtp", "eagle3", "dflash"); `draft` the drafter's
    directory (None: the target's own, e.g. its MTP head)."""

    name: str  # the drafter's part of the row name, e.g. "dflash k=15"
    drafter: str  # Row.drafter
    kind: str | None = None
    draft: str | None = None
    k: int = 0


@dataclass(frozen=True)
class Side:
    engine: str  # one of ENGINES
    target: str  # the target's directory
    target_name: str  # Row.target (rows of one target are checked for greedy identity)
    label: str  # the group's name, the rows' prefix
    rows: tuple[RowSpec, ...]
    prompts: list[list[int]] = field(default_factory=list)
    max_tokens: int = 96

    def row_name(self, spec: RowSpec) -> str:
        return f"{self.label}: {'ours' if self.engine == 'mlx-spec' else 'mlx-vlm'} {spec.name}"


def run_side(side: Side, timeout_s: float = 1800.0) -> list[Row]:
    """The side's rows, measured in a child process of their own."""
    with tempfile.TemporaryDirectory(prefix="mlx-spec-side-") as tmp:
        spec, out = Path(tmp) / "side.json", Path(tmp) / "rows.json"
        spec.write_text(json.dumps(asdict(side), default=str))
        log = Path(tmp) / "child.log"
        with log.open("w") as f:
            proc = subprocess.run([sys.executable, "-c", CHILD, str(spec), str(out)],
                                  stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, env=child_env())
        if proc.returncode != 0 or not out.exists():
            tail = log.read_text()[-2000:]
            raise RuntimeError(f"{side.engine} side of {side.label} failed "
                               f"(exit {proc.returncode}):\n{tail}")
        return [Row(**r) for r in json.loads(out.read_text())]


def side_by_side(sides: list[Side], pairs: int) -> dict[str, Any]:
    """Both sides in `pairs` mirrored pairs (A B B A): one aggregated row per side and row spec
    (tok/s, TTFT: the mean of its runs; the rest from its first run, all greedy and
    deterministic), ours ÷ mlx-vlm per row (the median of the pairs), each side's speedup over
    its own target-only row in the same process, and every run's greedy tokens against our
    target-only ones."""
    runs = mirrored([lambda s=s: run_side(s) for s in sides], pairs)
    per_side = [[r for p in runs for r in p[i]] for i in range(len(sides))]
    rows = [[aggregate([run[j] for run in side_runs]) for j in range(len(side.rows))]
            for side, side_runs in zip(sides, per_side, strict=True)]
    reference = per_side[0][0][0].tokens  # our target-only row, first run
    mismatched = sorted({run[j].name for side_runs in per_side for run in side_runs
                         for j in range(len(run)) if run[j].tokens != reference})
    out: dict[str, Any] = {"pairs": pairs, "rows": {}, "greedy_identical": not mismatched,
                           "greedy_mismatched_rows": mismatched}
    for j, spec in enumerate(sides[0].rows):
        entry: dict[str, Any] = {"k": spec.k, "drafter": spec.drafter}
        for i, side in enumerate(sides):
            r = rows[i][j]
            speedups = [run[j].tok_s / run[0].tok_s for run in per_side[i] if run[0].tok_s]
            entry[side.engine] = {
                "tok_s": r.tok_s, "tokens_per_pass": r.tokens_per_pass,
                "acceptance": r.acceptance_rate, "per_position": r.per_position_acceptance,
                "commit_ms_per_pass": r.commit_ms_per_pass,
                "draft_ms_per_pass": 1e3 * r.draft_s_per_pass if r.draft_share is not None
                else None, "verify_ms_per_pass": r.verify_ms_per_pass or None,
                "speedup_own_target_only": statistics.median(speedups) if speedups else None,
                "tok_s_runs": [run[j].tok_s for run in per_side[i]]}
        entry["ours_vs_vlm"] = pair_ratios(runs, 0, 1, lambda rs, j=j: rs[j].tok_s)
        out["rows"][spec.name] = entry
    out["table_rows"] = [r for side_rows in zip(*rows, strict=True) for r in side_rows]
    return out


def aggregate(runs: list[Row]) -> Row:
    """One row from several runs of it: tok/s averaged, the times per pass and TTFT their
    medians (a shared host slows single runs), the counts from the first (greedy and
    deterministic: every run's are the same)."""
    def median(name: str) -> Any:
        values = [getattr(r, name) for r in runs if getattr(r, name) is not None]
        return statistics.median(values) if values else None

    return replace(runs[0], tok_s=statistics.fmean(r.tok_s for r in runs),
                   **{name: median(name) for name in (
                       "ttft_s", "draft_s_per_pass", "verify_ms_per_pass", "commit_ms_per_pass",
                       "itl_p50_ms", "itl_p90_ms")})


# -- the children ------------------------------------------------------------------------------


def measure_ours(side: Side) -> list[Row]:
    """Our loader (the directories as a user passes them) and the bench's row runner."""
    from mlx_spec.loading import load_target, make_drafter

    target, tokenizer = load_target(side.target)
    run = Runner(tokenizer, side.prompts, side.max_tokens)
    rows = []
    for spec in side.rows:
        drafter = None if spec.kind is None else make_drafter(
            spec.kind, target, model_path=side.target, draft_model=spec.draft)
        rows.append(run.ours(target, drafter, spec.k or 1, side.row_name(spec), spec.drafter,
                             side.target_name, 0.0))
    return rows


def measure_vlm(side: Side) -> list[Row]:
    """mlx-vlm's own loader and generate_step, greedy, on token ids."""
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.speculative import load_drafter
    from mlx_vlm.utils import load_model

    model = load_model(Path(side.target))
    rows = []
    for spec in side.rows:
        drafter, kind = None, None
        if spec.kind is not None:
            drafter, kind = load_drafter(spec.draft or side.target, kind=spec.kind)
            drafter.prefer_requested_block_size = True  # the requested k every round

        def stream(ids: list[int], n: int, drafter=drafter, kind=kind, k=spec.k):
            extra = {} if drafter is None else dict(draft_model=drafter, draft_kind=kind,
                                                    draft_block_size=k + 1)
            return generate_step(mx.array([ids]), model, None, None, max_tokens=n,
                                 temperature=0.0, **extra)

        list(stream(side.prompts[0][:8], 4))  # warm-up, as runners.warm_up
        row = Row(side.row_name(spec), spec.drafter, "mlx-vlm", side.target_name, 0.0, 1.0,
                  spec.k or 1)
        timings, gaps, ttfts, accepted, drafted = [], [], [], [], []
        for ids in side.prompts:
            mx.reset_peak_memory()
            items, timing = timed(stream(ids, side.max_tokens), lambda _: True)
            row.tokens.append([int(t) for t, _ in items][: side.max_tokens])
            timings.append(timing)
            gaps += timing.gaps
            ttfts.append(timing.ttft_s)
            row.peak_memory_mb = max(row.peak_memory_mb, mx.get_peak_memory() / 2**20)
            if drafter is not None:
                accepted += [int(a) for a in drafter.accept_lens]
                drafted += [int(d) for d in drafter.draft_lens]
        row.tok_s = pooled_tok_s(timings)
        row.ttft_s = statistics.fmean(ttfts)
        row.itl_p50_ms, row.itl_p90_ms = itl_ms(gaps)
        fill_acceptance(row, accepted, drafted, sum(len(t) for t in row.tokens))
        rows.append(row)
    return rows


def fill_acceptance(row: Row, accepted: list[int], drafted: list[int], tokens: int) -> None:
    """Tokens per target pass and acceptance from a per-round record, as our Totals count
    them: every token emitted (the prefill's first one too) over the rounds' target passes (a
    round: one pass, its accepted drafts and one token of its own; the prefill not counted);
    position i's acceptance: the share of the rounds drafting it that accepted it."""
    if not drafted:
        row.tokens_per_pass = 1.0  # target-only: one forward per token
        return
    rounds = len(drafted)
    row.tokens_per_pass = tokens / rounds
    row.acceptance_rate = sum(accepted) / max(sum(drafted), 1)
    row.mean_draft = sum(drafted) / rounds
    row.per_position_acceptance = [
        sum(a > i for a in accepted) / n
        for i in range(max(drafted)) if (n := sum(d > i for d in drafted))]


def main(argv: list[str]) -> int:
    raw = json.loads(Path(argv[0]).read_text())
    side = Side(**{**raw, "rows": tuple(RowSpec(**r) for r in raw["rows"])})
    rows = measure_ours(side) if side.engine == "mlx-spec" else measure_vlm(side)
    Path(argv[1]).write_text(json.dumps([asdict(r) for r in rows]))
    return 0


def child_env() -> dict[str, str]:
    """The parent's environment, with OpenBLAS preloaded where the CLI would preload it (both
    engines' children alike: f32 matmuls are memory-bound only with it, see _platform.py)."""
    from mlx_spec._platform import OPENBLAS

    env = dict(os.environ)
    preload = env.get("LD_PRELOAD", "")
    if sys.platform.startswith("linux") and os.path.exists(OPENBLAS) and OPENBLAS not in preload:
        env["LD_PRELOAD"] = ":".join(p for p in (OPENBLAS, preload) if p)
    return env

