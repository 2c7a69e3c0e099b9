"""Build the bundled demo model pair from scratch, offline: `python -m mlx_spec.train.demo`.

Stages (each resumable, each skipped when its output exists):
  1. tokenizer  — byte-level BPE on the stdlib corpus
  2. tokens     — the corpus encoded to uint16 arrays (train / held-out)
  3. target     — a small qwen3 code model, saved as an mlx-lm directory (+ an 8-bit copy)
  4. drafters   — an MTP head and a small draft model, distilled from the frozen target
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
    ap.add_argument("--stage", choices=["tokenizer", "target", "drafters", "all"], default="all")
    ap.add_argument("--target-steps", type=int, default=1600)
    args = ap.parse_args(argv)
    tok_dir = build_tokenizer(args.work)
    train = encode_split(args.work, tok_dir, "train")
    held = encode_split(args.work, tok_dir, "heldout")
    print(f"corpus: {len(train):,} train tokens, {len(held):,} held-out tokens", flush=True)
    if args.stage in ("target", "all"):
        from .modeldir import save_model_dir
        from .target import TrainConfig, train_lm

        cfg = TrainConfig(steps=args.target_steps, batch_size=16, seq_len=256, lr=3e-3)
        model = train_lm(TARGET_CONFIG, train, held, cfg, args.work / "target-train",
                         log=lambda s: print(s, flush=True))
        save_model_dir(args.work / "target", model, TARGET_CONFIG, tokenizer_dir=tok_dir)


if __name__ == "__main__":
    main()
