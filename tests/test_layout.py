"""The house rules of the tree, read from the source (no imports run): no import cycles between
modules, nothing importing up a floor, hub/ and the UI-side modules free of MLX, every file at
most 450 lines. docs/DESIGN.md's "Layout" says what each floor is for."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mlx_spec", "mlx_spec_app", "benchmarks")
MAX_LINES = 450

# floor of each module (the longest prefix listed decides): a module may import its own floor
# or below, never above
FLOORS = {
    "mlx_spec": 0,  # core maths and types: sampling, cache, recurrent, events, stats, spec...
    "mlx_spec.drafters": 1,
    "mlx_spec.hub": 1,
    "mlx_spec.gguf": 1,
    "mlx_spec.engine": 2,
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
# import no MLX when imported (the UI's process loads these); hub/ none even lazily
NO_MLX = ("mlx_spec.hub", "mlx_spec.spec", "mlx_spec.kinds", "mlx_spec.layouts",
          "mlx_spec.errors", "mlx_spec.events", "mlx_spec.stats", "mlx_spec.service",
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
    """Every module of ours that `name` imports at run time, lazily inside functions too
    (imports under `if TYPE_CHECKING:` are types only, and skipped)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
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


def floor(name: str) -> int:
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


def test_every_file_is_at_most_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_checks_see_a_cycle_and_a_floor_crossing():
    """The checks can fail: a made-up two-module circle is a cycle, and core importing the
    engine crosses a floor."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert floor("mlx_spec.engine.turn") > floor("mlx_spec.stats")
