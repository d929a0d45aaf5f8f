"""What the benchmark scripts share about their result rows: each printed as a JSON line
and appended to the script's file as it comes (kept if a later run is killed), and a
table cell listing one field of several runs; and the argparse type of a list of names."""

from __future__ import annotations

import argparse
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


def names_of(text: str, known, what: str) -> list[str]:
    """argparse type: comma-separated names, each one of `known` (refused naming the
    others and the choices: a KeyError, or an error after the data were prepared,
    before)."""
    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if n not in known]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown {what}(s) {', '.join(map(repr, bad))}; "
                                         f"choose from {', '.join(known)}")
    return names
