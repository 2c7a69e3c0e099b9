"""`mlx-spec bench --model M`: one model timed target-only and with its drafter, A-B-B-A."""

from __future__ import annotations

import json

from mlx_spec.cli import main
from mlx_spec.cli_bench import PromptResult, Run


def test_bench_times_both_sides_and_checks_greedy_identity(model_dirs, capsys):
    assert main(["bench", "--model", str(model_dirs("llama")), "--draft-model",
                 str(model_dirs("llama", 1)), "-k", "3", "-p", "def f", "-p", "class A:",
                 "--max-tokens", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["drafter"].startswith("draft") and report["draft_length"] == 3
    assert [p["prompt"] for p in report["prompts"]] == ["def f", "class A:"]
    for p in report["prompts"]:
        assert len(p["target_only_tok_s"]) == len(p["speculative_tok_s"]) == 2
        assert min(p["target_only_tok_s"] + p["speculative_tok_s"]) > 0
        assert p["tokens_per_pass"] >= 1.0 and 0.0 <= p["acceptance"] <= 1.0
        ratio = (sum(p["speculative_tok_s"]) / sum(p["target_only_tok_s"]))
        assert abs(p["speedup"] - ratio) < 1e-9
    assert report["identical"] == 2  # lossless greedy: both answers equal target-only's


def test_identity_is_read_from_the_tokens():
    def run(*tokens):
        return Run(10.0, tokens, 1.0, 0.0)

    same = PromptResult("p", (run(1, 2), run(1, 2)), (run(1, 2), run(1, 2)))
    parted = PromptResult("p", (run(1, 2), run(1, 2)), (run(1, 2), run(1, 3)))
    assert same.identical and not parted.identical and same.speedup == 1.0


def test_no_drafter_is_one_line_and_exit_2(model_dirs, capsys):
    assert main(["bench", "--model", str(model_dirs("llama")), "--drafter", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to compare" in err[0]


def test_an_empty_prompt_is_refused_before_loading(capsys):
    assert main(["bench", "-p", " "]) == 2
    assert "a prompt is empty" in capsys.readouterr().err
