"""Where a data-parallel epoch's time goes on each device, from `benchmarks/scaling.py
--trace` traces: span, busy and idle time, and time inside NCCL collectives (which
includes waiting for the slower device).

    PYTHONPATH=. python3 benchmarks/dp_trace.py TRACE_DIR [--steps N]

TRACE_DIR is searched for `*.trace.json.gz`; `--steps` (the traced epoch's steps per
device) turns totals into per-step microseconds. Prints one JSON line per device.
"""

import argparse
import json
import pathlib

from zerognn_jax._src.bench import profiling


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace_dir")
    p.add_argument("--steps", type=int, default=0)
    args = p.parse_args()
    traces = sorted(pathlib.Path(args.trace_dir).rglob("*.trace.json.gz"))
    if not traces:
        raise SystemExit(f"no *.trace.json.gz under {args.trace_dir}")
    for trace in traces:
        for device, row in profiling.collective_breakdown(trace).items():
            record = {"trace": str(trace.relative_to(args.trace_dir)), "device": device, **row}
            if args.steps:
                record.update({k.replace("_seconds", "_us_per_step"): v * 1e6 / args.steps
                               for k, v in row.items() if k.endswith("_seconds")})
            print(json.dumps(record))


if __name__ == "__main__":
    main()
