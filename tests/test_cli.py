"""The `mlx-spec generate` contract: JSON output, and one clear line + exit 2 for bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ARCHS, VOCAB

from mlx_spec.cli import main
from mlx_spec.train.modeldir import build_model, save_model_dir
from mlx_spec.train.tokenizer import save_tokenizer, train_tokenizer


def gen(*args):
    return main(["generate", *map(str, args)])


def test_json_output_matches_target_only(model_dirs, capsys):
    target = model_dirs("llama")
    assert gen("--model", target, "--draft-model", model_dirs("llama", 1), "--prompt", "def f",
               "--raw", "--max-tokens", 12, "--json", "-k", 3) == 0
    spec = json.loads(capsys.readouterr().out)
    assert set(spec) >= {"prompt_ids", "tokens", "kinds", "text", "stats"}
    assert spec["stats"]["drafter"] == "draft+lookup" and spec["stats"]["target_passes"] > 0
    assert set(spec["kinds"]) <= {"accepted", "corrected", "bonus", "target"}
    assert gen("--model", target, "--drafter", "none", "--prompt", "def f", "--raw",
               "--max-tokens", 12, "--json") == 0
    base = json.loads(capsys.readouterr().out)
    assert base["prompt_ids"] == spec["prompt_ids"]
    assert base["tokens"] == spec["tokens"]  # same greedy output (tiny model: no near-tie here)
    assert set(base["kinds"]) == {"target"}
    assert base["text"] == spec["text"]


def test_kv_bits_option(model_dirs, capsys):
    target = model_dirs("llama")
    assert gen("--model", target, "--drafter", "none", "--prompt", "def f", "--raw",
               "--max-tokens", 8, "--json", "--kv-bits", 8) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["tokens"]) == 8 and out["stats"]["kv_cache_bytes"] > 0
    with pytest.raises(SystemExit):
        gen("--model", target, "--prompt", "x", "--kv-bits", 3)
    assert "invalid choice" in capsys.readouterr().err


def test_chat_template_is_applied_unless_raw(model_dirs, capsys):
    target = model_dirs("qwen3")
    gen("--model", target, "--prompt", "hi", "--max-tokens", 2, "--json")
    chat = json.loads(capsys.readouterr().out)["prompt_ids"]
    gen("--model", target, "--prompt", "hi", "--max-tokens", 2, "--json", "--raw")
    raw = json.loads(capsys.readouterr().out)["prompt_ids"]
    assert len(chat) > len(raw)


@pytest.fixture(scope="module")
def bad_dirs(tmp_path_factory, model_dirs, tokenizer_dir):
    root = tmp_path_factory.mktemp("bad")
    corrupt_cfg = root / "corrupt-config"
    shutil.copytree(model_dirs("llama"), corrupt_cfg)
    (corrupt_cfg / "config.json").write_text("{not json")
    corrupt_w = root / "corrupt-weights"
    shutil.copytree(model_dirs("llama"), corrupt_w)
    (corrupt_w / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    other_vocab = root / "other-vocab"  # another tokenizer (the same size, other tokens)
    other_tok = root / "other-tok"
    save_tokenizer(train_tokenizer([f"zz{i} yy{i} xx" for i in range(400)], VOCAB), other_tok)
    cfg = dict(ARCHS["llama"])
    save_model_dir(other_vocab, build_model(cfg), cfg, tokenizer_dir=other_tok)
    return {"corrupt-config": corrupt_cfg, "corrupt-weights": corrupt_w, "other-vocab": other_vocab}


@pytest.mark.parametrize("case,args,needle", [
    ("missing", ["--model", "/nonexistent/model"], "not found"),
    ("corrupt-config", [], "corrupt config.json"),
    ("corrupt-weights", [], "cannot load model"),
    ("vocab", [], "does not share"),
    ("k0", ["-k", "0"], "--draft-length: draft length must be 1..16 or 'auto', got 0"),
    ("k17", ["-k", "17"], "--draft-length: draft length must be 1..16"),
    ("k-text", ["-k", "many"], "--draft-length: draft length must be an integer 1..16 or 'auto'"),
    ("temp", ["--temp", "-1"], "--temp must be a number >= 0"),
    ("temp-nan", ["--temp", "nan"], "--temp must be a number >= 0, got nan"),
    ("top-p", ["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    ("top-p-inf", ["--top-p", "inf"], "--top-p must be in (0, 1], got inf"),
    ("penalty-nan", ["--repetition-penalty", "nan"], "--repetition-penalty must be"),
    ("empty", ["--prompt", ""], "prompt is empty"),
    ("too-long", ["--prompt", "def " * 700], "model's context is 512"),
])
def test_bad_input_is_one_line_and_exit_2(model_dirs, bad_dirs, capsys, case, args, needle):
    model = {"corrupt-config": bad_dirs["corrupt-config"],
             "corrupt-weights": bad_dirs["corrupt-weights"]}.get(case, model_dirs("llama"))
    base = ["--model", model, "--prompt", "x", "--raw", "--max-tokens", 4]
    if case == "vocab":
        base += ["--draft-model", bad_dirs["other-vocab"]]
    assert gen(*base, *args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_real_process_prints_no_traceback(model_dirs, tmp_path):
    """The installed entry point, as a user runs it."""
    cmd = [sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(tmp_path / "nope"),
           "--prompt", "x"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("mlx-spec: error:") and "Traceback" not in r.stderr
    ok = subprocess.run([sys.executable, "-m", "mlx_spec.cli", "generate", "--model",
                         str(model_dirs("llama")), "--prompt", "héllo 日本", "--raw",
                         "--max-tokens", "20"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip()
    assert "tok/s" in ok.stderr and "finish length" in ok.stderr


def test_prompt_bytes_that_are_not_utf8_are_replaced_in_one_line(model_dirs):
    """As a shell passes them: argv bytes reach Python through surrogateescape."""
    prompt = b"a\x01b\xff\xfe c"
    cmd = [sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(model_dirs("llama")),
           "--prompt", os.fsdecode(prompt), "--raw", "--max-tokens", "4", "--json"]
    r = subprocess.run(cmd, capture_output=True, timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "not UTF-8" in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert len(json.loads(r.stdout)["tokens"]) == 4


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_prints_the_partial_answer_and_exits_130(as_json):
    """SIGINT mid-generation: the turn ends between rounds; what was generated is printed with
    its stats (or the JSON object), exit code 130, no traceback."""
    cmd = [sys.executable, "-u", "-m", "mlx_spec.cli", "generate", "--prompt", "def f(",
           "--raw", "--max-tokens", "100000", *(["--json"] if as_json else [])]
    # the bundled demo pair: a 4096-token context does not end the answer within the test
    env = dict(os.environ, MLX_SPEC_NO_PRELOAD="1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    if as_json:
        time.sleep(12)  # loaded and generating, with margin on a busy 2-core machine
        first = b""
    else:
        first = p.stdout.read(1)  # the first token is out: mid-generation
        time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    out, err = first + out, err.decode()
    assert p.returncode == 130, err
    assert "Traceback" not in err
    if as_json:
        result = json.loads(out)
        assert result["finish_reason"] == "cancelled" and result["tokens"]
        assert result["target"].startswith("demo-target")
    else:
        assert out.strip() and "finish cancelled" in err and len(err.strip().splitlines()) == 1
        assert err.strip().startswith("[demo-target")  # which demo variant ran


def test_an_unexpected_failure_is_one_line_too(monkeypatch, capsys):
    import mlx_spec.cli_models as cm

    def broken(args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(cm, "cmd_models", broken)
    assert main(["models"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Input/output error" in err and "Traceback" not in err
    monkeypatch.setenv("MLX_SPEC_DEBUG", "1")
    with pytest.raises(OSError):
        main(["models"])


def test_the_commands_draft_copies_first_unless_told_not_to():
    """generate, chat and serve default to --lookup; --no-lookup turns it off. So does the
    bare `mlx-spec`, the README's first command (it read as lookup off: the demo's first turn
    drafted with the head alone). (The library's LoadSpec leaves it off unless asked.)"""
    from mlx_spec.cli import parse_args, spec_from_args
    from mlx_spec.spec import LoadSpec

    assert spec_from_args(parse_args([])).lookup is True
    assert parse_args([]).command == "chat" and not parse_args(["--version"]).command
    for command in (["serve"], ["chat"], ["generate", "--prompt", "x"]):
        assert spec_from_args(parse_args(command)).lookup is True
        assert spec_from_args(parse_args([*command, "--no-lookup"])).lookup is False
    assert LoadSpec().lookup is False
