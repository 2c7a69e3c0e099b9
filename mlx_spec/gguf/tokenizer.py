"""The tokenizer a GGUF file carries, rebuilt with `tokenizers`: its vocabulary, merges, token
types and pre-tokenizer (byte-level BPE, "gpt2" in GGUF terms), or its SentencePiece pieces and
scores ("llama": Gemma's). Written as tokenizer.json + tokenizer_config.json (chat template,
special tokens) so that mlx-lm, transformers and our own code all read one tokenizer."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedModelError
from .read import GGUFFile

CONTROL, USER_DEFINED = 3, 4  # GGUF token types: special / added but not special
# llama.cpp's own pre-tokenizer regexes, by the name the header gives (tokenizer.ggml.pre)
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "gpt2": (GPT2,),
    "smollm": (r"\p{N}", GPT2),  # digits one at a time, then GPT-2's split
    "starcoder": (r"\p{N}", GPT2),
    "refact": (r"\p{N}", GPT2),
    "qwen2": (QWEN2,),
    "deepseek-r1-qwen": (QWEN2,),
    "llama-bpe": (LLAMA3,),
    "llama3": (LLAMA3,),
}
NFC_PRE = {"qwen2", "deepseek-r1-qwen"}  # Qwen's own tokenizer normalises to NFC first
# end-of-turn tokens a chat stops at, beyond the header's eos/eot/eom ids (llama.cpp's list)
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>",
               "<|end|>", "<|return|>")


def build_tokenizer(f: GGUFFile) -> tuple[Any, dict[str, Any], list[int]]:
    """(tokenizers.Tokenizer, tokenizer_config.json, stop token ids) for the file's tokenizer."""
    kind = f.meta.get("tokenizer.ggml.model")
    tokens: list[str] = f.meta.get("tokenizer.ggml.tokens") or []
    if not tokens:
        raise UnsupportedModelError(f"{f.path.name} carries no tokenizer vocabulary")
    types: list[int] = f.meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if kind == "gpt2":
        tok = _byte_level_bpe(f, tokens)
    elif kind == "llama":
        tok = _sentencepiece_bpe(f, tokens, types)
    else:
        raise UnsupportedModelError(f"{f.path.name}: tokenizer kind {kind!r} is not supported "
                                    "(supported: gpt2 byte-level BPE, llama SentencePiece)")
    _add_special(tok, tokens, types)
    add_bos = bool(f.meta.get("tokenizer.ggml.add_bos_token", False))
    bos = _token(f, tokens, "bos")
    if add_bos and bos is not None:
        from tokenizers import processors

        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tokens.index(bos))])
    stops = stop_ids(f, tokens, types)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos, "eos_token": _token(f, tokens, "eos"),
        "unk_token": _token(f, tokens, "unknown"), "pad_token": _token(f, tokens, "padding"),
        "add_bos_token": add_bos, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(f.arch_key("context_length", 4096)),
    }
    if template := f.meta.get("tokenizer.chat_template"):
        config["chat_template"] = template
    return tok, config, stops


def stop_ids(f: GGUFFile, tokens: list[str], types: list[int]) -> list[int]:
    """The header's end-of-sequence / -turn / -message ids, and any control token named as an
    end of turn (a ChatML model's <|im_end|> and <|endoftext|>)."""
    ids = {int(f.meta[f"tokenizer.ggml.{k}_token_id"]) for k in ("eos", "eot", "eom")
           if f"tokenizer.ggml.{k}_token_id" in f.meta}
    ids |= {i for i, (t, ty) in enumerate(zip(tokens, types, strict=True))
            if ty == CONTROL and t in END_OF_TURN}
    return sorted(i for i in ids if 0 <= i < len(tokens))


def _token(f: GGUFFile, tokens: list[str], name: str) -> str | None:
    i = f.meta.get(f"tokenizer.ggml.{name}_token_id")
    return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None


def _byte_level_bpe(f: GGUFFile, tokens: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    pre = str(f.meta.get("tokenizer.ggml.pre", "gpt2"))
    if pre not in PRE_SPLITS:
        raise UnsupportedModelError(f"{f.path.name}: pre-tokenizer {pre!r} is not supported "
                                    f"(supported: {', '.join(PRE_SPLITS)})")
    merges = [tuple(m.split(" ", 1)) for m in f.meta.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                               ignore_merges=pre in ("llama-bpe", "llama3")))
    if pre in NFC_PRE:
        tok.normalizer = normalizers.NFC()
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_SPLITS[pre]]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(f: GGUFFile, tokens: list[str], types: list[int]):
    """SentencePiece BPE (Gemma): pieces merge by score; spaces are "▁", no prefix space; an
    unknown byte falls back to its <0xNN> piece. The merges are every pair of pieces whose
    join is a piece, ranked by that piece's score (how SentencePiece itself chooses)."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores: list[float] = f.meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    normal = [t for t, ty in zip(tokens, types, strict=True) if ty == 1]
    merges = []
    for piece in normal:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((scores[vocab[piece]], vocab[left], vocab[right], left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    unk = _token(f, tokens, "unknown")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges], unk_token=unk,
                               fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    return tok


def _add_special(tok, tokens: list[str], types: list[int]) -> None:
    """Control tokens are special (never split, hidden when decoding with skip_special);
    user-defined ones are added tokens that decode as text (Qwen's <tool_call>)."""
    from tokenizers import AddedToken

    def added(kind: int) -> list:
        return [AddedToken(t, special=kind == CONTROL, normalized=False)
                for t, ty in zip(tokens, types, strict=True) if ty == kind]

    tok.add_special_tokens(added(CONTROL))
    tok.add_tokens(added(USER_DEFINED))
