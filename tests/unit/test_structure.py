"""The house shows its flow: no import circle among the worker's modules, none too large.

Every import of a `vllm_worker` module counts, the ones inside functions too: a lazy import that
closes a circle hides the circle, it does not remove it. A module past ~700 lines is two modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "vllm_worker"
MAX_LINES = 700


def imports_of(path: Path) -> set[str]:
    """The worker modules `path` imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "vllm_worker":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("vllm_worker."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("vllm_worker."))
    return found


def graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in PACKAGE.glob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def test_no_import_circle() -> None:
    edges = graph()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not circles, " ; ".join(" -> ".join(c) for c in circles)


def test_no_module_is_two_modules() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    too_large = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not too_large, too_large
