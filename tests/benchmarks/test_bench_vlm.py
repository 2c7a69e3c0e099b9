"""The published group's side-by-side with mlx-vlm (bench/vlm.py): the checkpoints it writes load
through our own loader and decode exactly as the target alone, the per-round record of mlx-vlm
is counted as ours is, the report reads the result. Timings are never asserted.

The side by side itself (test_side_by_side_with_mlx_vlm_on_the_same_files) is an opt-in peer
check: marked `reference`, so the default run (`-m 'not reference'`) leaves it out and
`pytest -m reference` runs it, with the other cross-checks against implementations that are not
ours. It needs mlx-vlm (the `bench` group: `uv sync --group bench`; CI's reference step installs
it with tests/reference/requirements.txt) and fails, never skips, where it is missing."""

from __future__ import annotations

import pytest

from benchmarks import BenchConfig, vlm
from benchmarks.published import write_gemma4, write_hybrid
from benchmarks.report import SIDE_BY_SIDE, published_section
from benchmarks.runners import Row, load_demo_tokenizer
from mlx_spec.loading import load_target, make_drafter
from mlx_spec.train.corpus import prompts_from_corpus

TINY = BenchConfig(hidden=256, layers=5, ffn=640, draft_length=2)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return write_hybrid(TINY, tmp_path_factory.mktemp("side") / "hybrid")


@pytest.fixture(scope="module")
def prompts():
    return prompts_from_corpus(load_demo_tokenizer(), 1)


def rows_for(engine: str, hybrid: dict) -> tuple[vlm.RowSpec, ...]:
    ours = engine == "mlx-spec"
    return (vlm.RowSpec("target-only", "none"),
            vlm.RowSpec("mtp k=2", "mtp", "mtp", None if ours else str(hybrid["mtp"]), 2),
            vlm.RowSpec("eagle3 k=2", "eagle3", "draft" if ours else "eagle3",
                        str(hybrid["eagle3"]), 2),
            vlm.RowSpec("dflash k=15", "dflash", "draft" if ours else "dflash",
                        str(hybrid["dflash"]), 15))


def side(engine: str, hybrid: dict, prompts) -> vlm.Side:
    return vlm.Side(engine, str(hybrid["target"]), "vlm-hybrid", "hybrid",
                    rows_for(engine, hybrid), prompts, 12)


def test_the_written_hybrid_drafters_load_and_decode_as_the_target_alone(hybrid, prompts):
    rows = vlm.run_side(side("mlx-spec", hybrid, prompts))  # a process of its own
    assert [r.name for r in rows] == ["hybrid: ours target-only", "hybrid: ours mtp k=2",
                                      "hybrid: ours eagle3 k=2", "hybrid: ours dflash k=15"]
    assert all(r.tokens == rows[0].tokens for r in rows)
    block = rows[-1]
    assert block.draft_length == 15 and len(block.per_position_acceptance) > 8  # (the budget)
    # the constructed drafters' first draft is the target's undamped next token: a drafter
    # that loaded wrong (a shifted tap, the mask token's row, a missed norm) drafts ~never right
    assert min(r.per_position_acceptance[0] for r in rows[1:]) > 0.3
    assert block.commit_ms_per_pass is not None  # the recurrent rollback at block 16


def test_the_written_gemma4_pair_loads_through_our_loader(tmp_path):
    dirs = write_gemma4(TINY, tmp_path)
    target, _ = load_target(dirs["target"])
    drafter = make_drafter("draft", target, draft_model=dirs["assistant"])
    assert drafter.name == "draft-assistant" and drafter.draft_length == 3


@pytest.mark.reference
def test_side_by_side_with_mlx_vlm_on_the_same_files(hybrid, prompts):
    """mlx-vlm loads the files we wrote and decodes them (greedy) to our target-only tokens,
    every drafter row drafting: our layouts are the ones the peer reads."""
    assert vlm.available(), ("mlx-vlm is not installed: `uv sync --group bench` (the reference "
                             "step: tests/reference/requirements.txt)")
    ours = vlm.run_side(side("mlx-spec", hybrid, prompts))
    theirs = vlm.run_side(side("mlx-vlm", hybrid, prompts))
    assert [r.engine for r in theirs] == ["mlx-vlm"] * 4
    assert all(r.tokens == ours[0].tokens for r in theirs)  # greedy: the same tokens
    assert all(r.tokens_per_pass >= 1 and r.per_position_acceptance for r in theirs[1:])


def test_a_per_round_record_is_counted_as_ours():
    row = Row("x", "dflash", "mlx-vlm", "t", 0.0, 1.0, 3)
    vlm.fill_acceptance(row, accepted=[0, 3, 1], drafted=[3, 3, 2], tokens=8)
    assert row.tokens_per_pass == pytest.approx(8 / 3)  # the prefill's token, 3 passes
    assert row.acceptance_rate == pytest.approx(4 / 8)
    assert row.per_position_acceptance == pytest.approx([2 / 3, 1 / 3, 1 / 2])
    target_only = Row("y", "none", "mlx-vlm", "t", 0.0, 1.0, 1)
    vlm.fill_acceptance(target_only, [], [], 5)
    assert target_only.tokens_per_pass == 1.0 and target_only.acceptance_rate is None


def test_opt_in_and_pairs(monkeypatch):
    monkeypatch.delenv(vlm.OPT_IN, raising=False)
    assert not vlm.wanted()
    monkeypatch.setenv(vlm.OPT_IN, "3")
    assert vlm.wanted() and vlm.requested_pairs() == 3
    monkeypatch.setenv(vlm.OPT_IN, "yes")
    assert vlm.wanted() and vlm.requested_pairs() == 1


def entry(tok_s: float, per: list[float], draft: float | None) -> dict:
    return {"tok_s": tok_s, "tokens_per_pass": 1 + sum(per), "acceptance": None,
            "per_position": per, "commit_ms_per_pass": 1.0 if draft is not None else None,
            "draft_ms_per_pass": draft, "verify_ms_per_pass": 50.0 if draft else None,
            "speedup_own_target_only": tok_s / 10, "tok_s_runs": [tok_s]}


def test_the_report_reads_the_goals():
    rows = {name: {"k": k, "drafter": d, "mlx-spec": entry(a, per, 5.0),
                   "mlx-vlm": entry(b, per, None),
                   "ours_vs_vlm": {"median": a / b, "pairs": [a / b]}}
            for name, k, d, a, b, per in (
                ("target-only", 0, "none", 10, 9, []),
                ("mtp k=2", 2, "mtp", 20, 18, [0.9, 0.8]),
                ("dflash k=2", 2, "dflash", 15, 16, [0.9, 0.5]),
                ("dflash k=15", 15, "dflash", 25, 20, [0.9] + [0.5] * 14))}
    info = {"gemma4 assistant": {"params": 1e6, "noise": 0.1, "draft_params": 1e5,
                                 "verify_cost_ratio": [1.0]},
            SIDE_BY_SIDE: {"mlx_vlm": "0.7.10", "pairs": 1, "target_params": 1e6,
                           "eagle3_params": 1e5, "dflash_params": 2e5,
                           "groups": {"hybrid": {"rows": rows, "greedy_identical": True,
                                                 "greedy_mismatched_rows": []}}}}
    text = "\n".join(published_section(info))
    assert "## Side by side with mlx-vlm 0.7.10" in text
    assert "×2.50 against ×2.00: **met**" in text  # DFlash k=15 against the MTP head
    assert "**not met** (behind: hybrid dflash k=2 (0.938))" in text
    assert "greedy tokens of every run" in text
