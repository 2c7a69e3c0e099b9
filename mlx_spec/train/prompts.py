"""A small built-in prompt set for `train-drafter` without `--data`: the head then learns what
the target itself writes after them (code and prose, short, varied), not any corpus."""

PROMPTS = (
    "def fibonacci(n):",
    "import json\n\n\ndef load_config(path):",
    "class Stack:\n    def __init__(self):",
    "def parse_args(argv):\n    \"\"\"Parse command-line arguments.\"\"\"",
    "for i in range(10):",
    "def read_lines(path):\n    with open(path) as f:",
    "import os\nimport sys\n\n",
    "def quicksort(items):",
    "class Point:\n    \"\"\"A point in the plane.\"\"\"\n\n    def __init__(self, x, y):",
    "def is_prime(n):",
    "try:\n    import numpy as np\nexcept ImportError:",
    "def merge(a, b):\n    result = []",
    "# Compute the mean of a list\ndef mean(values):",
    "def test_addition():",
    "async def fetch(url):",
    "def binary_search(items, target):",
    "Write a function that reverses a string.",
    "Explain what a hash table is.",
    "The quick brown fox",
    "Once upon a time,",
    "Here is a short summary of the meeting:",
    "Q: What is the capital of France?\nA:",
    "def flatten(nested):",
    "def count_words(text):",
    # the last four are held out: the tokens-per-pass estimate runs on them
    "def gcd(a, b):",
    "class Queue:\n    def __init__(self):",
    "def to_snake_case(name):",
    "Tell me about the history of computing.",
)
HELD_OUT = 4
