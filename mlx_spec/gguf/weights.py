"""A GGUF tensor as MLX weights, in one of two forms:

- "f32": decoded exactly (by the `gguf` package's decoders, llama.cpp's own maths) and kept
  dense. On a CPU with OpenBLAS an f32 matmul is memory-bound, the regime speculation needs.
- "quantized": what Metal runs fast. Q4_0 / Q4_1 / Q8_0 blocks are already MLX's affine
  quantization with group 32, so they are repacked without loss: a block of 32 values
  w = d·(q - 8) (Q4_0), d·q + m (Q4_1) or d·q, q signed (Q8_0) is w = scale·q' + bias with
  q' unsigned. Every other type is decoded and quantized again by MLX (4-bit K-quants to 4
  bits, 5- and 6-bit to 6, group 32: close, not exact; the title says "requantized").
"""

from __future__ import annotations

import numpy as np

# GGUF block type -> (bits, scale, bias) recovering the block's unsigned codes q' exactly:
# w = d·q' + bias, with bias expressed from the block's d (and m for Q4_1)
EXACT = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
REQUANT_BITS = {"Q4_K": 4, "Q5_0": 6, "Q5_1": 6, "Q5_K": 6, "Q6_K": 6, "Q3_K": 4, "Q2_K": 4}
GROUP = 32
FORMATS = ("f32", "quantized")


def decode(tensor) -> np.ndarray:
    """The tensor's values as float32, shaped (rows, columns) as the checkpoint had them."""
    from gguf.quants import dequantize

    return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)


def block_params(tensor) -> tuple[np.ndarray, np.ndarray]:
    """(scale, bias) per group of 32 of a Q4_0 / Q4_1 / Q8_0 tensor, read from each block's
    f16 header (d, and m for Q4_1), as float32 of shape (rows, columns / 32)."""
    kind = tensor.tensor_type.name
    raw = np.asarray(tensor.data)
    rows = raw.shape[0]
    block = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind]
    blocks = raw.reshape(rows, -1, block)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q4_1":
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        return d, m
    return d, d * np.float32(-8.0 if kind == "Q4_0" else -128.0)


def repack(tensor, w: np.ndarray) -> dict[str, np.ndarray] | None:
    """MLX quantized (weight, scales, biases) holding exactly `w` (the decoded tensor), for a
    Q4_0 / Q4_1 / Q8_0 tensor; None for other types. The codes are recovered from the decoded
    values and the block headers, and checked to round-trip."""
    kind = tensor.tensor_type.name
    if kind not in EXACT or w.ndim != 2:
        return None
    bits = EXACT[kind]
    scale, bias = block_params(tensor)
    rows, cols = w.shape
    groups = w.reshape(rows, cols // GROUP, GROUP)
    safe = np.where(scale == 0, 1, scale)[..., None]
    codes = np.rint((groups - bias[..., None]) / safe)
    codes = np.where(scale[..., None] == 0, 0, codes)
    if codes.min() < 0 or codes.max() > 2**bits - 1 or not np.allclose(
            codes * scale[..., None] + bias[..., None], groups, rtol=0, atol=1e-6):
        raise ValueError(f"{tensor.name}: {kind} codes did not round-trip")
    return {"weight": pack(codes.astype(np.uint32).reshape(rows, cols), bits),
            "scales": scale.astype(np.float16), "biases": bias.astype(np.float16)}


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes (rows, cols) packed as MLX stores them: 32/bits codes per uint32, the
    first code in the lowest bits."""
    per = 32 // bits
    rows, cols = codes.shape
    c = codes.reshape(rows, cols // per, per).astype(np.uint32)
    shifts = (np.arange(per, dtype=np.uint32) * bits)
    return np.bitwise_or.reduce(c << shifts, axis=-1).astype(np.uint32)


def requantize(w: np.ndarray, bits: int) -> dict[str, np.ndarray]:
    """w quantized by MLX itself (affine, group 32)."""
    import mlx.core as mx

    q, s, b = mx.quantize(mx.array(w), group_size=GROUP, bits=bits)
    return {"weight": np.array(q), "scales": np.array(s.astype(mx.float16)),
            "biases": np.array(b.astype(mx.float16))}
