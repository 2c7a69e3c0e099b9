"""Ship a head train-drafter made: copy it into assets/heads/NAME/ (packed into the wheel as
mlx_spec/_assets/heads/NAME/), its floating-point weights in f16 (half the size; the loader
casts them to the dtype the target computes in), with the `shipped.json` that `--drafter auto`
matches a target by (mlx_spec.assets.shipped_head).

    uv run python -m tools.ship_head HEAD_DIR NAME --match smollm2-135m --target FILE_OR_DIR \
        --verifier HuggingFaceTB/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx

from mlx_spec.assets import heads_dir
from mlx_spec.loading import load_target


def ship(head: Path, name: str, match: str, target: str, verifier: str) -> Path:
    t, _ = load_target(target, lazy=True)
    if match not in t.name.lower():
        raise SystemExit(f"{match!r} is not in the target's name {t.name!r}")
    out = heads_dir() / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    weights = mx.load(str(head / "model.safetensors"))
    half = {k: v.astype(mx.float16) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in weights.items()}
    mx.save_safetensors(str(out / "model.safetensors"), half, metadata={"format": "pt"})
    config = json.loads((head / "config.json").read_text())
    config["dtype"] = "float16"
    # the verifier by its published name, not this machine's converted directory
    config["speculators_config"]["verifier"]["name_or_path"] = verifier
    (out / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(head / "training.json", out / "training.json")
    (out / "shipped.json").write_text(json.dumps({
        "name_contains": match, "hidden_size": t.hidden_size,
        "num_layers": len(t.backbone.layers), "vocab_size": t.vocab_size,
        "trained_on": Path(target).name}, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("head", type=Path)
    p.add_argument("name")
    p.add_argument("--match", required=True, help="a piece of the target's name, lower case")
    p.add_argument("--target", required=True)
    p.add_argument("--verifier", required=True, help="the target's published name (hub id)")
    a = p.parse_args(argv)
    out = ship(a.head, a.name, a.match, a.target, a.verifier)
    size = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    print(f"shipped {a.head} as {out} ({size:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
