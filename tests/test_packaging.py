"""The package as users install it: the wheel carries everything (demo pair, styles, presets),
installs into a fresh environment outside the checkout and runs from there; `--version` and
`doctor` answer; the Homebrew formula is generated from the lock with nothing left to fill in."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from mlx_spec.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(["uv", "build", "--quiet", "--out-dir", str(out)], cwd=ROOT, check=True,
                   timeout=600)
    return out


def test_version_and_doctor(capsys):
    assert main(["--version"]) == 0
    line = capsys.readouterr().out
    assert re.match(r"mlx-spec \d+\.\d+\.\d+ \(mlx \d", line) and "device" in line
    code = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    names = {c["name"] for c in report["checks"]}
    assert {"platform", "python", "mlx", "memory", "disk", "model cache", "openblas",
            "terminal"} <= names
    assert code == (0 if all(c["ok"] for c in report["checks"]) else 1)
    assert all(c["fix"] for c in report["checks"] if not c["ok"])  # each problem has a fix


def test_the_wheel_carries_the_app_and_runs_outside_the_checkout(dist, tmp_path):
    wheel = next(dist.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("mlx_spec/hub/presets.toml", "mlx_spec_app/app.tcss",
                   "mlx_spec/_assets/models/demo-target-q8/config.json",
                   "mlx_spec/_assets/models/demo-target-q8/mtp/mtp_config.json"):
        assert needed in names, needed
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    # the locked versions (so the wheels `uv sync` cached are used), then the wheel itself
    pins = tmp_path / "pins.txt"
    subprocess.run(["uv", "export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes",
                    "--quiet", "-o", str(pins)], cwd=ROOT, check=True)
    subprocess.run(["uv", "pip", "install", "--quiet", "--python", str(python), "-c", str(pins),
                    str(wheel)], check=True, timeout=600)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    exe = venv / "bin" / "mlx-spec"
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("mlx-spec "), version.stderr
    run = subprocess.run([str(exe), "generate", "--prompt", "def add(", "--raw", "--max-tokens",
                          "8", "--json"], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert len(out["tokens"]) == 8 and out["stats"]["drafter"] != "none"  # the bundled pair
    where = subprocess.run([str(python), "-c", "import mlx_spec; print(mlx_spec.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert str(ROOT) not in where.stdout  # the installed copy, not the checkout


def test_the_homebrew_formula_is_generated_from_the_lock(dist, tmp_path):
    sdist = next(dist.glob("*.tar.gz"))
    formula = ROOT / "packaging" / "mlx-spec.rb"
    before = formula.read_text()
    try:
        subprocess.run([sys.executable, str(ROOT / "packaging" / "make_formula.py"), str(sdist)],
                       check=True, capture_output=True)
        text = formula.read_text()
    finally:
        formula.write_text(before)
    assert "REPLACE" not in text and "TODO" not in text
    shas = re.findall(r'sha256 "([0-9a-f]+)"', text)
    assert shas and all(len(s) == 64 for s in shas)
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    runtime = {"mlx", "mlx-lm", "textual", "huggingface-hub", "tokenizers", "numpy"}
    resources = set(re.findall(r'resource "([^"]+)"', text))
    assert runtime <= resources and "pytest" not in resources and "ruff" not in resources
    assert len(resources) == len(shas) - 1  # one sha each, plus the formula's own
    version = next(p["version"] for p in lock["package"] if p["name"] == "mlx-spec")
    assert f"mlx_spec-{version}.tar.gz" in text
    # the committed formula matches the lock (its own sha256 changes with every commit's sdist)
    def own_sha_dropped(t: str) -> str:
        return re.sub(r'sha256 "[0-9a-f]{64}"', "", t, count=1)

    assert own_sha_dropped(text) == own_sha_dropped(before), (
        "packaging/mlx-spec.rb is stale: uv build --sdist, then packaging/make_formula.py")
