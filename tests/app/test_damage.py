"""History that survives crashes and damage: kill -9 mid-answer keeps what streamed, a damaged
file is moved aside (kept) for a fresh one, a data directory that cannot be written leaves the
chat working in memory; each of these is one line for the user."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

from mlx_spec import Baseline
from mlx_spec_app.app import SpecChatApp
from mlx_spec_app.history import COMPLETE, STREAMING, History
from mlx_spec_app.widgets import INTERRUPTED, Answer

from .fakes import FakeEngine

CHILD = """
import asyncio, sys
from mlx_spec import LoadSpec
from mlx_spec_app.app import SpecChatApp
from mlx_spec_app.history import History
from mlx_spec_app.settings import Settings
from mlx_spec_app.widgets import PromptInput

async def main():
    app = SpecChatApp(LoadSpec(model=sys.argv[1], draft_length=3), history=History())
    async with app.run_test(size=(100, 30)) as pilot:
        while app.engine is None or app.busy:
            await pilot.pause(0.05)
        app.settings = Settings(max_tokens=3000)
        app.query_one(PromptInput).text = "def add(a, b):"
        await pilot.press("enter")
        while not (app.chat.answer and len(app.chat.answer.text) > 200):
            await pilot.pause(0.05)
        await pilot.pause(1.5)  # at least one streaming save
        print("STREAMING", flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


def test_killed_mid_answer_the_answer_is_kept_and_marked_interrupted(home, tmp_path):
    from mlx_spec.assets import demo_model

    env = dict(os.environ, MLX_SPEC_HOME=str(home), MLX_SPEC_ENGINE="thread")
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(demo_model())], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.strip() == "STREAMING", p.stderr.read()[-2000:]
        shown = time.monotonic()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    history = History(home / "history.sqlite3")
    (conversation, _, _), = history.conversations()
    user, answer = history.messages(conversation)
    assert user["content"] == "def add(a, b):"
    assert answer["partial"] == STREAMING and len(answer["content"]) > 100
    assert answer["kinds"] and "".join(t for t, k in answer["kinds"]
                                       if k != "rejected") == answer["content"]
    assert time.monotonic() - shown < 5
    history.close()


async def test_an_interrupted_answer_reopens_marked(home):
    history = History()
    cid = history.new_conversation("def add(a, b):")
    history.add_message(cid, "user", "def add(a, b):")
    history.add_message(cid, "assistant", "    return a", kinds=[["    return a", "accepted"]],
                        partial=STREAMING)
    app = SpecChatApp(engine=FakeEngine(), baseline=Baseline(100.0, 8, "fixed"),
                      history=history)  # type: ignore[arg-type]
    async with app.run_test(size=(100, 30)) as pilot:
        app.chat.open(cid)
        await pilot.pause()
        answer = app.query(Answer).last()
        assert answer.text == "    return a" and answer.partial
        assert INTERRUPTED in str(answer.query_one(".stats").render())


def test_a_damaged_file_is_kept_aside_and_a_fresh_one_started(home):
    path = home / "history.sqlite3"
    path.write_bytes(os.urandom(4096))  # a few KB of garbage
    history = History(path)
    kept = list(home.glob("history.sqlite3.damaged-*"))
    assert len(kept) == 1 and kept[0].stat().st_size == 4096  # never deleted
    notice = history.take_notice()
    assert "damaged" in notice and kept[0].name in notice and "\n" not in notice
    cid = history.new_conversation("hi")
    assert history.conversations()[0][0] == cid and history.saving
    assert history.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_data_dir_that_cannot_be_written_keeps_the_chat_in_memory(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the data directory should be")
    history = History(blocker / "history.sqlite3")
    assert not history.saving and "not being saved" in history.take_notice()
    cid = history.new_conversation("hi")
    history.add_message(cid, "user", "hi")
    assert history.messages(cid)[0]["content"] == "hi"


def test_a_disk_that_fails_mid_session_moves_to_memory_with_what_was_saved(home):
    path = home / "history.sqlite3"
    history = History(path)
    cid = history.new_conversation("before")
    history.add_message(cid, "user", "before")
    history.db.close()
    history.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)  # the disk turned read-only
    history.add_message(cid, "assistant", "after", partial=COMPLETE)
    assert not history.saving and "not being saved" in history.take_notice()
    assert [m["content"] for m in history.messages(cid)] == ["before", "after"]
