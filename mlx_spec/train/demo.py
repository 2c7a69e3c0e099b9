"""Build the bundled demo model pair from scratch, offline: `python -m mlx_spec.train.demo`.

Stages (each resumable, each skipped when its output exists):
  1. tokenizer  — byte-level BPE on the stdlib corpus
  2. tokens     — the corpus encoded to uint16 arrays (train / held-out)
  3. target     — a small qwen3 code model, saved as an mlx-lm directory (+ an 8-bit copy)
  4. drafters   — an MTP head and a small draft model, distilled from the frozen target
  (eagle3: an EAGLE-3 head on the drafters' rows, measured as the MTP head is, not installed)
Long stages run outside CI; the results are committed under assets/models/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from . import corpus
from .tokenizer import chatml, save_tokenizer, train_tokenizer

VOCAB_SIZE = 4096

TARGET_CONFIG = {
    "model_type": "qwen3",
    "hidden_size": 192,
    "num_hidden_layers": 4,
    "intermediate_size": 512,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "rms_norm_eps": 1e-6,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}


def build_tokenizer(work: Path) -> Path:
    out = work / "tokenizer"
    if not (out / "tokenizer.json").exists():
        texts = corpus.documents("train", chat_template=chatml)
        save_tokenizer(train_tokenizer(texts, VOCAB_SIZE), out)
    return out


def encode_split(work: Path, tok_dir: Path, split: str) -> np.ndarray:
    path = work / f"{split}.u16.npy"
    if not path.exists():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        eos = tok.token_to_id("<|endoftext|>")
        ids: list[int] = []
        docs = list(corpus.documents(split, chat_template=chatml))
        for enc in tok.encode_batch(docs, add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(eos)
        np.save(path, np.asarray(ids, dtype=np.uint16))
    return np.load(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("runs/demo"))
    ap.add_argument("--stage", choices=["tokenizer", "target", "drafters", "mtp", "draft",
                                        "eagle3", "all"],
                    default="all", help="mtp: retrain only the MTP head and install it beside "
                    "the bundled targets (the draft model is left as it is); draft: the same "
                    "for the draft model; eagle3: an EAGLE-3 head on the same rows and "
                    "held-out prompts, written to WORK/eagle3 (not installed)")
    ap.add_argument("--target-steps", type=int, default=1300)
    ap.add_argument("--mtp-steps", type=int, default=1200)
    ap.add_argument("--draft-steps", type=int, default=800)
    ap.add_argument("--target-lr", type=float, default=3e-3)
    ap.add_argument("--init-from", type=Path, default=None,
                    help="continue the target from this model directory's weights")
    ap.add_argument("--mtp-init", type=Path, default=None,
                    help="--stage mtp: start the head from this head directory (e.g. the "
                         "bundled assets/models/demo-target/mtp) instead of random weights")
    ap.add_argument("--mtp-minutes", type=float, default=None,
                    help="--stage mtp: train this long instead of --mtp-steps (resumable)")
    ap.add_argument("--draft-init", type=Path, default=None,
                    help="--stage draft: start from this model directory (e.g. the bundled "
                         "assets/models/demo-draft) instead of random weights")
    ap.add_argument("--draft-minutes", type=float, default=None,
                    help="--stage draft: train this long instead of --draft-steps (resumable)")
    ap.add_argument("--eagle3-minutes", type=float, default=60.0,
                    help="--stage eagle3: train this long (resumable: a rerun trains this "
                         "much more)")
    ap.add_argument("--out", type=Path, default=Path("assets/models"))
    args = ap.parse_args(argv)
    tok_dir = build_tokenizer(args.work)
    train = encode_split(args.work, tok_dir, "train")
    held = encode_split(args.work, tok_dir, "heldout")
    print(f"corpus: {len(train):,} train tokens, {len(held):,} held-out tokens", flush=True)
    if args.stage in ("target", "all"):
        from .modeldir import save_model_dir
        from .target import TrainConfig, train_lm

        warmup = 100 if args.init_from is None else 30
        cfg = TrainConfig(steps=args.target_steps, batch_size=16, seq_len=256,
                          lr=args.target_lr, warmup=warmup, seed=1 if args.init_from else 0)
        model = train_lm(TARGET_CONFIG, train, held, cfg, args.work / "target-train",
                         log=lambda s: print(s, flush=True), init=args.init_from)
        save_model_dir(args.work / "target", model, TARGET_CONFIG, tokenizer_dir=tok_dir)
    if args.stage in ("drafters", "all"):
        build_drafters(args, tok_dir, train)
    if args.stage == "mtp":
        retrain_mtp(args, train, held)
    if args.stage == "draft":
        retrain_draft(args, tok_dir, train, held)
    if args.stage == "eagle3":
        train_eagle3(args, train, held)


DRAFT_CONFIG = dict(TARGET_CONFIG, hidden_size=96, num_hidden_layers=2, intermediate_size=256,
                    num_attention_heads=3, head_dim=32)


def build_drafters(args, tok_dir: Path, train: np.ndarray) -> None:
    """Distil the MTP head and the draft model from the trained target; write assets/models/."""
    import json
    import shutil

    import mlx.core as mx
    from mlx_lm.utils import quantize_model

    from ..drafters.mtp import MTPConfig
    from ..loading import load_target
    from .distill import DistillConfig, distill_draft_model, distill_mtp
    from .modeldir import save_model_dir

    target, _ = load_target(args.work / "target")
    dc = DistillConfig(steps=args.mtp_steps, batch_size=8, seq_len=128, lr=2e-3)
    data = distill_data(args.work, target, train, dc)
    cfg = MTPConfig.for_target(target, "shared-kv", hidden_size=128, num_layers=2,
                               num_heads=4, intermediate_size=384)
    mtp_dir = args.work / "mtp"
    if not (mtp_dir / "mtp.safetensors").exists():
        distill_mtp(target, data, cfg, dc, mtp_dir)
    draft_dir = args.work / "draft"
    if not (draft_dir / "model.safetensors").exists():
        ddc = DistillConfig(steps=args.draft_steps, batch_size=8, seq_len=128, lr=3e-3)
        student = distill_draft_model(target, data, DRAFT_CONFIG, ddc, args.work / "draft-train")
        save_model_dir(draft_dir, student, DRAFT_CONFIG, tokenizer_dir=tok_dir, dtype=mx.bfloat16)
    shutil.copytree(draft_dir, args.out / "demo-draft", dirs_exist_ok=True)
    # the target in bf16 (f32 training, half the bytes) and its 8-bit quantized form
    f32_dir, q8_dir = args.out / "demo-target", args.out / "demo-target-q8"
    save_model_dir(f32_dir, target.model, TARGET_CONFIG, tokenizer_dir=tok_dir, dtype=mx.bfloat16)
    qmodel, qconfig = quantize_model(target.model, dict(TARGET_CONFIG), group_size=64, bits=8)
    save_model_dir(q8_dir, qmodel, qconfig, tokenizer_dir=tok_dir)
    for d in (f32_dir, q8_dir):  # an MTP head installed beside each target is found by itself
        shutil.copytree(mtp_dir, d / "mtp", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("train"))
    metrics = json.loads((args.work / "target-train" / "metrics.json").read_text())
    (args.out / "build.json").write_text(json.dumps(
        {"target_heldout_loss": metrics["heldout_loss"], "target_steps": metrics["steps"],
         "mtp_steps": args.mtp_steps, "draft_steps": args.draft_steps,
         "train_tokens": int(len(train))}, indent=2))


def demo_target_for_training(work: Path):
    """The demo target in f32: the run's own (`work/target`), else the bundled bf16 one cast."""
    from ..assets import DEMO_TARGET_F32, demo_model
    from ..loading import load_target

    if (work / "target" / "config.json").exists():
        return load_target(work / "target")
    return load_target(demo_model(DEMO_TARGET_F32), dtype="float32")


def retrain_mtp(args, train: np.ndarray, held: np.ndarray) -> None:
    """`--stage mtp`: the MTP head again, with the current recipe (every position, weighted by
    the tokens that ride on it), optionally from a head already trained; installed beside both
    bundled targets with its held-out curve (3 held-out corpus windows, greedy, k = 4 / 8)."""
    import json
    import shutil

    from ..drafters.mtp import MTPConfig
    from ..drafters.mtp_files import CONFIG_FILE
    from .data import held_rows
    from .distill import DistillConfig, Progress, distill_mtp, held_out_scores

    log = lambda s: print(s, flush=True)  # noqa: E731
    target, tokenizer = demo_target_for_training(args.work)
    dc = DistillConfig(steps=args.mtp_steps, batch_size=8, seq_len=128, lr=2e-3)
    data = distill_data(args.work, target, train, dc)
    if args.mtp_init is not None:
        raw = json.loads((args.mtp_init / CONFIG_FILE).read_text())
        cfg = MTPConfig(**{k: v for k, v in raw.items() if k in MTPConfig.__dataclass_fields__})
    else:
        cfg = MTPConfig.for_target(target, "shared-kv", hidden_size=128, num_layers=2,
                                   num_heads=4, intermediate_size=384)
    prompts = held_out_prompts(held)
    seconds = args.mtp_minutes * 60 if args.mtp_minutes else None
    out = args.work / "mtp-retrained"
    distill_mtp(target, data, cfg, dc, out, Progress(), seconds=seconds, init=args.mtp_init,
                held=held_rows(target, prompts, dc.seq_len),
                evaluate=lambda d: held_out_scores(target, tokenizer, d, prompts))
    for name in ("demo-target", "demo-target-q8"):
        shutil.copytree(out, args.out / name / "mtp", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("train"))
    log(f"installed the head beside {args.out}/demo-target and demo-target-q8")


def held_out_prompts(held: np.ndarray) -> list[list[int]]:
    """The 3 held-out corpus windows every demo drafter's curve is measured on."""
    return [held[i : i + 32].tolist() for i in range(0, 3 * 400, 400)]


def train_eagle3(args, train: np.ndarray, held: np.ndarray) -> None:
    """`--stage eagle3`: the kind that won per minute of training (docs/TRAIN.md) on the rows
    and held-out prompts the bundled MTP head was trained and measured on, so their curves
    compare; written to WORK/eagle3 in the speculators format, not installed."""
    from .data import held_rows
    from .distill import DistillConfig, Progress, distill_eagle3, held_out_scores

    target, tokenizer = demo_target_for_training(args.work)
    dc = DistillConfig(batch_size=8, seq_len=128, lr=2e-3)  # steps: the time decides
    data = distill_data(args.work, target, train, dc)
    prompts = held_out_prompts(held)
    distill_eagle3(target, data, dc, args.work / "eagle3", Progress(),
                   seconds=args.eagle3_minutes * 60, eval_every=10 * 60,
                   held=held_rows(target, prompts, dc.seq_len),
                   evaluate=lambda d: held_out_scores(target, tokenizer, d, prompts))
    print(f"EAGLE-3 head written to {args.work / 'eagle3'}", flush=True)


def distill_data(work: Path, target, train: np.ndarray, dc) -> np.ndarray:
    """The drafters' rows (half of them the target's own continuations), made once per run
    directory and shared by the MTP head and the draft model."""
    from .data import build_training_set

    path = work / "distill-data.npy"
    if not path.exists():
        np.save(path, build_training_set(target, train, dc, n_generated=512,
                                         log=lambda s: print(s, flush=True)))
    return np.load(path)


def retrain_draft(args, tok_dir: Path, train: np.ndarray, held: np.ndarray) -> None:
    """`--stage draft`: the draft model again, distilled from the target's distributions,
    optionally continuing one already trained (`--draft-init`); its held-out tokens per pass
    (k = 4 / 8, greedy) before and after; installed as the bundled demo-draft (bf16)."""
    import json

    import mlx.core as mx

    from ..drafters import DraftModelDrafter
    from ..model import TargetModel
    from .distill import DistillConfig, distill_draft_model, held_out_scores
    from .modeldir import save_model_dir

    log = lambda s: print(s, flush=True)  # noqa: E731
    target, tokenizer = demo_target_for_training(args.work)
    # a continued model re-warms to half the first run's peak rate (as the target's second run)
    lr = 3e-3 if args.draft_init is None else 1.5e-3
    dc = DistillConfig(steps=args.draft_steps, batch_size=8, seq_len=128, lr=lr)
    data = distill_data(args.work, target, train, dc)
    prompts = held_out_prompts(held)

    def scores(model) -> dict:
        draft = TargetModel(model, target.context_length, name="demo-draft",
                            config=DRAFT_CONFIG, tokenizer=target.tokenizer)
        drafter = DraftModelDrafter(draft, target)
        return held_out_scores(target, tokenizer, drafter, prompts)

    workdir = args.work / "draft-retrain"
    before = None
    if args.draft_init is not None and not (workdir / "checkpoint.safetensors").exists():
        from .modeldir import build_model

        start = build_model(DRAFT_CONFIG)
        start.load_weights(str(args.draft_init / "model.safetensors"), strict=True)
        start.set_dtype(mx.float32)
        before = scores(start)
        log(f"held-out before: {before}")
    seconds = args.draft_minutes * 60 if args.draft_minutes else None
    student = distill_draft_model(target, data, DRAFT_CONFIG, dc, workdir, seconds=seconds,
                                  init=args.draft_init)
    after = scores(student)
    log(f"held-out after: {after}")
    out = args.out / "demo-draft"
    save_model_dir(out, student, DRAFT_CONFIG, tokenizer_dir=tok_dir, dtype=mx.bfloat16)
    (workdir / "held_out.json").write_text(json.dumps({"before": before, "after": after}))
    log(f"installed the draft model at {out}")


if __name__ == "__main__":
    main()
