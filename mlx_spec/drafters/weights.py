"""Reading a drafter checkpoint's tensors, and loading them into a module exactly."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import ModelLoadError, TokenizerMismatchError, first_line


def read_safetensors(path: Path) -> dict[str, mx.array]:
    weights: dict[str, mx.array] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    return weights


def load_exactly(module: nn.Module, weights: dict[str, mx.array], what: str) -> None:
    """Every parameter from `weights`, then evaluated. A tensor missing, left over or of the
    wrong shape is a ModelLoadError naming every one of them, in one line."""
    expected = dict(tree_flatten(module.parameters()))
    problems = []
    if missing := sorted(expected.keys() - weights.keys()):
        problems.append(f"lacks {len(missing)} tensor(s): {', '.join(missing)}")
    if unexpected := sorted(weights.keys() - expected.keys()):
        problems.append(f"has {len(unexpected)} tensor(s) this layout does not use (a config "
                        f"flag it was trained with?): {', '.join(unexpected)}")
    if shapes := [f"{k} {tuple(weights[k].shape)} (expected {tuple(v.shape)})"
                  for k, v in sorted(expected.items())
                  if k in weights and weights[k].shape != v.shape]:
        problems.append(f"has {len(shapes)} tensor(s) of the wrong shape: {', '.join(shapes)}")
    if problems:
        raise ModelLoadError(f"{what} {'; '.join(problems)}")
    module.load_weights(list(weights.items()), strict=True)
    mx.eval(module.parameters())


@contextmanager
def one_line_errors(what: str, path: Path) -> Iterator[None]:
    """Anything a loader trips over becomes one ModelLoadError line naming `what` and `path`."""
    try:
        yield
    except (ModelLoadError, TokenizerMismatchError):
        raise
    except KeyError as e:
        raise ModelLoadError(f"not a {what} config in {path}: {e} missing") from None
    except Exception as e:
        raise ModelLoadError(f"cannot load {what} {path}: {first_line(e)}") from e
