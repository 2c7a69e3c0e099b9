"""LoadSpec: one type for what to load, validated where it is made, unchanged to the loader."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from mlx_spec import LoadSpec, MlxSpecError, parse_draft_length
from mlx_spec.hub import Launch


@pytest.mark.parametrize(("text", "want"), [(None, None), ("auto", "auto"), (" AUTO ", "auto"),
                                            ("3", 3), (16, 16), ("1", 1)])
def test_draft_lengths_that_parse(text, want):
    assert parse_draft_length(text) == want


@pytest.mark.parametrize("text", ["0", "17", "-2", "many", "2.5", True, 0])
def test_draft_lengths_refused_in_one_line(text):
    with pytest.raises(MlxSpecError, match="draft length must be") as e:
        parse_draft_length(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bad", [dict(drafter="eagle"), dict(draft_length=0),
                                 dict(draft_length="4"), dict(kv_bits=3)])
def test_a_bad_spec_cannot_be_made(bad):
    with pytest.raises(MlxSpecError):
        LoadSpec(**bad)


def test_paths_travel_as_text_and_the_spec_pickles():
    spec = LoadSpec(model=Path("/m"), draft_model=Path("/d"), draft_length="auto")
    assert spec.model == "/m" and spec.draft_model == "/d"
    assert pickle.loads(pickle.dumps(spec)) == spec  # the process boundary


def test_a_pulled_pair_fills_only_what_the_user_left_unset():
    launch = Launch(name="p", target=Path("/t"), drafter="draft", draft_model=Path("/d"))
    assert launch.spec(LoadSpec(draft_length=3)) == LoadSpec(model="/t", drafter="draft",
                                                          draft_model="/d", draft_length=3)
    # a drafter the user chose is kept (the app used to overwrite it after a download)
    for chosen in (LoadSpec(drafter="ngram"), LoadSpec(mtp="/h"), LoadSpec(draft_model="/x")):
        got = launch.spec(chosen)
        assert got.model == "/t"
        assert (got.drafter, got.draft_model, got.mtp) == (chosen.drafter, chosen.draft_model,
                                                           chosen.mtp)


def test_turn_stats_saved_under_the_old_name_read_back():
    """TurnStats.num_draft is max_draft now: histories saved before keep their value."""
    from mlx_spec import TurnStats

    assert TurnStats.from_dict({"num_draft": 4, "generated_tokens": 3}).max_draft == 4
    s = TurnStats(max_draft=6, generated_tokens=2)
    assert TurnStats.from_dict(s.to_dict()) == s
