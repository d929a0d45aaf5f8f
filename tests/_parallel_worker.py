"""Runs data-parallel training in a fresh process with N virtual CPU devices.

`tests/test_parallel.py` starts this script, because `jax_num_cpu_devices` must be set
before JAX starts its backends (the pytest process keeps its single device). Usage:

    python _parallel_worker.py equivalence OUT_DIR --cpu-devices 8
    python _parallel_worker.py collectives OUT_DIR --cpu-devices 4
    python _parallel_worker.py typed OUT_DIR --cpu-devices 4
    python _parallel_worker.py train OUT_DIR [--cpu-devices N] [--name RUN] [--epochs E]
        [--ckpt DIR] [--eval-mode M] [--shard-features]
        [--coordinator HOST:PORT --num-processes P --process-id I]

Every command writes `<OUT_DIR>/<run>.npz` (flattened parameters) and
`<OUT_DIR>/<run>.json` (losses, summary) per run; the test compares them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

GLOO_UNAVAILABLE = 77  # exit status: this jaxlib has no gloo CPU collectives

# The test problem: every layer sees full neighbourhoods and there is no dropout, so a
# step's loss is a mean over seeds whatever the batch split, and train size 192 is a
# multiple of every global batch used (32), so every device's batch is full. With
# TRAIN_PARTIAL = 204 the last step has 12 seeds: 8 on device 0 and 4 on device 1 of 4.
NUM_NODES, TRAIN, GLOBAL_BATCH, TRAIN_PARTIAL = 400, 192, 32, 204


def make_problem(train: int = TRAIN):
    """A random 400-node graph, 8 features, 3 classes (labels follow the features);
    the first `train` nodes of a random order train, up to node 300 validate."""
    from zerognn_jax import from_edge_list, make_dataset

    rs = np.random.default_rng(0)
    graph = from_edge_list(rs.integers(0, NUM_NODES, 1600), rs.integers(0, NUM_NODES, 1600),
                           NUM_NODES, make_undirected=True, remove_self_loops=True,
                           remove_duplicates=True)
    feats = rs.normal(size=(NUM_NODES, 8)).astype(np.float32)
    labels = np.argmax(feats[:, :3] + rs.normal(scale=0.5, size=(NUM_NODES, 3)), 1)
    order = rs.permutation(NUM_NODES)
    return make_dataset("dp-test", graph.indptr, graph.indices, feats, labels,
                        order[:train], order[train:300], order[300:], 3)


def train_config(shards: int, **overrides):
    """TrainConfig for the test problem over `shards` devices, global batch 32."""
    from zerognn_jax import TrainConfig

    base = dict(dataset="dp-test", model="sage", hidden=16, layers=2, fanouts=(-1, -1),
                batch_size=GLOBAL_BATCH // shards, devices=shards, dropout=0.0, epochs=2,
                eval_mode="full", progress=False, lr=1e-2)
    return TrainConfig(**{**base, **overrides})


def flat(params) -> dict:
    import jax

    leaves = jax.tree_util.tree_leaves_with_path(jax.device_get(params))
    return {jax.tree_util.keystr(path): np.asarray(x) for path, x in leaves}


def save_run(out: pathlib.Path, name: str, params, record: dict) -> None:
    np.savez(out / f"{name}.npz", **flat(params))
    (out / f"{name}.json").write_text(json.dumps(record))


def engine_run(devices: int, *, shard_features=False, tiny_envelope=False,
               collectives="optimised", prefetch=False, train=TRAIN, embedding=False,
               host_features=False, plateau=False):
    """Two epochs of SGD through the engine API, in chunks of 4 steps.

    `tiny_envelope` starts from capacities equal to the batch, so the first steps
    overflow and the engine must grow the envelope and replay them. `collectives`
    (`Collectives.parse`) and `prefetch` choose how the data-parallel step runs.
    `embedding` adds a 4-wide learnable node embedding (its table is returned with the
    parameters, under "embedding"). `host_features` leaves the feature table in host
    memory (`zg.HostTable`, rows laid out in reverse), read by every device, each keeping
    the layout's first half cached. `plateau` halves the step size after each step whose
    loss is no lower than the best (`optax.contrib.reduce_on_plateau`, given the loss).
    Returns (params, record with per-epoch losses, accuracies, sampled edges, level
    maxima, overflows and the final envelope).
    """
    import dataclasses

    import jax.numpy as jnp
    import optax

    import zerognn_jax as zg
    from zerognn_jax._src.ops.host_rows import cache_leading_rows, reordered_table
    from zerognn_jax._src.training.embeddings import NodeEmbedding

    ds = make_problem(train)
    sampler = zg.SamplerConfig((-1, -1)).resolve(ds.graph.max_degree())
    model = zg.make_model("sage", hidden=16, num_layers=2, num_classes=3, dropout=0.0)
    batch = GLOBAL_BATCH // devices
    emb = NodeEmbedding(4, 0.05) if embedding else None
    tx = optax.sgd(0.5)
    if plateau:
        tx = optax.chain(tx, optax.contrib.reduce_on_plateau(factor=0.5, patience=0))
    program = zg.StepProgram(model, tx, sampler, batch, seed=3, embedding=emb)
    if devices > 1 or shard_features:
        program = program.with_mesh(zg.make_mesh(devices), shard_features=shard_features)
        program = dataclasses.replace(program, parallel=dataclasses.replace(
            program.parallel, collectives=zg.Collectives.parse(collectives)))
        # host features: a table laid out in reverse, so that its row map and cached rows
        # (device arrays in the table's pytree) must reach every device
        table = cache_leading_rows(reordered_table(np.asarray(ds.features),
                                                   np.arange(NUM_NODES)[::-1]),
                                   NUM_NODES // 2) if host_features else ds.features
        data = program.parallel.place_data(zg.DeviceData(ds.graph, table, ds.labels))
    else:
        data = zg.DeviceData(ds.graph.to_device(), jnp.asarray(ds.features),
                             jnp.asarray(ds.labels))
    env = zg.conservative(batch, sampler.fanouts, NUM_NODES)
    if tiny_envelope:
        env = zg.Envelope(batch, (batch, batch))
    state = zg.init_state(program, data, env, ds.train_idx)
    engine = zg.ScanEngine(program, chunk_steps=4, prefetch=prefetch)
    record = {"losses": [], "accs": [], "edges": [], "max_counts": [], "overflows": 0}
    for epoch in range(2):
        res = engine.run_epoch(state, data, ds.train_idx, epoch, env)
        state, env = res.state, res.envelope
        record["losses"].append(res.loss)
        record["accs"].append(res.train_acc)
        record["edges"].append(res.sampled_edges)
        record["max_counts"].append(list(res.max_counts))
        record["overflows"] += res.overflows
    params = {"params": state.params, "embedding": state.embedding} if embedding \
        else state.params
    return params, {**record, "envelope": env.levels}


def graph_run(devices: int, *, tiny_envelope=False, window=0):
    """Two epochs of the graph task (263 training molecules of 329, global batch 32: the
    last step has 7) with SGD and a user's model without batch norm (built-in models
    normalise with each device's batch statistics, which one device with the global
    batch does not share), through the engine API. `tiny_envelope` starts 192 node
    slots below the calibrated envelope, so some batches overflow, grow and replay.
    `window` > 1 deals size-balanced windows of that many batches and calibrates with
    no margin or rounding (the record's "calibrated": the largest counts it saw)."""
    import flax.linen as nn
    import jax
    import optax

    import zerognn_jax as zg
    from zerognn_jax._src.training.trainer import prepare

    class EdgeSums(nn.Module):
        """Node rows, a sum over each node's in-edges, a mean per graph, a dense head."""

        @nn.compact
        def __call__(self, graphs, *, train):
            del train
            h = nn.tanh(nn.Dense(8)(graphs.nodes / 100.0))  # atom and bond type ids
            msg = jax.ops.segment_sum(h[graphs.senders] * graphs.edge_mask[:, None],
                                      graphs.receivers, h.shape[0])
            return nn.Dense(1)(zg.pool(nn.tanh(nn.Dense(8)(h + msg)), graphs, "mean"))

    cfg = zg.TrainConfig(task="graph", dataset="molhiv-like", model="gin", epochs=2,
                         batch_size=GLOBAL_BATCH // devices, devices=devices, dropout=0.0,
                         progress=False, balance_window=window,
                         **(dict(margin=1.0, multiple=1) if window else {}))
    molecules = zg.molhiv_like(0.008, seed=3, positive_rate=0.3)
    _, data, program = prepare(cfg, molecules, model=EdgeSums(), optimizer=optax.sgd(0.1))
    items = program.task.train_items(molecules)
    env, cal = program.task.choose_envelope(program, data, molecules, cfg)
    if tiny_envelope:
        env = zg.Envelope(env.batch_size - 192, env.capacities)
    state = zg.init_state(program, data, env, items)
    engine = zg.ScanEngine(program, chunk_steps=4)
    record = {"losses": [], "overflows": 0, "max_counts": [],
              "calibrated": list(cal.max_counts)}
    for epoch in range(2):
        res = engine.run_epoch(state, data, items, epoch, env)
        state, env = res.state, res.envelope
        record["losses"].append(res.loss)
        record["overflows"] += res.overflows
        record["max_counts"].append([int(c) for c in res.max_counts])
    return state.params, record


def cmd_equivalence(args, out: pathlib.Path) -> None:
    """Engine runs: one device; 4 devices from a tiny envelope, reading one host-resident
    feature table; 8 with split features; one and 4 devices with a node embedding."""
    runs = {
        "ref_sgd": dict(devices=1),
        "dp4_tiny_envelope": dict(devices=4, tiny_envelope=True, host_features=True),
        "dp8_sharded": dict(devices=8, shard_features=True),
        "ref_embedding": dict(devices=1, embedding=True),
        "dp4_embedding": dict(devices=4, embedding=True),
    }
    for name, kwargs in runs.items():
        params, record = engine_run(**kwargs)
        save_run(out, name, params, record)


def cmd_collectives(args, out: pathlib.Path) -> None:
    """Engine runs on 4 devices, against one device: the baseline collectives (per-leaf
    all-reduce, metrics summed on the devices, overflow agreed late); the overflow
    agreed early with prefetched samples from a tiny envelope (replays); and a train set
    that leaves a partial last batch (12 seeds on 2 of 4 devices), with and without an
    optimizer reading the loss; the graph task
    against one device (`graph_run`) and its built-in model through the trainer. The
    optimised collectives, and the one-device run the full train set is compared with
    ("ref_sgd"), run in `cmd_equivalence`."""
    runs = {
        "dp4_baseline": dict(devices=4, collectives="baseline"),
        "dp4_early_prefetch_tiny": dict(devices=4, collectives="flat.host.early",
                                        prefetch=True, tiny_envelope=True),
        "ref_partial": dict(devices=1, train=TRAIN_PARTIAL),
        "dp4_partial": dict(devices=4, train=TRAIN_PARTIAL),
        "ref_plateau": dict(devices=1, train=TRAIN_PARTIAL, plateau=True),
        "dp4_plateau": dict(devices=4, train=TRAIN_PARTIAL, plateau=True),
    }
    for name, kwargs in runs.items():
        params, record = engine_run(**kwargs)
        save_run(out, name, params, record)
    for name, kwargs in {"graph_ref": dict(devices=1),
                         "graph_dp4_tiny": dict(devices=4, tiny_envelope=True),
                         "graph_dp4_window": dict(devices=4, window=6)}.items():
        params, record = graph_run(**kwargs)
        save_run(out, name, params, record)
    # built-in GINE-virtual (batch norm, dropout) through the trainer, evaluated
    from zerognn_jax import TrainConfig, molhiv_like, train

    result = train(TrainConfig(task="graph", dataset="molhiv-like", model="gine-virtual",
                               hidden=16, layers=2, batch_size=8, devices=4, epochs=1,
                               progress=False),
                   molhiv_like(0.008, seed=3, positive_rate=0.3))
    save_run(out, "graph_gine_dp4", result.variables["params"],
             {"history": result.history, "summary": result.summary})


def cmd_typed(args, out: pathlib.Path) -> None:
    """Relational SAGE on a small mag-like graph through the trainer, one device with
    batch 64 and 4 devices with 16 each: full neighbourhoods and no dropout, so the
    steps see the same subgraphs; the featureless types' embedding rows train by lazy
    Adam on both; exact evaluation after the epoch. Then, on 4 devices, the trainer
    with the feature table in host memory and a device cache of part of it: the same
    typed run (exact evaluation too, the table read onto the device), and with the
    table split by rows across the devices (`shard_features`); the test problem's SAGE
    against its run with the table on the device. Then R-GAT reading
    edge features, with learnable rows for every type (`embedding_dim`), on one device
    and on 4; and link prediction on 4 devices (`_link_runs`)."""
    import jax

    from zerognn_jax import TrainConfig, load_hetero_dataset, train

    mag = load_hetero_dataset("mag-like", scale=0.002, seed=0)
    # 300 rows of the stacked table (of 1,473 papers, 128 wide), the hottest
    typed_host = dict(feature_placement="host", feature_cache_gib=300 * 128 * 4 / 2**30)
    for name, devices, extra in (("typed_ref", 1, {}), ("typed_dp4", 4, {}),
                                 ("typed_dp4_host", 4, typed_host),
                                 ("typed_dp4_split", 4, {"shard_features": True})):
        result = train(TrainConfig(dataset="mag-like", scale=0.002, model="rsage", hidden=8,
                                   layers=2, fanouts=(-1, -1), batch_size=64 // devices,
                                   devices=devices, dropout=0.0, input_dropout=0.0, epochs=1,
                                   lr=0.01, multiple=8, sample_ahead=1, progress=False,
                                   **extra), mag)
        params = {"params": result.variables["params"],
                  "embedding": jax.device_get(result.state.embedding)}
        table = result.data.features
        save_run(out, name, params, {"history": result.history, "summary": result.summary,
                                     "cache": _cache_record(table),
                                     "table_rows": [int(table.shape[0]), int(
                                         table.sharding.shard_shape(table.shape)[0])]
                                     if isinstance(table, jax.Array) else None})
    edges = _typed_with_edge_features()
    for name, devices in (("typed_rgat_ref", 1), ("typed_rgat_dp4", 4)):
        result = train(TrainConfig(dataset="typed-edges", model="rgat", heads=2, hidden=8,
                                   layers=2, fanouts=(-1, -1), batch_size=32 // devices,
                                   devices=devices, dropout=0.0, input_dropout=0.0,
                                   epochs=1, lr=0.01, multiple=8, sample_ahead=1,
                                   edge_features=True, embedding_dim=4, eval_mode="full",
                                   progress=False), edges)
        params = {"params": result.variables["params"],
                  "embedding": jax.device_get(result.state.embedding)}
        save_run(out, name, params, {"history": result.history, "summary": result.summary})
    _link_runs(out)
    # rows as stored: the cache finds its 200 rows by a node -> slot map (4 bytes a node)
    cached = dict(feature_placement="host", host_row_order="stored",
                  feature_cache_gib=(4 * NUM_NODES + 200 * 8 * 4) / 2**30)
    # one epoch from the conservative envelope: where the rows come from is all that
    # differs, and calibrating would compile and run a sampling pass for each
    for name, extra in (("dp4_device", {}), ("dp4_host", cached)):
        result = train(train_config(4, eval_mode="none", epochs=1, envelope="conservative",
                                    **extra), make_problem())
        save_run(out, name, result.variables["params"],
                 {"history": result.history, "summary": result.summary,
                  "cache": _cache_record(result.data.features)})


def _link_runs(out: pathlib.Path) -> None:
    """Link prediction, batch 16 a device: "*link_still_*" with a learning rate too
    small to change the model's outputs, on one device and on 4 (the feature table split
    by rows), so that both see the initial model on the same batches, negatives and
    hidden pairs: the test problem's graph ("link_still_*") and the users-buy-items
    graph of test_typed_link.py ("typed_link_still_*"); then "typed_link_dp4", 4
    devices learning for 2 epochs."""
    from test_typed_link import BASE, shop

    from zerognn_jax import TrainConfig, train

    homogeneous = dict(task="link", dataset="dp-test", model="sage", hidden=16, layers=2,
                       fanouts=(5, 5), progress=False)
    # the conservative envelope: the runs compare batches, not how they were sized, and
    # calibrating would compile and run a sampling pass for each
    still = {"lr": 1e-30, "envelope": "conservative"}
    split = {**still, "shard_features": True}
    for name, devices, base, data, extra in (
            ("link_still_1", 1, homogeneous, make_problem(), still),
            ("link_still_4", 4, homogeneous, make_problem(), split),
            ("typed_link_still_1", 1, BASE, shop(), still),
            ("typed_link_still_4", 4, BASE, shop(), split),
            ("typed_link_dp4", 4, BASE, shop(), {"epochs": 2})):
        cfg = TrainConfig(**{**base, "batch_size": 16, "devices": devices, "epochs": 1,
                             **extra})
        result = train(cfg, data)
        save_run(out, name, result.variables["params"],
                 {"history": result.history, "summary": result.summary})


def _typed_with_edge_features():
    """A small random typed graph whose citations and authorships carry edge features
    (3 and 2 columns; their reverses too): papers with features, authors without."""
    from zerognn_jax import make_hetero_dataset

    rs = np.random.default_rng(7)
    writes, cites = ("author", "writes", "paper"), ("paper", "cites", "paper")
    edges = {writes: (rs.integers(0, 60, 300), rs.integers(0, 120, 300)),
             cites: (rs.integers(0, 120, 400), rs.integers(0, 120, 400))}
    tables = {cites: rs.standard_normal((400, 3)), writes: rs.standard_normal((300, 2))}
    return make_hetero_dataset(
        "typed-edges", {"paper": 120, "author": 60}, edges, target_type="paper",
        labels=rs.integers(0, 4, 120), train_idx=np.arange(80), val_idx=np.arange(80, 100),
        test_idx=np.arange(100, 120), features={"paper": rs.standard_normal((120, 6))},
        edge_features=tables, add_reverse=True)


def _cache_record(table) -> dict | None:
    """The cached rows of a host table, and the devices holding them (None: no cache)."""
    from zerognn_jax._src.ops.host_rows import CachedTable

    if not isinstance(table, CachedTable):
        return None
    return {"rows": int(table.rows.shape[0]), "devices": len(table.rows.sharding.device_set),
            "slot_map": table.slot is not None}


def cmd_train(args, out: pathlib.Path) -> None:
    """The trainer over every device of every process (`devices=0`)."""
    import jax

    from zerognn_jax import train
    from zerognn_jax._src.training import parallel

    parallel.initialize_distributed(args.coordinator, args.num_processes, args.process_id,
                                    timeout_s=60)
    cfg = train_config(jax.device_count(), devices=0, epochs=args.epochs,
                       checkpoint_dir=args.ckpt, eval_mode=args.eval_mode,
                       shard_features=args.shard_features)
    result = train(cfg, make_problem())
    if jax.process_index() == 0:
        save_run(out, args.name, result.variables["params"],
                 {"losses": [h["loss"] for h in result.history], "summary": result.summary})
    if args.start_one_device:  # the run's variables, on its devices, start a run on one
        one = train(train_config(1, epochs=0, eval_mode="none"), make_problem(),
                    variables=result.variables)
        save_run(out, f"{args.name}_on_one", one.variables["params"], {})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("equivalence", "collectives", "typed", "train"))
    parser.add_argument("out")
    parser.add_argument("--cpu-devices", type=int, default=1)
    parser.add_argument("--name", default="run")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ckpt")
    parser.add_argument("--eval-mode", default="none")
    parser.add_argument("--shard-features", action="store_true")
    parser.add_argument("--start-one-device", action="store_true")
    parser.add_argument("--coordinator")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    args = parser.parse_args(argv)

    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    if args.coordinator:
        try:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        except Exception as err:  # noqa: BLE001 - any failure means no gloo here
            print(f"gloo CPU collectives unavailable: {err}", file=sys.stderr)
            return GLOO_UNAVAILABLE
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commands = {"equivalence": cmd_equivalence, "collectives": cmd_collectives,
                "typed": cmd_typed, "train": cmd_train}
    commands[args.command](args, out)
    if args.coordinator:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
