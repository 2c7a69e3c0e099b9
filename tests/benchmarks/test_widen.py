"""Function-preserving widening (the benchmark's memory-bound target) really preserves function."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from conftest import ARCHS
from helpers import conversation
from mlx.utils import tree_map
from test_mtp import make_drafter

from benchmarks.widen import parameter_count, widen_mtp, widen_target


def test_wide_target_and_mtp_head_compute_the_same_function(load):
    small, tok = load("qwen3")
    wide, _ = widen_target(small, ARCHS["qwen3"], hidden=160, layers=4, ffn=320)
    assert parameter_count(wide.model) > 2 * parameter_count(small.model)
    x = mx.array([[5, 9, 33, 100, 7, 250]])
    a, b = np.array(small.model(x)), np.array(wide.model(x))
    # RMSNorm eps is added to a mean over more (zero) units: tiny differences only
    np.testing.assert_allclose(a, b, atol=5e-3, rtol=1e-3)
    assert (a.argmax(-1) == b.argmax(-1)).all()

    drafter = make_drafter(small, "shared-kv")
    wide_drafter = widen_mtp(drafter, wide, small_layers=2)
    prompt = [(i * 29) % 300 + 5 for i in range(20)]
    outs = []
    for target, d in ((small, drafter), (wide, wide_drafter)):
        engine = conversation(target, tok, d, draft_length=3)
        end = list(engine.generate(prompt, max_tokens=24, ignore_eos=True))[-1]
        outs.append((end.tokens, end.stats.accepted, end.stats.drafted))
    assert outs[0] == outs[1]  # same tokens, and the head proposes exactly the same drafts


def test_wide_hybrid_target_and_published_head_compute_the_same_function():
    """The bench's hybrid target: GDN heads added, hidden/FFN/layers widened, same function;
    its published-layout MTP head proposes exactly the same drafts on both."""
    from benchmarks.hybrid import SMALL, agreeing_pair
    from benchmarks.widen import widen_hybrid, widen_nextn
    from mlx_spec.drafters.mtp import nextn_drafter
    from mlx_spec.model import TargetModel

    model, head = agreeing_pair(SMALL, noise=0.06)
    small = TargetModel(model, 4096)
    wide, _ = widen_hybrid(small, SMALL, hidden=192, layers=5, ffn=512, head_factor=2)
    assert wide.args.linear_num_value_heads == 2 * small.args.linear_num_value_heads
    assert parameter_count(wide.model) > 1.5 * parameter_count(small.model)
    x = mx.array([[5, 9, 33, 100, 7, 250, 1000, 3]])
    a, b = np.array(small.model(x)), np.array(wide.model(x))
    np.testing.assert_allclose(a, b, atol=5e-3, rtol=1e-3)
    assert (a.argmax(-1) == b.argmax(-1)).all()

    class Tok:
        def decode(self, ids, **kw):
            return ""

    prompt = [(i * 29) % 4000 + 5 for i in range(20)]
    outs = []
    for target, d in ((small, nextn_drafter(head, small)),
                      (wide, widen_nextn(nextn_drafter(head, small), small, wide))):
        engine = conversation(target, Tok(), d, draft_length=3)
        end = list(engine.generate(prompt, max_tokens=24, ignore_eos=True))[-1]
        outs.append((end.tokens, end.stats.accepted, end.stats.drafted))
    assert outs[0] == outs[1]
    assert 0 < outs[0][1] < outs[0][2]


def test_wide_target_and_eagle3_head_compute_the_same_function(load):
    """An EAGLE-3 head widened with the target (bench/widen.widen_eagle3) gives the small
    head's draft logits at every chained step, and drafts exactly the same tokens."""
    from benchmarks.widen import widen_eagle3
    from mlx_spec.drafters.mtp import eagle3_drafter
    from mlx_spec.train.eagle3 import chained_steps, make_head, speculators_config

    small, tok = load("qwen3")
    wide, _ = widen_target(small, ARCHS["qwen3"], hidden=160, layers=4, ffn=320)
    head = make_head(small, speculators_config(small, 3, taps=(0, 1, 2)), seed=3)
    # a random fc and layer would leave the wide head's blocks untested where they are zero
    # in both: perturb every weight, norms included
    mx.random.seed(4)
    head.update(tree_map(lambda w: w + 0.05 * mx.random.normal(w.shape)
                         if w.dtype == mx.float32 else w, head.parameters()))
    wide_drafter = widen_eagle3(head, wide, ffn=320)
    assert wide_drafter.head.cfg.hidden_size == 160
    x = mx.array([[5, 9, 33, 100, 7, 250, 11, 42]])
    for a, b in zip(chained_steps(head, small, x, 3), chained_steps(wide_drafter.head, wide, x, 3),
                    strict=True):
        np.testing.assert_allclose(np.array(a.logits), np.array(b.logits), atol=5e-3, rtol=1e-3)

    prompt = [(i * 29) % 300 + 5 for i in range(20)]
    outs = []
    for target, d in ((small, eagle3_drafter(head, small)), (wide, wide_drafter)):
        engine = conversation(target, tok, d, draft_length=3)
        end = list(engine.generate(prompt, max_tokens=24, ignore_eos=True))[-1]
        outs.append((end.tokens, end.stats.accepted, end.stats.drafted))
    assert outs[0] == outs[1]
