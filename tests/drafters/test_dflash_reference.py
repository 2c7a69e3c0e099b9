"""DFlash drafters made by speculators itself (0.9: `create_transformer_layer_config` →
`DFlashDraftModel.from_training_args`, `save_pretrained`), loaded by our loader from the
speculators format: the q of every slot of our block equals the logits of speculators' own
`_backbone_forward` at an anchor placed where our pending token is, past the sliding window,
with sliding layers causal (its default) and non-causal; the taps the reference is fed are
HF's hidden_states[i] of the target, run by transformers. A perturbed reference (a tap one
layer off, the window ignored) is caught by the same comparison.

Needs torch, transformers and speculators: marked `reference` (see test_eagle3_reference.py)."""

from __future__ import annotations

import contextlib
import warnings

import mlx.core as mx
import numpy as np
import pytest
from eagle3 import VOCAB, build_target, write_target
from helpers import sampled_draft
from test_eagle3_reference import hf_taps, randomize

pytestmark = pytest.mark.reference

WINDOW, BLOCK, MASK = 6, 8, VOCAB - 1
TAPS = [2, 5, 7]  # speculators' ids: HF hidden_states indices (layer inputs)
FLAGS = {"causal": dict(sliding_window_non_causal=False),
         "non-causal": dict(sliding_window_non_causal=True)}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, tokenizer_dir):
    return write_target(tmp_path_factory.mktemp("dflash-ref-target"), build_target(seed=4),
                        tokenizer_dir)


@pytest.fixture(scope="module")
def hf_target(torch, target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def made(torch, target_dir, tmp_path_factory):
    from speculators.models.dflash import DFlashDraftModel
    from speculators.train.cli import create_transformer_layer_config

    out = {}

    def get(name: str):
        if name not in out:
            with warnings.catch_warnings(), contextlib.redirect_stderr(None):
                warnings.simplefilter("ignore")
                layer = create_transformer_layer_config(
                    str(target_dir), num_layers=2, draft_arch="qwen3", hidden_act="silu",
                    sliding_window=WINDOW, full_attention_indices=[1])
                model = DFlashDraftModel.from_training_args(
                    verifier_config=layer, draft_vocab_size=VOCAB, block_size=BLOCK,
                    verifier_name_or_path=str(target_dir), target_layer_ids=TAPS,
                    mask_token_id=MASK, draft_attn_impl="eager", **FLAGS[name])
            # (its embeddings and head are the verifier's: not saved, read from the target)
            randomize(torch, model, keep=("embed_tokens", "lm_head", "verifier_"))
            head_dir = tmp_path_factory.mktemp(f"dflash-ref-{name}")
            model.save_pretrained(head_dir)
            out[name] = model.eval(), head_dir
        return out[name]

    return get


def reference_q(torch, model, hf_target, tokens, *, taps=TAPS, window=True):
    """q of slots 1..BLOCK-1 for the block anchored at the pending token (position P =
    len(tokens) - 1): loss_mask marks only P, so the one anchor is there."""
    P = len(tokens) - 1
    seq = list(tokens) + [0] * BLOCK  # (positions after the anchor are never attended)
    hidden = hf_taps(torch, hf_target, seq, taps)
    T = len(seq)
    loss_mask = torch.zeros(1, T, dtype=torch.long)
    loss_mask[0, P] = 1
    sliding = model.sliding_window_indices
    if not window:
        model.sliding_window_indices, model.uses_full_attn = [], True
    try:
        with torch.no_grad():
            _, logits, *_ = model._backbone_forward(
                hidden, torch.tensor([seq]), loss_mask,
                torch.zeros(1, T, hidden.shape[-1] // len(taps)),
                torch.zeros(1, T, dtype=torch.long), max_anchors=1)
    finally:
        model.sliding_window_indices = sliding
        model.uses_full_attn = bool(model.config.transformer_layer_config.num_hidden_layers
                                    - len(sliding))
    q = torch.softmax(logits[0, 1:].double(), dim=-1).numpy()
    return q


def our_q(target, drafter, tokens):
    return np.array(sampled_draft(target, drafter, tokens, BLOCK - 1, 1).probs, np.float64)


def loaded(target_dir, head_dir):
    from mlx_spec.loading import load_target, make_drafter

    target, _ = load_target(target_dir)
    drafter = make_drafter("draft", target, draft_model=head_dir)
    assert drafter.name == "draft-dflash"
    return target, drafter


def prompt(n: int, seed: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, VOCAB - 1, n)]


@pytest.mark.parametrize("name", list(FLAGS))
def test_every_slot_equals_speculators(torch, made, hf_target, target_dir, name):
    model, head_dir = made(name)
    target, drafter = loaded(target_dir, head_dir)
    assert drafter.needs_hidden == tuple(TAPS)
    for n in (4, WINDOW + 1, 3 * WINDOW):
        tokens = prompt(n, seed=n)
        np.testing.assert_allclose(our_q(target, drafter, tokens),
                                   reference_q(torch, model, hf_target, tokens), atol=1e-5)


def test_a_perturbed_reference_is_caught(torch, made, hf_target, target_dir):
    model, head_dir = made("causal")
    target, drafter = loaded(target_dir, head_dir)
    tokens = prompt(3 * WINDOW, seed=9)
    ours = our_q(target, drafter, tokens)

    def gap(**perturb):
        return np.abs(ours - reference_q(torch, model, hf_target, tokens, **perturb)).max()

    assert gap() < 1e-5
    for shift in (-1, 1):
        assert gap(taps=[i + shift for i in TAPS]) > 1e-3
    assert gap(window=False) > 1e-3


def test_the_target_agrees_with_transformers(torch, hf_target, target_dir):
    from mlx_spec.loading import load_target

    target, _ = load_target(target_dir)
    tokens = prompt(10, seed=2)
    with torch.no_grad():
        want = hf_target(torch.tensor([tokens])).logits[0].numpy()
    np.testing.assert_allclose(np.array(target.model(mx.array([tokens]))[0]), want, atol=1e-4,
                               rtol=1e-4)
