"""Feature tables in host memory: the row gather against PCIe, and training with the table
on the host against the same run with it on the device.

    python benchmarks/host_features.py kernel [--out FILE.jsonl]
    python benchmarks/host_features.py io [--io-gib 16] [--out FILE.jsonl]
    python benchmarks/host_features.py train --dataset products-like [--scale 1] \\
        [--runs "sage:15,10,5;sage:10,15"] [--placements device,host] \\
        [--dtype float32] [--epochs 3] [--root DIR] [--out FILE.jsonl]

`kernel`: checks the host gather bit for bit against a device table's gather (float32
and bfloat16, masked and out-of-range ids), then times, for several row widths and row
counts, (a) a pinned host-to-device copy of the same bytes (PyTorch's `copy_` from
pinned memory: the PCIe ceiling for bulk transfers), (b) the host gather of random rows
(zero-copy reads over PCIe), (c) the same gather from a device table (HBM); then, on a table
of `--big-table-gib`, random rows read in the order given against sorted first (the
default), and rows drawn as papers100m-like's sampler draws them (by degree) from the
table laid out at random against hottest first (`host_row_order`). One JSON line per
case and a table; time to page-lock a table per GiB.

`io`: the layer streaming of exact inference (training/evaluate.py) on a bfloat16
table of `--io-gib` x 256 columns: page-locking fresh host memory from `np.empty` and
from `PinnedBuffer` (huge pages, each piece touched by threads first), the device
writing its rows into the locked table chunk by chunk from one compiled loop
(`write_rows`), and the table uploaded back by the host gather
(`uploaded`), each checked bit for bit; against the pinned copy above and JAX's own
`device_put` / `np.asarray` of the same bytes.

`train`: for each run (model:fanouts, with `layers` = number of fanouts) and each
placement (`--widen-to W` repeats the stored columns up to W, for a table larger than
the GPU), `zg.train` on the dataset (SAGE, hidden 256, batch 1024, `--sampler` uniform
or labor, no evaluation but the last epoch's sampled test accuracy), timing every epoch.
The PCIe floor of a host run is the bytes it must read per epoch (the calibrated mean
of the outermost level's rows per step, less the share a device cache serves, measured
on 16 batches, x steps x row bytes) over the measured bulk copy bandwidth
(`--pcie-gbs`, else measured here as in `kernel`). Progress lines go to stderr, JSON
lines to stdout and `--out` as they are made, so a run stopped at a time limit keeps
what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from papers100m import emit  # this folder: run as `python benchmarks/host_features.py`

import zerognn_jax as zg
from zerognn_jax._src.ops.gather import gather_rows_reference

T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {message}", file=sys.stderr, flush=True)


def timed(fn, *args, repeats: int = 10) -> float:
    """Median seconds of `fn(*args)` after one warm-up call, each ended by a device sync."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def check_gather() -> None:
    """The host gather equals a device table's, bit for bit, or this raises."""
    rng = np.random.default_rng(0)
    for dtype in (np.float32, jnp.bfloat16):
        table = rng.standard_normal((100_000, 100)).astype(dtype)
        host = zg.HostTable(table)
        ids = rng.integers(-5, table.shape[0] + 5, 50_000).astype(np.int32)
        valid = rng.random(ids.shape[0]) < 0.9
        inside = (ids >= 0) & (ids < table.shape[0])
        got = jax.jit(host.gather)(jnp.asarray(ids), jnp.asarray(valid))
        want = gather_rows_reference(jnp.asarray(table), jnp.asarray(np.where(inside, ids, 0)),
                                     jnp.asarray(valid & inside))
        if not np.array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8)):
            raise AssertionError(f"host gather differs from the device gather ({dtype})")
    log("host gather equals the device gather (float32, bfloat16)")


def pcie_copy_gbs(nbytes: int = 1 << 30, repeats: int = 12) -> float | None:
    """GB/s of a pinned host-to-device copy of `nbytes` (PyTorch), the best of `repeats`
    after a warm-up (the floors divide by it: the fastest copy seen gives the lowest
    floor), or None without a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / min(times[1:]) / 1e9


def unordered(host: zg.HostTable):
    """`host.gather` reading rows in the order given (no sort): the contrast case."""
    from zerognn_jax._src.ops.host_rows import read_rows

    return lambda ids, valid: read_rows(host, ids, valid,
                                        jnp.arange(ids.shape[0], dtype=jnp.int32))


def skewed_rows(n: int, draws: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of `draws` draws from papers100m-like's degree model (node of
    rank r within its class weighs (r + 8)^-0.77, Zipf class sizes: data/papers.py),
    as positions in a table laid out at random (as stored) and hottest first."""
    sizes = 1.0 / np.arange(1, 173)
    sizes = np.maximum(1, sizes / sizes.sum() * n).astype(np.int64)
    sizes[0] += n - sizes.sum()
    weight = np.concatenate([(np.arange(c) + 8.0) ** -(1 / 1.3) for c in sizes])
    cdf = np.cumsum(weight)
    nodes = np.unique(np.searchsorted(cdf, rng.random(draws) * cdf[-1]))
    rank = np.empty(n, np.int64)
    rank[np.argsort(-weight, kind="stable")] = np.arange(n)
    return rng.permutation(n)[nodes], rank[nodes]


def variants(args, copy, table_rows: list) -> None:
    """float32 x 128 rows from a table of `--big-table-gib`: 524,288 uniform random rows
    a call, read in the order given, and sorted first (the default); then the distinct
    rows of draws from papers100m-like's degree model (about a 2-layer step's outer
    level, and a larger one), the table laid out at random, and hottest first."""
    n = int(args.big_table_gib * 2**30) // 512
    table = np.empty((n, 128), np.float32)
    table[:] = 1.0
    host = zg.HostTable(table)
    count = min(524_288, n)
    rng = np.random.default_rng(7)
    cases = [("given order", unordered(host), rng.integers(0, n, count)),
             ("sorted", host.gather, rng.integers(0, n, count))]
    for draws in (150_000, 900_000):
        spread, hot = skewed_rows(n, draws, rng)
        cases += [("random layout", host.gather, spread), ("hottest first", host.gather, hot)]
    for name, fn, rows in cases:
        ids = jnp.asarray(rows.astype(np.int32))
        count = ids.shape[0]
        valid = jnp.ones(count, bool)
        t = timed(jax.jit(fn), ids, valid)
        nbytes = count * 512
        table_rows.append(emit(args, {
            "case": "gather", "variant": name, "dtype": "f32 " + name.split()[0][:7],
            "width": 128, "row_bytes": 512, "rows": count, "table_gib": table.nbytes / 2**30,
            "host_ms": 1e3 * t, "host_gbs": nbytes / t / 1e9, "device_ms": float("nan"),
            "device_gbs": float("nan"),
            "host_over_copy": None if not copy else nbytes / t / 1e9 / copy}))
    del host, table


def kernel_mode(args) -> None:
    copy = pcie_copy_gbs()  # before JAX takes its share of the GPU
    check_gather()
    emit(args, {"case": "pcie_copy", "gbs": copy})
    log(f"pinned host-to-device copy: {copy} GB/s")
    rows_total = 1 << 23  # 8M rows: the ids spread over 2-16 GiB of host memory
    max_bytes = int(args.max_table_gib * 2**30)
    table_rows = []
    for dtype, width in ((jnp.bfloat16, 128), (np.float32, 100), (np.float32, 128),
                         (np.float32, 1024)):
        itemsize = np.dtype(dtype).itemsize
        n = min(rows_total, max_bytes // (width * itemsize))
        table = np.empty((n, width), dtype)
        table[:] = np.arange(width, dtype=np.float32).astype(dtype)  # contents do not matter
        t0 = time.perf_counter()
        host = zg.HostTable(table)
        lock = time.perf_counter() - t0
        device = jnp.asarray(table)
        for count in (min(65_536, n), min(524_288, n)):
            ids = jnp.asarray(np.random.default_rng(count).integers(0, n, count, np.int32))
            valid = jnp.ones(count, bool)
            nbytes = count * width * itemsize
            t_host = timed(jax.jit(host.gather), ids, valid)
            t_dev = timed(jax.jit(gather_rows_reference), device, ids, valid)
            rec = emit(args, {"case": "gather", "dtype": jnp.dtype(dtype).name, "width": width,
                              "row_bytes": width * itemsize, "rows": count,
                              "table_gib": table.nbytes / 2**30,
                              "page_lock_s_per_gib": lock / (table.nbytes / 2**30),
                              "host_ms": 1e3 * t_host, "host_gbs": nbytes / t_host / 1e9,
                              "device_ms": 1e3 * t_dev, "device_gbs": nbytes / t_dev / 1e9,
                              "host_over_copy": None if not copy else
                              (nbytes / t_host / 1e9) / copy})
            table_rows.append(rec)
        del host, device, table
    variants(args, copy, table_rows)
    print(f"{'dtype':>9} {'width':>6} {'rows':>8} {'host ms':>8} {'host GB/s':>10} "
          f"{'dev ms':>7} {'dev GB/s':>9} {'of copy':>8}")
    for r in table_rows:
        share = f"{r['host_over_copy']:.2f}" if r["host_over_copy"] else "-"
        print(f"{r['dtype']:>9} {r['width']:>6} {r['rows']:>8} {r['host_ms']:>8.2f} "
              f"{r['host_gbs']:>10.1f} {r['device_ms']:>7.3f} {r['device_gbs']:>9.0f} "
              f"{share:>8}")


def io_mode(args) -> None:
    from zerognn_jax._src.ops.host_rows import (
        PageLock,
        PinnedBuffer,
        _register_targets,
        uploaded,
        write_rows,
    )
    copy = pcie_copy_gbs()
    t0 = time.perf_counter()
    _register_targets()  # builds the handlers (first use) outside the other timings
    build = time.perf_counter() - t0
    n, rows = int(args.io_gib * 2**30) // 512, 32_768
    nbytes = n * 512
    t0 = time.perf_counter()
    plain = np.empty(nbytes, np.uint8)
    lock = PageLock(plain)
    lock_fresh = time.perf_counter() - t0
    del lock
    t0 = time.perf_counter()
    pinned = PinnedBuffer(nbytes)
    pinned.ready(nbytes)
    lock_pinned = time.perf_counter() - t0
    fresh = pinned.array
    table = zg.HostTable(fresh.view(jnp.bfloat16).reshape(n, 256))
    rows_on_device = jax.random.normal(jax.random.key(0), (n, 256), jnp.bfloat16)

    @jax.jit
    def store(x):
        def body(j, count):
            first = jnp.minimum(j * rows, n - rows)
            return count + write_rows(table, jax.lax.dynamic_slice(x, (first, 0), (rows, 256)),
                                      first)
        return jax.lax.fori_loop(0, -(-n // rows), body, jnp.int32(0))

    t_write = timed(store, rows_on_device, repeats=3)
    want = np.asarray(rows_on_device)
    if not np.array_equal(table.array.view(np.uint16), want.view(np.uint16)):
        raise AssertionError("rows written to the host differ from the device's")
    t_upload = timed(lambda: uploaded(table), repeats=3)
    if not np.array_equal(np.asarray(uploaded(table)).view(np.uint16), want.view(np.uint16)):
        raise AssertionError("the uploaded table differs from the host's")
    # JAX refuses to copy from memory page-locked by us (CUDA_ERROR_INVALID_VALUE, JAX
    # 0.11.2): its device_put is timed on the same bytes unlocked.
    plain[:] = fresh
    t_put = timed(lambda: jax.device_put(plain.view(jnp.bfloat16).reshape(n, 256)), repeats=3)
    t_get = timed(lambda: np.asarray(rows_on_device + 0), repeats=3)
    gbs = lambda t: nbytes / t / 1e9
    rec = emit(args, {"case": "io", "gib": nbytes / 2**30, "pinned_copy_gbs": copy,
                      "build_s": build, "page_lock_fresh_s": lock_fresh,
                      "pinned_buffer_s": lock_pinned,
                      "write_rows_gbs": gbs(t_write), "uploaded_gbs": gbs(t_upload),
                      "device_put_gbs": gbs(t_put), "np_asarray_gbs": gbs(t_get)})
    print("| GiB | page-lock np.empty s | PinnedBuffer s | write_rows GB/s | uploaded GB/s "
          "| device_put GB/s | np.asarray GB/s | pinned copy GB/s |")
    print(f"| {rec['gib']:.1f} | {lock_fresh:.2f} | {lock_pinned:.2f} | "
          f"{gbs(t_write):.1f} | {gbs(t_upload):.1f} | {gbs(t_put):.1f} | {gbs(t_get):.1f} | "
          f"{copy or float('nan'):.1f} |")


def load(args):
    """The dataset, its features as stored (each run converts them to `args.dtype`, in
    the row order it lays them out in), or with `--widen-to` widened in memory in
    `args.dtype`. papers100m-like is generated into `--root` with bfloat16 features on
    disk (half the bytes) unless it is there already."""
    if args.dataset != "papers100m-like":
        log(f"loading {args.dataset} at scale {args.scale:g}")
        dataset = zg.load_dataset(args.dataset, root=args.root, scale=args.scale)
    else:
        from zerognn_jax._src.data import papers
        from zerognn_jax._src.data.storage import is_dataset_dir

        path = Path(args.root) / f"papers100m-like-{args.scale:g}-{args.seed}-bfloat16"
        if not is_dataset_dir(path):
            log(f"generating papers100m-like at scale {args.scale:g} into {path}")
            papers.write_papers100m_like(path, args.scale, args.seed,
                                         feature_dtype="bfloat16", log=log)
        dataset = zg.load_dir(path)
    source = np.asarray(dataset.features)
    n, d = source.shape
    if not args.widen_to or args.widen_to <= d:
        return dataset
    width = args.widen_to
    log(f"converting {source.shape} {source.dtype} features to {args.dtype}, {width} wide")
    # the stored columns, then as many of them again as `width` asks, block by block
    features = np.empty((n, width), jnp.dtype(args.dtype))
    for start in range(0, n, 1 << 20):
        block = source[start:start + (1 << 20)]
        features[start:start + block.shape[0], :d] = block
        for col in range(d, width, d):
            take = min(d, width - col)
            features[start:start + block.shape[0], col:col + take] = block[:, :take]
    return dataclasses.replace(dataset, features=features)


def cached_share(res, dataset, batches: int = 16) -> float | None:
    """The share of the outermost level's rows that a cached host table serves from the
    device, over `batches` batches of training seeds sampled as in training (None without
    a cache)."""
    from zerognn_jax._src.ops.host_rows import CachedTable

    table, program = res.data.features, res.program
    if not isinstance(table, CachedTable):
        return None
    levels = res.summary["envelope"]
    env = zg.Envelope(levels[0], tuple(levels[1:]))
    rng = np.random.default_rng(1)
    hits = total = 0
    for b in range(batches):
        seeds = rng.choice(dataset.train_idx, program.batch_size, replace=False)
        mb = zg.sample_minibatch(res.data.graph, jnp.asarray(seeds, jnp.int32),
                                 jnp.ones(seeds.shape[0], bool), jax.random.key(b),
                                 program.sampler, env.capacities, program.kernels)
        ids, valid = np.asarray(mb.nodes[-1]), np.asarray(mb.valid[-1])
        hit = np.asarray(table.cached(jnp.asarray(ids[valid])))
        hits, total = hits + int(hit.sum()), total + int(valid.sum())
    return hits / max(total, 1)


def train_mode(args) -> None:
    copy = args.pcie_gbs or pcie_copy_gbs()
    check_gather()
    log(f"pinned host-to-device copy: {copy} GB/s")
    dataset = load(args)
    log(f"loaded: {dataset.graph.num_nodes:,} nodes, features {dataset.features.shape} "
        f"{dataset.features.dtype}")
    results = []
    runs = [(placement, order, run) for placement in args.placements.split(",")
            for order in (args.row_orders.split(",") if placement != "device" else ["auto"])
            for run in args.runs.split(";")]
    for placement, order, run in runs:
        model, _, fanouts = run.partition(":")
        fanouts = tuple(int(f) for f in fanouts.split(","))
        where, _, cache = placement.partition("+")
        cache_gib = None if cache == "cache" or where == "auto" else \
            float(cache.removeprefix("cache:")) if cache else 0.0
        cfg = zg.TrainConfig(dataset=args.dataset, model=model, fanouts=fanouts,
                             layers=len(fanouts), hidden=args.hidden, dtype=args.dtype,
                             epochs=args.epochs, batch_size=args.batch_size,
                             eval_mode="sampled", eval_every=0, progress=True,
                             feature_placement=where, feature_cache_gib=cache_gib,
                             host_row_order=order, sample_ahead=args.sample_ahead,
                             read_ahead_gib=args.read_ahead_gib, sampler=args.sampler,
                             seed=args.seed)
        log(f"training {model} {list(fanouts)} ({args.sampler} sampling) with features on "
            f"the {placement}, row order {order}")
        t0 = time.perf_counter()
        try:
            res = zg.train(cfg, dataset)
        except Exception as err:  # noqa: BLE001 (recorded, and the next run goes on)
            emit(args, {"case": "train", "model": model, "fanouts": list(fanouts),
                        "placement": placement, "row_order": order, "status": "failed",
                        "error": f"{type(err).__name__}: {str(err)[:500]}"})
            log(f"  failed: {type(err).__name__}: {str(err)[:300]}")
            continue
        summary = res.summary
        times = [h["epoch_seconds"] for h in res.history]
        row_bytes = dataset.features.shape[1] * jnp.dtype(args.dtype).itemsize
        steps = res.history[-1]["steps"]
        mean = summary.get("calibration_mean_counts")
        share = cached_share(res, dataset)
        rows = mean[-1] * (1 - (share or 0.0)) if mean else None  # read over PCIe
        floor = None if not (copy and rows) else rows * row_bytes * steps / (copy * 1e9)
        rec = emit(args, {"case": "train", "dataset": args.dataset, "scale": args.scale,
                          "model": model, "fanouts": list(fanouts), "placement": placement,
                          "sampler": args.sampler, "placed": summary["feature_placement"],
                          "placed_why": summary["feature_placement_why"],
                          "row_order": summary.get("host_row_order"),
                          "sample_ahead": summary.get("sample_ahead"),
                          # the run's own (its summary: host tables only)
                          "read_ahead_bytes": summary.get("read_ahead_bytes"),
                          "pcie_gbs": copy,
                          "train_call_s": time.perf_counter() - t0,
                          "layout": summary["layout"]["layout"], "dtype": args.dtype,
                          "epoch_seconds": times, "epoch_s": min(times[1:] or times),
                          "steps": steps, "pcie_rows_mean": rows, "cached_share": share,
                          "pcie_floor_s": floor, "losses": [h["loss"] for h in res.history],
                          "test_acc": res.history[-1].get("test_acc"),
                          "compile_s": summary["compile_seconds"],
                          "peak_device_bytes": summary["peak_bytes_in_use"]})
        log(f"  epochs {', '.join(f'{t:.3f}' for t in times)} s; floor {floor}; "
            f"test acc {rec['test_acc']}")
        results.append(rec)
        del res
    print(f"{'run':>18} {'placement':>18} {'rows':>7} {'epoch s':>8} {'floor s':>8} "
          f"{'x floor':>8} {'test acc':>8}")
    for r in results:
        ratio = f"{r['epoch_s'] / r['pcie_floor_s']:.2f}" \
            if r["placement"].startswith("host") and r["pcie_floor_s"] else "-"
        floor = f"{r['pcie_floor_s']:.3f}" if r["pcie_floor_s"] else "-"
        name = f"{r['model']}:{','.join(map(str, r['fanouts']))}"
        print(f"{name:>18} {r['placement']:>18} {r['row_order'] or '-':>7} "
              f"{r['epoch_s']:>8.3f} {floor:>8} {ratio:>8} "
              f"{r['test_acc'] if r['test_acc'] is None else round(r['test_acc'], 4)!s:>8}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("kernel", "io", "train"))
    p.add_argument("--dataset", default="products-like")
    p.add_argument("--root", default=None)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--runs", default="sage:15,10,5;sage:10,15",
                   help="model:fanouts entries separated by ';'")
    p.add_argument("--placements", default="device,host,host+cache",
                   help="device, host (nothing cached), host+cache (cache sized by the "
                        "device), host+cache:GIB, auto (the library's choice)")
    p.add_argument("--row-orders", default="auto",
                   help="host placements: host_row_order values to run, comma-separated "
                        "(auto, degree, stored)")
    p.add_argument("--sample-ahead", type=int, default=None,
                   help="steps sampled together (and, with a host table, read together; "
                        "default: the library's, 16 with a host table)")
    p.add_argument("--read-ahead-gib", type=float, default=None,
                   help="device memory for the rows read ahead at once (default: the "
                        "library's read_ahead_limit, 1-4 GiB by the device's memory)")
    p.add_argument("--sampler", default="uniform", choices=("uniform", "labor"),
                   help="train mode: the neighbour sampler of every run")
    p.add_argument("--widen-to", type=int, default=None,
                   help="train mode: widen the features to this many columns by repeating "
                        "the stored ones (a table larger than the GPU from a preset)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pcie-gbs", type=float, default=None,
                   help="bulk copy bandwidth for the floor (default: measured here)")
    p.add_argument("--max-table-gib", type=float, default=16.0,
                   help="kernel mode: the largest table, in GiB of host memory")
    p.add_argument("--big-table-gib", type=float, default=40.0,
                   help="kernel mode: the table of the read-order comparison, in GiB")
    p.add_argument("--io-gib", type=float, default=16.0,
                   help="io mode: the streamed table, in GiB of host memory")
    p.add_argument("--out", default=None, help="append every record to this JSONL file")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    {"kernel": kernel_mode, "io": io_mode, "train": train_mode}[args.mode](args)


if __name__ == "__main__":
    main()
