"""One markdown table from the JSON lines of the link-prediction runs (link_peers.sh).

    python3 benchmarks/peers/link_table.py OUT/link.jsonl [more.jsonl ...]

Reads the last line of each system: the peers' and zerognn_link.py's summaries
(`"task": "link"`, named by `"system"`) and benchmarks/link.py's rows (no name: one per
engine, shown as "zerognn-jax, link.py ENGINE"; they carry no metrics). The speed column
is zerognn-jax's positive edges per second over each system's (how many times faster
zerognn-jax is); the metric columns come from exact inference after each run's steps,
and the gap is each system's test AUC (MRR where zerognn-jax has one) less zerognn-jax's,
in points.
"""

from __future__ import annotations

import argparse
import sys

from table import ZEROGNN, context, fmt, read_records

COLUMNS = ("system", "steps", "ms/step", "positive edges/s", "epoch s (extrapolated)",
           "zerognn-jax faster by", "GPU fraction", "syncs/step", "test AUC", "test MRR",
           "gap (points)")


def system_of(record: dict) -> str | None:
    """The run's name, or None for a line that is no link result."""
    if record.get("task") == "link" and record.get("summary"):
        return record["system"]
    if "positive_edges_per_second" in record and "engine" in record:
        return f"{ZEROGNN}, link.py {record['engine']}"
    return None


def collect(records: list[dict]) -> dict[str, dict]:
    """{system: its last record}, zerognn-jax's rows first."""
    rows = {}
    for record in records:
        name = system_of(record)
        if name is not None:
            rows[name] = record
    order = sorted(rows, key=lambda s: not s.startswith(ZEROGNN))
    return {s: rows[s] for s in order}


def ranking_metric(rows: dict) -> str:
    """"test_mrr" where zerognn-jax reports one, else "test_auc"."""
    return "test_mrr" if rows.get(ZEROGNN, {}).get("test_mrr") is not None else "test_auc"


def table(rows: dict) -> str:
    base = rows.get(ZEROGNN, {})
    metric = ranking_metric(rows)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for system, row in rows.items():
        eps = row.get("positive_edges_per_second")
        speed = base.get("positive_edges_per_second") / eps \
            if eps and base.get("positive_edges_per_second") else None
        gap = None if row.get(metric) is None or base.get(metric) is None \
            or system == ZEROGNN else 100 * (row[metric] - base[metric])
        frac = row.get("gpu_fraction")
        cells = [system, fmt(row.get("steps", row.get("steps_timed")), "{}"),
                 fmt(row.get("ms_per_step"), "{:.3g}"), fmt(eps, "{:,.0f}"),
                 fmt(row.get("epoch_seconds"), "{:.4g}"), fmt(speed, "{:.3g}x"),
                 fmt(None if frac is None else 100 * frac, "{:.0f} %"),
                 fmt(row.get("syncs_per_step"), "{:.1f}"),
                 fmt(row.get("test_auc"), "{:.4f}"), fmt(row.get("test_mrr"), "{:.4f}"),
                 fmt(gap, "{:+.2f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("jsonl", nargs="+")
    args = p.parse_args(argv)
    rows = collect(read_records(args.jsonl))
    if not rows:
        print("no results found", file=sys.stderr)
        return 1
    print(table(rows))
    print(f"\n{context(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
