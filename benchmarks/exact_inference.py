"""Exact layer-wise inference on papers100m-like, layer by layer, with a kernel table.

    python benchmarks/exact_inference.py --root DIR [--scale 0.05] [--dtype bfloat16] \\
        [--variants f32+drop,native+last] [--trace-dir DIR]

Generates (or reuses) the papers100m-like dataset directory that benchmarks/papers100m.py
uses, puts it on the device, initialises SAGE (3 x `--hidden`, untrained: the work does
not depend on the weights) and times `layerwise_logits`' layers one at a time, compile
apart. A variant names how an exact edge chunk sums (or maxes) its edges into their
destinations, `ACC+PAD[+unsorted]`:

  ACC       f32: float32 accumulation; f32g: the same, behind an optimisation barrier
            on the gathered edge rows (XLA cannot move the conversion onto the whole
            input); native: in the model's dtype
  PAD       drop: padding slots out of range, dropped; last: padding slots added
            (weight 0) into the chunk's last row
  unsorted  the segment ops are not told that destinations are sorted

`f32+drop` is the library's form; `native+last+unsorted` the form before 2026-11-23.

With `--trace-dir`, each variant's first layer is run once more under the profiler, and
its kernels are summed by name (top 8). One JSON line per layer and variant on stdout,
then a table. CPU smoke run: --scale 0.0005 --hidden 32.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from zerognn_jax._src.bench import profiling
from zerognn_jax._src.data import papers
from zerognn_jax._src.data.storage import is_dataset_dir, load_dir
from zerognn_jax._src.nn.views import EdgeView
from zerognn_jax._src.sampling.envelope import conservative
from zerognn_jax._src.training import evaluate, trainer
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.program import init_state

VARIANTS = ("f32+drop", "f32+drop+unsorted", "native+last", "native+last+unsorted")


def view_class(variant: str) -> type:
    """EdgeView whose segment sum and max follow `variant`."""
    accumulate, padding, *rest = variant.split("+")
    if (accumulate not in ("f32", "f32g", "native") or padding not in ("drop", "last")
            or rest not in ([], ["unsorted"])):
        raise ValueError(f"variant must be ACC+PAD[+unsorted] with ACC f32, f32g or native "
                         f"and PAD drop or last; got {variant!r}")
    is_sorted = not rest

    class View(EdgeView):
        def _scatter_index(self):
            return EdgeView._scatter_index(self) if padding == "drop" else self.dst

        def _segment_sum(self, values):
            if accumulate == "f32g":
                values = jax.lax.optimization_barrier(values)
            acc = values if accumulate == "native" else values.astype(jnp.float32)
            out = jax.ops.segment_sum(acc, self._scatter_index(), num_segments=self.num_dst,
                                      indices_are_sorted=is_sorted)
            return out.astype(values.dtype)

        def _segment_max(self, values):
            return jax.ops.segment_max(values, self._scatter_index(),
                                       num_segments=self.num_dst, indices_are_sorted=is_sorted)

    return View


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def dataset_dir(args) -> Path:
    path = Path(args.root) / f"papers100m-like-{args.scale:g}-{args.seed}-{args.dtype}"
    if not is_dataset_dir(path):
        log(f"generating {path}")
        papers.write_papers100m_like(path, args.scale, args.seed, feature_dtype=args.dtype,
                                     log=log)
    return path


def kernel_table(trace: Path, top: int = 8) -> list[dict]:
    """Device events of a trace summed by name, longest first."""
    events = profiling.load_events(trace)
    lines = profiling.stream_lines(events)
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in lines:
            total[e["name"]] += float(e["dur"]) * 1e-6
            count[e["name"]] += 1
    return [{"kernel": name[:80], "seconds": round(sec, 4), "calls": count[name]}
            for name, sec in total.most_common(top)]


def run_variant(args, variant, program, variables, data, plan) -> list[dict]:
    evaluate.EdgeView = view_class(variant)  # _layer_rows builds its chunks' views with it
    jax.clear_caches()  # the class is read while tracing: no program of another variant
    try:
        return _timed_layers(args, variant, program, variables, data, plan)
    finally:
        evaluate.EdgeView = EdgeView


def _timed_layers(args, variant, program, variables, data, plan) -> list[dict]:
    records, h, n = [], data.features, data.graph.num_nodes
    for layer in range(program.model.num_layers):
        t0 = time.perf_counter()
        compiled = evaluate._layer_rows.lower(program, variables, h, data.graph, 0,
                                              layer=layer, plan=plan, length=n).compile()
        compile_s = time.perf_counter() - t0
        mem = compiled.memory_analysis()
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(variables, h, data.graph, 0))
        rec = {"variant": variant, "layer": layer, "rows": n, "chunk_rows": plan.rows,
               "chunks": plan.num_chunks, "edge_capacity": plan.edge_capacity,
               "compile_seconds": compile_s, "seconds": time.perf_counter() - t0,
               "input_bytes": int(h.nbytes),
               "temp_bytes": getattr(mem, "temp_size_in_bytes", None)}
        if args.trace_dir and layer == 0:
            trace_dir = Path(args.trace_dir) / variant.replace("+", "_")
            with profiling.traced_window(trace_dir):
                jax.block_until_ready(compiled(variables, h, data.graph, 0))
            trace = profiling.find_trace(trace_dir)
            rec["kernels"] = kernel_table(trace)
            rec["execution_fraction"] = (profiling.execution_fraction(trace) or {}).get(
                "fraction")
        log(f"{variant} layer {layer}: {rec['seconds']:.2f} s (compile {compile_s:.1f} s)")
        print(json.dumps(rec), flush=True)
        records.append(rec)
        h = out
    checksum = float(jnp.sum(h.astype(jnp.float32)))
    for rec in records:
        rec["checksum"] = checksum
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", required=True)
    p.add_argument("--scale", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--budget", type=int, default=1 << 30, help="bytes per chunk's edge rows")
    p.add_argument("--uint32-offsets", action="store_true",
                   help="row offsets as uint32 (what graphs past 2**31 edges get) at any size")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--trace-dir", default=None)
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    for v in variants:
        try:
            view_class(v)
        except ValueError as e:
            p.error(str(e))
    dataset = load_dir(dataset_dir(args))
    cfg = TrainConfig(dataset="papers100m-like", scale=args.scale, model="sage",
                      hidden=args.hidden, layers=3, fanouts=(15, 10, 5), batch_size=1024,
                      dtype=args.dtype, seed=args.seed, eval_mode="none", progress=False)
    dataset, data, program = trainer.prepare(cfg, dataset)
    if args.uint32_offsets:
        data = data._replace(graph=data.graph._replace(
            indptr=data.graph.indptr.astype(jnp.uint32)))
    env = conservative(cfg.batch_size, program.sampler.slots, dataset.num_nodes)
    state = init_state(program, data, env, dataset.train_idx)
    variables = {"params": state.params}
    widest = max(data.features.shape[1], args.hidden)
    plan = evaluate.plan_chunks(np.asarray(data.graph.indptr), widest, args.budget)
    log(f"{dataset.num_nodes:,} nodes, {data.graph.num_edges:,} edges; {plan}")
    records = [r for v in variants for r in run_variant(args, v, program, variables, data,
                                                        plan)]
    jax.clear_caches()  # no variant's program: the library's own
    t0 = time.perf_counter()  # the public entry point, compiles included, as users call it
    jax.block_until_ready(evaluate.layerwise_logits(program, variables, data,
                                                    budget_bytes=args.budget))
    log(f"layerwise_logits end to end: {time.perf_counter() - t0:.2f} s")
    print(f"\n{'variant':<22} {'layer':>5} {'seconds':>9} {'compile':>8} {'input GiB':>10} "
          f"{'temp GiB':>9} {'checksum':>14}")
    gib = lambda b: f"{b / 2**30:.2f}" if b is not None else "-"
    for r in records:
        print(f"{r['variant']:<22} {r['layer']:>5} {r['seconds']:>9.3f} "
              f"{r['compile_seconds']:>8.1f} {gib(r['input_bytes']):>10} "
              f"{gib(r['temp_bytes']):>9} {r['checksum']:>14.6g}")
    for r in records:
        for k in r.get("kernels", []):
            print(f"  {r['variant']:<22} {k['seconds']:>8.4f} s {k['calls']:>6}  {k['kernel']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
