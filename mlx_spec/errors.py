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
