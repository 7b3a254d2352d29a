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


def _used_names(tree: ast.AST) -> set[str]:
    """Names a module uses, string annotations included; a name listed only in `__all__` is passed on, not used."""
    listed = {
        id(const)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        for const in ast.walk(node.value)
    }
    used: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in listed:
            continue
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used.update(node.value.replace("[", " ").replace("]", " ").replace(".", " ").replace("|", " ").split())
    return used


def test_no_reexport_outside_a_face() -> None:
    """A name imported from the package is used where it is imported; only a folder's face passes names on."""
    found: list[str] = []
    for name, path in modules().items():
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        used = _used_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm_worker":
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if bound not in used:
                        found.append(f"{name}: {bound} (from {node.module})")
    assert not found, "imported and never used (a re-export): " + "; ".join(found)


# Folder -> the folders (or single modules) of the package it may import. `main` wires them all.
FOLDER_RULE: dict[str, set[str]] = {
    "config": set(),
    "diagnosis": {"config"},
    "model": {"config", "diagnosis"},
    "capacity": {"config", "diagnosis", "model", "engine.ladder"},
    "engine": {"config", "diagnosis", "model", "serving.state"},
    "serving": {"config", "diagnosis"},
}


def _folder(module: str) -> str:
    return module.split(".")[0]


def test_each_folder_imports_only_what_comes_before_it_in_a_start() -> None:
    broken: list[str] = []
    for module, targets in graph().items():
        folder = _folder(module)
        allowed = FOLDER_RULE.get(folder)
        if allowed is None:
            continue
        for target in sorted(targets):
            if _folder(target) == folder or target in allowed or _folder(target) in allowed:
                continue
            broken.append(f"{module} -> {target}")
    assert not broken, "imports across the folder rule: " + "; ".join(broken)


def test_no_two_folders_import_each_other() -> None:
    """Folders form a ladder, not a ring: engine and capacity imported each other once (issue 23)."""
    between: dict[str, set[str]] = {}
    for module, targets in graph().items():
        for target in targets:
            if _folder(module) != _folder(target):
                between.setdefault(_folder(module), set()).add(_folder(target))
    pairs = sorted({tuple(sorted((a, b))) for a, out in between.items() for b in out if a in between.get(b, set())})
    assert not pairs, f"folders that import each other: {pairs}"


def _launch_knobs() -> set[str]:
    from vllm_worker.config import args_builder, settings

    return set(args_builder.FLAGS) | set(args_builder.ALIASES) | set(args_builder.LEGACY_ALIASES) | set(
        settings.DOCUMENTED
    ) | set(args_builder.WORKER_VARIABLES) | {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT",
                                              "VLLM_USE_MODELSCOPE", "VLLM_CPU_KVCACHE_SPACE"}


def env_reads(source: str, knobs: set[str]) -> list[str]:
    """Where `source` reads one of `knobs` from an environment mapping: `env.get("X")`, `env["X"]`,
    `"X" in env`, or a helper called with an env and the name (`value(env, "X")`)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault") and node.args
            and "env" in ast.unparse(node.func.value).lower()
        ):
            key = node.args[0]
        elif isinstance(node, ast.Call) and len(node.args) > 1 and "env" in ast.unparse(node.args[0]).lower():
            key = node.args[1]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and "env" in ast.unparse(node.value).lower():
            key = node.slice
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            if any("env" in ast.unparse(c).lower() for c in node.comparators):
                key = node.left
        if isinstance(key, ast.Constant) and key.value in knobs:
            found.append(f"{node.lineno} reads {key.value}")
    return found + profile_string_reads(source, knobs)


_PARSERS = ("int", "float", "bool_word", "parse_human_int", "human_int", "shell_words", "split", "lower")


def profile_string_reads(source: str, knobs: set[str]) -> list[str]:
    """Where `source` reads a knob through a LaunchProfile's strings instead of its typed fields:
    `profile.values[...]`/`.values.get(...)`, `profile.value("X")`/`.raw("X")` (gone from the profile),
    or what the user wrote (`written("X")`, for a message to quote) parsed to decide on it."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("values", "flags") and "profile" in ast.unparse(node.value):
            found.append(f"{node.lineno} reads the profile's strings ({ast.unparse(node)})")
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("value", "raw")
            and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in knobs
        ):
            found.append(f"{node.lineno} reads {node.args[0].value}")
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            parsed = [*node.args, node.func.value] if isinstance(node.func, ast.Attribute) else list(node.args)
            if name in _PARSERS and any(".written(" in ast.unparse(arg) for arg in parsed):
                found.append(f"{node.lineno} parses what the user wrote ({ast.unparse(node)})")
    return found


def test_the_env_read_check_sees_each_way_of_reading() -> None:
    knobs = {"MAX_NUM_SEQS"}
    for line in ('os.environ.get("MAX_NUM_SEQS")', 'env["MAX_NUM_SEQS"]', '"MAX_NUM_SEQS" in launch_env',
                 'env_value(ctx.env, "MAX_NUM_SEQS")'):
        assert env_reads(line, knobs) == ["1 reads MAX_NUM_SEQS"], line
    for line in ('profile.value("MAX_NUM_SEQS")', 'ctx.profile.raw("MAX_NUM_SEQS")',
                 'int(profile.written("MAX_NUM_SEQS") or 0)', 'profile.written("MAX_NUM_SEQS").lower()',
                 'launch.profile.values.get("MAX_NUM_SEQS")'):
        assert len(env_reads(line, knobs)) == 1, line
    for line in ('profile.max_num_seqs', 'overrides["MAX_NUM_SEQS"] = "8"', '"MAX_NUM_SEQS" in step.changes',
                 'f"MAX_NUM_SEQS={profile.written(\'MAX_NUM_SEQS\')}"'):
        assert env_reads(line, knobs) == [], line


def test_only_config_reads_a_launch_knob_from_an_environment() -> None:
    """Outside `config/`, a knob is read from a LaunchProfile's typed fields or Settings, never from an env
    mapping nor through the profile's strings (what the user wrote is only quoted)."""
    knobs = _launch_knobs()
    found = [
        f"{module}:{where}"
        for module, path in modules().items()
        if _folder(module) != "config"
        for where in env_reads(path.read_text(), knobs)
    ]
    assert not found, "; ".join(found)


def test_no_two_test_files_share_a_name() -> None:
    """pytest imports test files by their base name (the test folders are not packages): two files
    of one name in different folders stop the whole run at collection."""
    tests = PACKAGE.parents[1] / "tests"
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
