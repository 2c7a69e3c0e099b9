"""`mlx-spec serve`: the engine behind OpenAI-compatible HTTP endpoints, several requests at once,
speculation on for each (requests.py: bodies to typed requests; scheduler.py: one engine thread,
a Conversation per request; responses.py: answers and per-request stats; http.py: the server)."""

from .http import Server
from .requests import BadRequest, GenerateRequest
from .scheduler import QueueFull, Scheduler

__all__ = ["BadRequest", "GenerateRequest", "QueueFull", "Scheduler", "Server"]
