"""Published MTP heads, read from the files their makers ship.

DeepSeek-V3's multi-token-prediction module, which Qwen3.5 / 3.6 / 3.8, Qwen3-Next, GLM-4.5 and
MiMo ship too, predicts token t+2 from the target's final hidden state h_t and token x_{t+1}:

    h'_t = norm( Block( proj( concat( enorm(Emb(x_{t+1})), hnorm(h_t) ) ) ) )     (MiMo: h first)

on the target's own embeddings and LM head. Block is one decoder layer of the target's family, so
it is built from mlx-lm's own class for that family (gated attention, MLA, partial RoPE and MoE
come with it). Its KV entry i pairs x_{i+1} with h_i at position i. For a deeper draft, h' is fed
back as the next h.

Where the weights are found:

* in the checkpoint, where mlx-lm's `sanitize` drops them: `mtp.*` (Qwen), `model.layers.{N}.*`
  (DeepSeek-V3, GLM-4.5: the layer after the last), `model.mtp_layers.0.*` (MiMo);
* in a sidecar directory, as mlx-vlm splits them off MLX conversions (which drop `mtp.*`), e.g.
  `mlx-community/Qwen3.6-27B-MTP-4bit`: config.json with model_type `<family>_mtp`, the target's
  `text_config` and any `quantization`; model.safetensors with the names without `mtp.`.

Qwen's RMSNorm computes x·(1 + w), so its checkpoints store zero-centred norm weights; mlx-lm's
RMSNorm computes x·w. An HF-layout checkpoint's head gets +1 on every norm (as mlx-lm does for the
trunk); MLX files (sidecars, or a converted checkpoint that kept `mtp.*`) are already shifted.
A missing, misnamed or misshapen tensor is refused by name: a head that loaded wrong would be
rejected every round and look like a merely bad drafter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import ModelLoadError
from ..layouts import LAYOUTS, Layout, tensor_names
from ..model import TargetModel

HEAD_NAMES = ("enorm", "hnorm", "eh_proj", "norm")  # NextNHead's own tensors (and `block.*`)
SUFFIXES = (".weight", ".scales", ".biases", ".bias")


class NextNHead(nn.Module):
    """h' = norm(block(eh_proj(concat(enorm(emb), hnorm(h))))) — the block brings its own cache."""

    def __init__(self, dim: int, eps: float, block: nn.Module, *, hidden_first: bool = False):
        super().__init__()
        self.enorm = nn.RMSNorm(dim, eps=eps)
        self.hnorm = nn.RMSNorm(dim, eps=eps)
        self.eh_proj = nn.Linear(2 * dim, dim, bias=False)
        self.block = block
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.hidden_first = hidden_first

    def __call__(self, emb, h, cache=None, mask=None):
        e, g = self.enorm(emb), self.hnorm(h)
        x = self.eh_proj(mx.concatenate([g, e] if self.hidden_first else [e, g], axis=-1))
        return self.norm(self.block(x, mask, cache))


def family(target: TargetModel) -> str:
    return str(getattr(target.model, "model_type", None) or target.args.model_type)


def layout_for(target: TargetModel) -> Layout | None:
    return next((lay for lay in LAYOUTS if family(target) in lay.families), None)


def _read(files: dict[str, Path], keys: list[str]) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for f in sorted({files[k] for k in keys}):
        loaded = mx.load(str(f))  # lazy: only the arrays kept here are ever read
        out.update({k: loaded[k] for k in keys if files[k] == f})
    return out


def has_checkpoint_head(target: TargetModel, model_dir: Path | None) -> bool:
    """True if the target's own checkpoint kept its MTP module (cheap: headers only)."""
    lay = layout_for(target)
    if lay is None or model_dir is None or not Path(model_dir).is_dir():
        return False
    prefix = lay.prefix(target.args)
    return any(k.startswith(prefix) for k in tensor_names(Path(model_dir)))


def declared_layers(target: TargetModel, config: dict[str, Any]) -> int:
    """How many MTP layers the model's config says it has (0 when it does not say)."""
    lay = layout_for(target)
    text = config.get("text_config", config)
    keys = lay.config_keys if lay else ()
    return max((int(text.get(k) or config.get(k) or 0) for k in keys), default=0)


def is_sidecar(path: Path) -> bool:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return str(config.get("model_type", "")).endswith("_mtp")


def load_checkpoint_head(target: TargetModel, model_dir: Path):
    """The MTP head inside the target's own checkpoint: (head, layout)."""
    lay = _layout_or_raise(target)
    prefix = lay.prefix(target.args)
    files = tensor_names(model_dir)
    keys = [k for k in files if k.startswith(prefix)]
    if not keys:
        raise ModelLoadError(f"{model_dir} has no MTP tensors ({prefix}*)")
    weights = {k[len(prefix) :]: v for k, v in _read(files, keys).items()}
    conv = next((k for k in files if k.endswith("conv1d.weight")), None)
    hf = conv is not None and _read(files, [conv])[conv].shape[-1] != 1  # mlx-lm's own test
    config = json.loads((model_dir / "config.json").read_text())
    head = build_head(target, lay, weights, source=prefix, shift_norms=lay.zero_centred and hf,
                      quantization=config.get("quantization"))
    return head, lay


def load_sidecar_head(target: TargetModel, path: Path):
    """A sidecar MTP directory (mlx-vlm's layout): (head, layout)."""
    lay = _layout_or_raise(target)
    config = json.loads((path / "config.json").read_text())
    kind = str(config.get("model_type", ""))[: -len("_mtp")]
    if kind not in lay.families:
        raise ModelLoadError(f"{path} is an MTP head for {kind}, the target is {family(target)}")
    text = config.get("text_config", config)
    if text.get("hidden_size") not in (None, target.hidden_size):
        raise ModelLoadError(
            f"{path}: the MTP head's hidden size is {text['hidden_size']}, the target's "
            f"{target.hidden_size}; it was made for another model"
        )
    files = tensor_names(path)
    if not files:
        raise ModelLoadError(f"no weights (*.safetensors) in {path}")
    weights = _read(files, list(files))
    weights = {k.removeprefix("mtp."): v for k, v in weights.items()}
    head = build_head(target, lay, weights, source=f"{path.name}: ", shift_norms=False,
                      quantization=config.get("quantization"))
    return head, lay


def quantize_head(head: NextNHead, *, bits: int, group_size: int) -> NextNHead:
    """Quantize the head's linear layers (those whose input width the group size divides)."""
    nn.quantize(head, group_size=group_size, bits=bits,
                class_predicate=lambda p, m: hasattr(m, "to_quantized")
                and getattr(m, "weight", None) is not None
                and m.weight.shape[-1] % group_size == 0)
    return head


def save_sidecar(out: Path, head: NextNHead, target: TargetModel, *,
                 quantization: dict | None = None) -> Path:
    """`head` as a sidecar directory in mlx-vlm's layout (what load_sidecar_head reads): MLX
    tensors under the published names without `mtp.`, config.json with model_type
    `<family>_mtp`, the target's text config and the quantization, if any."""
    lay = _layout_or_raise(target)
    text = target.config.get("text_config", target.config)
    config = {"model_type": f"{lay.families[0]}_mtp", "text_config": text,
              "tie_word_embeddings": False}
    if quantization:
        config["quantization"] = quantization
    weights = {_published_name(lay, "", k): v for k, v in tree_flatten(head.parameters())}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _layout_or_raise(target: TargetModel) -> Layout:
    lay = layout_for(target)
    if lay is None:
        raise ModelLoadError(f"no published MTP layout is known for {family(target)} models")
    return lay


# -- building the head -------------------------------------------------------------------------


def build_head(target: TargetModel, lay: Layout, weights: dict[str, mx.array], *, source: str,
               shift_norms: bool, quantization: dict | None) -> NextNHead:
    """NextNHead for `target` from published tensors (names relative to the module's prefix)."""
    args = target.args
    head = NextNHead(target.hidden_size, args.rms_norm_eps, lay.block(args),
                     hidden_first=lay.hidden_first)
    mapped, published = _map_names(lay, weights, source)
    mapped = _sanitize_block(target, lay, mapped, shift_norms)
    if shift_norms:
        for name in ("enorm.weight", "hnorm.weight", "norm.weight"):
            if name in mapped:
                mapped[name] = mapped[name] + 1.0
    if any(k.endswith(".scales") for k in mapped):
        q = quantization or {}
        nn.quantize(head, group_size=q.get("group_size", 64), bits=q.get("bits", 4),
                    class_predicate=lambda p, m: f"{p}.scales" in mapped)
    _check(head, mapped, published, lambda ours: _published_name(lay, source, ours))
    head.load_weights(list(mapped.items()), strict=True)
    mx.eval(head.parameters())
    return head


def _map_names(lay: Layout, weights: dict[str, mx.array], source: str):
    """Published names -> NextNHead names; and back, for error messages."""
    by_published = {v: k for k, v in lay.names.items()}
    mapped, published = {}, {}
    for name, value in weights.items():
        stem, suffix = _split_suffix(name)
        if stem in lay.shared:
            continue
        if stem in by_published:
            ours = by_published[stem] + suffix
        elif name.startswith(lay.block_prefix):
            ours = "block." + name[len(lay.block_prefix) :]
        else:
            raise ModelLoadError(f"unexpected MTP tensor {source}{name}: not part of the "
                                 f"{lay.families[0]} MTP layout")
        mapped[ours], published[ours] = value, source + name
    return mapped, published


def _split_suffix(name: str) -> tuple[str, str]:
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)], s
    return name, ""


def _sanitize_block(target: TargetModel, lay: Layout, mapped: dict, shift_norms: bool) -> dict:
    """Run the block's tensors through the family's own sanitize, as if they were trunk layer L
    (a layer of the same kind), so expert stacking, MLA splitting or conv layouts match what
    mlx-lm does for the trunk. Zero-centred norms it left alone are shifted here."""
    L = lay.trunk_layer(target.args)
    inner = f"model.layers.{L}."
    block = {inner + k[len("block.") :]: v for k, v in mapped.items() if k.startswith("block.")}
    out = target.model.sanitize(dict(block)) if hasattr(target.model, "sanitize") else block
    marker = f"layers.{L}."
    result = {k: v for k, v in mapped.items() if not k.startswith("block.")}
    for k, v in out.items():
        if marker not in k:
            continue
        rest = k.split(marker, 1)[1]
        before = block.get(inner + rest)
        if shift_norms and v.ndim == 1 and "norm" in rest.split(".")[-2] and v is before:
            v = v + 1.0
        result["block." + rest] = v
    return result


def _published_name(lay: Layout, source: str, ours: str) -> str:
    if ours.startswith("block."):
        return source + lay.block_prefix + ours[len("block.") :]
    stem, suffix = _split_suffix(ours)
    return source + lay.names.get(stem, stem) + suffix


def _check(head: nn.Module, mapped: dict[str, mx.array], published: dict[str, str],
           name_of: Callable[[str], str]) -> None:
    want = dict(tree_flatten(head.parameters()))
    for name, value in want.items():
        if name not in mapped:
            raise ModelLoadError(f"MTP tensor missing: {name_of(name)}")
        if tuple(mapped[name].shape) != tuple(value.shape):
            raise ModelLoadError(
                f"MTP tensor {published.get(name, name)} has shape {tuple(mapped[name].shape)}; "
                f"this target needs {tuple(value.shape)} (a head made for another model?)"
            )
    for name in mapped:
        if name not in want:
            raise ModelLoadError(f"unexpected MTP tensor {published.get(name, name)}")
