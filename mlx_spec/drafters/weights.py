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
    """Every parameter from `weights` (missing ones named in one line), then evaluated."""
    expected = {k for k, _ in tree_flatten(module.parameters())}
    if missing := sorted(expected - weights.keys()):
        raise ModelLoadError(f"{what} lacks {len(missing)} tensor(s): "
                             f"{', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}")
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
