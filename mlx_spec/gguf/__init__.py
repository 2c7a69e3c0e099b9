"""GGUF files as a model source: read with llama.cpp's own `gguf` reader, converted once into an
mlx-lm model directory (weights, tokenizer, chat template, stop tokens) under MLX_SPEC_HOME;
found where Ollama, LM Studio, llama.cpp and the Hugging Face cache keep them."""

from .directory import convert, converted, default_format, is_gguf, source_of
from .local import LocalGGUF, draft_for, find_local, find_packaged, model_file
from .read import GGUFFile, open_gguf

__all__ = ["GGUFFile", "LocalGGUF", "convert", "converted", "default_format", "draft_for",
           "find_local", "find_packaged", "is_gguf", "model_file", "open_gguf", "source_of"]
