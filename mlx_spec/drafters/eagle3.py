"""EAGLE-3 heads in the speculators format (RedHatAI/*-speculator.eagle3, what speculators 0.9
writes), SpecForge's (`eagle_config`) and the original one (yuhuili/EAGLE3-*): decoder layers
over fused target features, their own KV cache.

Per committed position t the head reads the token x_{t+1} and the target's *taps* at t, the
inputs of three target layers (low, mid, high; see `Eagle3Config.taps`), and predicts x_{t+2}:

    a    = concat(a_low, a_mid, a_high)           input_norm(a) if norm_before_fc,
                                                  concat(fc_norm_i(a_i)) if fc_norm
    g    = fc(a)                                  3·d_target → d
    x    = concat(input_layernorm(Emb(x_{t+1})), hidden_norm(g))   embeddings first
    r    = hidden_norm(g) if norm_before_residual else g          the residual is the hidden half
    h    = r + o_proj(attention(q, k, v of x))                RoPE at the head's own positions
    h'   = h + mlp(post_attention_layernorm(h))   then layers 1.. (plain decoder layers over d)
    s    = norm(h') if norm_output else h'        the state fed back as the next step's g
    logits over the draft vocabulary = lm_head(s if norm_output else norm(h'));
    draft id i is target id i + d2t[i]

Later draft steps feed s back in place of g (it skips fc). The cache pairs entry i with
(x_{i+1}, taps at i), the layout the MTP drafter's own-cache path already keeps (first = 1), so
commit and catch-up are that drafter's: entries a draft step built from s are dropped even
when accepted, and rebuilt next round from the target's true taps, as vLLM does.

A `sliding_attention` layer sees the last W entries as training saw them (speculators' TTT
mask): a committed entry e sees (e − W, e]; a draft step sees the window of the last committed
entry (the first draft's) plus the chain's own entries, however deep.

The draft vocabulary's logits are laid out at the target's width (-inf off the draft
vocabulary), so q is exactly what the sampler draws from and p is left as the target has it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import initialize_rope

from ..errors import ModelLoadError, TokenizerMismatchError
from ..model import TargetModel
from .weights import load_exactly, one_line_errors, read_safetensors

FULL, SLIDING = "full_attention", "sliding_attention"
OWN_TRAINING = "training.json"  # what `train-drafter` writes beside a head it trained
# speculators 0.9's Eagle3SpeculatorConfig: the top-level fields (the flags among them that
# change the forward are all honoured); an unknown flag that is on is refused by name
KNOWN_FIELDS = {"speculators_model_type", "architectures", "transformer_layer_config",
                "draft_vocab_size", "norm_before_residual", "target_hidden_size",
                "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "fc_norm", "norm_output",
                "embed_requires_grad", "speculators_config", "speculators_version",
                "torch_dtype", "dtype", "transformers_version", "has_no_defaults_at_init"}


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    qk_norm: bool = False  # a qwen3-type layer
    norm_before_residual: bool = False
    norm_before_fc: bool = False  # one RMSNorm over the concatenated taps
    fc_norm: bool = False  # one RMSNorm per tap (Eagle 3.1)
    norm_output: bool = False  # the normed output is fed back across draft steps
    num_layers: int = 1
    layer_types: tuple[str, ...] = ()  # per layer, FULL or SLIDING (empty: all FULL)
    sliding_window: int | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    layer_ids: tuple[int, ...] | None = None  # target taps, as layer inputs; None: default
    speculative_tokens: int | None = None

    @classmethod
    def from_dict(cls, raw: dict) -> Eagle3Config:
        layer = raw.get("transformer_layer_config") or raw  # speculators nests it; others not
        refuse_unknown(raw, layer)
        hidden = int(layer["hidden_size"])
        heads = int(layer["num_attention_heads"])
        spec = (raw.get("speculators_config") or {}).get("proposal_methods") or [{}]
        rope = layer.get("rope_parameters") or {}
        qwen3 = layer.get("model_type") == "qwen3"
        # qwen3 configs switch their window off unless use_sliding_window (transformers' rule)
        window = layer.get("sliding_window") if not qwen3 or layer.get(
            "use_sliding_window") else None
        n = int(layer.get("num_hidden_layers") or 1)
        types = layer.get("layer_types") or (
            [SLIDING if window is not None and i >= int(layer.get("max_window_layers", 28))
             else FULL for i in range(n)] if qwen3 else [FULL] * n)
        return cls(
            hidden_size=hidden,
            target_hidden_size=int(raw.get("target_hidden_size") or hidden),
            num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            intermediate_size=int(layer["intermediate_size"]),
            vocab_size=int(layer["vocab_size"]),
            draft_vocab_size=int(raw.get("draft_vocab_size") or layer["vocab_size"]),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float(layer.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            rope_scaling=layer.get("rope_scaling") or (rope if rope.get("rope_type") not in
                                                       (None, "default") else None),
            qk_norm=qwen3,
            norm_before_residual=bool(raw.get("norm_before_residual", False)),
            norm_before_fc=bool(raw.get("norm_before_fc", False)),
            fc_norm=bool(raw.get("fc_norm", False)),
            norm_output=bool(raw.get("norm_output", False)),
            num_layers=n,
            layer_types=tuple(types),
            sliding_window=int(window) if window is not None else None,
            attention_bias=bool(layer.get("attention_bias", False)),
            mlp_bias=bool(layer.get("mlp_bias", False)),
            layer_ids=layer_inputs(raw),
            speculative_tokens=spec[0].get("speculative_tokens"),
        )

    def taps(self, target_layers: int) -> tuple[int, ...]:
        """The target layers whose inputs are read; by default [2, L/2, L-3] (vLLM's and
        speculators' default; SpecForge's [1, L/2-1, L-4] layer outputs are the same)."""
        return self.layer_ids or (2, target_layers // 2, target_layers - 3)

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window (None: full attention)."""
        sliding = layer < len(self.layer_types) and self.layer_types[layer] == SLIDING
        return self.sliding_window if sliding else None


def layer_inputs(raw: dict) -> tuple[int, ...] | None:
    """The configured taps as target layer *inputs*. speculators' top-level ids (what vLLM
    reads, `get_eagle3_aux_layers_from_config`) index layer inputs, HF's hidden_states[i].
    SpecForge's `eagle_config` ids index layer *outputs*: its trainer reads hidden_states[id
    + 1] (specforge/modeling/target/eagle3_target_model.py) and SGLang captures the input of
    layer id + 1 (LlamaForCausalLM.set_eagle3_layers_to_capture), so they are read one on."""
    if ids := raw.get("eagle_aux_hidden_state_layer_ids"):
        return tuple(int(i) for i in ids)
    if ids := (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"):
        return tuple(int(i) + 1 for i in ids)
    return None


def refuse_unknown(raw: dict, layer: dict) -> None:
    """A config asking for a forward this head does not run is refused, by name."""
    if "transformer_layer_config" in raw:
        if flags := sorted(k for k, v in raw.items() if k not in KNOWN_FIELDS and v is True):
            raise ModelLoadError(f"EAGLE-3 config flag(s) not supported: {', '.join(flags)}")
    if raw.get("norm_before_fc") and raw.get("fc_norm"):
        raise ModelLoadError("EAGLE-3 config sets both norm_before_fc and fc_norm (speculators "
                             "allows one or the other)")
    kind = layer.get("model_type", "llama")
    if kind not in ("llama", "qwen3"):
        raise ModelLoadError(f"EAGLE-3 draft layers of type {kind!r} are not supported "
                             "(llama or qwen3)")
    if (act := layer.get("hidden_act", "silu")) != "silu":
        raise ModelLoadError(f"EAGLE-3 draft layers with hidden_act {act!r} are not supported")
    rope = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0 or "mrope_section" in rope:
        raise ModelLoadError("EAGLE-3 draft layers with partial or multimodal RoPE "
                             "(partial_rotary_factor / mrope_section) are not supported")
    types = layer.get("layer_types")
    if types and (len(types) != int(layer.get("num_hidden_layers") or 1)
                  or set(types) - {FULL, SLIDING}):
        raise ModelLoadError(f"EAGLE-3 layer_types {types} do not fit this head "
                             f"({FULL!r} / {SLIDING!r}, one per layer)")


def is_eagle3(path: str | Path) -> bool:
    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    arch = " ".join(raw.get("architectures") or [])
    return raw.get("speculators_model_type") == "eagle3" or "Eagle3" in arch


class Attention(nn.Module):
    """Queries, keys and values from the input (2d-wide in the first layer); output to d."""

    def __init__(self, cfg: Eagle3Config, width: int):
        super().__init__()
        d, h, kvh, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.h, self.kvh, self.hd = h, kvh, hd
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(width, h * hd, bias=bias)
        self.k_proj = nn.Linear(width, kvh * hd, bias=bias)
        self.v_proj = nn.Linear(width, kvh * hd, bias=bias)
        self.o_proj = nn.Linear(h * hd, d, bias=bias)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
            self.k_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.rope = initialize_rope(hd, cfg.rope_theta, False, cfg.rope_scaling)

    def __call__(self, x, cache, mask):
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.h, self.hd)
        k = self.k_proj(x).reshape(B, L, self.kvh, self.hd)
        v = self.v_proj(x).reshape(B, L, self.kvh, self.hd).transpose(0, 2, 1, 3)
        if "q_norm" in self:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        q, k = self.rope(q, offset=cache.offset), self.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.hd**-0.5, mask=mask)
        return self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=bias)
        self.up_proj = nn.Linear(d, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d, bias=bias)

    def __call__(self, x):
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """A plain decoder layer over d (the head's layers after the first)."""

    def __init__(self, cfg: Eagle3Config, width: int | None = None):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.self_attn = Attention(cfg, width or d)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)
        self.mlp = MLP(d, cfg.intermediate_size, cfg.mlp_bias)

    def __call__(self, h, cache, mask):
        h = h + self.self_attn(self.input_layernorm(h), cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class FirstLayer(Layer):
    """The first layer reads concat(embeddings, hidden): q, k, v are 2d wide."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__(cfg, 2 * cfg.hidden_size)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.norm_before_residual = cfg.norm_before_residual

    def __call__(self, emb, g, cache, mask):
        e, gn = self.input_layernorm(emb), self.hidden_norm(g)
        h = (gn if self.norm_before_residual else g) + self.self_attn(
            mx.concatenate([e, gn], axis=-1), cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """The speculators module tree; `embed_tokens` only when the checkpoint carries its own."""

    def __init__(self, cfg: Eagle3Config, *, own_embedding: bool = False):
        super().__init__()
        d, n_taps = cfg.hidden_size, len(cfg.layer_ids or (0, 0, 0))
        self.cfg = cfg
        self.input_dim = n_taps * cfg.target_hidden_size
        if cfg.norm_before_fc:
            self.input_norm = nn.RMSNorm(self.input_dim, eps=cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = [nn.RMSNorm(cfg.target_hidden_size, eps=cfg.rms_norm_eps)
                            for _ in range(n_taps)]
        self.fc = nn.Linear(self.input_dim, d, bias=False)
        self.layers = [FirstLayer(cfg)] + [Layer(cfg) for _ in range(cfg.num_layers - 1)]
        self.norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(d, cfg.draft_vocab_size, bias=False)
        self.d2t = mx.zeros((cfg.draft_vocab_size,), mx.int32)
        if own_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, d)

    def fuse(self, taps: mx.array) -> mx.array:
        """g = fc(the taps, normed as the config says)."""
        if "input_norm" in self:
            taps = self.input_norm(taps)
        if "fc_norm" in self:
            parts = mx.split(taps, len(self.fc_norm), axis=-1)
            taps = mx.concatenate([norm(p) for norm, p in zip(self.fc_norm, parts,
                                                               strict=True)], axis=-1)
        return self.fc(taps)

    def __call__(self, emb, h, caches, *, true_entries: int | None = None, mask=None):
        """emb [1, L, d]; h: the target's taps [1, L, 3·d_target] (through fc) or the state
        fed back from the previous step [1, L, d]; caches: one per layer, holding
        `true_entries` entries built from true taps (None: all of them). Returns the state
        to feed back (normed if norm_output). `mask`: one mask for every layer instead of
        those built from the caches (training's chained steps, train/chain.py)."""
        if h.shape[-1] == self.input_dim:
            h = self.fuse(h)
        n, offset = emb.shape[1], caches[0].offset

        def mask_of(i: int):
            return self.mask(i, offset, n, true_entries) if mask is None else mask

        h = self.layers[0](emb, h, caches[0], mask_of(0))
        for i, layer in enumerate(self.layers[1:], 1):
            h = layer(h, caches[i], mask_of(i))
        return self.norm(h) if self.cfg.norm_output else h

    def mask(self, layer: int, offset: int, n: int, true_entries: int | None):
        """Entries offset..offset+n-1 attend causally; in a sliding layer, query e sees keys
        j > min(e, true_entries - 1) − W (the TTT mask: a draft keeps its first step's
        window of committed entries, and its own chain)."""
        window = self.cfg.window(layer)
        if window is None and n == 1:
            return None
        q = mx.arange(offset, offset + n)[:, None]
        k = mx.arange(offset + n)[None]
        visible = k <= q
        if window is not None:
            anchor = q if true_entries is None else mx.minimum(q, true_entries - 1)
            visible = visible & (k > anchor - window)
        return visible

    def logits(self, s: mx.array, width: int, fill: float = -mx.inf) -> mx.array:
        """Draft-vocabulary logits at the target's width: `fill` off the draft vocabulary
        (-inf: q is zero there; training passes a finite one, so that 0 · log q stays 0)."""
        small = self.lm_head(s if self.cfg.norm_output else self.norm(s))
        ids = self.target_ids()
        out = mx.full((*small.shape[:-1], width), fill, small.dtype)
        return mx.put_along_axis(out, mx.broadcast_to(ids, small.shape), small, axis=-1)

    def target_ids(self) -> mx.array:
        """The target id of each draft id (draft id i is target id i + d2t[i])."""
        return mx.arange(self.d2t.shape[0]) + self.d2t

    def drafted(self) -> mx.array:
        """[target vocabulary] True where a target id is in the draft vocabulary (t2d)."""
        return mx.zeros((self.cfg.vocab_size,), mx.int32).at[self.target_ids()].add(1) > 0
def load_eagle3(path: str | Path, target: TargetModel):
    """An MTP-style drafter around an EAGLE-3 head directory, fitted to `target`."""
    from .mtp import eagle3_drafter

    path = Path(path).expanduser()
    with one_line_errors("EAGLE-3 head", path):
        raw = json.loads((path / "config.json").read_text())
        cfg = Eagle3Config.from_dict(raw)
        weights = _in_dtype(_sanitize(read_safetensors(path)), target)
        layers = len(target.backbone.layers)
        cfg = Eagle3Config(**{**cfg.__dict__, "layer_ids": cfg.taps(layers)})
        check_fits(cfg, target)
        if "d2t" not in weights and cfg.draft_vocab_size == cfg.vocab_size:
            weights["d2t"] = mx.zeros((cfg.draft_vocab_size,), mx.int32)  # speculators writes
            # no vocabulary map when the draft vocabulary is the target's whole one
        head = Eagle3Head(cfg, own_embedding="embed_tokens.weight" in weights)
        load_exactly(head, weights, f"EAGLE-3 head {path}")
    drafter = eagle3_drafter(head, target)
    if (path / OWN_TRAINING).exists():
        # our own head: its speculative_tokens is the depth it was trained to (what vLLM would
        # draft), not a length chosen for any machine; here `auto` chooses it from measured
        # acceptance and costs (a 3-minute head: auto 2-3x the tok/s of a fixed k = 8)
        drafter.draft_length = None
    return drafter


def _sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    out = {}
    for k, v in weights.items():
        if k == "t2d" or k.startswith(("verifier_", "rotary_emb")) or "rotary_emb" in k:
            continue  # t2d is the inverse map (training only); verifier copies are not saved
        k = k.removeprefix("model.").replace("midlayer.", "layers.0.")  # the original naming
        out[k] = v.astype(mx.int32) if k == "d2t" else v
    return out


def _in_dtype(weights: dict[str, mx.array], target: TargetModel) -> dict[str, mx.array]:
    """A head's floating-point weights in the dtype the target computes in (a head shipped in
    f16 for size drafts for an f32 target in f32: MLX-CPU's half-precision matmul is slower,
    and a mixed product would be promoted on every step anyway)."""
    dtype = target.embed(mx.array([[0]])).dtype
    return {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in weights.items()}


def check_fits(cfg: Eagle3Config, target: TargetModel) -> None:
    layers = len(target.backbone.layers)
    if cfg.target_hidden_size != target.hidden_size:
        raise ModelLoadError(
            f"this EAGLE-3 head reads a {cfg.target_hidden_size}-wide target; {target.name} is "
            f"{target.hidden_size} wide (pick the head trained for this model)")
    if cfg.vocab_size != target.vocab_size:
        raise TokenizerMismatchError(f"EAGLE-3 head vocabulary ({cfg.vocab_size}) differs from "
                                     f"the target's ({target.vocab_size})")
    if any(not 0 <= i <= layers for i in cfg.layer_ids or ()):
        raise ModelLoadError(f"EAGLE-3 head taps layers {list(cfg.layer_ids)}; {target.name} "
                             f"has {layers}")
    if not target.exposes_taps(tuple(cfg.layer_ids)):
        raise ModelLoadError(f"{target.args.model_type}: the layer inputs EAGLE-3 reads are not "
                             "reachable (a llama-style trunk is needed)")
