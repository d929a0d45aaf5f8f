"""One markdown table from the JSON lines of the peer runs.

    python3 benchmarks/peers/table.py OUT/peers.jsonl [more.jsonl ...]
    python3 benchmarks/peers/table.py --accuracy [--gap 2] OUT/peers.jsonl


Reads the summary line of each system (the last one wins): the baselines' own
(`"system"`, `epoch_seconds`, `peak_bytes`, ...) and zerognn-jax's, as `zerognn train
--metrics-out` writes it (`"summary": true`, `median_epoch_seconds`,
`peak_bytes_in_use`, `engine`, no `"system"`). A system that was cut off before its
summary gets a row from its epoch lines (the measures of its first epoch), marked
"(cut off)". Epoch time is the median over the epochs after the first, taken from the
epoch lines where a run has two or more. The speed column is each system's epoch time
over zerognn-jax's: how many times faster zerognn-jax is.

`--accuracy` (the Cora runs of `peers.sh --cora`, one summary line per system and
seed) prints instead each system's test accuracy per run, in file order, their mean
and standard deviation, and the mean's distance from zerognn-jax's in points; the exit
status is 1 unless every baseline's mean lies within `--gap` points of zerognn-jax's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

ZEROGNN = "zerognn-jax"
ALIASES = {
    "epoch_seconds": ("epoch_seconds", "median_epoch_seconds"),
    "peak_bytes": ("peak_bytes", "peak_bytes_in_use"),
    "gpu_fraction": ("gpu_fraction", "gpu_execution_fraction", "execution_fraction"),
    "syncs_per_step": ("syncs_per_step", "host_syncs_per_step"),
    "launches_per_step": ("launches_per_step", "kernel_launches_per_step"),
}
COLUMNS = ("system", "epoch s", "zerognn-jax faster by", "GPU fraction", "syncs/step",
           "launches/step", "peak GiB", "test acc")


def system_of(record: dict) -> str:
    """The baselines name themselves; zerognn's own lines have no name: scan or engine,
    and the dtype when it is not float32 (read from the summary's config)."""
    if record.get("system"):
        return record["system"]
    engine = record.get("engine", "scan")
    name = ZEROGNN if engine in (None, "scan") else f"{ZEROGNN} ({engine})"
    dtype = (record.get("config") or {}).get("dtype", "float32")
    return name if dtype == "float32" else f"{name}, {dtype}"


def pick(record: dict, field: str):
    for key in ALIASES.get(field, (field,)):
        if record.get(key) is not None:
            return record[key]
    return None


def read_records(paths) -> list[dict]:
    records = []
    for path in paths:
        with open(path) as handle:
            for line in handle:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # a line cut by a kill
    return records


def median_after_first(epochs: list[dict]) -> float | None:
    times = [e["epoch_seconds"] for e in epochs if e.get("epoch_seconds") is not None]
    kept = times[1:] or times
    return statistics.median(kept) if kept else None


def collect(records: list[dict]) -> tuple[dict, list[dict]]:
    """({system: summary row}, fanout check records); zerognn-jax's rows first.

    Epoch lines belong to the next summary line of the same system (zerognn's own
    lines carry no system name); a row's "_epochs" holds them. Epoch lines left with
    no summary after them make a row of their own, marked cut off.
    """
    rows, pending, checks = {}, {}, []
    for record in records:
        key = record.get("system")
        if "check" in record:
            checks.append(record)
        elif record.get("summary") or "median_epoch_seconds" in record:
            rows[system_of(record)] = dict(record, _epochs=pending.pop(key, []))
        elif "epoch" in record:
            pending.setdefault(key, []).append(record)
    for key, epochs in pending.items():
        name = key or ZEROGNN
        if name not in rows:
            rows[name] = dict(epochs[0], _epochs=epochs, test_acc=None, peak_bytes=None,
                              cut_off=True)
    order = sorted(rows, key=lambda s: not s.startswith(ZEROGNN))
    return {s: rows[s] for s in order}, checks


def epoch_seconds(row: dict) -> float | None:
    """Median epoch time after the warm-up epoch, from the epoch lines where there are
    two or more (zerognn's own summary takes the median over all epochs)."""
    epochs = row.get("_epochs") or []
    if len(epochs) >= 2:
        return median_after_first(epochs)
    return pick(row, "epoch_seconds")


def fmt(value, pattern: str) -> str:
    return "—" if value is None else pattern.format(value)


def table(rows: dict) -> str:
    base = epoch_seconds(rows[ZEROGNN]) if ZEROGNN in rows else None
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for system, row in rows.items():
        seconds = epoch_seconds(row)
        speed = seconds / base if seconds and base else None
        peak = pick(row, "peak_bytes")
        acc = row.get("test_acc")
        cells = [
            system + (" (cut off)" if row.get("cut_off") else ""),
            fmt(seconds, "{:.3g}"),
            fmt(speed, "{:.3g}x"),
            fmt(None if pick(row, "gpu_fraction") is None
                else 100 * pick(row, "gpu_fraction"), "{:.0f} %"),
            fmt(pick(row, "syncs_per_step"), "{:.1f}"),
            fmt(pick(row, "launches_per_step"), "{:.0f}"),
            fmt(None if peak is None else peak / 2**30, "{:.2f}"),
            fmt(None if acc is None else 100 * acc, "{:.1f} %"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def context(rows: dict) -> str:
    """Device and versions, from the first row that names them."""
    parts = []
    for key in ("device_name", "torch_version", "pyg_version", "jax_version"):
        value = next((r[key] for r in rows.values() if r.get(key)), None)
        if value:
            parts.append(f"{key.removesuffix('_version').removesuffix('_name')} {value}")
    return ", ".join(parts)


def accuracies(records: list[dict]) -> dict[str, list[float]]:
    """{system: test accuracy of each of its summary lines, in file order}, zerognn-jax's
    first; summaries without a test accuracy are left out."""
    runs: dict[str, list[float]] = {}
    for record in records:
        is_summary = record.get("summary") or "median_epoch_seconds" in record
        if is_summary and record.get("test_acc") is not None:
            runs.setdefault(system_of(record), []).append(float(record["test_acc"]))
    order = sorted(runs, key=lambda s: not s.startswith(ZEROGNN))
    return {s: runs[s] for s in order}


def accuracy_table(runs: dict[str, list[float]], gap: float) -> tuple[str, bool]:
    """(markdown table, whether every other system's mean is within `gap` points of
    zerognn-jax's); False when zerognn-jax has no run."""
    base = statistics.mean(runs[ZEROGNN]) * 100 if ZEROGNN in runs else None
    lines = ["| system | runs | test acc per run (%) | mean (%) | std | vs zerognn-jax |",
             "|---|---|---|---|---|---|"]
    holds = base is not None
    for system, accs in runs.items():
        pct = [100 * a for a in accs]
        mean = statistics.mean(pct)
        std = statistics.stdev(pct) if len(pct) > 1 else None
        diff = None if base is None or system == ZEROGNN else mean - base
        if diff is not None and abs(diff) > gap:
            holds = False
        cells = [system, str(len(pct)), ", ".join(f"{a:.1f}" for a in pct), f"{mean:.2f}",
                 fmt(std, "{:.2f}"), fmt(diff, "{:+.2f} points")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), holds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("jsonl", nargs="+")
    p.add_argument("--accuracy", action="store_true",
                   help="test accuracy per run and system, against zerognn-jax's")
    p.add_argument("--gap", type=float, default=2.0,
                   help="with --accuracy: the largest allowed distance, in points")
    args = p.parse_args(argv)
    if args.accuracy:
        runs = accuracies(read_records(args.jsonl))
        if not runs:
            print("no results found", file=sys.stderr)
            return 1
        text, holds = accuracy_table(runs, args.gap)
        print(text)
        verdict = "holds" if holds else "FAILS" if ZEROGNN in runs else "no zerognn-jax run"
        print(f"\nevery mean within {args.gap:g} points of zerognn-jax's: {verdict}")
        return 0 if holds else 1
    rows, checks = collect(read_records(args.jsonl))
    if not rows and not checks:
        print("no results found", file=sys.stderr)
        return 1
    if rows:
        print(table(rows))
        print(f"\n{context(rows)}")
    for c in checks:
        verdict = "ok" if c.get("ok") else "FAILED: " + "; ".join(c.get("problems", []))
        print(f"fanout check {c.get('system')}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
