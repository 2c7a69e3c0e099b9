"""The engine, bottom up: round messages (rounds.py, data only); `Conversation`, one chat's state
and the verbs a round is made of, reading the measured costs through a `CostBook`; the turn loop
(turn.py) that drives one conversation and the batch driver (batch.py, cycle.py) that drives
several; `Engine` on top, a façade over the shared weights that hands out conversations (`Chat`:
a Conversation with its turns)."""

from .conversation import Conversation
from .engine import Chat, Engine

__all__ = ["Chat", "Conversation", "Engine"]
