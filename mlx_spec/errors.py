"""Errors meant for users: each carries one clear line; the CLI and the app show only that line."""


class MlxSpecError(Exception):
    """Base class: str(error) is the whole message a user sees."""


class ModelLoadError(MlxSpecError):
    """A model or drafter directory is missing, incomplete or corrupt."""


class TokenizerMismatchError(MlxSpecError):
    """Target and drafter do not share a vocabulary."""


class UnsupportedModelError(MlxSpecError):
    """The model has a layer kind speculation cannot handle (yet)."""


class PromptTooLongError(MlxSpecError):
    """The prompt does not fit the model's context."""


def first_line(error: BaseException) -> str:
    """An error's first line (its type's name when it has no message)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def user_message(error: BaseException, what: str) -> str:
    """The one line a user reads: an MlxSpecError's own, else `what: Type: first line`."""
    if isinstance(error, MlxSpecError):
        return str(error)
    name = type(error).__name__
    line = first_line(error)
    return f"{what}: {name}" + (f": {line}" if line != name else "")


def as_user_error(error: BaseException, what: str) -> MlxSpecError:
    """`error` as an MlxSpecError carrying user_message's line (MlxSpecErrors unchanged)."""
    return error if isinstance(error, MlxSpecError) else MlxSpecError(user_message(error, what))
