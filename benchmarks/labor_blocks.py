"""Training epochs of uniform sampling, LABOR-0 in row form and LABOR-0 in edge form.

    PYTHONPATH=. python3 benchmarks/labor_blocks.py --root .cache/zerognn --out $OUT/labor.jsonl

Workload: products-like (generated into `--root` when missing), the library's SAGE
defaults (3 x 256, fanouts 15,10,5, batch 1024, Adam 3e-3, kernels auto, calibrated
envelope, capacities in multiples of 1024). Runs (`--runs`, sampler form:dtype):

- `uniform`: uniform sampling in the library's default layout (tree for SAGE);
- `labor-rows`: LABOR-0 with [C, K] row blocks (`edge_blocks=False`: before edge blocks);
- `labor-edges`: LABOR-0 with edge blocks (the default for LABOR), flat outer hop;
- `labor-edges-dedup`: the same with the outermost level deduplicated too.

First a check: one step sampled in row form and in edge form holds the same levels and
edges, and the model's float32 outputs on both agree (max abs difference reported).
Then per run: calibration, a first epoch (compile included), `--repeats` timed epochs
(median), and the exact test accuracy after those 1 + repeats epochs (`--eval`, each
run trained from the same seed). One JSON line per result goes to stdout and `--out` as
it comes; the table is printed last. `--budget` seconds: runs that would start later
are reported as skipped. On a CPU: `--scale 0.01 --repeats 1 --runs uniform:float32,
labor-rows:float32,labor-edges:float32`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.sampling.calibrate import choose_envelope
from zerognn_jax._src.sampling.steps import sample_step
from zerognn_jax._src.training import trainer
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.program import init_state
from zerognn_jax._src.training.scan import ScanEngine

FORMS = {
    "uniform": {"sampler": "uniform"},
    "labor-rows": {"sampler": "labor", "edge_blocks": False},
    "labor-edges": {"sampler": "labor", "edge_blocks": True},
    "labor-edges-dedup": {"sampler": "labor", "edge_blocks": True, "flat_outer": False},
}
RUNS = ("uniform:bfloat16,labor-rows:bfloat16,labor-edges:bfloat16,labor-edges-dedup:bfloat16,"
        "uniform:float32,labor-rows:float32,labor-edges:float32")


class Output:
    """Prints JSON lines and appends them to `path` as they come."""

    def __init__(self, path: str | None):
        self.path, self.records = path, []

    def __call__(self, record: dict):
        self.records.append(record)
        line = json.dumps(record)
        print(line, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(line + "\n")


def prepared(base: TrainConfig, dataset, form: str, dtype: str):
    cfg = dataclasses.replace(base, dtype=dtype, **FORMS[form])
    _, data, program = trainer.prepare(cfg, dataset)
    t0 = time.perf_counter()
    env, cal = choose_envelope(data.graph, dataset.train_idx, cfg.batch_size, program.sampler,
                               seed=cfg.seed, policy=cfg.envelope_policy,
                               kernels=program.kernels)
    return cfg, data, program, env, cal, time.perf_counter() - t0


def check_forms(base: TrainConfig, dataset) -> dict:
    """One step of LABOR in row and in edge form: equal counts and live edges, and the
    float32 model outputs of both under the same parameters."""
    rows = prepared(base, dataset, "labor-rows", "float32")
    edges = prepared(base, dataset, "labor-edges", "float32")
    _, data, program, env, _, _ = edges
    perm = jnp.asarray(dataset.train_idx[:base.batch_size], jnp.int32)
    state = init_state(program, data, env, dataset.train_idx)
    out = {}
    for name, (_, dat, prog, envelope, _, _) in (("rows", rows), ("edges", edges)):
        def logits(params, dat, prog=prog, envelope=envelope):
            mb = sample_step(dat.graph, perm, 0, seed=prog.seed, epoch=0,
                             batch_size=prog.batch_size, config=prog.sampler,
                             envelope=envelope, kernels=prog.kernels).mb
            x = prog.model_input({}, dat, mb, in_mesh=False)
            y = prog.model.apply({"params": params}, x, prog.views(dat, mb, inference=False),
                                 train=False)
            return y, mb.counts, mb.num_edges()
        out[name] = jax.device_get(jax.jit(logits)(state.params, dat))
    hops = len(base.fanouts)
    (y_r, c_r, e_r), (y_e, c_e, e_e) = out["rows"], out["edges"]
    levels_equal = bool(np.array_equal(c_r[:hops + 1], c_e[:hops + 1]))
    diff = float(np.max(np.abs(np.asarray(y_r, np.float64) - y_e)))
    return {"kind": "check", "levels_equal": levels_equal, "edges_equal": int(e_r) == int(e_e),
            "edges": int(e_e), "max_abs_logit_diff": diff,
            "passed": levels_equal and int(e_r) == int(e_e) and diff < 1e-3}


def measure(base: TrainConfig, dataset, form: str, dtype: str, repeats: int,
            evaluate: bool) -> dict:
    cfg, data, program, env, cal, cal_s = prepared(base, dataset, form, dtype)
    items = jnp.asarray(dataset.train_idx, jnp.int32)
    engine = ScanEngine(program, sample_ahead=cfg.sample_ahead, policy=cfg.envelope_policy)
    state = init_state(program, data, env, dataset.train_idx)
    t0 = time.perf_counter()
    res = engine.run_epoch(state, data, items, 0, env)
    jax.block_until_ready(res.state.params)
    first = time.perf_counter() - t0
    times = []
    for epoch in range(1, repeats + 1):
        t0 = time.perf_counter()
        res = engine.run_epoch(res.state, data, items, epoch, res.envelope)
        jax.block_until_ready(res.state.params)
        times.append(time.perf_counter() - t0)
    record = {"kind": "run", "form": form, "dtype": dtype, "layout": program.layout.name,
              "epoch_seconds": round(statistics.median(times), 4),
              "runs": [round(t, 4) for t in times], "first_epoch_seconds": round(first, 2),
              "calibrate_seconds": round(cal_s, 2), "loss": round(res.loss, 5),
              "overflows": res.overflows, "envelope": list(res.envelope.levels),
              "edge_budgets": list(res.envelope.edges),
              "mean_counts": None if cal is None else [round(c) for c in cal.mean_counts],
              "epochs_trained": repeats + 1}
    if evaluate:
        t0 = time.perf_counter()
        metrics = trainer.evaluate(cfg, program, {"params": res.state.params}, data, dataset)
        record.update({k: round(float(v), 4) for k, v in metrics.items()
                       if isinstance(v, float | int)})
        record["eval_seconds"] = round(time.perf_counter() - t0, 1)
    return record


def table(records) -> str:
    lines = ["| run | layout | epoch s | first epoch s | test acc | overflows |",
             "|---|---|---|---|---|---|"]
    for r in records:
        if r.get("kind") == "run":
            acc = r.get("test_acc", "-")
            lines.append(f"| {r['form']}:{r['dtype']} | {r['layout']} | {r['epoch_seconds']} "
                         f"| {r['first_epoch_seconds']} | {acc} | {r['overflows']} |")
        elif r.get("kind") == "skipped":
            lines.append(f"| {r['run']} | skipped ({r['reason']}) | | | | |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="products-like")
    p.add_argument("--root", default=None)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--runs", default=RUNS, help=f"form:dtype,...; forms {', '.join(FORMS)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--eval", default="bfloat16",
                   help="dtypes whose runs report exact test accuracy ('' for none)")
    p.add_argument("--budget", type=float, default=390.0,
                   help="seconds; runs that would start later are skipped")
    p.add_argument("--out", default=None, help="append JSON lines to this file")
    args = p.parse_args()
    start = time.perf_counter()
    out = Output(args.out)
    base = TrainConfig(dataset=args.dataset, root=args.root, scale=args.scale,
                       eval_mode="full", progress=False)
    dataset = trainer.prepare(base)[0]
    out({"kind": "setup", "device": jax.devices()[0].device_kind, "jax": jax.__version__,
         "dataset": dataset.name, "scale": args.scale, "num_nodes": dataset.num_nodes,
         "load_seconds": round(time.perf_counter() - start, 1)})
    out(check_forms(base, dataset))
    eval_dtypes = set(filter(None, args.eval.split(",")))
    for run in filter(None, args.runs.split(",")):
        form, _, dtype = run.partition(":")
        if form not in FORMS:
            p.error(f"unknown form {form!r}; choose from {', '.join(FORMS)}")
        if time.perf_counter() - start > args.budget:
            out({"kind": "skipped", "run": run, "reason": f"past the {args.budget:.0f} s budget"})
            continue
        out(measure(base, dataset, form, dtype or "float32", args.repeats,
                    (dtype or "float32") in eval_dtypes))
    print(table(out.records), flush=True)


if __name__ == "__main__":
    main()
