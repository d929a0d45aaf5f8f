"""What the benchmark scripts share about their result rows: each printed as a JSON line
and appended to the script's file as it comes (kept if a later run is killed), and a
table cell listing one field of several runs."""

from __future__ import annotations

import json
import pathlib


def record(row: dict, folder: pathlib.Path, name: str) -> None:
    """Prints `row` as one JSON line and appends it to `folder`/`name`."""
    print(json.dumps(row), flush=True)
    with open(folder / name, "a") as f:
        f.write(json.dumps(row) + "\n")


def each(runs: list[dict], key: str, fmt: str) -> str:
    """Every run's `key`, formatted with `fmt`, comma-joined (a table cell)."""
    return ", ".join(format(r[key], fmt) for r in runs)
