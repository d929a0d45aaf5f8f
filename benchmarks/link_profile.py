"""Where a link-prediction step's time goes (issue #37), form by form, on one GPU.

    PYTHONPATH=. python3 benchmarks/link_profile.py --data F.npz [--forms f32,bf16,...]
        [--profile f32,bf16] [--steps 300] [--repeats 3] [--top 12]

The workload is benchmarks/link_peers.sh's (products-like's split in a
`benchmarks/peers/link_data.py` file, written first if `--data` does not exist; SAGE
3x256, fanouts 15,10,5, 1024 positives a step, one destination-corrupted negative
each, Adam 3e-3), on the scan engine as `benchmarks/peers/zerognn_link.py` runs it.
Each form changes one thing:

  f32, bf16         the library's step in float32, bfloat16
  *-every-row       the seed-edge mask checks every row of every block (as before
                    it checked only the endpoints' rows of deduplicated levels)
  *-keep            no seed-edge mask: the step's positives stay readable (an
                    ablation; not a valid protocol)
  *-tree            every level in slot order (tree layout)
  *-no-flat         the outermost level deduplicated too (no flat outer hop)
  *-shared64        64 negatives a positive, shared by the step's positives
                    (`negative_mode="shared"`) instead of one destination each
  *-host            the host-mediated engine (host-bucketed, every level
                    deduplicated, as it requires) instead of the scan engine, which
                    samples `sample_ahead` (the library's default) steps at once, as
                    `zg.train` runs it

Per form: the envelope calibrated on the first `--steps` steps, a compiling warm-up,
`--repeats` timed runs of those steps from the same state (median), the last run's
mean loss; for the forms in `--profile`, one more run under `jax.profiler` (with
`XLA_FLAGS=--xla_gpu_enable_command_buffer=` for kernels named one by one:
bench/profiling.py): device time per step split into phases by
the named scopes of each kernel's operation (sampling, the seed-edge mask, the
feature gather, the model's forward and backward, the optimizer's update; see
`bench/profiling.step_profile`) and the busiest kernels with the operation each
came from (`--hlo-dir` keeps the optimized programs). JSON lines, then a table.
On a CPU (a small split) everything runs but the profile's device lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import jax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "peers"))

import link_data  # noqa: E402
import zerognn_link  # noqa: E402

import zerognn_jax as zg  # noqa: E402
from zerognn_jax._src.bench import profiling  # noqa: E402
from zerognn_jax._src.training.trainer import prepare  # noqa: E402

DTYPES = {"f32": "float32", "bf16": "bfloat16"}
VARIANTS = ("", "-every-row", "-keep", "-tree", "-no-flat", "-shared64", "-host")
FORMS = tuple(d + v for d in DTYPES for v in VARIANTS)
def build(form: str, args, programs: dict):
    """(engine, program, device data, training items, envelope) of `form`; `programs`
    caches one prepared run per (dtype, layout, flat outer hop, negatives)."""
    dtype = DTYPES[form.split("-")[0]]
    layout = "tree" if form.endswith("-tree") else "auto"
    flat = False if form.endswith(("-no-flat", "-host")) else None
    shared = form.endswith("-shared64")
    key = (dtype, layout, flat, shared)
    if key not in programs:
        args.dtype, args.layout = dtype, layout
        cfg = dataclasses.replace(zerognn_link.config(args, "auc"), flat_outer=flat)
        if shared:
            cfg = dataclasses.replace(cfg, negatives=64, negative_mode="shared")
        dataset, data, program = prepare(cfg)
        train = program.task.train_items(dataset)
        items = train[: args.steps * args.batch]
        env, _ = zg.choose_envelope(data.graph, items, args.batch, program.sampler,
                                    seed=args.seed, policy=cfg.envelope_policy,
                                    kernels=program.kernels, source=program.task)
        programs[key] = (program, data, items, env, cfg.sample_ahead)
    program, data, items, env, ahead = programs[key]
    task = program.task
    if form.endswith("-every-row"):
        task = dataclasses.replace(task, unique_levels=1)
    elif form.endswith("-keep"):
        task = dataclasses.replace(task, exclude_seed_edges=False)
    program = dataclasses.replace(program, task=task)
    engine = zg.make_engine("host-bucketed", program) if form.endswith("-host") else \
        zg.make_engine("scan", program, sample_ahead=ahead)
    return engine, program, data, items, env


def measure(form: str, args, programs: dict, profile: bool) -> dict:
    engine, program, data, items, env = build(form, args, programs)

    def run():  # the engine donates its state: each run starts from a fresh one
        state = zg.init_state(program, data, env, items)
        jax.block_until_ready(state.params)
        t0 = time.perf_counter()
        res = engine.run_epoch(state, data, items, 0, env)
        jax.block_until_ready(res.state.params)
        return res, time.perf_counter() - t0

    res, _ = run()
    times = []
    for _ in range(args.repeats):
        res, seconds = run()
        times.append(seconds)
    seconds = statistics.median(times)
    record = {"form": form, "ms_per_step": round(1e3 * seconds / res.steps, 3),
              "positive_edges_per_second": round(res.steps * args.batch / seconds),
              "runs": [round(t, 4) for t in times], "steps": res.steps,
              "loss": round(res.loss, 5), "overflows": res.overflows,
              "envelope": list(res.envelope.levels),
              "compile_seconds": round(engine.compile_seconds, 1),
              "layout": program.layout.name if program.layout else None}
    if profile and not form.endswith("-host"):
        with tempfile.TemporaryDirectory() as tmp:
            state = zg.init_state(program, data, env, items)
            jax.block_until_ready(state.params)
            with profiling.traced_window(tmp):
                res = engine.run_epoch(state, data, items, 0, env)
                jax.block_until_ready(res.state.params)
            (compiled,) = engine.programs.values()  # names are unique within a program
            text = compiled.as_text()
            trace = profiling.find_trace(tmp)
            record.update(profiling.step_profile(trace, text, res.steps, profiling.step_phase,
                                                 args.top))
            if args.hlo_dir:
                pathlib.Path(args.hlo_dir, f"{form}.hlo.txt").write_text(text)
    return record


def table(records: list[dict]) -> str:
    phases = []
    for r in records:
        phases += [p for p in r.get("phases_us_per_step", {}) if p not in phases]
    head = ["form", "ms/step", "positives/s", "loss"] + [f"{p} us" for p in phases]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        cells = [r["form"], f"{r['ms_per_step']:.3f}", f"{r['positive_edges_per_second']:,}",
                 f"{r['loss']:.5f}"]
        got = r.get("phases_us_per_step", {})
        cells += [f"{got[p][0]:.0f}" if p in got else "" for p in phases]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True,
                   help="link split file (benchmarks/peers/link_data.py); written if absent")
    p.add_argument("--scale", type=float, default=1.0, help="of a split written here")
    p.add_argument("--root", default=None, help="zerognn-jax's data folder, for a split "
                   "written here")
    p.add_argument("--forms", default="f32,f32-every-row,f32-keep,bf16,bf16-keep")
    p.add_argument("--profile", default="f32,bf16", help="forms to profile")
    p.add_argument("--top", type=int, default=12, help="kernels listed per profile")
    zerognn_link.add_workload_arguments(p)
    p.add_argument("--hlo-dir", default=None,
                   help="write each profiled form's optimized HLO here (<form>.hlo.txt)")
    p.add_argument("--out", default=None, help="append the JSON lines here")
    args = p.parse_args(argv)
    forms = [f for f in args.forms.split(",") if f]
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        p.error(f"unknown forms {unknown}; choose from {', '.join(FORMS)}")
    if not os.path.exists(args.data):
        link_data.main(["--scale", str(args.scale), "--seed", str(args.seed), "--out",
                        args.data] + (["--root", args.root] if args.root else []))
    zg.register_task(zerognn_link.SavedLinkTask)
    print(json.dumps({"device": jax.devices()[0].device_kind, "jax": jax.__version__}),
          flush=True)
    profiled = set(args.profile.split(","))
    programs, records = {}, []
    for form in forms:
        record = measure(form, args, programs, form in profiled)
        records.append(record)
        print(json.dumps(record), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(record) + "\n")
    print(table(records))
    return records


if __name__ == "__main__":
    main()
