"""The rooms of the library import one another only downward (docs/architecture.md).

Every import in the package, module level or inside a function, is read from the
source with `ast` and checked against the table below; a new import across rooms must
either fit it or change the table and the document together.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# room -> the rooms it may import (besides itself).
ALLOWED = {
    "pallas_kernels": set(),
    "data": set(),
    "ops": {"pallas_kernels"},
    "sampling": {"pallas_kernels", "data", "ops"},
    "nn": {"pallas_kernels", "ops"},
    "training": {"data", "ops", "sampling", "nn"},
    "bench": {"data", "ops", "sampling", "nn", "training"},
    "cli": {"data", "ops", "sampling", "nn", "training", "bench"},
    "api": {"data", "ops", "sampling", "nn", "training"},
}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "pallas_kernels":
        return "pallas_kernels"
    if parts[0] != "zerognn_jax":
        return None
    if len(parts) == 1 or parts[1:] == ["_src"]:
        return "api"  # the package and its (empty) private root
    if parts[1] == "cli":
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


def sources():
    for top in ("zerognn_jax", "pallas_kernels"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
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
