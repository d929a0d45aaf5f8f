"""The rooms of the library import one another only downward (docs/architecture.md).

Every import in the package, module level or inside a function, is read from the
source with `ast` and checked against the table below; a new import across rooms must
either fit it or change the table and the document together. Within a room (a
folder), files form no import circle, and no import sits inside a function to hide
one: every library import inside a function is listed in `LAZY` with its reason, and
none of them may close a circle. The checks are tried on planted circles too.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# room -> the rooms it may import (besides itself).
ALLOWED = {
    "pallas": set(),
    "data": set(),
    "ops": {"pallas", "data"},  # data: writes.py's temporary-file names (host_rows)
    "sampling": {"pallas", "data", "ops"},
    "nn": {"pallas", "ops"},
    "training": {"data", "ops", "sampling", "nn"},
    "bench": {"data", "ops", "sampling", "nn", "training"},
    "cli": {"data", "ops", "sampling", "nn", "training", "bench", "api"},  # api: __version__
    "api": {"data", "ops", "sampling", "nn", "training"},
}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "zerognn_jax":
        return None
    if len(parts) == 1 or parts[1:] == ["_src"]:
        return "api"  # the package and its (empty) private root
    if parts[1] in ("cli", "__main__"):  # (`python -m zerognn_jax` runs the command)
        return "cli"
    if parts[1] == "_src" and len(parts) > 2:
        return parts[2]
    raise AssertionError(f"module {module} lies in no room")


def imports_of(path: pathlib.Path, module: str):
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def sources(root=ROOT, tops=("zerognn_jax",)):
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield path, ".".join(parts)


@pytest.mark.parametrize("path, module", list(sources()), ids=lambda v: str(v)[-50:])
def test_imports_point_down(path, module):
    room = room_of(module)
    for target in imports_of(path, module):
        other = room_of(target)
        if other is None or other == room:
            continue
        assert other in ALLOWED[room], f"{module} ({room}) imports {target} ({other})"


def test_every_library_file_lies_in_a_room():
    rooms = {room_of(module) for _, module in sources()}
    assert rooms <= set(ALLOWED)


# Slow imports that wait until they are needed: orbax (checkpoints), flax.nnx (a model
# that is an NNX module, nn/bridge.py) and scipy.special (proteins-like's generator).
NOT_AT_START = ("orbax", "flax.nnx", "scipy.special")


def test_importing_the_package_leaves_the_slow_imports_for_later():
    code = ("import sys, zerognn_jax; "
            f"print(' '.join(m for m in {NOT_AT_START!r} if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == []


def test_the_kernels_room_is_the_pallas_folder_and_imports_nothing_else():
    kernels = {module for _, module in sources() if room_of(module) == "pallas"}
    assert {"zerognn_jax._src.pallas.sample", "zerognn_jax._src.pallas.counter_hash"} <= kernels
    assert ALLOWED["pallas"] == set()


# ---- circles ------------------------------------------------------------------------------

# Library imports inside functions, by importing module (prefix) and imported module
# (prefix): each is lazy for a reason of its own, never to hide a circle.
LAZY = {
    ("zerognn_jax._src.training.trainer", "zerognn_jax._src.training.checkpoint"):
        "orbax takes about a second to import; runs without checkpoints skip it",
    ("zerognn_jax._src.training.inference", "zerognn_jax._src.training.checkpoint"):
        "orbax takes about a second to import",
    ("zerognn_jax._src.ops.registry", "zerognn_jax._src.pallas"):
        "a Pallas kernel (and Triton) is imported only when it is selected",
    ("zerognn_jax._src.bench.run", "zerognn_jax"):
        "XLA reads its flags when JAX first loads: the runner sets them, then imports",
    ("zerognn_jax.cli", "zerognn_jax"):
        "a command's handler imports what it runs when it runs",
}


def import_graph(root=ROOT, tops=("zerognn_jax",)):
    """{module: {imported library module: True if only imported inside functions}}."""
    paths = dict((module, path) for path, module in sources(root, tops))
    graph = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        inner = {id(n) for f in ast.walk(tree)
                 if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                 for n in ast.walk(f) if isinstance(n, ast.Import | ast.ImportFrom)}
        edges = {}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(node, module, path):
                if target in paths and target != module:
                    edges[target] = edges.get(target, True) and id(node) in inner
        graph[module] = edges
    return graph


def _targets(node, module: str, path: pathlib.Path):
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def reaches(graph, start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module == goal:
            return True
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return False


def hidden_circles(graph) -> list[str]:
    """Imports inside functions whose target imports their module back: each would be
    a circle at module level."""
    return [f"{a} imports {b} inside a function, and {b} imports {a}"
            for a, edges in graph.items() for b, inner in edges.items()
            if inner and reaches(graph, b, a)]


def folder_circles(graph) -> list[str]:
    """Circles among the files of one folder (any import, module level or not)."""
    folder = lambda m: m.rpartition(".")[0]
    local = {a: {b for b in edges if folder(b) == folder(a)} for a, edges in graph.items()}
    return [f"{a} imports {b}, which leads back to it (a circle in {folder(a)})"
            for a, edges in local.items() for b in edges if reaches(local, b, a)]


def undocumented_lazy(graph) -> list[str]:
    return [f"{a} imports {b} inside a function: move it to the top or add it to LAZY"
            for a, edges in graph.items() for b, inner in edges.items()
            if inner and not any(a.startswith(m) and b.startswith(t) for m, t in LAZY)]


def test_no_import_inside_a_function_hides_a_circle():
    assert hidden_circles(import_graph()) == []


def test_files_within_a_folder_form_no_circle():
    assert folder_circles(import_graph()) == []


def test_every_import_inside_a_function_is_documented():
    assert undocumented_lazy(import_graph()) == []


def _plant(tmp_path, files: dict) -> dict:
    pkg = tmp_path / "planted"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / f"{name}.py").write_text(text)
    return import_graph(tmp_path, ("planted",))


def test_the_checks_catch_planted_circles(tmp_path):
    graph = _plant(tmp_path, {
        "task": "from planted import evaluate\n",
        "evaluate": "from planted.program import run\n",
        "program": "def default():\n    from planted.task import make\n    return make\n",
        "clean": "def lazy():\n    import planted.task\n",
    })
    assert hidden_circles(graph) == [
        "planted.program imports planted.task inside a function, and planted.task imports "
        "planted.program"]
    assert len(folder_circles(graph)) == 3  # task -> evaluate -> program -> task
    assert "planted.clean imports planted.task inside a function" in \
        " ".join(undocumented_lazy(graph))
    flat = _plant(tmp_path / "again", {"a": "import planted.b\n", "b": "import planted.a\n"})
    assert folder_circles(flat) == [
        "planted.a imports planted.b, which leads back to it (a circle in planted)",
        "planted.b imports planted.a, which leads back to it (a circle in planted)"]


def test_every_module_is_named_in_its_rooms_row():
    """docs/architecture.md's "What each room holds" names each module of each room (8
    had been left out: where new work goes read wrong)."""
    rows = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        if line.startswith("| `") and "/` | " in line:
            room, modules = line.split(" | ")[:2]
            rows[room.strip("|` /")] = modules
    assert set(rows) == {"data", "ops", "sampling", "nn", "training", "bench", "cli",
                         "pallas"}
    for room, modules in rows.items():
        folder = ROOT / "zerognn_jax" / ("cli" if room == "cli" else f"_src/{room}")
        missing = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*.py"))
                   if p.name != "__init__.py" and f"`{p.name}`" not in modules]
        assert not missing, (room, missing)
