"""Draft models that share the target's tokenizer but not its embedding size (padded
vocabularies, as Qwen2.5-0.5B's 151,936 rows against Qwen2.5-7B's 152,064): compatibility comes
from the tokenizers, padded ids are impossible for the draft, decoding stays lossless.

Known answer: the draft is the target's own weights with padded rows whose logits dominate. Were
they not masked, it would propose padded ids every round and be rejected every round."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import ARCHS, VOCAB
from helpers import PROMPT, checked, conversation, open_chat, run
from mlx.utils import tree_flatten, tree_unflatten
from test_engine_sampling import assert_both_paths_taken, chi2_pvalue, sample_pairs, target_joint

from mlx_spec.drafters import DraftModelDrafter
from mlx_spec.errors import TokenizerMismatchError
from mlx_spec.loading import load_target
from mlx_spec.sampling import SamplingConfig
from mlx_spec.train.modeldir import build_model, save_model_dir
from mlx_spec.train.tokenizer import save_tokenizer, train_tokenizer

PAD = VOCAB  # padded rows: one per real row, so a loud twin out-scores every real token
TOP_P = dict(temperature=1.0, top_p=0.9, top_k=6)


def padded_twin(target, out, tokenizer_dir, *, loud: bool):
    """`target`'s weights with PAD extra vocabulary rows. loud: row VOCAB + t is 1.5 x row t,
    so wherever t's logit is positive its padded twin beats it (a draft that must be masked);
    else the padded rows are zero (logit 0: a sane padded target, whose p keeps some mass
    there at T=1)."""
    config = dict(ARCHS["qwen3"], vocab_size=VOCAB + PAD)
    model = build_model(config, seed=0)
    model.update(dict(target.model.parameters()))  # then embeddings and head, wider:
    emb = target.model.model.embed_tokens.weight
    head = target.model.lm_head.weight
    extra = 1.5 * head if loud else mx.zeros_like(head)
    model.model.embed_tokens.weight = mx.concatenate([emb, mx.zeros_like(emb)])
    model.lm_head.weight = mx.concatenate([head, extra])
    mx.eval(model.parameters())
    save_model_dir(out, model, config, tokenizer_dir=tokenizer_dir)
    return out


@pytest.fixture(scope="module")
def pair(model_dirs, tokenizer_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("padded")
    small = model_dirs("qwen3", 0)
    target, tok = load_target(small)
    # a draft that partly agrees (0.9 the target's weights, 0.1 another model's): for the χ²
    # tests, whose power needs drafts both accepted and rejected
    other, _ = load_target(model_dirs("qwen3", 1))
    a = dict(tree_flatten(target.model.parameters()))
    b = dict(tree_flatten(other.model.parameters()))
    blended = build_model(dict(ARCHS["qwen3"]), seed=0)
    blended.update(tree_unflatten([(k, 0.9 * a[k] + 0.1 * b[k]) for k in a]))
    mx.eval(blended.parameters())
    save_model_dir(root / "blend", blended, dict(ARCHS["qwen3"]), tokenizer_dir=tokenizer_dir)
    blend, _ = load_target(root / "blend")
    return {"small": small, "blend": root / "blend",
            "loud": padded_twin(target, root / "loud", tokenizer_dir, loud=True),
            "quiet": padded_twin(target, root / "quiet", tokenizer_dir, loud=False),
            "blend-loud": padded_twin(blend, root / "blend-loud", tokenizer_dir, loud=True)}


def test_unmasked_padded_rows_would_always_be_proposed(pair):
    """The negative control: over its whole width the loud twin's argmax is a padded id, so
    the known-answer test below measures the masking."""
    from mlx_lm.models.cache import make_prompt_cache

    draft, _ = load_target(pair["loud"])
    logits, _ = draft.forward(PROMPT, make_prompt_cache(draft.model))
    assert (mx.argmax(logits, axis=-1) >= VOCAB).all()


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize(("target_dir", "draft_dir"), [("small", "loud"), ("quiet", "small")],
                         ids=["draft-padded", "target-padded"])
def test_padded_vocabulary_draft_is_lossless_and_accepted(pair, k, target_dir, draft_dir):
    engine = open_chat(model=pair[target_dir], drafter="draft", draft_model=pair[draft_dir],
                         draft_length=k)
    plain = open_chat(model=pair[target_dir], drafter="none")
    rounds = checked(engine)  # every cache equals a recompute after every round
    end, events = run(engine, max_tokens=40)
    assert [e.token for e in events] == [e.token for e in run(plain, max_tokens=40)[1]]
    assert all(e.token < VOCAB for e in events)
    assert end.stats.acceptance_rate > 0.95  # the twin on the real ids: a known answer
    assert rounds and max(rounds) <= k + 1
    end2, events2 = run(engine, prompt=PROMPT + [e.token for e in events], max_tokens=12)
    assert [e.token for e in events2] == [e.token for e in run(
        plain, prompt=PROMPT + [e.token for e in events], max_tokens=12)[1]]  # multi-turn


@pytest.mark.parametrize(("target_dir", "draft_dir"),
                         [("small", "blend-loud"), ("quiet", "blend")],
                         ids=["draft-padded", "target-padded"])
def test_padded_vocabulary_draft_samples_the_target_distribution(pair, target_dir, draft_dir):
    target, tok = load_target(pair[target_dir])
    draft, _ = load_target(pair[draft_dir])
    engine = conversation(target, tok, DraftModelDrafter(draft, target), draft_length=2)
    tally = []
    prompt = PROMPT[:12]
    pairs = sample_pairs(engine, dict(TOP_P, repetition_penalty=1.0), tally, prompt)
    pval = chi2_pvalue(pairs, target_joint(target, SamplingConfig(**TOP_P), prompt))
    print(f"padded vocabulary ({target_dir}/{draft_dir}) χ² p = {pval:.3f}")
    assert pval > 0.01
    assert_both_paths_taken(tally)


def test_a_different_tokenizer_is_refused_naming_what_differs(pair, tmp_path):
    other_tok = tmp_path / "tok"
    save_tokenizer(train_tokenizer([f"zz{i} yy{i} xx" for i in range(400)], VOCAB), other_tok)
    config = dict(ARCHS["qwen3"])
    save_model_dir(tmp_path / "other", build_model(config, seed=3), config,
                   tokenizer_dir=other_tok)
    with pytest.raises(TokenizerMismatchError) as e:
        open_chat(model=pair["small"], drafter="draft", draft_model=tmp_path / "other")
    message = str(e.value)
    assert "does not share" in message and "is id" in message and "\n" not in message
