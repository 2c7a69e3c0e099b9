"""Chat data for a chat model's head: user turns through the model's own chat template, answered
by the target itself (self-distillation), so the head learns what the target writes where it is
used — after `<|im_start|>assistant`, not after raw code.

The questions come from this machine: a built-in set of everyday requests; from the Python
standard library's own sources, "write a function that …" from docstrings and "what does
module.name do?" for the documented functions; and, for half the list, the model's own: given
its template up to where a user's words begin, a chat model writes a user's turn (T = 0.7),
so the head meets requests as varied as the model can imagine rather than a few hundred of ours
(the "Magpie" way of drawing instructions from an aligned model). A few hand-written prompts
are held out: the acceptance curve is measured on them and nothing is trained on them.
"""

from __future__ import annotations

import ast
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..templates import encode_chat
from .corpus import is_held_out, read_text, stdlib_files

EVERYDAY = (
    "What is the capital of France?", "How do I make a cup of tea?",
    "Give me three tips for sleeping better.", "What is photosynthesis?",
    "Write a short poem about the sea.", "How many days are there in a leap year?",
    "Explain what a black hole is in simple words.", "What is the difference between weather and "
    "climate?", "Suggest a name for a small bakery.", "How do I boil an egg?",
    "What are the primary colors?", "Tell me a fun fact about octopuses.",
    "Why is the sky blue?", "Write a haiku about autumn.", "What does a CPU do?",
    "How can I learn to play the guitar?", "What is the boiling point of water?",
    "Summarize the story of Cinderella in two sentences.", "What is a prime number?",
    "How do airplanes stay in the air?", "Give me a recipe for pancakes.",
    "What is the largest planet in our solar system?", "How do I write a good email?",
    "What is machine learning?", "List five fruits that are high in vitamin C.",
    "What is the meaning of the word 'ephemeral'?", "How do vaccines work?",
    "Write a thank-you note to a friend.", "What causes earthquakes?",
    "What is the Pythagorean theorem?", "How do I stay motivated when studying?",
    "Translate 'good morning' into Spanish.", "What is an API?",
    "Describe the water cycle.", "What are the benefits of exercise?",
    "How does the internet work?", "What is the difference between a virus and a bacterium?",
    "Give me a riddle.", "What is 15 multiplied by 12?", "How do I plant tomatoes?",
    "What is democracy?", "Write a short story about a lost cat.",
    "Why do leaves change color in autumn?", "What is a healthy breakfast?",
    "Explain recursion to a beginner.", "What is the speed of light?",
    "How do I reverse a list in Python?", "What is a database?",
    "Give me tips for a job interview.", "What is gravity?", "Who wrote Romeo and Juliet?",
    "How do I make my code easier to read?", "What is the tallest mountain on Earth?",
    "Explain what an operating system is.", "What are some good habits for saving money?",
    "Write a limerick about a dog.", "What is the difference between RAM and storage?",
    "How does a refrigerator keep food cold?", "What is the greenhouse effect?",
    "Suggest a weekend activity for a rainy day.", "What is a noun?",
    "How do I sort a dictionary by value in Python?", "What is the moon made of?",
    "Explain the rules of chess briefly.", "What is inflation?",
    "How do bees make honey?", "Give me a motivational quote.",
    "What is the difference between a list and a tuple in Python?",
    "Describe a sunset in one paragraph.", "What is a good way to learn a new language?",
    "What are the planets in our solar system?", "How do I center text in HTML?",
    "What is electricity?", "Write a short birthday message for my sister.",
    "How many continents are there?", "What is the purpose of a unit test?",
    "Explain what Git is used for.", "What should I pack for a beach trip?",
    "How do clouds form?", "What is a verb?", "Why do we need sleep?",
)

HELD_OUT_CHAT = (  # never trained on: the curve train-drafter reports is measured here
    "What are the main causes of climate change?",
    "Write a Python function that checks whether a string is a palindrome.",
    "How do I make a good first impression?",
    "Explain how a bicycle works.",
)


def stdlib_questions(limit: int) -> list[str]:
    """User turns built from the standard library's documented functions (held-out files
    excluded): a request to write one from its docstring, or a question about what it does."""
    out: list[str] = []
    for path in stdlib_files():
        if is_held_out(path):
            continue
        text = read_text(path)
        try:
            tree = ast.parse(text or "")
        except (SyntaxError, ValueError):
            continue
        module = path.stem if path.stem != "__init__" else path.parent.name
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = (ast.get_docstring(node) or "").strip().split("\n")[0].rstrip(".")
            if len(doc) < 12:
                continue
            if len(out) % 2:
                out.append(f"Write a Python function `{node.name}` that does this: {doc}.")
            else:
                out.append(f"What does `{module}.{node.name}` do in Python?")
    return out[:: max(1, len(out) // limit)][:limit] if limit else []  # spread over modules


def chat_prompts(tokenizer: Any, n: int, seed: int = 0, own: Sequence[str] = ()
                 ) -> list[list[int]]:
    """n user turns — the model's `own` (own_questions), and for the rest the everyday ones
    three times over (answered greedily in one batch, sampled in others), then the standard
    library's — in a fixed shuffled order with the model's own spread evenly through it, each
    as the model's chat template lays it out, ready for the answer."""
    own = list(own)[:n]
    asks = list(EVERYDAY) * 3
    asks = (asks + stdlib_questions(max(0, n - len(own) - len(asks))))[: n - len(own)]
    order = np.random.default_rng(seed).permutation(len(asks))
    ours = [asks[i] for i in order]
    merged = [ours[i * len(ours) // len(own) : (i + 1) * len(ours) // len(own)] + [q]
              for i, q in enumerate(own)] if own else [ours]
    return [encode_chat(tokenizer, [{"role": "user", "content": a}])
            for part in merged for a in part]


MARK = "\x00MARK\x00"  # stands for a user's words while the template is laid out


def user_turn_start(tokenizer: Any) -> list[int] | None:
    """The template up to where a user's words begin (its default system turn included), or
    None for a model without one."""
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False,
                                         add_generation_prompt=False)
    start = text.find(MARK)
    return list(tokenizer.encode(text[:start], add_special_tokens=False)) if start > 0 else None


def own_questions(target: Any, tokenizer: Any, n: int, store: Path, *, seconds: float | None,
                  seed: int = 0, batch: int = 64, max_tokens: int = 64, log=print) -> list[str]:
    """Up to n user turns the model writes itself (see the module doc), kept in
    `store`/questions.json: a later sitting reads them and writes no more. Only whole turns
    (ended by a stop token) of 3 to 80 words, each once, never a held-out one. `seconds` caps
    the time (at least one batch)."""
    file = store / "questions.json"
    if file.exists():
        return json.loads(file.read_text())["questions"][:n]
    start = user_turn_start(tokenizer)
    if start is None or n <= 0:
        return []
    import mlx.core as mx
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    out: list[str] = []
    seen: set[str] = set()
    t0 = time.perf_counter()
    for b in range(3 * n // batch + 1):  # a model that seldom ends its turn: stop trying
        if len(out) >= n or b and seconds is not None and time.perf_counter() - t0 > seconds:
            break
        mx.random.seed(seed + 1000 + b)
        r = batch_generate(target.model, tokenizer, [start] * batch, max_tokens=max_tokens,
                           return_token_ids=True, sampler=make_sampler(temp=0.7, top_p=0.9))
        for ids in r.token_ids:
            turn, whole = ended(tokenizer, ids, max_tokens)
            if not whole:
                continue
            text = tokenizer.decode(turn[:-1]).strip()
            if (3 <= len(text.split()) <= 80 and "<|" not in text and text.lower() not in seen
                    and text not in HELD_OUT_CHAT):
                seen.add(text.lower())
                out.append(text)
        log(f"the target wrote {min(len(out), n)}/{n} user turns of its own")
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / ".questions.json.partial"
    tmp.write_text(json.dumps({"questions": out[:n]}, indent=1))
    tmp.replace(file)
    return out[:n]


def held_out_prompts(tokenizer: Any) -> list[list[int]]:
    return [encode_chat(tokenizer, [{"role": "user", "content": a}]) for a in HELD_OUT_CHAT]


def answer(target: Any, tokenizer: Any, prompts: list[list[int]], *, max_tokens: int,
           temperature: float, seed: int) -> list[list[int]]:
    """The target's own answers, batched (mlx-lm's batch_generate, left-padded): each prompt
    followed by its answer, and by its end of turn where it ended (batch_generate leaves the
    stop token out: put back, so the head learns where a turn ends)."""
    import mlx.core as mx
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(seed)
    r = batch_generate(target.model, tokenizer, prompts, max_tokens=max_tokens,
                       return_token_ids=True, sampler=make_sampler(temp=temperature))
    return [list(p) + ended(tokenizer, ids, max_tokens)[0]
            for p, ids in zip(prompts, r.token_ids, strict=True)]


def ended(tokenizer: Any, ids: Sequence[int], max_tokens: int) -> tuple[list[int], bool]:
    """(a generated turn with its stop token, whether it ended by one): a turn shorter than
    max_tokens stopped at a stop token, which batch_generate does not return."""
    ids = list(map(int, ids))
    stops = set(tokenizer.eos_token_ids)
    if ids and ids[-1] in stops:
        return ids, True
    if len(ids) < max_tokens:
        return ids + [tokenizer.eos_token_id], True
    return ids, False


def conversations(target: Any, tokenizer: Any, prompts: list[list[int]], store: Path, *,
                  seconds: float | None, max_tokens: int = 160, batch: int = 32, seed: int = 0,
                  log=print) -> Iterator[list[int]]:
    """Every prompt answered by the target, batch by batch, kept in `store` (one .npy per
    batch): a resumed run reads what an earlier sitting answered and goes on from there.
    Batches alternate greedy (what T = 0 drafting meets) and sampled at T = 0.8. `seconds`
    caps the time spent answering in this sitting (at least one batch)."""
    store.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    made = 0
    for b, i in enumerate(range(0, len(prompts), batch)):
        path = store / f"answers-{b:04d}.npy"
        if not path.exists():
            if made and seconds is not None and time.perf_counter() - t0 > seconds:
                log(f"answering budget spent after {i} prompts")
                return
            rows = answer(target, tokenizer, prompts[i : i + batch], max_tokens=max_tokens,
                          temperature=0.0 if b % 2 == 0 else 0.8, seed=seed + b)
            flat = np.concatenate([[len(r)] + r for r in rows]).astype(np.int32)
            tmp = store / f".answers-{b:04d}.partial.npy"
            np.save(tmp, flat)
            tmp.replace(path)
            made += 1
            log(f"the target answered {min(i + batch, len(prompts))}/{len(prompts)} prompts")
        flat = np.load(path).tolist()
        j = 0
        while j < len(flat):
            yield flat[j + 1 : j + 1 + flat[j]]
            j += 1 + flat[j]


def windows(convs: list[list[int]], seq_len: int) -> np.ndarray:
    """Rows of seq_len tokens, one starting at each conversation (its template's start), run on
    into the next where it is shorter: what the head sees is what drafting sees, a turn from
    its beginning."""
    stream = np.concatenate([np.asarray(c, np.int32) for c in convs])
    starts = np.cumsum([0] + [len(c) for c in convs[:-1]])
    rows = [stream[s : s + seq_len] for s in starts if s + seq_len <= len(stream)]
    if not rows:
        rows = [np.resize(stream, seq_len)]  # a stream shorter than one row: repeat it
    return np.stack(rows).astype(np.int32)


def chat_training_set(target: Any, tokenizer: Any, seq_len: int, store: Path, *,
                      seconds: float | None, seed: int = 0, n_prompts: int = 512,
                      log=print) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """(training rows, held-out rows, held-out prompts) for a chat model without --data: the
    target's own answers to chat_prompts (kept in `store` across sittings), and its greedy
    answers to the held-out prompts (where the per-position weights are estimated)."""
    held_prompts = held_out_prompts(tokenizer)
    t0 = time.perf_counter()
    own = own_questions(target, tokenizer, n_prompts // 2, store, seed=seed, log=log,
                        seconds=None if seconds is None else seconds / 3)
    left = None if seconds is None else max(0.0, seconds - (time.perf_counter() - t0))
    convs = list(conversations(target, tokenizer, chat_prompts(tokenizer, n_prompts, seed, own),
                               store, seconds=left, seed=seed, log=log))
    held = answer(target, tokenizer, held_prompts, max_tokens=160, temperature=0.0, seed=seed)
    rows = windows(convs, seq_len)
    log(f"training on {len(rows)} rows of the target's own answers to {len(convs)} chat prompts")
    return rows[np.random.default_rng(seed).permutation(len(rows))], windows(held, seq_len), \
        held_prompts
