"""GGUF files in: a tiny model written as llama.cpp lays it out comes back as the same model
(logits, tokenizer, stop tokens), Q4_0 / Q4_1 / Q8_0 blocks repack without loss, the cache
converts once, and bad files are one line with nothing half-written left behind."""

from __future__ import annotations

import json
import os
import shutil

import mlx.core as mx
import numpy as np
import pytest
from gguf_files import write_gguf
from test_cli import bad_dirs  # noqa: F401, F811  (a fixture: a model with another vocabulary)

from mlx_spec import gguf
from mlx_spec.cli import main
from mlx_spec.gguf.weights import decode
from mlx_spec.loading import load_target
from mlx_spec.paths import data_dir

TEXTS = ["def f(x):\n    return x", "héllo wörld 日本語 naïve", "  spaces\tand\nlines 12345",
         "<|im_start|>user\nhi<|im_end|>\n"]


def logits(target, ids):
    return np.array(target.model(mx.array([ids]))[0].astype(mx.float32))


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3_text"])
def test_a_converted_file_is_the_model_it_was_written_from(model_dirs, tmp_path, arch):
    """Names, llama's rotary row order and Gemma's 1 + w norms undone: the same logits."""
    source = model_dirs(arch)
    file = write_gguf(source, tmp_path / f"{arch}.gguf")
    out = gguf.convert(file, tmp_path / "out", weights="f32")
    want, want_tok = load_target(source)
    got, got_tok = load_target(out)
    ids = want_tok.encode(TEXTS[0])
    np.testing.assert_allclose(logits(got, ids), logits(want, ids), atol=1e-4)
    for text in TEXTS:
        assert got_tok.encode(text) == want_tok.encode(text)
    config = json.loads((out / "config.json").read_text())
    im_end = want_tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in config["eos_token_id"]  # stops at the end of a turn
    assert got_tok.chat_template == want_tok.chat_template


@pytest.mark.parametrize("qtype,bits", [("Q8_0", 8), ("Q4_0", 4), ("Q4_1", 4)])
def test_legacy_blocks_repack_into_mlx_quantized_without_loss(model_dirs, tmp_path, qtype, bits):
    file = write_gguf(model_dirs("llama"), tmp_path / "q.gguf", qtype=qtype)
    out = gguf.convert(file, tmp_path / "out", weights="quantized")
    config = json.loads((out / "config.json").read_text())
    weights = {}
    for shard in out.glob("*.safetensors"):
        weights.update(mx.load(str(shard)))
    f32 = gguf.convert(file, tmp_path / "f32", weights="f32")
    dense = {}
    for shard in f32.glob("*.safetensors"):
        dense.update(mx.load(str(shard)))
    quantized = [k.removesuffix(".scales") for k in weights if k.endswith(".scales")]
    assert len(quantized) >= 2 * 7 + 1  # every projection of both layers, and the embedding
    for name in quantized:
        assert config["quantization"][name] == {"group_size": 32, "bits": bits}
        # the codes and the f16 block scales are the file's own: computed in f32, exact (at
        # run time MLX computes scale·q + bias in f16, as with any f16-scaled model)
        w = mx.dequantize(weights[f"{name}.weight"],
                          weights[f"{name}.scales"].astype(mx.float32),
                          weights[f"{name}.biases"].astype(mx.float32), group_size=32, bits=bits)
        np.testing.assert_array_equal(np.array(w), np.array(dense[f"{name}.weight"]))
    source = gguf.source_of(out)
    assert source["converted_as"] == {f"exact q{bits}": len(quantized), "f32": 5}
    target, tok = load_target(out)  # mlx-lm reads the per-layer quantization as written
    assert logits(target, tok.encode("def f")).shape[-1] == config["vocab_size"]


def test_decoded_weights_are_the_gguf_packages_own(model_dirs, tmp_path):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    file = write_gguf(model_dirs("qwen3"), tmp_path / "q.gguf", qtype="Q8_0")
    for t in GGUFReader(file).tensors[:4]:
        np.testing.assert_array_equal(decode(t), dequantize(t.data, t.tensor_type))


def test_the_second_start_reads_the_cache_and_a_changed_file_converts_again(
        model_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "home"))
    file = write_gguf(model_dirs("llama"), tmp_path / "m.gguf")
    first = gguf.converted(file, weights="f32")
    assert first.parent == data_dir() / "gguf" and (first / "config.json").exists()

    def no_parsing(*a, **k):
        raise AssertionError("the GGUF was parsed again")

    monkeypatch.setattr("mlx_spec.gguf.directory.open_gguf", no_parsing)
    assert gguf.converted(file, weights="f32") == first
    target, _ = load_target(str(file))  # a .gguf path is a model everywhere a model is named
    assert target.path == first and target.name == "m.gguf → f32"
    monkeypatch.undo()
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "home"))
    os.utime(file, ns=(1, 1))
    assert gguf.converted(file, weights="f32") != first


@pytest.fixture
def bad_files(model_dirs, bad_dirs, tmp_path):  # noqa: F811
    good = write_gguf(model_dirs("llama"), tmp_path / "good.gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3])
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(good.read_bytes()[:40])
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf file at all")
    arch = write_gguf(model_dirs("llama"), tmp_path / "mamba.gguf", arch_name="mamba")
    other = write_gguf(bad_dirs["other-vocab"], tmp_path / "other.gguf")
    return {"good": good, "truncated": truncated, "header": header_only, "not-gguf": not_gguf,
            "arch": arch, "other-vocab": other, "missing": tmp_path / "absent.gguf"}


@pytest.mark.parametrize("case,needle", [
    ("truncated", "truncated"),
    ("header", "truncated or corrupt"),
    ("not-gguf", "not a GGUF file"),
    ("arch", "architecture 'mamba' is not supported (supported: llama, qwen2, qwen3, gemma3)"),
    ("missing", "GGUF file not found"),
    ("other-vocab", "does not share"),
])
def test_a_bad_gguf_is_one_line_exit_2_and_nothing_half_written(bad_files, capsys, tmp_path,
                                                                 monkeypatch, case, needle):
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "home"))
    model, draft = bad_files[case], []
    if case == "other-vocab":
        model, draft = bad_files["good"], ["--draft-model", str(bad_files["other-vocab"])]
    code = main(["generate", "--model", str(model), *draft, "--prompt", "x", "--raw",
                 "--max-tokens", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    left = list((tmp_path / "home" / "gguf").glob("*.partial"))
    assert left == []


def test_import_writes_a_directory_mlx_lm_loads(model_dirs, tmp_path, capsys):
    file = write_gguf(model_dirs("qwen3"), tmp_path / "m.gguf", qtype="Q8_0")
    assert main(["import", str(file), "--out", str(tmp_path / "dir"), "--weights", "f32"]) == 0
    out = capsys.readouterr().out
    assert "qwen3" in out and "Q8_0" in out
    from mlx_lm import load

    model, tok = load(str(tmp_path / "dir"))
    assert model(mx.array([tok.encode("def f")])).shape[-1] == 384
    assert main(["import", str(tmp_path / "dir" / "config.json")]) == 2
    assert "not a .gguf file" in capsys.readouterr().err


def test_an_interrupted_conversion_leaves_nothing(model_dirs, tmp_path, monkeypatch):
    file = write_gguf(model_dirs("llama"), tmp_path / "m.gguf")

    def interrupt(done, total):
        if done > 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gguf.convert(file, tmp_path / "out", progress=interrupt)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


def test_the_header_reader_agrees_with_the_gguf_package(model_dirs, tmp_path):
    from mlx_spec.gguf.header import read_header

    file = write_gguf(model_dirs("qwen3"), tmp_path / "m.gguf", qtype="Q8_0")
    h = read_header(file)
    full = gguf.open_gguf(file)
    for key in ("general.architecture", "qwen3.block_count", "qwen3.embedding_length"):
        assert h[key] == full.meta[key]
    body = sum(int(np.prod(t.shape)) for t in full.tensors
               if not t.name.startswith(("token_embd.", "output.")))
    assert h["parameters"] == body
    other = write_gguf(model_dirs("llama"), tmp_path / "l.gguf")  # the same tokenizer
    assert read_header(other)["vocab_sha256"] == h["vocab_sha256"]


def test_ollama_and_lm_studio_models_are_found_named_and_paired(
        model_dirs, bad_dirs, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A big and a small model with one vocabulary in Ollama's store (manifest → blob), one in
    LM Studio's folder: `models` lists them, `ollama:NAME:TAG` opens one, auto pairs the
    small one with the big one as its draft model."""
    from mlx_spec.gguf.local import find_local, model_file
    from mlx_spec.loading import paired_draft
    from mlx_spec.train.modeldir import build_model, save_model_dir

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("MLX_SPEC_HOME", str(tmp_path / "spec"))
    monkeypatch.setattr("mlx_spec.gguf.local.PACKAGED", {})  # not the chat model uv installed
    small = model_dirs("llama")
    big_dir = tmp_path / "big"
    cfg = json.loads((small / "config.json").read_text())
    cfg.update(num_hidden_layers=8)
    save_model_dir(big_dir, build_model(cfg), cfg, tokenizer_dir=small)
    store = home / ".ollama" / "models"
    (store / "blobs").mkdir(parents=True)
    for tag, source in (("big", big_dir), ("small", small)):
        blob = write_gguf(source, tmp_path / f"{tag}.gguf")
        digest = "sha256:" + tag * 8
        blob.rename(store / "blobs" / digest.replace(":", "-"))
        manifest = store / "manifests" / "registry.ollama.ai" / "library" / "tiny" / tag
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": digest}]}))
    lms = home / ".lmstudio" / "models" / "pub" / "repo"
    lms.mkdir(parents=True)
    write_gguf(bad_dirs["other-vocab"], lms / "other.gguf")  # small, another vocabulary
    names = {m.name: m.source for m in find_local()}
    assert names == {"ollama:tiny:big": "ollama", "ollama:tiny:small": "ollama",
                     str(lms / "other.gguf"): "lm-studio"}
    assert model_file("ollama:tiny:big") == store / "blobs" / ("sha256-" + "big" * 8)
    assert paired_draft("ollama:tiny:big") == "ollama:tiny:small"
    assert paired_draft("ollama:tiny:small") is None  # not 3x smaller than anything
    assert main(["models"]) == 0
    assert "ollama:tiny:big  (draft: ollama:tiny:small)" in capsys.readouterr().out
    assert main(["generate", "--model", "ollama:tiny:big", "--prompt", "def f", "--raw",
                 "--max-tokens", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target"] == "ollama:tiny:big → " + gguf.default_format()
    assert out["stats"]["drafter"].startswith("draft")
    assert main(["generate", "--model", "ollama:nope", "--prompt", "x"]) == 2
    assert "no Ollama model 'nope' here (found: ollama:tiny:big, ollama:tiny:small)" in \
        capsys.readouterr().err
