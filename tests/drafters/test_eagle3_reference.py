"""EAGLE-3 heads made by speculators itself (0.9, the format vLLM loads), through its own
training path (`create_transformer_layer_config` → `Eagle3DraftModel.from_training_args`, vocab
maps from `build_vocab_mappings_from_distribution`, `save_pretrained`), loaded by our loader:
our first and second drafts' q equal the q of speculators' own forward (its TTT loop, the
second step fed our first draft), over contexts past the sliding window and after several
committed rounds; the taps the reference is fed are HF's hidden_states[i] of the target, run
by transformers. A perturbed reference (a tap one layer off, norm_output off, the window
ignored) is caught by the same comparison.

Needs torch, transformers and speculators (tests/reference/requirements.txt): marked
`reference`, deselected from the main suite (pyproject addopts), run by CI in its own step
(`pytest -m reference`), where a missing package fails rather than skips."""

from __future__ import annotations

import contextlib
import warnings

import mlx.core as mx
import numpy as np
import pytest
from eagle3 import DRAFT_VOCAB, LAYERS, VOCAB, build_target, write_target

from mlx_spec import cache as kv
from mlx_spec.drafters import DraftContext
from mlx_spec.sampling import Sampler, SamplingConfig

pytestmark = pytest.mark.reference

WINDOW = 8
# (name, speculators training kwargs, draft layers, full-attention layer ids, architecture)
FLAGS = {
    # speculators 0.9's defaults for eagle3: every norm flag on, a sliding-window layer
    "defaults": (dict(norm_before_fc=True, norm_output=True), 1, [], "llama"),
    "fc-norm": (dict(fc_norm=True, norm_output=True), 1, [], "llama"),
    "flags-off": (dict(norm_before_residual=False), 1, [0], "llama"),
    "two-layers": (dict(norm_before_fc=True, norm_output=True), 2, [1], "llama"),
    "qwen3": (dict(norm_before_fc=True, norm_output=True), 1, [], "qwen3"),
}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, tokenizer_dir):
    return write_target(tmp_path_factory.mktemp("ref-target"), build_target(seed=3),
                        tokenizer_dir)


@pytest.fixture(scope="module")
def made(torch, target_dir, tmp_path_factory):
    """name -> (reference module, head dir), built and saved by speculators."""
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    rng = np.random.default_rng(7)
    freq = {int(t): int(c) for t, c in enumerate(rng.integers(1, 1000, VOCAB))}
    d2t, t2d = build_vocab_mappings_from_distribution(freq, DRAFT_VOCAB, VOCAB)
    out = {}

    def get(name: str):
        if name not in out:
            flags, layers, full, arch = FLAGS[name]
            with warnings.catch_warnings(), contextlib.redirect_stderr(None):
                warnings.simplefilter("ignore")
                layer = create_transformer_layer_config(
                    str(target_dir), num_layers=layers, draft_arch=arch, hidden_act="silu",
                    sliding_window=WINDOW, full_attention_indices=full)
                model = Eagle3DraftModel.from_training_args(
                    verifier_config=layer, t2d=t2d.clone(), d2t=d2t.clone(),
                    draft_vocab_size=DRAFT_VOCAB, ttt_steps=3,
                    verifier_name_or_path=str(target_dir), draft_attn_impl="eager",
                    **{"norm_before_residual": True, **flags})
            randomize(torch, model)
            head_dir = tmp_path_factory.mktemp(f"ref-{name}")
            model.save_pretrained(head_dir)
            out[name] = model.eval(), head_dir
        return out[name]

    return get


def randomize(torch, model, keep: tuple[str, ...] = ("embed_tokens", "verifier_")) -> None:
    """Weights big enough that attention is far from uniform (the window then matters) and
    every norm's weight away from 1 (so a norm applied or skipped shows); `keep`: the
    verifier's own copies, left as loaded."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(keep):
                continue
            if p.dim() == 1:
                p.copy_(torch.empty_like(p).uniform_(0.5, 2.0))
            else:
                p.copy_(torch.randn_like(p) * 1.5 / p.shape[1] ** 0.5)


@pytest.fixture(scope="module")
def hf_target(torch, target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()


def hf_taps(torch, hf_target, tokens, layer_ids):
    """HF's hidden_states[i] (the input of layer i) at each tap, concatenated."""
    with torch.no_grad():
        out = hf_target(torch.tensor([tokens]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layer_ids], dim=-1)


def reference_q(torch, model, hf_target, seq, *, layer_ids=None):
    """q of the reference's first two TTT steps at the last committed entry: seq is the
    context (n tokens) and the first draft; entry i pairs seq[i + 1] with the taps at i."""
    ids = list(layer_ids or model.config.eagle_aux_hidden_state_layer_ids)
    taps = hf_taps(torch, hf_target, seq[:-1], ids)
    logits = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, o: logits.append(o[0]))
    try:
        with torch.no_grad():
            model(hidden_states=taps, input_ids=torch.tensor([seq[1:]]),
                  document_ids=torch.zeros(1, len(seq) - 1, dtype=torch.long), ttt_steps=2)
    finally:
        hook.remove()
    n = len(seq) - 1  # the context's length: its last committed entry is n - 2
    qs = []
    for step in logits:
        small = step[n - 2].double().numpy()
        wide = np.full(VOCAB, -np.inf)
        wide[np.arange(DRAFT_VOCAB) + model.d2t.numpy()] = small
        q = np.exp(wide - wide.max())
        qs.append(q / q.sum())
    return qs


def our_drafts(target, drafter, tokens, *, chunks=(None,)):
    """Our first two drafts (T = 1) after committing `tokens` in the given chunk lengths
    (several commits: catch-up across rounds, the windowed masks at an offset)."""
    cache, state, done = kv.make_cache(target.model), drafter.new_state(), 0
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=5))
    for size in chunks:
        upto = len(tokens) if size is None else min(done + size, len(tokens))
        new = tokens[done : upto - 1] if done == 0 else tokens[done - 1 : upto - 1]
        start = 0 if done == 0 else done - 1
        _, taps = target.forward(new, cache, hidden=drafter.needs_hidden)
        drafter.commit(state, DraftContext(target, tokens[:upto], cache, taps, start), done)
        draft = drafter.draft(state, DraftContext(target, tokens[:upto], cache), 2, sampler)
        done = upto
    return draft


def loaded(target_dir, head_dir):
    from mlx_spec.loading import load_target, make_drafter

    target, _ = load_target(target_dir)
    return target, make_drafter("draft", target, draft_model=head_dir)


def assert_matches(torch, model, hf_target, target, drafter, tokens, chunks=(None,)):
    draft = our_drafts(target, drafter, tokens, chunks=chunks)
    seq = list(tokens) + [int(draft.tokens[0])]
    want = reference_q(torch, model, hf_target, seq)
    for i in range(2):
        np.testing.assert_allclose(np.array(draft.probs[i], np.float64), want[i], atol=1e-5)
    return draft


def prompt(n: int, seed: int = 0) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, VOCAB, n)]


@pytest.mark.parametrize("name", list(FLAGS))
def test_first_and_second_drafts_equal_speculators(torch, made, hf_target, target_dir, name):
    model, head_dir = made(name)
    target, drafter = loaded(target_dir, head_dir)
    for n in (5, WINDOW + 1, 3 * WINDOW):  # inside the window, at its edge, well past it
        assert_matches(torch, model, hf_target, target, drafter, prompt(n, seed=n))


def test_drafts_equal_speculators_after_several_rounds(torch, made, hf_target, target_dir):
    """Committed in chunks (as rounds commit), the head's cache built at offsets across the
    window: the drafts still equal the reference's recompute from scratch."""
    model, head_dir = made("two-layers")
    target, drafter = loaded(target_dir, head_dir)
    assert_matches(torch, model, hf_target, target, drafter, prompt(30, seed=1),
                   chunks=(6, 3, 1, 5, 2, 4, None))


def test_the_written_config_is_read_as_speculators_wrote_it(made):
    from mlx_spec.drafters.eagle3 import Eagle3Config

    model, head_dir = made("two-layers")
    import json

    cfg = Eagle3Config.from_dict(json.loads((head_dir / "config.json").read_text()))
    assert (cfg.norm_before_fc, cfg.norm_output, cfg.norm_before_residual) == (True, True, True)
    assert cfg.layer_types == ("sliding_attention", "full_attention")
    assert (cfg.num_layers, cfg.sliding_window) == (2, WINDOW)
    assert cfg.layer_ids == tuple(model.config.eagle_aux_hidden_state_layer_ids)


def test_a_perturbed_reference_is_caught(torch, made, hf_target, target_dir):
    """The comparison sees each bug the issue names: read taps one layer off, feed back the
    pre-norm state, ignore the window."""
    model, head_dir = made("defaults")
    target, drafter = loaded(target_dir, head_dir)
    tokens = prompt(3 * WINDOW, seed=2)
    draft = our_drafts(target, drafter, tokens)
    seq = list(tokens) + [int(draft.tokens[0])]
    ours = [np.array(draft.probs[i], np.float64) for i in range(2)]

    def gap(**perturb):
        want = reference_q(torch, model, hf_target, seq, **perturb)
        return max(np.abs(ours[i] - want[i]).max() for i in range(2))

    assert gap() < 1e-5
    ids = model.config.eagle_aux_hidden_state_layer_ids
    for shift in (-1, 1):
        assert gap(layer_ids=[min(max(i + shift, 0), LAYERS) for i in ids]) > 1e-3
    model.config.norm_output = False
    try:
        assert gap() > 1e-3
    finally:
        model.config.norm_output = True
    sliding = model.sliding_window_indices
    model.sliding_window_indices, model.uses_full_attn = [], True
    try:
        assert gap() > 1e-3
    finally:
        model.sliding_window_indices, model.uses_full_attn = sliding, False


def test_mx_and_torch_agree_on_the_target(torch, hf_target, target_dir):
    """The target itself: our logits equal transformers' (so a gap above is the head's)."""
    from mlx_spec.loading import load_target

    target, _ = load_target(target_dir)
    tokens = prompt(12, seed=4)
    with torch.no_grad():
        want = hf_target(torch.tensor([tokens])).logits[0].numpy()
    got = np.array(target.model(mx.array([tokens]))[0])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
