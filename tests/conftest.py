"""Tiny models built by the tests themselves (random weights, seeded), saved as mlx-lm dirs."""

from __future__ import annotations

import os
import string
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.utils import quantize_model

from mlx_spec.loading import load_target
from mlx_spec.train.modeldir import build_model, save_model_dir
from mlx_spec.train.tokenizer import chatml, save_tokenizer, train_tokenizer

VOCAB = 384

COMMON = dict(
    hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2,
    num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=VOCAB, max_position_embeddings=512,
)
ARCHS = {
    "llama": dict(COMMON, model_type="llama", tie_word_embeddings=False, rope_theta=10000.0),
    "qwen3": dict(COMMON, model_type="qwen3", head_dim=32, tie_word_embeddings=False,
                  rope_theta=10000.0),
    # sliding window of 16 so tests run past the window; layer 2 of every 2 is global
    "gemma3_text": dict(COMMON, model_type="gemma3_text", head_dim=32, sliding_window=16,
                        sliding_window_pattern=2, query_pre_attn_scalar=32),
}


def _corpus():
    words = ["def", "return", "self", "import", "class", "for", "in", "if", "else", "None",
             "print", "value", "item", "range", "len", "héllo", "wörld", "日本語", "naïve"]
    for i in range(300):
        yield " ".join(words[(i * 7 + j) % len(words)] for j in range(12)) + string.punctuation
        yield chatml(f"question {i}", f"answer {i}")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    save_tokenizer(train_tokenizer(_corpus(), VOCAB), out)
    return out


def _scale_head(model) -> None:
    """Random init gives near-uniform logits (many near-ties); sharpen the head a little so
    greedy decoding is well defined, as in a trained model."""
    norm = model.model.norm
    # gemma's RMSNorm scales by (1 + weight)
    gemma = "gemma" in model.model_type
    norm.weight = mx.full(norm.weight.shape, 3.0) if gemma else norm.weight * 4
    mx.eval(model.parameters())


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer_dir):
    """{(arch, seed, bits): path} built lazily."""
    root = tmp_path_factory.mktemp("models")
    made: dict[tuple, Path] = {}

    def get(arch: str, seed: int = 0, bits: int | None = None) -> Path:
        key = (arch, seed, bits)
        if key not in made:
            config = dict(ARCHS[arch])
            model = build_model(config, seed=seed)
            _scale_head(model)
            if bits:
                model, config = quantize_model(model, config, group_size=32, bits=bits)
            out = root / f"{arch}-{seed}-{bits or 'f32'}"
            save_model_dir(out, model, config, tokenizer_dir=tokenizer_dir)
            made[key] = out
        return made[key]

    return get


@pytest.fixture(scope="session")
def load(model_dirs):
    loaded = {}

    def get(arch: str, seed: int = 0, bits: int | None = None):
        key = (arch, seed, bits)
        if key not in loaded:
            loaded[key] = load_target(model_dirs(arch, seed, bits))
        return loaded[key]

    return get


def pytest_terminal_summary(terminalreporter):
    from helpers import IDENTITY

    if IDENTITY["identical"] or IDENTITY["near_tie"]:
        terminalreporter.write_line(
            f"greedy identity: {IDENTITY['identical']} comparisons identical token for token, "
            f"{IDENTITY['near_tie']} parted at a measured near-tie "
            f"({IDENTITY['tokens']} reference tokens compared)"
        )


@pytest.fixture(scope="session", autouse=True)
def _own_home(tmp_path_factory):
    """Calibrations, heads and history go under a home of the run's own, never the user's
    (child processes inherit it). A test that needs a fresh one sets its own."""
    os.environ["MLX_SPEC_HOME"] = str(tmp_path_factory.mktemp("mlx-spec-home"))


@pytest.fixture(scope="session")
def torch():
    """torch, for the reference cross-checks (`-m reference`): a missing reference package
    fails them, it never skips them."""
    import torch

    torch.manual_seed(0)
    return torch
