"""`mlx-spec train-drafter`: what a run is asked for turned into data, a head kind and a budget,
then the one distiller (distill.py), then the curve before and after in one summary line.

Without --data a chat model learns from its own answers to chat prompts in its template
(chat.py); a model without a template from its own continuations of built-in prompts; with
--data, from that text (its last 5% held out) and the target's continuations of it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..drafters.mtp_files import CONFIG_FILE
from ..errors import MlxSpecError
from .chat import chat_training_set
from .config import DistillConfig
from .data import build_training_set, encode, held_rows, read_text_data
from .distill import (
    Progress,
    _check_resume,
    _previous_curve,
    _resume_keys,
    check_settings,
    default_kind,
    default_lr,
    default_mtp_config,
    distill_eagle3,
    distill_mtp,
    held_out_scores,
)

# the chat prompts a timed run goes down (unless --chat-prompts), answering until its answering
# budget (30%) is spent; the list is the same whatever the budget, so a resumed sitting reads
# the answers an earlier one wrote and goes on down it
CHAT_PROMPTS = 2048


def held_out_split(tokenizer: Any, data: str | None, dc: DistillConfig):
    """(corpus tokens or None, prompts to continue or None, held-out prompts). From `data` (a
    text file or directory): its last 5% are held out. Without: the target's own continuations
    of the built-in prompts, the last few of them held out."""
    from .prompts import HELD_OUT, PROMPTS

    if data:
        ids = encode(tokenizer, read_text_data(Path(data)))
        cut = len(ids) - max(3 * 48, len(ids) // 20)
        if cut < dc.seq_len + 2:
            raise MlxSpecError(f"training data too short: {len(ids)} tokens, need > "
                               f"{dc.seq_len + 3 * 48 + 1}")
        held = ids[cut:]
        return np.asarray(ids[:cut], dtype=np.int32), None, [held[i : i + 32]
                                                              for i in range(0, 3 * 48, 48)]
    encoded = [encode(tokenizer, [p]) for p in PROMPTS]
    return None, encoded[:-HELD_OUT], encoded[-HELD_OUT:]


def cmd_train_drafter(args) -> int:

    from ..loading import load_target

    t0 = time.perf_counter()
    if args.minutes is not None and args.steps is not None:
        raise MlxSpecError("give --steps or --minutes, not both")
    budget = args.minutes * 60 if args.minutes is not None else None
    target, tokenizer = load_target(args.target)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    kind = args.kind or default_kind(target, log)
    eagle = kind == "eagle3"
    cfg = None if eagle else default_mtp_config(target, kind)
    lr = args.lr or default_lr(target.hidden_size if eagle else cfg.hidden_size)
    dc = DistillConfig(steps=args.steps or 2000, minutes=args.minutes, seed=args.seed,
                       batch_size=args.batch_size, seq_len=args.seq_len, lr=lr,
                       depth=getattr(args, "depth", None) or DistillConfig.depth)
    tokens, prompts, held_out = held_out_split(tokenizer, args.data, dc)
    # beside the model's own directory (a GGUF's: its converted one, where auto looks)
    out = Path(args.out) if args.out else target.path / ("eagle3" if eagle else "mtp")
    draft_vocab = getattr(args, "draft_vocab", None)
    if draft_vocab is not None and not eagle:
        raise MlxSpecError("--draft-vocab is for --kind eagle3 (a head with its own lm_head)")
    _check_resume(out, *_resume_keys(target, cfg, dc.depth, draft_vocab))  # before any data
    check_settings(out, dc)
    if args.data is None and getattr(tokenizer, "chat_template", None) is not None:
        # a chat model: its own answers to chat prompts, in its template (train/chat.py)
        data, held, held_out = chat_training_set(
            target, tokenizer, dc.seq_len, out / "train" / "chat", seed=dc.seed, log=log,
            seconds=budget * 0.3 if budget else None,
            n_prompts=getattr(args, "chat_prompts", None) or (
                CHAT_PROMPTS if budget else min(512, max(32, dc.steps // 4))))
    else:
        n_gen = 256 if budget else min(256, max(32, dc.steps // 4))
        data = build_training_set(target, tokens, dc, n_gen, log, prompts=prompts,
                                  seconds=budget * 0.25 if budget else None)
        held = held_rows(target, held_out, dc.seq_len, dc.seed)  # where weights are estimated
    seconds = None if budget is None else max(10.0, budget - (time.perf_counter() - t0))

    def evaluate(drafter) -> dict:
        return held_out_scores(target, tokenizer, drafter, held_out)

    run = dict(progress=Progress(), seconds=seconds, evaluate=evaluate, held=held,
               deadline=None if budget is None else t0 + budget)
    if eagle:
        distill_eagle3(target, data, dc, out, draft_vocab=draft_vocab, **run)
    else:
        distill_mtp(target, data, cfg, dc, out, **run)
    curve = _previous_curve(out / ("training.json" if eagle else CONFIG_FILE))
    first, last = (curve or [{}])[0], (curve or [{}])[-1]
    for name, point in (("before", first), ("after", last)):
        acc = " ".join(f"{a:.2f}" for a in point.get("acceptance_k8", []))
        print(f"held-out {name} ({point.get('step', '?')} steps): per-position acceptance at "
              f"k=8: {acc}; {point.get('tokens_per_pass_k8', 0):.2f} tokens per pass at k=8",
              file=sys.stderr)
    print(f"mlx-spec: trained {last.get('step', '?')} steps in "
          f"{(time.perf_counter() - t0) / 60:.1f} min: {last.get('tokens_per_pass', 0):.2f} "
          f"tokens per target pass at k=4 on held-out text (greedy); head in {out}"
          + (" (found by `--drafter auto` beside the model)" if out.parent == target.path
             else f" (use it with --draft-model {out})" if eagle else ""),
          file=sys.stderr)
    return 0
