"""What acceptance a drafter needs on this machine, read off the bench's fixed-k rows.

A round of k drafts (draft them, verify k + 1 tokens in one pass) took tokens/pass ÷ tok/s
seconds in a row; a target-only token 1 ÷ that row's tok/s. A drafter whose drafts are each
accepted with the same chance α, given the ones before it were, emits E(α, k) = 1 + α + … + α^k
tokens a round (`expected_by_k`), so it runs ×S the target alone where

    E(α, k) = S · (round seconds ÷ target-only token seconds).

Solved for α, that is how good a drafter must be at this k on this machine for ×S: the device's
side of a speedup (its verify pass and this drafter's cost per round), apart from what the
drafter gets right. The row's own tokens/pass, put the same way, is what it got right."""

from __future__ import annotations

from typing import Any

from mlx_spec.engine.adaptive import expected_by_k

GOALS = (1.0, 1.5, 2.0, 2.5)


def equal_acceptance(tokens: float, k: int) -> float | None:
    """The α with E(α, k) = tokens (E climbs from 1 at α = 0 to k + 1 at α = 1): bisection.
    None where no α reaches it (more than k + 1 tokens a round)."""
    if tokens > k + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_by_k([mid] * k)[k] < tokens else (lo, mid)
    return lo


def round_ratio(row: dict[str, Any], plain: dict[str, Any]) -> float:
    """A round's seconds ÷ a target-only token's, both pooled over the same prompts."""
    return (row["tokens_per_pass"] / row["tok_s"]) * plain["tok_s"]


def needed_section(rows: list[dict[str, Any]], drafter: str = "mtp") -> list[str]:
    """One line per fixed-k row of `drafter` at T = 0 and T = 1 (no top-p), against the
    target-only row at its temperature."""
    plain = {r["name"].removeprefix("target-only "): r for r in rows
             if r["name"].startswith("target-only T=")}
    fixed = sorted((r for r in rows if r["name"].startswith(f"ours {drafter} k=")
                    and r["engine"] == "mlx-spec" and r["top_p"] == 1.0 and r["tokens_per_pass"]),
                   key=lambda r: (r["temperature"], r["draft_length"]))
    lines = []
    for r in fixed:
        base = plain.get(r["name"].split()[-1])
        if base is None:
            continue
        k, ratio = int(r["draft_length"]), round_ratio(r, base)
        need = [equal_acceptance(s * ratio, k) for s in GOALS]
        own = equal_acceptance(r["tokens_per_pass"], k)
        lines.append(f"| {r['name']} | {ratio:.2f} | "
                     + " / ".join("–" if a is None else f"{a:.2f}" for a in need)
                     + f" | {r['tokens_per_pass']:.2f} ({own:.2f}) |")
    if not lines:
        return []
    goals = " / ".join(f"×{s:g}" for s in GOALS)
    return ["", f"What acceptance pays on this machine (the {drafter} head's fixed-k rows): a "
            "round's time ÷ a target-only token's, and the per-position acceptance α, the same "
            "at every position, that would make such rounds run " + goals + " the target "
            "alone (– : not even a drafter that is never wrong); the row's own tokens/pass, and "
            "the equal α that gives it. `benchmarks/needed.py` says how.", "",
            f"| row | round ÷ token | α for {goals} | tokens/pass (as equal α) |",
            "|---|---|---|---|", *lines]
