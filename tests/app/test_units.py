"""The app's logic without a UI or a model: history, data dir, totals, settings, lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_spec import Baseline, Kind, SamplingConfig, TokenEvent, Totals, TurnEnd, TurnStats
from mlx_spec_app.chat_pane import race_line
from mlx_spec_app.history import History, data_dir
from mlx_spec_app.settings import Settings
from mlx_spec_app.stream import TokenBuffer, clean
from mlx_spec_app.widgets import ESTIMATING, STOPPED, Answer, stats_line

from .fakes import STATS


def test_data_dir_env_override_and_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "x"))
    assert data_dir() == tmp_path / "x"
    monkeypatch.delenv("MLX_SPEC_HOME")
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "mlx-spec"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert data_dir() == Path.home() / ".local" / "share" / "mlx-spec"
    monkeypatch.setattr("sys.platform", "darwin")
    assert data_dir() == Path.home() / "Library" / "Application Support" / "mlx-spec"


def test_history_round_trip(home):
    h = History()
    assert h.path.parent == home
    c = h.new_conversation("  a long\nfirst message " * 10, model="demo")
    h.add_message(c, "user", "hi")
    h.add_message(c, "assistant", "yo", kinds=[["y", "accepted"], ["o", "target"]],
                  stats=STATS.to_dict(), partial=True)
    [(cid, title, _)] = h.conversations()
    assert cid == c and len(title) <= 60 and "\n" not in title
    user, answer = h.messages(c)
    assert user == dict(role="user", content="hi", kinds=None, stats=None, partial=False)
    assert answer["partial"] and answer["kinds"][0] == ["y", "accepted"]
    assert TurnStats.from_dict(answer["stats"]) == STATS
    h.delete_last_answer(c)
    assert [m["role"] for m in h.messages(c)] == ["user"]
    h.set("last_model", {"model": "/m"})
    assert History().get("last_model") == {"model": "/m"}  # another connection sees it
    h.delete(c)
    assert not h.conversations() and not h.messages(c) and not h.exists(c)


def test_session_totals_sum_turns_with_different_k():
    t = Totals()
    t.add(STATS)
    t.add(TurnStats(generated_tokens=10, target_passes=4, drafted=8, accepted=8,
                    per_position_drafted=(4, 4), per_position_accepted=(4, 4), total_s=0.1,
                    drafter="mtp"))
    assert t.turns == 2 and t.tokens == STATS.generated_tokens + 10
    assert t.acceptance_rate == pytest.approx((11 + 8) / (24 + 8))
    assert [p for p, _, _ in t.per_position()] == [1, 2, 3]
    assert t.per_position()[0][1] == pytest.approx(10 / 12)
    assert t.acceptance == [pytest.approx(100 * 11 / 24), 100.0]


def test_settings_restore_keeps_saved_part_only():
    s = Settings(SamplingConfig(temperature=0.7, top_k=5), system_prompt="be brief",
                 max_tokens=99)
    back = Settings.restore(s.saved())
    assert back == s  # drafter and draft length are the engine's (EngineInfo), never saved
    assert Settings.restore({"sampling": {"temperature": -1}}) == Settings()  # bad: defaults


def test_stats_line_and_stopped_marker():
    line = stats_line(STATS, Baseline(100.0, 32, "m"))
    # 19 tokens and the end-of-turn token that ended the turn, over 8 target passes
    for part in ("19 tokens", "tok/s", "TTFT 15 ms", "acceptance 46%", "2.50 tok/pass",
                 "speedup ×1.90", "draft 20 ms / verify 80 ms", "mtp k=3"):
        assert part in line
    stopped = TurnStats(generated_tokens=2, finish_reason="cancelled")
    assert stats_line(stopped, None).startswith(STOPPED)
    assert ESTIMATING in stats_line(stopped, None) and "×" not in stats_line(stopped, None)
    assert "speedup" not in stats_line(stopped, None, speedup=False)  # a saved answer's


def test_race_line_reports_both_speeds_and_identity():
    fast = TurnEnd(STATS, "stop", (1, 2, 3))
    plain = TurnEnd(TurnStats(generated_tokens=19, total_s=0.2, prefill_s=0.01), "stop",
                    (1, 2, 3))
    line = race_line(fast, plain, greedy=True)
    assert "190.0 tok/s" in line and "target-only 100.0 tok/s" in line and "same tokens" in line
    assert "differ" in race_line(fast, TurnEnd(plain.stats, "stop", (1, 2, 4)), greedy=True)
    assert race_line(fast, TurnEnd(plain.stats, "cancelled"), greedy=True) == "race stopped"
    # sampled: the texts differ and say nothing, unless seeded (drafter-invariant: they must
    # be the same)
    assert "tokens" not in race_line(fast, plain, greedy=False)
    assert "same tokens (seeded)" in race_line(fast, plain, greedy=False, seeded=True)
    parted = TurnEnd(plain.stats, "stop", (1, 2, 4))
    assert "must not" in race_line(fast, parted, greedy=False, seeded=True)


def test_buffer_and_answer_keep_span_offsets_aligned():
    buf = TokenBuffer()
    for text, kind in [("a\r", Kind.ACCEPTED), ("\x0cb", Kind.CORRECTED), ("c", Kind.TARGET)]:
        buf.push(TokenEvent(0, text, kind))
    pieces = buf.drain()
    assert pieces == [("a", "accepted"), ("b", "corrected"), ("c", "target")] and not len(buf)
    answer = Answer()
    answer.extend(pieces + [("d", "accepted"), ("e", "accepted")])
    assert answer.text == "abcde" == clean("a\rb\x0ccde")
    assert answer.runs == [["a", "accepted"], ["b", "corrected"], ["c", "target"],
                           ["de", "accepted"]]
    spans = [(s.start, s.end, s.style) for s in answer.content.spans]
    assert spans == [(0, 1, "$success"), (1, 2, "bold underline $error"), (3, 5, "$success")]


def test_a_turn_stopped_before_any_token_prints_no_rates():
    from mlx_spec import TurnStats
    from mlx_spec_app.widgets import stats_line

    line = stats_line(TurnStats(finish_reason="cancelled", drafter="mtp"), None)
    assert line == "[stopped] · no tokens"
