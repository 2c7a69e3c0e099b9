"""What the CLI prints of a turn: its text coloured by token kind, and the one-line summary."""

from __future__ import annotations

import sys
from typing import Any

KIND_COLOURS = {"accepted": "\x1b[32m", "corrected": "\x1b[4;31m", "bonus": "\x1b[34m"}


def print_fragment(text: str, kind: str, colour: bool) -> None:
    if colour and kind in KIND_COLOURS:
        text = f"{KIND_COLOURS[kind]}{text}\x1b[0m"
    sys.stdout.write(text)
    sys.stdout.flush()


def summary_line(s: Any, target: str = "") -> str:
    """The turn's one stderr line; `target` named first (which demo variant ran, say)."""
    line = (f"[{target + ': ' if target else ''}{s.generated_tokens} tokens, "
            f"{s.tok_s:.1f} tok/s, TTFT {s.ttft_s * 1000:.0f} ms, drafter {s.drafter}")
    if s.drafter != "none":
        k = f"auto≤{s.max_draft} (mean {s.mean_draft:.1f})" if s.adaptive else str(s.max_draft)
        line += (f" k={k}, acceptance {s.acceptance_rate:.0%}, "
                 f"{s.tokens_per_pass:.2f} tokens/pass")
        line += f", drafter mem {s.drafter_bytes / 2**20:.1f} MB"
    line += f", KV {s.kv_cache_bytes / 2**20:.1f} MB"
    if s.ranks > 1:
        line += f", target split {s.split}, {s.target_bytes / 2**20:.1f} MB of it here"
    if s.generated_tokens > 1:
        line += (f", ITL p50/p90/max {s.itl_p50_s * 1e3:.0f}/{s.itl_p90_s * 1e3:.0f}/"
                 f"{s.itl_max_s * 1e3:.0f} ms")
    return line + f", finish {s.finish_reason}]"
