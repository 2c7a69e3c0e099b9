"""The engine: shared weights (`Engine`), one `Conversation` per chat, the verbs a round is
made of, the turn loop, and the schedule that decides each round (with the adaptive policy)."""

from .conversation import Conversation
from .engine import Engine

__all__ = ["Conversation", "Engine"]
