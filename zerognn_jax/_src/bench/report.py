"""What `zerognn bench` prints and draws from its records: summary, table and plot.

`python -m zerognn_jax._src.bench.report FILE.jsonl... [--plot PNG]` renders them again
from the JSON lines of one or several runs (`--out` appends), each run on its own (a
fresh summary replaces its own; `runs_of`).
"""

from __future__ import annotations

import argparse
import json
import sys

from zerognn_jax._src.data.writes import writing

SCAN_CONFIGS = ("scan-xla", "scan-pallas", "scan-cmdbuf", "scan-tree", "scan-bf16")
GOALS = {"speedup_vs_host_exact": 5.0, "gpu_fraction": 0.95, "epoch_seconds": 0.3}
# The workload the epoch time's goal was set on (an epoch of another is no measure of it).
GOAL_WORKLOAD = {"dataset": "products-like", "scale": 1.0, "batch_size": 1024}


SWEPT = ("scan-xla", "host-bucketed")
KINDS = ("config", "sweep", "check", "phases", "summary")


def _ok(records: list[dict], kind: str) -> dict[str, dict]:
    return {r["config"]: r for r in records if r["kind"] == kind and r["status"] == "ok"}


def sweep_points(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """{config: [(batch size, step seconds)]} from the sweep and the main configurations."""
    points = {name: {} for name in SWEPT}
    for r in records:
        if r["kind"] in ("sweep", "config") and r["status"] == "ok" and r["config"] in SWEPT:
            points[r["config"]][r["batch_size"]] = r["epoch_seconds"] / r["steps_per_epoch"]
    return {name: sorted(p.items()) for name, p in points.items() if p}


def summarize(records: list[dict]) -> dict | None:
    """Speed-ups over the host baselines, measured/floor, and the issue's goals per scan config.

    Goals: at least 5x host-exact's epoch time, a GPU execution fraction of at least
    95 %, an epoch under 0.3 s (of `GOAL_WORKLOAD` alone: None, "n/a", for another).
    None when no configuration was measured.
    """
    configs = _ok(records, "config")
    if not configs:
        return None
    phases = next((r for r in records if r["kind"] == "phases" and r["status"] == "ok"), None)
    summary = {"kind": "summary", "status": "ok"}
    for base in ("host-exact", "host-bucketed"):
        if base in configs:
            summary[f"speedup_vs_{base}"] = {
                name: configs[base]["epoch_seconds"] / r["epoch_seconds"]
                for name, r in configs.items()}
    if phases is not None:
        summary["measured_over_floor"] = {
            name: r["epoch_seconds"] / phases["floor_epoch_seconds"]
            for name, r in configs.items()}
    speedups = summary.get("speedup_vs_host-exact", {})
    summary["goals"] = {
        name: {"speedup_vs_host_exact": _at_least(speedups.get(name),
                                                  GOALS["speedup_vs_host_exact"]),
               "gpu_fraction": _at_least(r["gpu_fraction"], GOALS["gpu_fraction"]),
               "epoch_seconds": r["epoch_seconds"] < GOALS["epoch_seconds"]
               if all(r.get(k) == v for k, v in GOAL_WORKLOAD.items()) else None}
        for name, r in configs.items() if name in SCAN_CONFIGS}
    return summary


def _at_least(value, goal) -> bool | None:
    return None if value is None else value >= goal


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    """`value * scale` formatted by `spec` ("8.3f"), or "-" at the same width."""
    width = int(spec.split(".")[0])
    return f"{'-':>{width}}" if value is None else format(value * scale, spec)


def _config_rows(records: list[dict], summary: dict | None) -> list[str]:
    speedups = (summary or {}).get("speedup_vs_host-exact", {})
    width = max([14, *(len(r["config"]) for r in records if r["kind"] == "config")])
    head = (f"{'config':<{width}} {'epoch s':>8} {'compile s':>9} {'steps/s':>8} {'Medges/s':>9} "
            f"{'gpu% tr':>7} {'gpu% un':>7} {'peak GiB':>8} {'env/ideal':>9} {'vs exact':>8}")
    rows = [head, "-" * len(head)]
    for r in records:
        if r["kind"] != "config":
            continue
        if r["status"] != "ok":
            rows.append(f"{r['config']:<{width}} {r['status']}: {str(r['reason'])[:90]}")
            continue
        rows.append(
            f"{r['config']:<{width}} {_fmt(r['epoch_seconds'], '8.3f')} "
            f"{_fmt(r['compile_seconds'], '9.1f')} {_fmt(r['steps_per_second'], '8.1f')} "
            f"{_fmt(r['sampled_edges_per_second'], '9.1f', 1e-6)} "
            f"{_fmt(r['gpu_fraction'], '7.1f', 100)} "
            f"{_fmt(r['gpu_fraction_untraced'], '7.1f', 100)} "
            f"{_fmt(r['peak_bytes_in_use'], '8.2f', 2**-30)} "
            f"{_fmt(r['envelope_over_ideal'], '9.2f')} "
            f"{_fmt(speedups.get(r['config']), '7.1f')}x"
            + (" (extrapolated)" if r["extrapolated"] else ""))
    return rows


def _other_rows(records: list[dict]) -> list[str]:
    rows = []
    for r in records:
        if r["kind"] in ("check", "phases") and r["status"] != "ok":  # no figures
            rows.append(f"{r['kind']} {r['config']}: {r['status']}: {r.get('reason', '')}")
        elif r["kind"] == "check":
            rows.append(
                f"check {r['config']} over {r['steps_timed']} steps: {r['status']} "
                f"(counts equal {r['counts_equal']}, edges equal {r['edges_equal']}, "
                f"loss rel diff first {r['loss_rel_diff_first']:.1e} "
                f"max {r['loss_rel_diff_max']:.1e})")
        elif r["kind"] == "phases":
            parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in r["bytes_per_step"].items())
            rows.append(
                f"phases: sampling-only epoch {r['sample_epoch_seconds']:.3f} s, "
                f"sampling+gather {r['sample_gather_epoch_seconds']:.3f} s; copy bandwidth "
                f"{r['copy_bandwidth_bytes_per_second'] / 1e9:.0f} GB/s; per step {parts}; "
                f"bytes floor {r['floor_epoch_seconds']:.4f} s/epoch")
    for name, points in sweep_points(records).items():
        if len(points) < 2:  # the configuration's own batch alone: no sweep was asked
            continue
        rows.append(f"step time (ms) vs batch size, {name}: " + ", ".join(
            f"b={b} {t * 1e3:.2f}" for b, t in points))
    return rows


def format_table(records: list[dict]) -> str:
    """The human-readable end of the output."""
    summary = next((r for r in records if r["kind"] == "summary"), None)
    rows = _config_rows(records, summary) + _other_rows(records)
    if summary is not None:
        for name, goals in summary["goals"].items():
            rows.append(f"goals {name}: " + ", ".join(f"{k} {'met' if v else 'MISSED'}"
                                                      if v is not None else f"{k} n/a"
                                                      for k, v in goals.items()))
    return "\n".join(rows)


PLOT_NEEDS = "--plot needs matplotlib: pip install 'zerognn-jax[plot]'"


def plot(records: list[dict], path: str) -> None:
    """A PNG: epoch time and GPU execution fraction per config; step time vs batch size."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError(PLOT_NEEDS) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(_ok(records, "config").values())
    fig, (ax_time, ax_frac, ax_sweep) = plt.subplots(1, 3, figsize=(16, 4.8))
    names = [r["config"] for r in configs]
    ax_time.bar(names, [r["epoch_seconds"] for r in configs], color="tab:blue")
    ax_time.set(ylabel="epoch time (s)", yscale="log", title="Epoch time")
    fractions = [100 * (r["gpu_fraction"] or 0.0) for r in configs]
    ax_frac.bar(names, fractions, color="tab:green")
    ax_frac.set(ylabel="GPU busy / wall (%)", ylim=(0, 100),
                title="GPU execution fraction (profiled epoch; 0 = not measured)")
    for (name, points), style in zip(sweep_points(records).items(), ("o-", "s--")):
        batch, seconds = zip(*points)
        ax_sweep.plot(batch, [1e3 * t for t in seconds], style, label=name)
    ax_sweep.set(xlabel="batch size", ylabel="step time (ms)", xscale="log", yscale="log",
                 title="Step time vs batch size")
    if ax_sweep.lines:
        ax_sweep.legend()
    for ax in (ax_time, ax_frac):
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    with writing("bench plot", path):
        fig.savefig(path, dpi=110)
    plt.close(fig)


def runs_of(records: list[dict]) -> list[list[dict]]:
    """`records` (one or several runs appended to one file) cut into runs: each ends with
    its summary record (dropped here; `zerognn bench` writes one however a run ends, a
    file written before 2026-12-01 may lack it after a run that measured nothing), and
    records after the last summary are one more. Ratios and sweeps compare records of
    one run only."""
    runs, current = [], []
    for record in records:
        if record.get("kind") == "summary":
            runs.append(current)
            current = []
        else:
            current.append(record)
    return [run for run in (*runs, current) if run]


def _read(path: str) -> list[dict]:
    """The records of `path`, one JSON object a line; ValueError naming the first line
    that is not a record of `zerognn bench` (another command's JSON, a list)."""
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}, line {number}, is not a JSON record "
                                     f"({err.msg})") from None
                if not _is_record(record):
                    raise ValueError(f"{path}, line {number}, is not a record of zerognn "
                                     f"bench: {line.strip()[:80]!r}")
                records.append(record)
    return records


def _is_record(record) -> bool:
    """Whether `record` has what the report reads: a kind of `KINDS` and, but for a
    summary, the configuration and status."""
    if not isinstance(record, dict) or record.get("kind") not in KINDS:
        return False
    return record["kind"] == "summary" or {"config", "status"} <= record.keys()


def main(argv=None) -> int:
    """Prints each run's summary (as a JSON line) and table from saved records."""
    parser = argparse.ArgumentParser(prog="python -m zerognn_jax._src.bench.report")
    parser.add_argument("files", nargs="+", help="JSON lines written by `zerognn bench`")
    parser.add_argument("--plot", help="also write the PNG here (of the last run)")
    args = parser.parse_args(argv)
    try:
        saved = [r for name in args.files for r in _read(name)]
    except (OSError, ValueError) as err:
        parser.error(str(err))
    runs = runs_of(saved)
    for records in runs:
        summary = summarize(records)
        if summary is not None:
            records.append(summary)
            print(json.dumps(summary))
        print(format_table(records))
    if args.plot and runs:
        plot(runs[-1], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
