"""The target split over 2 ranks on 127.0.0.1 (mlx's ring backend, started by our own
launcher from a hostfile): greedy output identical to one machine and to target-only, for a
pipeline split of the Qwen3.5-layout hybrid with its published MTP head and a tensor split of
a llama with a draft model and with n-gram, k in {1, 3, auto}; every rank's caches equal a
recompute after every round; one command message per target forward whatever k; χ² at T = 1;
a rank killed mid-answer ends rank 0 with one line; bad splits and mismatched hosts refused in
one line. Rank 0 runs in a child (tests/distributed_driver.py): a process joins one group."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from test_engine_sampling import chi2_pvalue, target_joint

from benchmarks.hybrid import agreeing_pair
from mlx_spec.distributed.hosts import HostfileError, read_hostfile
from mlx_spec.distributed.ranks import verdict
from mlx_spec.errors import MlxSpecError
from mlx_spec.loading import load_engine, load_target
from mlx_spec.model import TargetModel
from mlx_spec.sampling import SamplingConfig
from mlx_spec.spec import LoadSpec
from mlx_spec.train.modeldir import build_model, save_model_dir

HERE = Path(__file__).parents[1]  # tests/: the driver sits beside the shared helpers
PROMPT = [(i * 29) % 300 + 5 for i in range(20)]
# llama with 2 KV heads, so a tensor split gives each rank one
LLAMA = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=384,
             max_position_embeddings=512, model_type="llama", tie_word_embeddings=False,
             rope_theta=10000.0)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tokenizer_dir):
    """{name: model dir}: the hybrid checkpoint with its MTP module (HF layout, a head that
    partly agrees with its trunk), a llama, and a draft model blended from it."""
    import published as pub
    from conftest import _scale_head

    root = tmp_path_factory.mktemp("split")
    model, head = pub.build_pair("qwen3_5", agree=True, noise=0.3)
    out = {"hybrid": pub.write_checkpoint(root / "hybrid", "qwen3_5", model, head,
                                          tokenizer_dir)}
    # attention every 4th layer, as published: an even split ends rank 1 on a recurrent layer
    # (mlx-lm's pipeline ties its send into that layer's cache: it must not end its rollback)
    config = json.loads(json.dumps(pub.CONFIGS["qwen3_5"]))
    config["text_config"]["full_attention_interval"] = 4
    model, head = agreeing_pair(config, noise=0.3)
    target = TargetModel(model, 512)
    weights = {**pub.trunk_to_hf("qwen3_5", model), **pub.head_to_hf("qwen3_5", head, target)}
    out["hybrid4"] = pub.write_dir(root / "hybrid4", config, weights, tokenizer_dir, "pt")
    target, other = build_model(LLAMA, seed=0), build_model(LLAMA, seed=1)
    _scale_head(target)
    a, b = dict(tree_flatten(target.parameters())), dict(tree_flatten(other.parameters()))
    draft = build_model(LLAMA)
    draft.update(tree_unflatten([(k, 0.9 * a[k] + 0.1 * b[k]) for k in a]))
    mx.eval(draft.parameters())
    for name, m in (("llama", target), ("draft", draft)):
        save_model_dir(root / name, m, LLAMA, tokenizer_dir=tokenizer_dir)
        out[name] = root / name
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hostfile(tmp_path):
    p = tmp_path / "hosts.json"
    p.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    return p


def drive(job: dict, hostfile: Path, timeout: float = 240) -> dict:
    env = {**os.environ, "MLX_SPEC_PORT": str(_free_port())}
    done = subprocess.run([sys.executable, str(HERE / "distributed_driver.py"),
                           json.dumps({**job, "hostfile": str(hostfile)}, default=str)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_machine(model: Path, max_tokens: int) -> list[int]:
    """Target-only greedy on one machine: the reference every split run must equal."""
    conv = load_engine(LoadSpec(model=str(model), drafter="none")).conversation()
    return list(list(conv.generate(PROMPT, max_tokens=max_tokens, ignore_eos=True))[-1].tokens)


def assert_split_runs_exact(result: dict, want: list[int], mode: str) -> None:
    assert result["ranks"] == 2 and result["split"].startswith(mode)
    for turn in result["turns"]:
        assert turn["tokens"][0] == want  # token for token (these fixtures have no near-tie)
        assert len(turn["worst"]) == 2 and max(turn["worst"]) < 1e-4, turn["worst"]
        # one command per forward, whatever k: the network cost per pass does not grow
        assert turn["messages"] == turn["forwards"], (turn["messages"], turn["forwards"])
        assert turn["stats_ranks"] == 2 and turn["stats_split"] == result["split"]


@pytest.mark.parametrize("name", ["hybrid", "hybrid4"])
def test_pipeline_split_of_the_hybrid_with_its_mtp_head_is_exact(dirs, hostfile, name):
    want = one_machine(dirs[name], 40)
    turns = [{"prompt": PROMPT, "max_tokens": 40, "k": k, "check": True} for k in (1, 3, "auto")]
    result = drive({"model": dirs[name], "drafter": "mtp", "turns": turns}, hostfile)
    assert_split_runs_exact(result, want, "pipeline")
    assert sum(t["accepted"] for t in result["turns"]) > 0  # the head loaded right
    whole = load_target(dirs[name])[0].nbytes()
    assert 0 < result["turns"][0]["target_bytes"] < whole  # rank 0 holds only its part


def test_tensor_split_with_a_draft_model_and_ngram_is_exact(dirs, hostfile):
    want = one_machine(dirs["llama"], 40)
    turns = [{"prompt": PROMPT, "max_tokens": 40, "k": k, "check": True} for k in (1, 3, "auto")]
    result = drive({"model": dirs["llama"], "drafter": "draft", "draft_model": dirs["draft"],
                    "turns": turns}, hostfile)
    assert_split_runs_exact(result, want, "tensor")
    assert all(t["accepted"] > 0 for t in result["turns"][:2])  # the draft model is used
    ngram = drive({"model": dirs["llama"], "drafter": "ngram", "turns": [turns[1]]}, hostfile)
    assert_split_runs_exact(ngram, want, "tensor")


def test_batched_verify_over_a_split_is_exact(dirs, hostfile):
    """The server's batch: several conversations' rounds in one pass, on every rank."""
    from helpers import assert_same_or_near_tie

    prompts = [PROMPT, PROMPT[:7] + [3, 1, 4, 1, 5], [9] * 4]
    result = drive({"model": dirs["hybrid"], "drafter": "mtp", "k": 3, "max_tokens": 24,
                    "batch": prompts}, hostfile)
    batch = result["batch"]
    assert max(batch["sizes"]) == 3 and max(batch["worst"]) < 1e-4, batch
    target, _ = load_target(dirs["hybrid"])
    for prompt, got in zip(prompts, batch["tokens"], strict=True):
        conv = load_engine(LoadSpec(model=str(dirs["hybrid"]), drafter="none")).conversation()
        want = list(list(conv.generate(prompt, max_tokens=24, ignore_eos=True))[-1].tokens)
        assert_same_or_near_tie(target, prompt, got, want)


def test_sampling_over_a_split_is_the_targets_distribution(dirs, hostfile):
    cfg = dict(temperature=1.0, top_k=4)
    runs = 1000
    turn = {"prompt": PROMPT[:12], "max_tokens": 2, "k": 2, "seed": 0, "sampling": cfg,
            "repeat": runs, "reseed": True}
    result = drive({"model": dirs["llama"], "drafter": "draft", "draft_model": dirs["draft"],
                    "turns": [turn]}, hostfile)
    pairs = [tuple(t) for t in result["turns"][0]["tokens"]]
    target, _ = load_target(dirs["llama"])
    pval = chi2_pvalue(pairs, target_joint(target, SamplingConfig(**cfg), prompt=PROMPT[:12]))
    print(f"split χ² p = {pval:.3f}")
    assert pval > 1e-3


def test_a_seeded_answer_over_a_split_is_the_one_machine_target_only_answer(dirs, hostfile):
    """Seeded T = 1 (the drafter-invariant coupling): a draft model over two ranks gives, seed
    for seed, the tokens target-only gives on one machine."""
    cfg = dict(temperature=1.0)
    turn = {"prompt": PROMPT[:12], "max_tokens": 16, "k": 3, "seed": 0, "sampling": cfg,
            "repeat": 3, "reseed": True, "check": True}
    result = drive({"model": dirs["llama"], "drafter": "draft", "draft_model": dirs["draft"],
                    "turns": [turn]}, hostfile)
    got = result["turns"][0]
    assert result["ranks"] == 2 and got["drafted"] > 0
    alone = load_engine(LoadSpec(model=str(dirs["llama"]), drafter="none"))
    for seed, tokens in enumerate(got["tokens"]):
        end = list(alone.conversation().generate(
            PROMPT[:12], max_tokens=16, ignore_eos=True,
            sampling=SamplingConfig(seed=seed, **cfg)))[-1]
        assert tokens == list(end.tokens), seed
    assert max(got["worst"]) < 1e-4  # every cache equal to a recompute, every round


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_lost_rank_ends_rank_0_with_one_line(dirs, hostfile, how):
    """Killed mid-answer, or stopped (alive, silent: SIGSTOP) past MLX_SPEC_RANK_TIMEOUT:
    rank 0 says so in one line and exits non-zero, and no process is left."""
    env = {**os.environ, "MLX_SPEC_PORT": str(_free_port()), "MLX_SPEC_RANK_TIMEOUT": "3"}
    job = {"model": str(dirs["llama"]), "hostfile": str(hostfile), "hang": True, "turns": []}
    p = subprocess.Popen([sys.executable, str(HERE / "distributed_driver.py"), json.dumps(job)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()
        if not line:  # (seen once in a full run, not again: say why if it comes back)
            p.kill()
            pytest.fail(f"the driver exited before its ranks were up: {p.stderr.read()[-800:]}")
        worker = json.loads(line)["pids"][0]
        time.sleep(0.5)  # mid-answer
        os.kill(worker, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        code = p.wait(timeout=30)
    finally:
        p.kill()
    # (MLX's ring backend prints its own "[ring] Socket … closed" lines; ours is the last)
    err = [line for line in p.stderr.read().strip().splitlines() if not line.startswith("[ring]")]
    assert code != 0
    want = "rank 1 (127.0.0.1) exited" if how == "killed" else "no answer from the other ranks"
    assert err and err[-1].startswith(f"mlx-spec: {want}"), err[-3:]
    assert "Traceback" not in "\n".join(err)
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):  # gone (a stopped one is killed by rank 0)
        os.kill(worker, 0)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_an_idle_worker_sleeps(dirs, hostfile):
    """Between rank 0's commands a worker waits on the doorbell (bell.py), in the kernel: over
    3 idle seconds it uses a small fraction of a core (the ring backend's own wait polls: a
    whole one), and answers the next command."""
    env = {**os.environ, "MLX_SPEC_PORT": str(_free_port())}
    job = {"model": str(dirs["llama"]), "hostfile": str(hostfile), "idle": 4, "turns": []}
    p = subprocess.Popen([sys.executable, str(HERE / "distributed_driver.py"), json.dumps(job)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        worker = json.loads(p.stdout.readline())["pids"][0]
        time.sleep(0.5)
        before = _cpu_seconds(worker)
        time.sleep(3.0)
        used = _cpu_seconds(worker) - before
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0, err[-2000:]
    assert used < 0.3, f"an idle worker used {used:.2f} s of CPU in 3 s"
    assert len(json.loads(out.strip().splitlines()[-1])["after_idle"]) == 4


def test_bad_splits_and_hostfiles_are_one_line(dirs, tmp_path, hostfile):
    with pytest.raises(MlxSpecError, match="cannot be split by pipeline"):
        load_engine(LoadSpec(model=str(dirs["llama"]), drafter="none", hostfile=str(hostfile),
                             split="pipeline"))
    bad = tmp_path / "bad.json"
    for text, match in (("{", "not a JSON hostfile"), ('[{"ssh": "127.0.0.1"}]', "at least 2"),
                        ('[{"ips": []}, {"ssh": "b"}]', "no \"ssh\""),
                        ('[{"ssh": "a"}, {"ssh": "b"}]', "needs \"ips\""),
                        ('{"backend": "mpi", "hosts": []}', "mlx.launch")):
        bad.write_text(text)
        with pytest.raises(HostfileError, match=match):
            read_hostfile(bad)


def test_hosts_must_agree_on_versions_and_model_files():
    ok = {"versions": "mlx-spec 0.1.0, mlx 0.32.4, mlx-lm 0.32.2", "model": "abc"}
    hosts = ["mac1", "mac2"]
    assert verdict([ok, ok], hosts, "/m") is None
    assert "mac2" in verdict([ok, {**ok, "versions": "mlx-spec 0.2.0"}], hosts, "/m")
    assert "no model" in verdict([ok, {**ok, "model": "missing"}], hosts, "/m")
    assert "different model files" in verdict([ok, {**ok, "model": "abd"}], hosts, "/m")


def test_doctor_checks_every_host(dirs, hostfile, tmp_path, monkeypatch):
    from mlx_spec.doctor import check_hosts

    monkeypatch.setenv("MLX_SPEC_PORT", str(_free_port()))
    checks = check_hosts(str(hostfile), str(dirs["llama"]))
    assert [c.name for c in checks] == ["rank 0", "rank 1", "ring"]
    assert all(c.ok for c in checks), checks
    checks = check_hosts(str(hostfile), str(tmp_path / "nowhere"))
    assert not checks[1].ok and "no model" in checks[1].detail and checks[1].fix
    unreachable = tmp_path / "far.json"
    unreachable.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]},
                                       {"ssh": "nohost.invalid", "ips": ["10.9.9.9"]}]))
    far = check_hosts(str(unreachable), None)
    assert far[0].ok and not far[1].ok and "ssh" in far[1].fix


def test_a_tensor_split_needs_heads_that_divide(dirs):
    """mlx-lm's shard does not check: 3 ranks over 4 heads / 2 KV heads would fail at the
    first forward inside a norm. Refused at load, in one line."""
    from mlx_spec.distributed.target import check_heads_divide

    target, _ = load_target(dirs["llama"], lazy=True)
    check_heads_divide(target, 2)
    with pytest.raises(MlxSpecError, match="4 attention heads / 2 KV heads do not divide over 3"):
        check_heads_divide(target, 3)
