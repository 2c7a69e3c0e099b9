"""The house rules of the tree, read from the source (no imports run): no import cycles between
modules and nothing importing up a floor (type-only imports count: a circle drawn for the type
checker is still a circle), hub/ and the UI-side modules free of MLX, every file at most 600
lines (over 450 is flagged for review). docs/DESIGN.md's "Layout" says what each floor is for."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mlx_spec", "mlx_spec_app", "benchmarks")
REVIEW_LINES, MAX_LINES = 450, 600

# floor of each module (the longest prefix listed decides): a module may import its own floor
# or below, never above
FLOORS = {
    "mlx_spec": 0,  # core maths and types: sampling, cache, recurrent, events, stats, spec...
    "mlx_spec.drafters": 1,
    "mlx_spec.hub": 1,
    "mlx_spec.gguf": 1,
    # engine/, bottom up: the measurements, policies and round messages (data); one chat's
    # state and verbs; what drives it (one turn, several at once); the cycle over a batch;
    # the Engine façade (and the package's own __init__)
    "mlx_spec.engine": 2.4,
    "mlx_spec.engine.costs": 2.0,
    "mlx_spec.engine.calibration": 2.0,
    "mlx_spec.engine.costbook": 2.0,
    "mlx_spec.engine.adaptive": 2.0,
    "mlx_spec.engine.batch_length": 2.0,
    "mlx_spec.engine.planner": 2.0,
    "mlx_spec.engine.rounds": 2.0,
    "mlx_spec.engine.inspect": 2.0,  # what a traced round records (p, q, top-5)
    "mlx_spec.engine.conversation": 2.1,
    "mlx_spec.engine.turn": 2.2,
    "mlx_spec.engine.batch": 2.2,
    "mlx_spec.engine.cycle": 2.3,
    "mlx_spec.engine.engine": 2.4,
    "mlx_spec.engine.acceptance": 2.5,  # measures an Engine (the trainer's and the bench's)
    "mlx_spec.loading": 3,
    "mlx_spec.distributed": 3,
    "mlx_spec.service": 4,
    "mlx_spec.process": 4,
    "mlx_spec._child": 4,
    "mlx_spec.train": 5,
    "mlx_spec.doctor": 5,
    "mlx_spec.cli_models": 5,
    "mlx_spec.cli_options": 5,
    "mlx_spec.serve": 5,
    "mlx_spec_app": 6,
    "mlx_spec.cli": 7,
    "mlx_spec.cli_print": 7,
    "mlx_spec.cli_bench": 7,
    "benchmarks": 8,  # the project's lab, run from a checkout: outside the wheel
}
# a package's own __init__ where it is a façade over floors above its modules': mlx_spec's
# public API names (lazily, PEP 562) what the engine, loading and the service define
FACADES = {"mlx_spec": 5.5}  # (the app, floor 6, uses only it)
# import no MLX when imported (the UI's process loads these); hub/ none even lazily
NO_MLX = ("mlx_spec.hub", "mlx_spec.spec", "mlx_spec.kinds", "mlx_spec.layouts",
          "mlx_spec.errors", "mlx_spec.events", "mlx_spec.stats", "mlx_spec.service",
          "mlx_spec.trace", "mlx_spec.trace_html",
          "mlx_spec.process", "mlx_spec_app")
NEVER_MLX = ("mlx_spec.hub",)


def modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ours that `name` imports: at run time, lazily inside functions, and for
    the type checker alone (under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - max(0, node.level - 1)]
            module = ".".join(base + [node.module] if node.module else base) if node.level \
                else node.module
            targets = [f"{module}.{a.name}" for a in node.names] + [module]
        else:
            continue
        for t in targets:
            while t not in known and "." in t:
                t = t.rpartition(".")[0]
            if t in known and t != name and not name.startswith(t + "."):
                found.add(t)
                break
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                found.append(sorted([v, *comp]))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def floor(name: str) -> float:
    if name in FACADES:
        return FACADES[name]
    best = max((p for p in FLOORS if name == p or name.startswith(p + ".")), key=len)
    return FLOORS[best]


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_nothing_imports_up_a_floor():
    up = [f"{a} (floor {floor(a)}) imports {b} (floor {floor(b)})"
          for a, targets in graph().items() for b in targets if floor(b) > floor(a)]
    assert up == []


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_ui_side_and_hub_import_no_mlx():
    """The app's process and a download never load MLX; only the engine's child does."""
    offenders = []
    for name, path in modules().items():
        if not _under(name, NO_MLX):
            continue
        tree = ast.parse(path.read_text())
        lazy_too = _under(name, NEVER_MLX)
        for node in ast.walk(tree) if lazy_too else _module_level(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            offenders += [f"{name}: {n}" for n in names if n.split(".")[0] in ("mlx", "mlx_lm")]
    assert offenders == []


def _module_level(tree: ast.Module):
    """The statements run at import: the module's body, into if / try blocks, not functions."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If | ast.Try):
            todo += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]


def test_every_file_is_at_most_600_lines_and_over_450_is_flagged():
    """A file split by its reasons, not by a cap: 450 lines asks a reviewer to look, 600 fails
    (the tests' own files too)."""
    files = [*modules().values(), *(ROOT / "tests").rglob("*.py")]
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in files}
    flagged = {f: n for f, n in sizes.items() if n > REVIEW_LINES}
    if flagged:
        warnings.warn(f"over {REVIEW_LINES} lines, for review: {flagged}", stacklevel=1)
    assert {f: n for f, n in flagged.items() if n > MAX_LINES} == {}


def test_the_checks_see_a_cycle_and_a_floor_crossing():
    """The checks can fail: a made-up two-module circle is a cycle, and core importing the
    engine crosses a floor."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert floor("mlx_spec.engine.turn") > floor("mlx_spec.stats")
    assert floor("mlx_spec.engine.turn") > floor("mlx_spec.engine.conversation")


def test_type_only_imports_count():
    """A circle drawn only under TYPE_CHECKING is found (it was skipped before)."""
    import textwrap

    source = textwrap.dedent("""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from mlx_spec.engine.turn import play
    """)
    path = ROOT / "tests" / "_layout_probe.py"
    try:
        path.write_text(source)
        found = imports("mlx_spec.engine.conversation", path, modules())
    finally:
        path.unlink()
    assert "mlx_spec.engine.turn" in found
