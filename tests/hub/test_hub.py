"""Downloads, against a local stand-in for the hub (hubserver.py) serving tiny repositories that
these tests build: a target and a draft model that share a tokenizer, a Qwen3.5-layout original
checkpoint whose MTP module sits in one shard of three, its MLX conversion (which dropped the
head; its card names the original), and a sidecar head. Everything a user does goes through the
same code a real download does: `mlx-spec pull` / `chat` / `generate` by preset or repo id."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import open_chat, run
from hubenv import hub_env, skip_retry_sleeps
from hubserver import HubServer
from published import CONFIGS, build_pair, write_checkpoint, write_sidecar

from mlx_spec import hub
from mlx_spec.cli import main
from mlx_spec.errors import MlxSpecError
from mlx_spec.hub import download as fetch_mod
from mlx_spec.hub import heads
from mlx_spec.loading import load_target, make_drafter, quantize_mtp_head
from mlx_spec.spec import LoadSpec
from mlx_spec.train.modeldir import save_model_dir

ORIGINAL = "Qwen/Tiny3.5"
CONVERSION = "mlx-community/Tiny3.5-bf16"
SIDECAR = "mlx-community/Tiny3.5-MTP"
TARGET, DRAFT = "org/tiny", "org/tiny-draft"

PRESETS = f"""
[[preset]]
name = "tiny-pair"
title = "a target and its draft model"
tier_gb = 8
target = "{TARGET}"
drafter = "{DRAFT}"
drafter_kind = "draft"
download_gb = 0.01
ram_gb = 0.1
verified = "built by the test"

[[preset]]
name = "tiny-mtp"
title = "a conversion and its sidecar head"
tier_gb = 8
target = "{CONVERSION}"
drafter = "{SIDECAR}"
drafter_kind = "mtp"
download_gb = 0.01
ram_gb = 0.1
verified = "built by the test"

[[preset]]
name = "tiny-extract"
title = "a conversion, its head read out of the original"
tier_gb = 8
target = "{CONVERSION}"
mtp_from = "{ORIGINAL}"
drafter_kind = "mtp"
download_gb = 0.01
ram_gb = 0.1
verified = "built by the test"

[[preset]]
name = "tiny-eagle"
title = "a drafter kind not loadable yet"
tier_gb = 8
target = "{TARGET}"
drafter = "{DRAFT}"
drafter_kind = "medusa"
download_gb = 0.01
ram_gb = 0.1
verified = "built by the test"

[[preset]]
name = "huge"
title = "does not fit"
tier_gb = 512
target = "{TARGET}"
drafter_kind = "none"
download_gb = 400
ram_gb = 100000
verified = "built by the test"
"""


def shard(src: Path, out: Path, prefix: str, parts: int = 3) -> Path:
    """`src` re-saved as `parts` shards with an index, every `prefix*` tensor in the middle one
    with a third of the trunk (as Qwen's checkpoints put mtp.* in one shard of many)."""
    weights = mx.load(str(src / "model.safetensors"))
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("model.safetensors"))
    head = {k: v for k, v in weights.items() if k.startswith(prefix)}
    trunk = sorted(k for k in weights if not k.startswith(prefix))
    third = len(trunk) // 3
    groups = [trunk[:third], sorted([*head, *trunk[third : 2 * third]]), trunk[2 * third :]]
    weight_map = {}
    for i, names in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{parts:05d}.safetensors"
        mx.save_safetensors(str(out / name), {k: weights[k] for k in names},
                            metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, name))
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return out


@pytest.fixture(scope="module")
def repos(tmp_path_factory, tokenizer_dir, model_dirs):
    root = tmp_path_factory.mktemp("hubrepos")
    model, head = build_pair("qwen3_5", agree=True)  # a head that agrees: a known answer
    original = shard(write_checkpoint(root / "single", "qwen3_5", model, head, tokenizer_dir),
                     root / "original", "mtp.")
    (original / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Tiny3.5\n")
    target, _ = load_target(root / "single")
    conversion = root / "conversion"
    save_model_dir(conversion, target.model, CONFIGS["qwen3_5"], tokenizer_dir=tokenizer_dir)
    (conversion / "README.md").write_text(
        f"---\nlibrary_name: mlx\nbase_model:\n- {ORIGINAL}\ntags:\n- mlx\n---\n# Tiny3.5 MLX\n")
    reference = make_drafter("mtp", target, mtp=root / "single")
    sidecar = write_sidecar(root / "sidecar", "qwen3_5", reference.head)
    return {TARGET: model_dirs("qwen3", 0), DRAFT: model_dirs("qwen3", 1), ORIGINAL: original,
            CONVERSION: conversion, SIDECAR: sidecar}


@pytest.fixture
def server(repos, tmp_path, monkeypatch):
    presets = tmp_path / "presets.toml"
    presets.write_text(PRESETS)
    monkeypatch.setenv("MLX_SPEC_PRESETS", str(presets))
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "home"))
    skip_retry_sleeps(monkeypatch)
    monkeypatch.setattr(fetch_mod.time, "sleep", lambda s: None)
    with HubServer(repos) as srv, hub_env(srv, tmp_path / "hf"):
        yield srv


def served(srv: HubServer, repo: str) -> int:
    return sum(n for (r, _), n in srv.bytes_served.items() if r == repo)


def ranges(srv: HubServer, path: str) -> list[str | None]:
    return [r for m, p, r in srv.requests if m == "GET" and p.endswith(path)]


def test_fresh_pull_then_generate_on_the_downloaded_pair(server, capsys):
    launch = hub.pull("tiny-pair")
    assert launch.drafter == "draft" and launch.draft_model is not None
    assert (launch.target / "config.json").exists() and launch.target.is_relative_to(
        fetch_mod.cache_root())
    spec = open_chat(model=launch.target, drafter="draft", draft_model=launch.draft_model,
                       draft_length=3)
    plain = open_chat(model=launch.target, drafter="none")
    assert [e.token for e in run(spec)[1]] == [e.token for e in run(plain)[1]]
    assert hub.missing("tiny-pair") is None
    before = len(server.requests)
    assert hub.pull("tiny-pair") == launch  # nothing fetched again: one listing per repo
    assert all("/resolve/" not in p for _, p, _ in server.requests[before:])
    capsys.readouterr()
    assert main(["generate", "--model", "tiny-pair", "--prompt", "def f(", "--max-tokens", "8",
                 "--json", "--raw"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["drafter"] == "draft+lookup" and len(out["tokens"]) == 8


def test_models_lists_presets_fit_and_downloads(server, capsys):
    hub.pull("tiny-pair")
    assert main(["models", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in table["presets"]}
    assert rows["tiny-pair"]["downloaded"] and not rows["tiny-mtp"]["downloaded"]
    assert rows["huge"]["fits"] is False and rows["tiny-pair"]["fits"] is True
    assert rows["tiny-eagle"]["loadable"] is False
    assert {TARGET, DRAFT} <= {i["repo"] for i in table["installed"]}
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "tiny-eagle" in text and "cannot be loaded yet" in text


def test_the_models_table_keeps_its_columns_for_the_bundled_names(tmp_path, monkeypatch,
                                                                  capsys):
    """The longest bundled preset name (qwen3.5-4b-dflash) ran into its drafter kind."""
    monkeypatch.delenv("MLX_SPEC_PRESETS", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    col = lines[1].index("drafter")
    rows = [line for line in lines[2:] if line.endswith(tuple("0123456789B")) or " GB " in line]
    assert len(rows) == len(hub.presets()) > 1
    for line in rows:
        name, kind = line[:col].split(), line[col:].split()[0]
        assert len(name) == 1 and name[0] in {p.name for p in hub.presets()}
        assert kind.rstrip("*") in {p.drafter_kind for p in hub.presets()}


def test_interrupted_transfer_resumes_next_time(server, monkeypatch):
    monkeypatch.setattr(fetch_mod, "RETRIES", 0)  # fail at the first cut, as a dropped network
    size = (server.repos[TARGET] / "model.safetensors").stat().st_size
    server.cut_after[(TARGET, "model.safetensors")] = size // 3
    with pytest.raises(hub.DownloadError, match="run it again to resume"):
        hub.fetch(TARGET)
    assert hub.local_snapshot(TARGET) is None  # nothing half-written looks complete
    part = next(fetch_mod.repo_dir(TARGET).glob("blobs/*.part"))
    assert part.stat().st_size == size // 3
    path = hub.fetch(TARGET)
    assert ranges(server, "model.safetensors")[-1] == f"bytes={size // 3}-"
    assert server.bytes_served[(TARGET, "model.safetensors")] == size  # every byte once
    assert (path / "model.safetensors").read_bytes() == (
        server.repos[TARGET] / "model.safetensors").read_bytes()


def test_a_cut_connection_is_resumed_within_the_call(server):
    size = (server.repos[TARGET] / "model.safetensors").stat().st_size
    server.cut_after[(TARGET, "model.safetensors")] = size // 2
    path = hub.fetch(TARGET)
    assert ranges(server, "model.safetensors")[-1] == f"bytes={size // 2}-"
    load_target(path)


def test_cancel_keeps_what_arrived_and_the_next_pull_resumes(server, monkeypatch):
    import threading

    monkeypatch.setattr(fetch_mod._Meter, "every_s", 0.0)
    cancel = threading.Event()
    seen = []

    def progress(p):
        seen.append(p)
        if p.file == "model.safetensors" and p.done > 0:
            cancel.set()

    with pytest.raises(hub.Cancelled):
        hub.fetch(TARGET, progress=progress, cancel=cancel)
    part = next(fetch_mod.repo_dir(TARGET).glob("blobs/*.part"))
    have = part.stat().st_size
    assert have > 0
    done = []
    hub.fetch(TARGET, progress=done.append)
    assert ranges(server, "model.safetensors")[-1] == f"bytes={have}-"
    assert done[-1].done == done[-1].total  # the bar starts where the last pull stopped
    assert all(p.total > 0 and p.rate >= 0 for p in seen)


def test_corrupted_files_are_detected_refetched_or_reported(server):
    path = hub.fetch(TARGET)
    blob = (path / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))  # bit rot on disk: same size, other bytes
    hub.fetch(TARGET, verify=True)
    assert blob.read_bytes() == (server.repos[TARGET] / "model.safetensors").read_bytes()
    server.corrupt.add((DRAFT, "model.safetensors"))  # the hub (or a proxy) sends wrong bytes
    with pytest.raises(hub.DownloadError, match="corrupt after a fresh fetch"):
        hub.fetch(DRAFT)
    assert hub.local_snapshot(DRAFT) is None or not (
        hub.local_snapshot(DRAFT) / "model.safetensors").exists()


def test_not_found_gated_unknown_and_disk_full_are_one_line(server, monkeypatch, capsys):
    with pytest.raises(hub.DownloadError, match="was not found on the hub"):
        hub.pull("org/nope")
    server.gated.add(TARGET)
    with pytest.raises(hub.DownloadError, match="is gated: accept its licence"):
        hub.fetch(TARGET)
    server.gated.clear()
    with pytest.raises(hub.UnknownPresetError, match="unknown preset 'nope'"):
        hub.pull("nope")
    assert main(["pull", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    import collections

    monkeypatch.setattr(fetch_mod.shutil, "disk_usage",
                        lambda p: collections.namedtuple("u", "total used free")(1, 1, 10))
    before = len(server.requests)
    with pytest.raises(hub.DownloadError, match="not enough disk space"):
        hub.fetch(TARGET)
    assert all("/resolve/" not in p for _, p, _ in server.requests[before:])  # checked first


def test_offline_with_and_without_a_cache(server, monkeypatch):
    server.offline = True
    with pytest.raises(hub.DownloadError, match="cannot reach the hub.*nothing is downloaded"):
        hub.pull("tiny-pair")
    server.offline = False
    launch = hub.pull("tiny-pair")
    server.offline = True
    assert hub.pull("tiny-pair") == launch  # the cache serves, no error
    with pytest.raises(hub.DownloadError, match="ready to use offline: tiny-pair"):
        hub.pull("tiny-mtp")
    server.offline = False
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub.pull("tiny-pair") == launch
    with pytest.raises(hub.DownloadError, match="HF_HUB_OFFLINE"):
        hub.pull("tiny-mtp")
    before = len(server.requests)
    assert hub.launch_for("tiny-pair") == launch  # the app's question: never the network
    assert len(server.requests) == before


def test_mtp_head_range_read_from_the_original_checkpoint(server):
    """A conversion that dropped its head, with no preset: the card's base_model names the
    original, whose mtp.* tensors are read with range requests, far fewer bytes than their
    shard; the head then loads and is accepted (known answer) and decoding stays lossless."""
    launch = hub.pull(CONVERSION)
    assert launch.drafter == "mtp" and launch.mtp == heads.head_dir(ORIGINAL)
    index = json.loads((server.repos[ORIGINAL] / "model.safetensors.index.json").read_text())
    shard_of_head = index["weight_map"]["mtp.fc.weight"]
    for shard_name in set(index["weight_map"].values()):
        size = (server.repos[ORIGINAL] / shard_name).stat().st_size
        assert server.bytes_served[(ORIGINAL, shard_name)] < size  # never a whole shard
    head_bytes = sum(mx.load(str(launch.mtp / "model.safetensors"))[k].nbytes
                     for k in index["weight_map"] if k.startswith("mtp."))
    # the head's own bytes, the witness conv, and one header probe per shard it touched
    assert served(server, ORIGINAL) < head_bytes + 3 * fetch_mod_probe() + 64 * 1024
    source = json.loads((launch.mtp / heads.SOURCE).read_text())
    assert source["bytes_read"] == served(server, ORIGINAL) - served_small(server)
    spec = open_chat(model=launch.target, drafter="mtp", mtp=launch.mtp, draft_length=4)
    plain = open_chat(model=launch.target, drafter="none")
    end, events = run(spec)
    assert end.stats.acceptance_rate > 0.9  # loaded right: norms shifted, halves in order
    assert [e.token for e in events] == [e.token for e in run(plain)[1]]
    assert shard_of_head.startswith("model-00002")
    assert hub.pull("tiny-extract").mtp == launch.mtp  # the preset reuses the extracted head


def fetch_mod_probe() -> int:
    from mlx_spec.hub.remote import HEAD_PROBE

    return HEAD_PROBE


def served_small(srv: HubServer) -> int:
    """Bytes of the original's small files fetched whole (config, index)."""
    return sum(n for (r, p), n in srv.bytes_served.items()
               if r == ORIGINAL and not p.endswith(".safetensors"))


def test_sidecar_preset_and_a_drafter_kind_not_loadable_yet(server):
    launch = hub.pull("tiny-mtp")
    assert launch.drafter == "mtp" and launch.mtp is not None
    engine = open_chat(model=launch.target, drafter=launch.drafter, mtp=launch.mtp, draft_length=4)
    assert run(engine)[0].stats.acceptance_rate > 0.9
    other = hub.pull("tiny-eagle")  # a kind the engine has no loader for
    assert other.drafter == "none" and "cannot be loaded yet" in other.warnings[0]


def test_rm_frees_what_a_preset_downloaded(server, capsys):
    hub.pull("tiny-extract")
    assert hub.missing("tiny-extract") is None
    assert main(["rm", "tiny-extract"]) == 0
    out = capsys.readouterr().out
    assert CONVERSION in out and "MTP head" in out
    assert hub.missing("tiny-extract") is not None
    assert not heads.head_dir(ORIGINAL).exists()


async def test_chat_preset_downloads_in_the_app_then_answers(server, tmp_path, monkeypatch):
    """`mlx-spec chat tiny-pair` with nothing downloaded: the app's download screen (a child
    `mlx-spec pull` process against the local hub), then the engine loads and answers."""
    from mlx_spec_app.app import SpecChatApp
    from mlx_spec_app.history import History
    from mlx_spec_app.models import DownloadScreen
    from mlx_spec_app.widgets import Answer, PromptInput

    monkeypatch.setenv("MLX_SPEC_ENGINE", "thread")
    app = SpecChatApp(LoadSpec(draft_length=3), pull="tiny-pair",
                      history=History(tmp_path / "h.sqlite3"))
    async with app.run_test(size=(80, 24)) as pilot:
        saw_screen = False
        for _ in range(1200):
            saw_screen |= isinstance(app.screen, DownloadScreen)
            if app.engine is not None and not app.busy:
                break
            await pilot.pause(0.05)
        assert saw_screen and app.engine is not None, app.busy
        assert app.engine.info.drafter == "draft" and app.sub_title == TARGET
        app.query_one(PromptInput).text = "def f("
        await pilot.press("enter")
        for _ in range(600):
            if not app.busy:
                break
            await pilot.pause(0.05)
        answer = app.query(Answer).last()
        assert answer.text and answer.stats is not None
    assert hub.missing("tiny-pair") is None  # downloaded into the test's cache


def test_chat_opens_a_cached_preset_on_local_paths_and_pulls_a_missing_one(server, monkeypatch):
    import mlx_spec_app.app as app_module

    calls = []
    monkeypatch.setattr(app_module, "run_app",
                        lambda spec, **kw: calls.append((spec, kw)) or 0)
    assert main(["chat", "tiny-pair", "-k", "3"]) == 0
    # nothing cached: the app's download screen, the user's options kept for after it
    assert calls[-1] == (LoadSpec(draft_length=3, lookup=True), dict(pull="tiny-pair"))
    launch = hub.pull("tiny-pair")
    before = len(server.requests)
    assert main(["chat", "tiny-pair"]) == 0
    assert calls[-1] == (LoadSpec(model=str(launch.target), drafter="draft",
                                  draft_model=str(launch.draft_model), lookup=True), {})
    assert main(["chat", "tiny-pair", "--drafter", "ngram"]) == 0  # the user's choice stands
    assert calls[-1][0] == LoadSpec(model=str(launch.target), drafter="ngram", lookup=True)
    assert len(server.requests) == before  # opened from the cache, no request
    assert main(["chat", "nope"]) == 2


def test_a_head_read_out_of_the_original_is_quantized_when_asked(server, capsys):
    """`pull --quantize-mtp 4`: the head read out of the checkpoint becomes a 4-bit sidecar
    beside it (the published tensors kept), still a known answer, still lossless."""
    assert main(["pull", CONVERSION, "--quantize-mtp", "4"]) == 0
    launch = hub.launch_for(CONVERSION)
    assert launch.mtp.name.endswith(".q4") and launch.mtp.parent == heads.heads_root()
    config = json.loads((launch.mtp / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_mtp" and config["quantization"]["bits"] == 4
    assert any(k.endswith(".scales") for k in mx.load(str(launch.mtp / "model.safetensors")))
    assert (heads.head_dir(ORIGINAL) / "model.safetensors").exists()  # as published, kept
    spec = open_chat(model=launch.target, drafter="mtp", mtp=launch.mtp, draft_length=4)
    plain = open_chat(model=launch.target, drafter="none")
    end, events = run(spec)
    assert end.stats.acceptance_rate > 0.9
    assert [e.token for e in events] == [e.token for e in run(plain)[1]]
    with pytest.raises(MlxSpecError, match="not quantized, so there is nothing to match"):
        hub.pull(CONVERSION, quantize_mtp=quantize_mtp_head)
    capsys.readouterr()
    assert main(["rm", CONVERSION]) == 0
    out = capsys.readouterr().out
    assert "MTP head, q4" in out and not heads.all_copies(ORIGINAL)
