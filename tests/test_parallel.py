"""Data-parallel training: equivalence with one device, checkpoints across device counts,
two processes over JAX's distributed runtime, and the CLI flags.

Runs with several devices happen in fresh processes (`_parallel_worker.py`) with virtual
CPU devices, since `jax_num_cpu_devices` must be set before JAX starts its backends;
this pytest process keeps its single device. Workers start early and in parallel
(compilation is mostly single-threaded), each under a time limit.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import _parallel_worker as worker
import jax
import numpy as np
import pytest
from conftest import FAST_XLA

import zerognn_jax as zg
from zerognn_jax import train
from zerognn_jax._src.training import parallel

WORKER = pathlib.Path(worker.__file__)
REPO = WORKER.parents[1]
# A bound for a hung worker, not a speed check: a four-device worker ran past 300 s on a
# machine shared with other work (2026-11-30), where the suite is allowed twice its time.
TIMEOUT_S = 900


class Job:
    """A worker process whose output lands in `out`; `wait` checks how it ended."""

    def __init__(self, out: pathlib.Path, *args: str):
        self.out, self.log = out, out.with_suffix(".log")
        out.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
               "XLA_FLAGS": FAST_XLA}
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-X", "faulthandler", str(WORKER),
                                          *args, str(out)],
                                         stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait(self) -> pathlib.Path:
        try:
            code = self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"worker timed out after {TIMEOUT_S} s:\n{self.tail()}")
        if code == worker.GLOO_UNAVAILABLE:
            pytest.skip(f"this jaxlib has no gloo CPU collectives: {self.tail()}")
        assert code == 0, f"worker exited with {code}:\n{self.tail()}"
        return self.out

    def tail(self) -> str:
        return self.log.read_text()[-3000:]


def load(out: pathlib.Path, name: str) -> tuple[dict, dict]:
    with np.load(out / f"{name}.npz") as params:
        return dict(params), json.loads((out / f"{name}.json").read_text())


def assert_params_close(a: dict, b: dict, rtol=1e-5, atol=1e-6):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=atol, err_msg=key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_process_jobs(root: pathlib.Path) -> list[Job]:
    """Two processes of 2 CPU devices each, joined over a loopback coordinator (gloo)."""
    args = ["train", "--cpu-devices", "2", "--name", "two", "--epochs", "3",
            "--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", "2"]
    return [Job(root / f"two{pid}", *args, "--process-id", str(pid)) for pid in (0, 1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every multi-device run, started as soon as what it needs exists.

    The 8-device equivalence run goes on in the background while a checkpoint is saved on
    2 devices and training resumes from it on 4 (features split, in a worker) and on 1
    (here); the two-process run starts once those are done.
    """
    root = tmp_path_factory.mktemp("parallel")
    jobs = {"equivalence": Job(root / "equivalence", "equivalence", "--cpu-devices", "8"),
            "collectives": Job(root / "collectives", "collectives", "--cpu-devices", "4")}
    try:
        Job(root / "save", "train", "--cpu-devices", "2", "--name", "saved",
            "--ckpt", str(root / "ckpt"), "--start-one-device").wait()
        for copy in ("ckpt4", "ckpt1"):
            shutil.copytree(root / "ckpt", root / copy)
        jobs["resume4"] = Job(root / "resume4", "train", "--cpu-devices", "4", "--name",
                              "resumed4", "--epochs", "3", "--shard-features", "--eval-mode",
                              "sampled", "--ckpt", str(root / "ckpt4"))
        one = train(worker.train_config(1, epochs=3, eval_mode="none",
                                        checkpoint_dir=str(root / "ckpt1")),
                    worker.make_problem())
        jobs["resume4"].wait()
        jobs["two0"], jobs["two1"] = two_process_jobs(root)
        # started last: the save job above, the first one waited for, competes with less
        jobs["typed"] = Job(root / "typed", "typed", "--cpu-devices", "4")
        yield {"jobs": jobs, "resumed1": (worker.flat(one.variables["params"]), one.summary),
               "root": root}
    finally:
        for job in jobs.values():
            if job.proc.poll() is None:
                job.proc.kill()
                job.proc.wait()


@pytest.fixture(scope="module")
def equivalence(runs):
    return runs["jobs"]["equivalence"].wait()


@pytest.fixture(scope="module")
def collectives(runs):
    return runs["jobs"]["collectives"].wait()


@pytest.fixture(scope="module")
def resumed(runs):
    """Epoch 2 after a checkpoint saved on 2 devices: on 4 (features split) and on 1."""
    return load(runs["jobs"]["resume4"].out, "resumed4"), runs["resumed1"]


def test_make_mesh_names_the_bad_device_count(capsys):
    from zerognn_jax.cli import main

    have = jax.local_device_count()
    with pytest.raises(ValueError, match=f"^devices {have + 1} .* {have} local"):  # Python's
        parallel.make_mesh(have + 1)
    assert main(["train", "--devices", str(have + 1)]) == 2  # the command line's spelling
    err = capsys.readouterr().err
    assert f"--devices {have + 1} must lie in [0, {have}]" in err
    if jax.default_backend() == "cpu":  # how to get more of them there
        assert "start the process with JAX_NUM_CPU_DEVICES=N" in err
    assert parallel.make_mesh(0).size == have


def test_initialize_distributed_checks_its_flags():
    assert parallel.initialize_distributed(None) is False
    with pytest.raises(ValueError, match="--num-processes and --process-id"):
        parallel.initialize_distributed("127.0.0.1:1234", 2)
    with pytest.raises(ValueError, match=r"--process-id 2 must lie in \[0, 2\)"):
        parallel.initialize_distributed("127.0.0.1:1234", 2, 2)
    with pytest.raises(ValueError, match="--num-processes must be >= 1, got 0"):
        parallel.initialize_distributed("127.0.0.1:1234", 0, 0)
    with pytest.raises(ValueError, match="--num-processes 2 and --process-id 5 join .* only "
                                         "with --coordinator"):
        parallel.initialize_distributed(None, 2, 5)
    # the flag not given had been named: "--num-processes None and --process-id 1 join"
    with pytest.raises(ValueError, match="^--process-id 1 joins a run"):
        parallel.initialize_distributed(None, None, 1)


def test_a_coordinator_port_taken_is_named_before_joining():
    """Process 0 whose coordinator port another program listens on ended with a
    segfault inside JAX's runtime; the port is tried first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(ValueError, match=rf"^--coordinator 127.0.0.1:{port}: port {port} "
                                             rf"is taken on this machine \(.*\), where "
                                             rf"process 0 serves the run's coordinator: give "
                                             rf"a free port$"):
            parallel.initialize_distributed(f"127.0.0.1:{port}", 2, 0)
    assert not jax.distributed.is_initialized()


def test_the_cli_joins_a_run_over_a_coordinator(tmp_path):
    """`zerognn train --coordinator ...` joins JAX's distributed runtime before anything
    starts a backend: building the commands' default configs once asked JAX for its
    backend (kernels "auto"), and every such run stopped with jax.distributed's
    RuntimeError. One process here; two join in `runs` (through the worker)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
           "XLA_FLAGS": FAST_XLA}
    cmd = [sys.executable, "-m", "zerognn_jax.cli", "train", "--epochs", "1", "--no-progress",
           "--hidden", "8", "--layers", "1", "--fanouts", "2",
           "--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", "1",
           "--process-id", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1])["processes"] == 1


def _cli(*args: str, cwd) -> subprocess.Popen:
    """`zerognn ARGS` in a fresh CPU process, its output piped."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
           "XLA_FLAGS": FAST_XLA}
    return subprocess.Popen([sys.executable, "-m", "zerognn_jax.cli", *args], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_processes_given_other_options_stop_in_one_line(tmp_path):
    """Two processes of one run with another --hidden: one aborted inside gloo and the
    other printed a traceback and hung; with another --epochs, both hung at the end."""
    port = free_port()
    run = ["train", "--epochs", "1", "--layers", "1", "--fanouts", "2",
           "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
    procs = [_cli(*run, "--hidden", str(h), "--process-id", str(i), cwd=tmp_path)
             for i, h in enumerate((8, 16))]
    try:
        ends = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for i, (p, (_, err)) in enumerate(zip(procs, ends)):
        assert p.returncode == 2, err[-3000:]
        mine = f"--hidden {(8, 16)[i]} in process {i}"
        assert f"zerognn: error: the processes of this run were given other options: " \
               f"{mine}, other values in another; give every process the same\n" in err
        # each said it was waiting to join (the join had waited up to 300 s in silence)
        assert err.startswith(f"zerognn: process {i} of 2 joining the run at "
                              f"127.0.0.1:{port}; waiting up to 300 s for every process\n")


def test_a_bad_option_ends_a_process_before_it_joins_the_others(tmp_path):
    """A process given a bad option joined the run first, printed its error and then
    waited for the others as it exited (and they for it): nothing listens at this
    coordinator, so joining would have waited out its time limit."""
    proc = _cli("train", "--lr", "-1", "--coordinator", f"127.0.0.1:{free_port()}",
                "--num-processes", "2", "--process-id", "1", cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == ""
    assert err == "zerognn: error: --lr must be positive and finite, got -1.0\n"


def test_sigterm_still_stops_a_process_that_joined_a_run(tmp_path):
    """JAX's distributed runtime installs a SIGTERM handler of its own (its preemption
    notifier, which only logs): a run over several processes trained on through a
    batch scheduler's SIGTERM. Joining puts the handler that was there back."""
    script = tmp_path / "term.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "from zerognn_jax._src.training import interrupts, parallel\n"
        "with interrupts.deferred():\n"
        "    parallel.initialize_distributed(sys.argv[1], 1, 0, timeout_s=60)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    for _ in range(100):\n"
        "        time.sleep(0.05)  # the handler runs between bytecodes\n"
        "        try:\n"
        "            interrupts.check('joining')\n"
        "        except interrupts.Interrupted as err:\n"
        "            sys.exit(err.exit_code)\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(script), f"127.0.0.1:{free_port()}"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 143, out.stderr[-3000:]


def test_a_signal_to_one_process_stops_every_process_of_the_run(tmp_path):
    """A SIGINT to one process of a run stopped it alone at its next check point, and
    the other waited in its next collective until JAX's runtime aborted it (about 90 s)
    or for good. Process 1 signals itself after epoch 0; both stop there."""
    script = tmp_path / "one.py"
    script.write_text(
        "import os, signal, sys\n"
        "import zerognn_jax as zg\n"
        "from zerognn_jax._src.training import interrupts, parallel\n"
        "me = int(sys.argv[2])\n"
        "def signal_in_process_1(record):\n"
        "    if me == 1:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "with interrupts.deferred():\n"
        "    parallel.initialize_distributed(sys.argv[1], 2, me, timeout_s=300)\n"
        "    cfg = zg.TrainConfig(epochs=3, hidden=8, layers=1, fanouts=(2,),\n"
        "                         progress=False)\n"
        "    try:\n"
        "        zg.train(cfg, callbacks=[signal_in_process_1])\n"
        "    except interrupts.Interrupted as err:\n"
        "        print(err, *getattr(err, '__notes__', ()), sep='\\n')\n"
        "        sys.exit(err.exit_code)\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
           "XLA_FLAGS": FAST_XLA}
    port = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, str(script), port, str(i)], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    try:
        ends = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, ends):
        assert p.returncode == 130, err[-3000:]
        assert "interrupted by SIGINT after epoch 0\n" in out, out
    assert ends[0][0].endswith("process 1 of this run received it; every process stops at "
                               "the same point\n"), ends[0][0]
    assert "process 1 of this run" not in ends[1][0]


def test_coordinator_auto_without_a_cluster_says_what_to_give(tmp_path):
    """Outside a scheduler's job, `--coordinator auto` ends in one line that says what
    JAX looked for and which flags to give instead (JAX's own message names none)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "KUBERNETES_", "JAX_COORDINATOR"))}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "zerognn_jax.cli", "train", "--epochs", "1", "--no-progress",
           "--coordinator", "auto"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=TIMEOUT_S)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.startswith("zerognn: error: --coordinator auto takes the cluster from "
                                 "its scheduler's environment"), out.stderr[-3000:]
    assert "give --coordinator HOST:PORT with --num-processes and --process-id" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_placement_checks_data_is_on_the_mesh(small_graph):
    import optax

    import zerognn_jax as zg

    sampler = zg.SamplerConfig((2,)).resolve(small_graph.max_degree())
    model = zg.make_model("sage", hidden=4, num_layers=1, num_classes=2)
    program = zg.StepProgram(model, optax.sgd(0.1), sampler, 8, 0).with_mesh(
        zg.make_mesh(1), shard_features=True)
    n = small_graph.num_nodes
    data = zg.DeviceData(small_graph, np.zeros((n, 3), np.float32), np.zeros(n, np.int32))  # host
    with pytest.raises(ValueError, match=r"data.graph.indptr .*place_data"):
        program.parallel.check_placed(data)
    placed = program.parallel.place_data(data)
    assert placed.features.sharding.is_equivalent_to(
        parallel.row_sharded(program.parallel.mesh), 2)
    assert program.global_batch == 8


def test_a_mesh_of_another_form_is_refused_naming_it(small_graph):
    """A mesh with a second axis trained on the batches of its first alone (the others
    never): refused, as is a 1-D mesh of another axis name and a value that is no mesh;
    a device count that is no integer is named."""
    import optax

    sampler = zg.SamplerConfig((2,)).resolve(small_graph.max_degree())
    model = zg.make_model("sage", hidden=4, num_layers=1, num_classes=2)
    program = zg.StepProgram(model, optax.sgd(0.1), sampler, 8, 0)
    one = np.array(jax.devices()[:1])
    refused = r"^mesh must be a 1-D jax.sharding.Mesh of the axis 'data', one device a " \
              r"batch \(zg.make_mesh\(devices\)\), got "
    for mesh, got in ((jax.sharding.Mesh(one.reshape(1, 1), ("data", "model")),
                       r"a mesh of axes \('data', 'model'\) \(shape \{'data': 1, 'model': 1\}\)"),
                      (jax.sharding.Mesh(one, ("batch",)), r"a mesh of axes \('batch',\)"),
                      ("data", "str 'data'")):
        with pytest.raises(ValueError, match=refused + got):
            program.with_mesh(mesh)
    with pytest.raises(ValueError, match=r"^devices must be an integer, the local devices "
                                         r"of each process \(0: all of them\), got '2'$"):
        zg.make_mesh("2")


def test_data_parallel_matches_one_device(equivalence):
    ref, ref_record = load(equivalence, "ref_sgd")
    for name in ("dp4_tiny_envelope", "dp8_sharded"):
        params, record = load(equivalence, name)
        assert_params_close(params, ref)
        np.testing.assert_allclose(record["losses"], ref_record["losses"], rtol=1e-5)
        np.testing.assert_allclose(record["accs"], ref_record["accs"], rtol=1e-6)
    _, tiny = load(equivalence, "dp4_tiny_envelope")
    assert tiny["overflows"] >= 1  # the envelope grew and the failed steps were replayed


def test_data_parallel_node_embedding_matches_one_device(equivalence):
    """Replicated tables, each updated with every device's rows: the table and the
    parameters of one device with the global batch."""
    ref, ref_record = load(equivalence, "ref_embedding")
    params, record = load(equivalence, "dp4_embedding")
    assert any("embedding" in key for key in ref)
    assert_params_close(params, ref)
    np.testing.assert_allclose(record["losses"], ref_record["losses"], rtol=1e-5)


def test_every_way_of_reducing_a_step_matches_one_device(collectives, equivalence):
    """Per-leaf or flat gradient all-reduce, metrics summed per step on the devices or
    per chunk on the host, the overflow flag agreed late, early or packed, sampling a
    step ahead: the parameters, losses and accuracies of one device with the global
    batch. Sampled edges and level maxima describe the 4 per-device subgraphs, so they
    are compared between the variants only."""
    ref, ref_record = load(equivalence, "ref_sgd")  # one device, as in the other tests
    _, base = load(collectives, "dp4_baseline")
    runs = {"dp4_baseline": collectives, "dp4_early_prefetch_tiny": collectives,
            "dp4_tiny_envelope": equivalence}  # the last: flat, host metrics, packed flag
    for name, out in runs.items():
        params, record = load(out, name)
        assert_params_close(params, ref)
        np.testing.assert_allclose(record["losses"], ref_record["losses"], rtol=1e-5)
        np.testing.assert_allclose(record["accs"], ref_record["accs"], rtol=1e-6)
        assert (record["edges"], record["max_counts"]) == (base["edges"], base["max_counts"])
    assert load(collectives, "dp4_early_prefetch_tiny")[1]["overflows"] >= 1  # replayed


def test_partial_last_batch_weighs_every_seed_alike(collectives):
    """204 training nodes, global batch 32: the last step has 12 seeds, 8 on device 0,
    4 on device 1, none on devices 2 and 3. The gradient is weighted by each device's
    seeds, so the update is that of one device with the global batch."""
    ref, ref_record = load(collectives, "ref_partial")
    params, record = load(collectives, "dp4_partial")
    assert_params_close(params, ref)
    np.testing.assert_allclose(record["losses"], ref_record["losses"], rtol=1e-5)
    np.testing.assert_allclose(record["accs"], ref_record["accs"], rtol=1e-6)


def test_an_optimizer_reading_the_loss_reads_the_global_batchs(collectives):
    """`reduce_on_plateau` halving the step size after each step that does not improve:
    every device's optimizer state takes the loss of every device's seeds (weighted as
    the gradient), so the run is one device's with the global batch. Each device's own
    loss would have halved the step at other steps."""
    ref, ref_record = load(collectives, "ref_plateau")
    params, record = load(collectives, "dp4_plateau")
    assert_params_close(params, ref)
    np.testing.assert_allclose(record["losses"], ref_record["losses"], rtol=1e-5)
    plain, _ = load(collectives, "ref_partial")
    assert not all(np.allclose(ref[k], plain[k]) for k in ref)  # the step size changed


def test_graph_task_on_four_devices_trains_like_one(collectives):
    """Molecules packed per device (batch 8 on each of 4, the last step partial) train as
    one device with batch 32 does, from an envelope that overflows and grows; the
    built-in model (batch norm per device) trains and evaluates through the trainer;
    calibration counts the batches each device packs, balanced windows included."""
    ref, ref_record = load(collectives, "graph_ref")
    params, record = load(collectives, "graph_dp4_tiny")
    assert ref_record["overflows"] == 0 and record["overflows"] >= 1
    np.testing.assert_allclose(record["losses"], ref_record["losses"], rtol=1e-5)
    assert_params_close(params, ref)
    _, gine = load(collectives, "graph_gine_dp4")
    summary, (epoch,) = gine["summary"], gine["history"]
    assert summary["devices"] == 4 and summary["global_batch"] == 32, summary
    assert epoch["overflows"] == 0 and np.isfinite(epoch["loss"])  # calibrated per device
    assert 0.0 <= epoch["test_rocauc"] <= 1.0
    # size-balanced windows of 6 batches dealt over 4 devices, calibrated with no margin
    # or rounding: the envelope holds every batch, whose largest counts it saw (padded to
    # one device's batch instead, calibration saw [231, 504, 6] against [220, 476, 6])
    _, window = load(collectives, "graph_dp4_window")
    assert window["overflows"] == 0
    assert np.max(window["max_counts"], axis=0).tolist() == window["calibrated"]


def _typed_runs_agree(out, one_device: str, four_devices: str) -> dict:
    """Asserts that the typed run `four_devices` (4 devices) trained as `one_device`: the
    parameters, the stacked embedding table (whose lazy Adam differs from one device by
    up to ~9e-6 on a CPU), the loss and every split's exact accuracy. Returns the
    4-device run's parameters."""
    ref, ref_record = load(out, one_device)
    params, record = load(out, four_devices)
    assert record["summary"]["devices"] == 4
    embedding = [k for k in ref if "embedding" in k]
    assert embedding
    assert_params_close({k: params[k] for k in embedding}, {k: ref[k] for k in embedding},
                        atol=5e-5)
    assert_params_close({k: params[k] for k in ref if k not in embedding},
                        {k: ref[k] for k in ref if k not in embedding}, atol=1e-5)
    (one,), (four,) = ref_record["history"], record["history"]
    np.testing.assert_allclose(four["loss"], one["loss"], rtol=1e-5)
    assert four["overflows"] == 0
    for split in ("train", "val", "test"):
        assert abs(four[f"{split}_acc"] - one[f"{split}_acc"]) < 1e-6, split
    return params


def test_typed_graph_on_four_devices_trains_like_one(runs):
    """Relational SAGE on mag-like, 4 devices x 16 seeds against one device x 64 (the last
    step 16 + 16 + 11 + 0): the same parameters, featureless types' embedding rows,
    losses and exact evaluation. Every neighbour is taken and dropout is off, so the
    devices' own random streams are not exercised here (the homogeneous tests above
    cover the step keys of batch s D + d, which the typed sampler shares)."""
    out = runs["jobs"]["typed"].wait()
    _typed_runs_agree(out, "typed_ref", "typed_dp4")
    assert load(out, "typed_dp4")[1]["summary"]["global_batch"] == 64


def test_typed_graph_with_split_features_trains_like_one_device(runs):
    """The stacked feature table split by rows across 4 devices (`shard_features`: each
    holds a quarter, a step fetches its rows from their owners) trains as one device
    holding it whole, and exact evaluation, reading it across the devices, agrees."""
    out = runs["jobs"]["typed"].wait()
    _typed_runs_agree(out, "typed_ref", "typed_dp4_split")
    record = load(out, "typed_dp4_split")[1]
    rows, per_device = record["table_rows"]
    whole, on_each = load(out, "typed_dp4")[1]["table_rows"]
    assert on_each == whole  # replicated
    assert per_device * 4 == rows and whole <= rows < whole + 4  # split, padded to 4 parts
    assert record["summary"]["feature_placement_why"] == \
        "shard_features splits it across the devices"


def test_typed_rgat_with_edge_features_and_every_types_rows_on_four_devices(runs):
    """R-GAT reading edge features, every type with learnable rows (`embedding_dim`):
    4 devices x 8 seeds train as one device x 32 (the devices' views carry the edge
    rows of their own slots; the stacked table's rows, featured papers' included, go
    through the all-gathered lazy Adam)."""
    out = runs["jobs"]["typed"].wait()
    params = _typed_runs_agree(out, "typed_rgat_ref", "typed_rgat_dp4")
    assert any("edge_kernel" in k for k in params)
    assert params["['embedding']"].shape == (180, 4)  # 120 papers and 60 authors


@pytest.mark.parametrize("graph", ["link", "typed_link"])
def test_link_prediction_on_four_devices_takes_one_devices_batches(runs, graph):
    """A link run on 4 devices (the feature table split by rows) takes, at a learning
    rate too small to change the model's outputs, the batches, negatives, hidden pairs
    and sampled subgraphs of the one-device run of the same batch (device d of step s is
    batch 4 s + d): equal losses, counts and exact metrics (of both end types, typed)."""
    out = runs["jobs"]["typed"].wait()
    (a,), (b,) = (load(out, f"{graph}_still_{d}")[1]["history"] for d in (1, 4))
    assert load(out, f"{graph}_still_4")[1]["summary"]["devices"] == 4
    assert b["steps"] == -(-a["steps"] // 4)  # 4 batches a step, the last ones padded
    assert a["max_counts"] == b["max_counts"] and a["sampled_edges"] == b["sampled_edges"]
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-6)
    for key in ("train_batch_pair_acc", "val_auc", "test_auc", "test_ap"):
        assert abs(a[key] - b[key]) < 1e-9, key


def test_typed_link_prediction_learns_on_four_devices(runs):
    """Trained for real on 4 devices, typed link prediction learns the users' groups as
    one device does (test_typed_link.py)."""
    history = load(runs["jobs"]["typed"].wait(), "typed_link_dp4")[1]["history"]
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["test_auc"] > 0.75, history[-1]


def test_the_trainer_caches_a_host_table_on_every_device(runs):
    """The trainer on 4 devices with the feature table in host memory keeps its cache on
    every device (typed: the stacked table's hottest rows, laid out first; the test
    problem: rows as stored, found by a slot map) and trains as with the table on the
    device."""
    out = runs["jobs"]["typed"].wait()
    for host, device in (("typed_dp4_host", "typed_dp4"), ("dp4_host", "dp4_device")):
        params, record = load(out, host)
        ref, ref_record = load(out, device)
        assert record["summary"]["feature_placement"] == "host", host
        assert record["summary"]["feature_placement_why"] == "asked for (feature_placement)"
        assert ref_record["cache"] is None
        assert_params_close(params, ref, atol=5e-5)
        np.testing.assert_allclose([h["loss"] for h in record["history"]],
                                   [h["loss"] for h in ref_record["history"]], rtol=1e-5)
    (host,), (device,) = (load(out, run)[1]["history"] for run in ("typed_dp4_host",
                                                                     "typed_dp4"))
    for split in ("train", "val", "test"):  # exact evaluation over the host table
        assert abs(host[f"{split}_acc"] - device[f"{split}_acc"]) < 1e-6, split
    assert load(out, "typed_dp4_host")[1]["cache"] == {"rows": 300, "devices": 4,
                                                       "slot_map": False}
    assert load(out, "dp4_host")[1]["cache"] == {"rows": 200, "devices": 4, "slot_map": True}


def test_collectives_parse_and_check():
    assert zg.Collectives.parse("optimised") == zg.Collectives()
    assert zg.Collectives.parse("baseline").describe() == "tree.psum.late"
    assert zg.Collectives.parse("flat.host.early").overflow == "early"
    with pytest.raises(ValueError, match="needs grads 'flat'"):
        zg.Collectives.parse("tree.host.packed")
    with pytest.raises(ValueError, match="metrics must be one of psum, host"):
        zg.Collectives("flat", "device", "late")
    with pytest.raises(ValueError, match="GRADS.METRICS.OVERFLOW"):
        zg.Collectives.parse("fast")


def test_psum_flat_is_one_all_reduce_per_dtype():
    """The flat reduction sums every leaf and the extras exactly like per-leaf psums,
    with one all-reduce for the float32 leaves (and the extras) and one for bfloat16."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    mesh = parallel.make_mesh(1)
    tree = {"a": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(4, jnp.bfloat16),
            "c": jnp.float32(2.5), "n": jnp.arange(3)}
    extras = jnp.array([7.0, 1.0])
    run = jax.jit(jax.shard_map(parallel.psum_flat, mesh=mesh, in_specs=P(), out_specs=P(),
                                check_vma=False))
    out, ex = run(tree, extras)
    for key in tree:
        assert out[key].dtype == tree[key].dtype and out[key].shape == tree[key].shape
        np.testing.assert_array_equal(out[key], tree[key])
    np.testing.assert_array_equal(ex, extras)
    hlo = run.lower(tree, extras).as_text()
    assert hlo.count("all_reduce") == 3  # float32 with the extras, bfloat16, the int leaf


def test_checkpoint_restores_across_device_counts(resumed):
    (params4, record4), (params1, summary1) = resumed
    assert_params_close(params4, params1)
    summary4 = record4["summary"]
    assert (summary4["devices"], summary4["global_batch"]) == (4, 32)
    assert (summary1["devices"], summary1["global_batch"]) == (1, 32)
    assert len(record4["losses"]) == 3  # two epochs restored from the record, one trained


def test_a_checkpoint_of_two_devices_restores_for_inference_on_one(runs):
    """`restore(for_inference=True)` reads the arrays whole onto this process's device
    (it asked Orbax for the saving mesh's shardings, and failed on a topology mismatch)."""
    from zerognn_jax import restore

    root = runs["root"]
    saved, _ = load(root / "save", "saved")
    result = restore(root / "ckpt", dataset=worker.make_problem(), for_inference=True)
    assert_params_close(worker.flat(result.variables["params"]), saved, rtol=0, atol=0)
    assert result.program.num_shards == 1


def test_variables_of_two_devices_start_a_run_on_one(runs):
    """train(variables=) given a run's variables as they lie on its two devices starts a
    one-device run from them (their copy was committed to the other devices: JAX
    refused the two together)."""
    saved, _ = load(runs["root"] / "save", "saved")
    started, _ = load(runs["root"] / "save", "saved_on_one")
    assert_params_close(started, saved, rtol=0, atol=0)


def test_two_processes_train_like_one(runs, resumed):
    out = runs["jobs"]["two0"].wait()
    runs["jobs"]["two1"].wait()
    params, record = load(out, "two")
    (params4, record4), _ = resumed
    assert (record["summary"]["processes"], record["summary"]["devices"]) == (2, 4)
    assert_params_close(params, params4, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(record["losses"], record4["losses"], rtol=1e-5)


def test_a_process_count_from_the_environment_that_is_no_number_names_it(monkeypatch,
                                                                         capsys):
    """argparse reads a default through the flag's type: $JAX_NUM_PROCESSES=two was
    refused as the flag's value, which the command line did not hold."""
    from zerognn_jax import cli

    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    for argv, said in ((["--coordinator", "127.0.0.1:1", "--process-id", "0"],
                        "'two' (the value of $JAX_NUM_PROCESSES)"),
                       (["--num-processes", "x"], "'x'")):
        with pytest.raises(SystemExit) as stop:  # argparse's usage error
            cli.main(["train", *argv])
        assert stop.value.code == 2
        assert capsys.readouterr().err.endswith(
            f"zerognn train: error: argument --num-processes: expected an integer, got "
            f"{said}\n")


def test_cli_distributed_flags(monkeypatch, capsys):
    from zerognn_jax import cli

    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    args = cli.build_parser().parse_args(
        ["train", "--devices", "0", "--shard-features", "--coordinator", "10.0.0.1:9000",
         "--num-processes", "2", "--process-id", "1"])
    assert (args.devices, args.shard_features, args.coordinator) == (0, True, "10.0.0.1:9000")
    assert (args.num_processes, args.process_id) == (2, 1)
    assert cli.main(["train", "--coordinator", "10.0.0.1:9000"]) == 2
    assert "--num-processes and --process-id" in capsys.readouterr().err
    for address in ("nonsense", "10.0.0.1:", ":9000", "10.0.0.1:port", "h:70000"):
        assert cli.main(["train", "--coordinator", address, "--num-processes", "1",
                         "--process-id", "0"]) == 2  # (JAX's IndexError: a traceback)
        assert f"--coordinator '{address}' must be HOST:PORT" in capsys.readouterr().err
