"""End to end at T > 0: with speculation, the first two generated tokens are distributed exactly as
the target's own (the exact target probabilities are computed directly and compared with χ²)."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
from helpers import conversation
from scipy.stats import chisquare

from mlx_spec.drafters import DraftModelDrafter
from mlx_spec.events import TurnEnd
from mlx_spec.sampling import SamplingConfig, probabilities

PROMPT = [(i * 29) % 300 + 5 for i in range(12)]
CFG = dict(temperature=1.0, top_k=4)
RUNS = 2500


def target_joint(target, cfg, prompt=PROMPT):
    """Exact P(t1, t2) of the target alone under the same logits processing."""
    def dist(ctx):
        logits = target.model(mx.array(ctx)[None])[0, -1:]
        return np.array(probabilities(logits, cfg))[0]

    p1 = dist(prompt)
    joint = {}
    for t1 in np.nonzero(p1)[0]:
        p2 = dist(prompt + [int(t1)])
        for t2 in np.nonzero(p2)[0]:
            joint[(int(t1), int(t2))] = p1[t1] * p2[t2]
    return joint


def sample_pairs(engine, cfg_kw, accepted=None, prompt=PROMPT, runs=RUNS):
    """`runs` two-token answers; `accepted` (a list) collects (drafted, accepted) per run.
    Seeded for repeatability, with Leviathan's rejection sampling unless cfg_kw names another
    coupling (a seed alone would choose the drafter-invariant one: test_invariant.py)."""
    pairs = []
    for seed in range(runs):
        cfg = SamplingConfig(seed=seed, **{"coupling": "leviathan", **cfg_kw})
        events = list(engine.generate(prompt, max_tokens=2, ignore_eos=True, sampling=cfg))
        end = events[-1]
        pairs.append(tuple(end.tokens) if isinstance(end, TurnEnd) else None)
        if accepted is not None:
            accepted.append((end.stats.drafted, end.stats.accepted))
    return pairs


def assert_both_paths_taken(tally):
    """The test only has power if drafts are sometimes accepted and sometimes rejected."""
    drafted = sum(d for d, _ in tally)
    acc = sum(a for _, a in tally)
    assert 0.1 * drafted < acc < 0.9 * drafted, (acc, drafted)


def blended_drafter_model(load, arch):
    """A draft model that partly agrees with the target: its weights are a blend of the
    target's and an unrelated model's, so p and q overlap without being equal."""
    from conftest import ARCHS
    from mlx.utils import tree_flatten, tree_unflatten

    from mlx_spec.model import TargetModel
    from mlx_spec.train.modeldir import build_model

    target, _ = load(arch)
    other, _ = load(arch, seed=1)
    model = build_model(dict(ARCHS[arch]))
    a = dict(tree_flatten(target.model.parameters()))
    b = dict(tree_flatten(other.model.parameters()))
    model.update(tree_unflatten([(k, 0.75 * a[k] + 0.25 * b[k]) for k in a]))
    mx.eval(model.parameters())
    return TargetModel(model, context_length=target.context_length)


def chi2_pvalue(pairs, joint):
    cells = sorted(joint)
    counts = np.array([sum(1 for p in pairs if p == c) for c in cells], dtype=float)
    assert counts.sum() == len(pairs), "a sample fell outside the target's support"
    expected = np.array([joint[c] for c in cells], dtype=np.float64)
    expected *= len(pairs) / expected.sum()
    # merge cells with small expectation so the χ² approximation holds
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp).pvalue


def test_draft_model_speculation_samples_the_target_distribution(load):
    target, tok = load("llama")
    draft = blended_drafter_model(load, "llama")
    engine = conversation(target, tok, DraftModelDrafter(draft, target), draft_length=2)
    tally = []
    pairs = sample_pairs(engine, CFG, tally)
    assert_both_paths_taken(tally)
    joint = target_joint(target, SamplingConfig(**CFG))
    pval = chi2_pvalue(pairs, joint)
    print(f"draft-model χ² p = {pval:.3f}")
    assert pval > 0.01


def test_negative_control_wrong_temperature_is_detected(load):
    """The same test must reject samples from a different distribution (power check)."""
    target, tok = load("llama")
    engine = conversation(target, tok, None)
    pairs = sample_pairs(engine, dict(temperature=2.0, top_k=4))
    assert chi2_pvalue(pairs, target_joint(target, SamplingConfig(**CFG))) < 0.01


def test_same_seed_same_output(load):
    target, tok = load("llama")
    draft, _ = load("llama", seed=1)
    engine = conversation(target, tok, DraftModelDrafter(draft, target), draft_length=3)
    cfg = SamplingConfig(temperature=0.8, top_p=0.9, seed=42)
    runs = [list(engine.generate(PROMPT, max_tokens=12, sampling=cfg))[-1].tokens
            for _ in range(2)]
    assert runs[0] == runs[1]
    assert list(itertools.islice(runs[0], 12))


def redraws_counted(monkeypatch):
    """Four top-p candidates (a random model's rows are near flat, so no row's nucleus fits
    among them); returns the list that Sampler.redraw appends to."""
    from mlx_spec import sampling

    monkeypatch.setattr(sampling, "CANDIDATES", 4)
    calls, redraw = [], sampling.Sampler.redraw
    monkeypatch.setattr(sampling.Sampler, "redraw",
                        lambda self, *a, **kw: calls.append(1) or redraw(self, *a, **kw))
    return calls


def test_top_p_fall_back_keeps_every_cache_equal_to_a_recompute(load, monkeypatch):
    """Every plain token is redrawn from the exact p and the step built ahead on its first draw
    cut back; every round is decided again. The caches equal a recompute after every commit."""
    from helpers import checked, run

    redraws = redraws_counted(monkeypatch)
    target, tok = load("llama")
    for coupling in ("leviathan", "gumbel"):
        cfg = SamplingConfig(temperature=1.0, top_p=0.9, seed=1, coupling=coupling)
        for drafter in (None, DraftModelDrafter(target, target)):
            engine = conversation(target, tok, drafter, draft_length=3)
            rounds = checked(engine)
            end, _ = run(engine, max_tokens=24, sampling=cfg)
            assert len(end.tokens) == 24 and rounds
    assert len(redraws) >= 40
