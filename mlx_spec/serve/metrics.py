"""`GET /metrics`: Prometheus text under vLLM's metric names, so dashboards made for vLLM read
this server unchanged: requests running and waiting, prompt and generated tokens, time to first
token and inter-token latency histograms, and the speculation counters (drafting rounds, drafted
and accepted tokens, accepted tokens per draft position)."""

from __future__ import annotations

import threading
from bisect import bisect_left

from ..events import TurnStats

PREFIX = "vllm:"  # the names vLLM dashboards read
OWN = "mlx_spec:"  # ours, where vLLM has none
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = name, help, buckets
        self.counts = [0] * (len(buckets) + 1)  # the last: +Inf
        self.sum, self.n = 0.0, 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds
        self.n += 1

    def render(self) -> list[str]:
        name = PREFIX + self.name
        lines = [f"# HELP {name} {self.help}", f"# TYPE {name} histogram"]
        total = 0
        for le, c in zip([*map(str, self.buckets), "+Inf"], self.counts, strict=True):
            total += c
            lines.append(f'{name}_bucket{{le="{le}"}} {total}')
        return lines + [f"{name}_sum {self.sum}", f"{name}_count {self.n}"]


class Metrics:
    """Counters kept by the engine thread and read by the HTTP threads (under one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = self.prompt_tokens = self.generation_tokens = 0
        self.drafts = self.draft_tokens = self.accepted_tokens = 0
        self.accepted_per_pos: list[int] = []
        self.verify_passes = self.verify_rows = 0  # target verify passes, the rounds they ran
        self.ttft = Histogram("time_to_first_token_seconds",
                              "Time from a request's arrival to its first token.", TTFT_BUCKETS)
        self.itl = Histogram("inter_token_latency_seconds",
                             "Time between a request's consecutive tokens.", ITL_BUCKETS)

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def next_token(self, seconds: float) -> None:
        with self._lock:
            self.itl.observe(seconds)

    def verified(self, passes: int, rows: int) -> None:
        """`passes` target verify passes ran `rows` requests' rounds."""
        with self._lock:
            self.verify_passes += passes
            self.verify_rows += rows

    def finished(self, s: TurnStats) -> None:
        with self._lock:
            self.requests += 1
            self.prompt_tokens += s.prompt_tokens
            self.generation_tokens += s.generated_tokens
            self.drafts += s.per_position_drafted[0] if s.per_position_drafted else 0
            self.draft_tokens += s.drafted
            self.accepted_tokens += s.accepted
            grow = len(s.per_position_accepted) - len(self.accepted_per_pos)
            self.accepted_per_pos += [0] * max(0, grow)
            for i, a in enumerate(s.per_position_accepted):
                self.accepted_per_pos[i] += a

    def render(self, *, running: int, waiting: int, reserved: int = 0,
               budget: int | None = None) -> str:
        with self._lock:
            lines = []
            for name, kind, help, value in (
                ("num_requests_running", "gauge", "Requests generating now.", running),
                ("num_requests_waiting", "gauge", "Requests waiting for a slot.", waiting),
                ("request_success_total", "counter", "Requests finished.", self.requests),
                ("prompt_tokens_total", "counter", "Prompt tokens processed.",
                 self.prompt_tokens),
                ("generation_tokens_total", "counter", "Tokens generated.",
                 self.generation_tokens),
                ("spec_decode_num_drafts_total", "counter", "Rounds that drafted.",
                 self.drafts),
                ("spec_decode_num_draft_tokens_total", "counter", "Tokens drafted.",
                 self.draft_tokens),
                ("spec_decode_num_accepted_tokens_total", "counter", "Drafted tokens accepted.",
                 self.accepted_tokens),
                (OWN + "verify_passes_total", "counter", "Target verify passes.",
                 self.verify_passes),
                (OWN + "verify_rounds_total", "counter",
                 "Requests' rounds those passes verified (÷ passes: the mean batch).",
                 self.verify_rows),
                *memory_gauges(),
                (OWN + "cache_reserved_bytes", "gauge",
                 "Cache memory the admitted requests reserve (their longest).", reserved),
                *([(OWN + "cache_budget_bytes", "gauge",
                    "Cache memory the server admits requests up to (serve --kv-memory).",
                    budget)] if budget is not None else []),
            ):
                name = name if name.startswith(OWN) else PREFIX + name
                lines += [f"# HELP {name} {help}", f"# TYPE {name} {kind}", f"{name} {value}"]
            name = PREFIX + "spec_decode_num_accepted_tokens_per_pos_total"
            lines += [f"# HELP {name} Drafted tokens accepted, by position in the draft.",
                      f"# TYPE {name} counter"]
            lines += [f'{name}{{position="{i}"}} {a}' for i, a in enumerate(self.accepted_per_pos)]
            return "\n".join(lines + self.ttft.render() + self.itl.render()) + "\n"


def memory_gauges() -> list[tuple[str, str, str, int]]:
    """MLX's memory now: what arrays hold, and what its allocator keeps cached for reuse
    (freed buffers it has not returned: a server's memory growth is one or the other)."""
    import mlx.core as mx

    return [(OWN + "mlx_active_memory_bytes", "gauge", "Memory MLX arrays hold now.",
             mx.get_active_memory()),
            (OWN + "mlx_cache_memory_bytes", "gauge",
             "Memory MLX's allocator keeps cached for reuse.", mx.get_cache_memory())]

