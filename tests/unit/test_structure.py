"""The house shows its flow: folders in the order of a start, no import circle, no module too large.

Every import of a `vllm_worker` module counts, the ones inside functions too: a lazy import that
closes a circle hides the circle, it does not remove it. A module past ~700 lines is two modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "vllm_worker"
MAX_LINES = 700


def module_name(path: Path) -> str:
    """`engine/launcher.py` -> `engine.launcher`; a folder's `__init__.py` is the folder's name."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or "__init__"


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The worker modules `path` imports, anywhere in it (a name from a folder's face counts as the face)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm_worker":
            base = node.module.partition(".")[2]
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                found.add(sub if sub in known else base)
        elif isinstance(node, ast.Import):
            found.update(a.name.partition(".")[2] for a in node.names if a.name.startswith("vllm_worker."))
    return {m for m in found if m}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: {m for m in imports_of(path, known) if m in known and m != name} for name, path in mods.items()}


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
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    too_large = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not too_large, too_large
