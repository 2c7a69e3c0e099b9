"""GGUF files as a model source: read with llama.cpp's own `gguf` reader, converted once into an
mlx-lm model directory (weights, tokenizer, chat template, stop tokens) under MLX_SPEC_HOME."""

from .directory import convert, converted, default_format, is_gguf, source_of
from .read import GGUFFile, open_gguf

__all__ = ["GGUFFile", "convert", "converted", "default_format", "is_gguf", "open_gguf",
           "source_of"]
