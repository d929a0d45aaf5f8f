"""`zerognn bench` end to end on CPU, and the trace parsing behind the GPU fraction."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FAST_XLA

from zerognn_jax import TrainConfig
from zerognn_jax._src.bench import profiling
from zerognn_jax._src.bench import report as bench_report
from zerognn_jax._src.bench import run as bench
from zerognn_jax._src.bench.workload import FIELDS, VARIANTS
from zerognn_jax._src.ops import aggregate

NUMBERS = ("epoch_seconds", "compile_seconds", "warmup_seconds", "steps_per_second",
           "sampled_edges_per_second", "envelope_bytes", "ideal_bytes", "envelope_over_ideal",
           "steps_per_epoch", "steps_timed", "overflows")


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    out, png = tmp / "bench.jsonl", tmp / "bench.png"
    cmd = [sys.executable, "-m", "zerognn_jax.cli", "bench", "--dataset", "tiny",
           "--layers", "1", "--fanouts", "4", "--hidden", "16", "--batch-size", "128",
           "--epochs", "1", "--host-steps", "2", "--check-steps", "2", "--phases",
           "--batch-sizes", "128", "--out", str(out), "--plot", str(png), "--no-progress"]
    env = dict(os.environ, XLA_FLAGS=FAST_XLA, JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return records, png, proc.stdout


def test_every_config_reports_every_field(bench_run):
    records, _, _ = bench_run
    configs = {r["config"]: r for r in records if r["kind"] == "config"}
    assert set(configs) == set(VARIANTS)
    for name, r in configs.items():
        assert set(FIELDS) <= set(r), name
        assert r["status"] in ("ok", "skipped"), (name, r["reason"])
        # the bench ran on the CPU (JAX_PLATFORMS above), where Pallas kernels would run
        # in their interpreter, which sums repeated ids wrongly: the epoch it timed
        # trained on wrong gradients
        if name == "scan-pallas":
            assert r["status"] == "skipped" and "need an NVIDIA GPU" in r["reason"], r
            continue
        for field in NUMBERS:
            assert isinstance(r[field], (int, float)) and r[field] >= 0, (name, field)
        assert len(r["envelope"]) == 2 and r["device"] == "cpu"
        assert r["jax_version"] == jax.__version__
        assert isinstance(r["git_commit"], (str, type(None)))
        # No GPU: no execution fraction and no allocator statistics.
        assert r["gpu_fraction"] is None and r["peak_bytes_in_use"] is None
    assert configs["host-exact"]["extrapolated"] and not configs["scan-xla"]["extrapolated"]
    assert configs["host-exact"]["shapes_compiled"] == 2
    # One hop: the library's choice is a tree; the host engines always deduplicate.
    assert configs["scan-xla"]["dedup"] is False and configs["scan-dedup"]["dedup"] is True
    assert configs["host-exact"]["dedup"] is True
    assert configs["scan-cmdbuf"]["peak_scope"] == "config"  # measured in its own process


def test_check_phases_sweep_and_summary(bench_run):
    records, png, stdout = bench_run
    kinds = {r["kind"]: r for r in records}
    check = kinds["check"]
    assert check["status"] == "ok" and check["counts_equal"] and check["edges_equal"]
    phases = kinds["phases"]
    assert phases["sample_epoch_seconds"] > 0 and phases["floor_epoch_seconds"] > 0
    assert set(phases["bytes_per_step"]) == {"features", "csr", "activations", "optimizer"}
    sweep = [r for r in records if r["kind"] == "sweep"]
    assert {r["config"] for r in sweep} == {"scan-xla", "host-bucketed"}
    assert all(r["step_seconds"] > 0 for r in sweep)
    summary = kinds["summary"]
    assert summary["speedup_vs_host-exact"]["host-exact"] == pytest.approx(1.0)
    assert "scan-xla" in summary["goals"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "scan-xla" in stdout.splitlines()[-1] or "goals" in stdout


def test_options_are_checked():
    with pytest.raises(ValueError, match="unknown configs"):
        bench.BenchOptions(configs=("scan-fast",))
    with pytest.raises(ValueError, match="host_steps"):
        bench.BenchOptions(host_steps=0)
    for train, script in ((dict(task="link"), "benchmarks/link.py"),
                          (dict(task="graph", dataset="molhiv-like", model="gin"),
                           "benchmarks/graph.py"),
                          (dict(dataset="mag-like", model="rsage"), "benchmarks/hetero.py")):
        with pytest.raises(ValueError, match=f"zerognn bench times .* run {script}"):
            bench.BenchOptions(TrainConfig(**train))


def test_a_dataset_that_cannot_be_read_is_refused_before_any_child_process(tmp_path):
    """A missing or unreadable dataset file was found by each child process and then by
    the parent: one error line each. The options refuse it, naming the file."""
    with pytest.raises(FileNotFoundError, match="no/such.npz'?: no such file"):
        bench.BenchOptions(TrainConfig(dataset=str(tmp_path / "no/such.npz")))
    (tmp_path / "bad.npz").write_bytes(b"not an archive")
    with pytest.raises(ValueError, match="bad.npz is not a readable zerognn dataset file"):
        bench.BenchOptions(TrainConfig(dataset=str(tmp_path / "bad.npz")))


@pytest.mark.parametrize("kwargs, match", [
    ({"configs": ()}, r"configs must name at least one configuration \(or ask for "
                      r"check_steps, phases or batch_sizes alone\)"),
    ({"deadline": -1.0}, "deadline must be a positive number of seconds, got -1.0"),
    ({"deadline": float("nan")}, "deadline must be a positive number of seconds, got nan"),
    ({"batch_sizes": (2**33,)}, r"batch_sizes must be in \[1, 2\*\*31\)"),
    ({"out": ""}, "out must not be an empty path"),
    ({"plot": "x.foo"}, "plot must end in one of .png"),
    ({"plot": "no/such/folder/x.png"},
     r"plot 'no/such/folder/x.png' names a folder that does not exist \(no/such/folder\)"),
    ({"plot": "x.png", "matplotlib": None},
     r"--plot needs matplotlib: pip install 'zerognn-jax\[plot\]'"),
])
def test_options_that_would_fail_after_the_measurements_fail_first(kwargs, match, tmp_path,
                                                                    monkeypatch):
    if kwargs.pop("matplotlib", True) is None:  # not installed: it failed after the runs
        monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ValueError, match=match):
        bench.BenchOptions(**kwargs)
    with pytest.raises(ValueError, match="out .* is a folder, not a file"):
        bench.BenchOptions(out=str(tmp_path))
    (tmp_path / "notes.txt").write_text("hello\n")  # written over, or found after the runs
    for name, path, said in (
            ("envelope_cache", "notes.txt", r"holds something other than a cached envelope "
                                            r"\(it begins 'hello'\)"),
            ("envelope_cache", "notes.txt/env.json", "notes.txt is a file, not a folder"),
            ("trace_dir", "notes.txt/t", "notes.txt is a file, not a folder"),
            ("plot", "notes.txt/x.png", "notes.txt is a file, not a folder"),
            ("plot", "folder.png", "is a folder, not a file")):
        (tmp_path / "folder.png").mkdir(exist_ok=True)
        with pytest.raises(ValueError, match=f"{name} .*{said}"):
            bench.BenchOptions(**{name: str(tmp_path / path)})
    assert (tmp_path / "notes.txt").read_text() == "hello\n"
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="trace_dir .* is a file, not a folder"):
        bench.BenchOptions(trace_dir=str(tmp_path / "f"))
    with pytest.raises(ValueError, match="envelope_cache .* is a folder, not a file"):
        bench.BenchOptions(envelope_cache=str(tmp_path))
    (tmp_path / "data.npz").write_bytes(b"PK\x03\x04 not records")  # appended to before
    with pytest.raises(ValueError, match=r"data.npz holds something other than JSON lines "
                                         r"\(it begins 'PK\\x03\\x04 not records'\)"):
        bench.BenchOptions(out=str(tmp_path / "data.npz"))
    (tmp_path / "old.jsonl").write_text('{"config": "scan"}\n')
    bench.BenchOptions(out=str(tmp_path / "old.jsonl"))  # an earlier run's lines: appended to


def test_the_envelope_option_chunks_and_devices_reach_the_measured_run(tmp_path):
    """--envelope conservative runs at the conservative bound (it ran at the calibrated
    envelope), and an epoch over two devices is timed whole at the global batch (it was
    taken for half an epoch and doubled), its records naming both counts (they named
    neither); a cached envelope of another --envelope is not
    reused (nor of another --replace: the cache's key holds both)."""
    out, cache = tmp_path / "b.jsonl", tmp_path / "env.json"
    cmd = [sys.executable, "-m", "zerognn_jax.cli", "bench", "--dataset", "tiny",
           "--layers", "2", "--fanouts", "2,2", "--hidden", "8", "--batch-size", "128",
           "--epochs", "1", "--configs", "scan-dedup", "--multiple", "1", "--no-flat-outer",
           "--devices", "2", "--chunk-steps", "5", "--out", str(out), "--no-progress",
           "--envelope-cache", str(cache)]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{FAST_XLA} --xla_force_host_platform_device_count=2")
    for envelope in ("calibrate", "conservative"):
        proc = subprocess.run([*cmd, "--envelope", envelope], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    calibrated, conservative = [json.loads(line) for line in out.read_text().splitlines()
                                if '"kind": "config"' in line]
    assert conservative["envelope"] == [128, 384, 1152]  # 128 (1 + 2) (1 + 2)
    assert calibrated["envelope"] != conservative["envelope"]
    for record in (calibrated, conservative):  # tiny trains 2,938 nodes: 12 steps of 256
        assert record["steps_per_epoch"] == record["steps_timed"] == 12
        assert not record["extrapolated"]
        assert (record["batch_size"], record["devices"], record["global_batch"]) == \
            (128, 2, 256)
    key = json.loads(cache.read_text())["key"]
    assert key["envelope"] == "conservative" and key["replace"] is False


def test_chunk_steps_reach_the_measured_engine(tmp_path, monkeypatch):
    from zerognn_jax._src.bench import workload
    from zerognn_jax.cli import main

    made, make = [], workload.make_engine
    monkeypatch.setattr(workload, "make_engine",
                        lambda *a, **k: made.append(k["chunk_steps"]) or make(*a, **k))
    assert main(["bench", "--dataset", "tiny", "--layers", "1", "--fanouts", "2",
                 "--hidden", "8", "--batch-size", "512", "--epochs", "1", "--configs",
                 "scan-xla", "--chunk-steps", "3", "--no-progress",
                 "--out", str(tmp_path / "b.jsonl")]) == 0
    assert made == [3]


def test_an_envelope_cache_that_does_not_read_is_calibrated_again(tmp_path):
    from zerognn_jax._src.bench.workload import _read_cache

    for text in ("[1, 2]", '{"key": ', '{"key": {}}'):
        (tmp_path / "c.json").write_text(text)
        assert _read_cache(tmp_path / "c.json") is None
    assert _read_cache(tmp_path / "gone.json") is None
    good = {"key": {}, "capacities": [8], "max_counts": [4], "mean_counts": [3.0], "steps": 2}
    (tmp_path / "c.json").write_text(json.dumps(good))
    assert _read_cache(tmp_path / "c.json") == good


def test_a_failing_child_becomes_an_error_record():
    options = bench.BenchOptions(TrainConfig(dataset="tiny", progress=False),
                                 configs=("scan-xla",))
    (record,) = bench.run_child(options, "--xla_no_such_flag=1", timeout=120)
    assert record["status"] == "error" and "xla_no_such_flag" in record["reason"]
    assert set(FIELDS) <= set(record)


def test_a_child_the_deadline_stops_is_skipped_with_its_reason(monkeypatch):
    """It was an error record of empty reason (the killed child's stderr), and `zerognn
    bench` exited 1 where a measurement in process is skipped. The child here sleeps
    past its deadline whatever the machine's speed."""
    popen = subprocess.Popen

    def sleeping_child(cmd, **kwargs):
        return popen([sys.executable, "-c", "import time; time.sleep(120)"], **kwargs)

    monkeypatch.setattr(bench.subprocess, "Popen", sleeping_child)
    options = bench.BenchOptions(TrainConfig(dataset="tiny", progress=False),
                                 configs=("scan-xla",))
    (record,) = bench.run_child(options, timeout=0.2)
    assert record["status"] == "skipped"
    assert record["reason"] == ("time budget (--deadline) spent: its child process was "
                                "stopped after 0.2 s")


def test_a_child_stopped_by_ctrl_c_keeps_what_it_measured(monkeypatch):
    """A terminal's Ctrl-C reaches the child too: it finishes its config, writes the
    record and exits 130. Its record was thrown away for an error record (`bench
    --isolate`, and `scan-cmdbuf` always); a child stopped before it measured anything
    is skipped, not an error. A child that exits 1 (its measurement's record an error)
    keeps its record and reason: they were replaced by "child process exited with 1: "
    and nothing (an out-of-memory error under `--isolate` showed no reason)."""
    popen = subprocess.Popen
    script = ("import json, sys; out = json.load(open(sys.argv[1]))['out']; "
              "r = {'kind': 'config', 'config': 'scan-xla', 'status': 'ok', 'epoch_s': 1.5}; "
              "e = dict(r, status='error', reason='JaxRuntimeError: out of memory'); "
              "open(out, 'w').write({'1': json.dumps(r) + '\\n', '2': json.dumps(e) + "
              "'\\n'}.get(sys.argv[2], '')); sys.exit(int(sys.argv[3]))")
    options = bench.BenchOptions(TrainConfig(dataset="tiny", progress=False),
                                 configs=("scan-xla",))
    def child(wrote: str, code: int) -> dict:
        monkeypatch.setattr(bench.subprocess, "Popen", lambda cmd, **kw: popen(
            [sys.executable, "-c", script, cmd[-1], wrote, str(code)], **kw))
        (record,) = bench.run_child(options, timeout=120)
        return record

    for code in (130, 143, 129):
        record = child("1", code)
        assert (record["status"], record["epoch_s"]) == ("ok", 1.5)
    record = child("0", 130)
    assert record["status"] == "skipped" and record["reason"] == (
        "its child process was stopped by SIGINT before it measured it")
    record = child("2", 1)
    assert (record["status"], record["reason"]) == ("error", "JaxRuntimeError: out of memory")
    record = child("0", 1)  # a failure before any record stays an error
    assert record["status"] == "error" and record["reason"].startswith(
        "child process exited with 1")


def test_check_phases_or_a_sweep_run_without_configs_and_skips_are_no_failure(monkeypatch):
    """benchmarks/run_gpu.sh's third step asks for the check, the phases and the sweep
    with `--configs ""`, which was refused: the step never ran. A run whose records are
    all skipped (Pallas off a GPU) exited 1 with no message, for its summary's "nothing
    measured"; an error record still makes it 1. A check or phases record that failed
    is a line of the table (the table read its figures: KeyError)."""
    from zerognn_jax.cli import bench as bench_cli

    for alone in ({"check_steps": 2}, {"phases": True}, {"batch_sizes": (64,)}):
        assert bench.BenchOptions(configs=(), **alone).configs == ()
    summary = {"kind": "summary", "status": "nothing measured", "goals": {}}
    skipped = {"kind": "config", "config": "scan-pallas", "status": "skipped"}
    for records, code in (([skipped, summary], 0),
                          ([dict(skipped, status="error"), summary], 1)):
        monkeypatch.setattr(bench, "run", lambda options, records=records: records)
        monkeypatch.setattr(bench_cli, "options_from_args", lambda args: None)
        assert bench_cli.run_bench(SimpleNamespace()) == code
    failed = {"kind": "check", "config": "scan-vs-host-exact", "status": "error",
              "reason": "ValueError: the host engine runs on one device"}
    assert "check scan-vs-host-exact: error: ValueError: the host engine runs on one " \
           "device" in bench_report.format_table([failed, dict(failed, kind="phases",
                                                                config="phases")])


def test_a_batch_above_the_training_items_is_lowered_and_a_sweep_point_above_skipped(
        tmp_path):
    """`zerognn train` lowers a batch above the training items to them
    (`trainer.fit_batch`); the bench calibrated and timed the batch asked (env/ideal
    2.15 at batch 1024 on 393 items) while its program took the lowered one. A sweep
    point above the items is skipped, its record carrying its own batch."""
    from zerognn_jax._src.bench import workload

    cfg = TrainConfig(dataset="tiny", layers=1, fanouts=(3,), hidden=8,
                      batch_size=10**6, epochs=1, progress=False)
    wb = workload.Workbench(bench.BenchOptions(cfg, configs=("scan-xla",)))
    items = len(wb.dataset.train_idx)
    assert wb.cfg.batch_size == wb.program.batch_size == wb.envelope.batch_size == items
    records = bench.run(bench.BenchOptions(cfg, configs=(), batch_sizes=(items + 1,)))
    sweep = [r for r in records if r["kind"] == "sweep"]
    assert [(r["status"], r["batch_size"]) for r in sweep] == [("skipped", items + 1)] * 2
    assert sweep[0]["reason"] == (f"batch {items + 1} is above the {items} training items "
                                  f"a device takes")


def test_a_workload_refused_at_its_start_writes_no_record(tmp_path, capsys):
    """A workload refused as the run builds it (edge features on a graph without them)
    is one error line; a "nothing measured" summary was printed and appended to `out`
    before it, as if a run had happened. The `out` it created is taken back (an empty
    file was left); one that was there stays as it was."""
    out = tmp_path / "b.jsonl"
    cfg = TrainConfig(dataset="tiny", layers=1, fanouts=(3,), hidden=8, epochs=1,
                      edge_features=True, model="gine", progress=False)
    for before in (None, "", '{"kind": "summary"}\n'):
        if before is not None:
            out.write_text(before)
        with pytest.raises(ValueError, match="has no edge-feature table"):
            bench.run(bench.BenchOptions(cfg, configs=("scan-xla",), out=str(out)))
        assert capsys.readouterr().out == ""
        assert (out.read_text() if out.exists() else None) == before


def test_union_length_counts_overlaps_once():
    assert profiling.union_length([]) == 0
    assert profiling.union_length([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == pytest.approx(4.0)


def _event(pid, tid, ts, dur, name="k"):
    return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name}


def _meta(pid, tid, kind, name):
    event = {"ph": "M", "pid": pid, "name": kind, "args": {"name": name}}
    return event if tid is None else dict(event, tid=tid)


def test_execution_fraction_reads_device_streams(tmp_path):
    events = [
        _meta(1, None, "process_name", "/device:GPU:0"),
        _meta(1, 7, "thread_name", "Stream #7(compute)"),
        _meta(1, 8, "thread_name", "Stream #8(memcpy)"),
        _meta(1, 9, "thread_name", "XLA Modules"),
        _meta(2, None, "process_name", "/host:CPU"),
        _meta(2, 1, "thread_name", "python"),
        _event(2, 1, 100, 100, profiling.WINDOW),
        _event(1, 7, 90, 20),  # clipped to [100, 110]
        _event(1, 7, 120, 30),
        _event(1, 8, 140, 20),  # overlaps the kernel above: union [120, 160]
        _event(1, 9, 100, 100, "jit_run"),  # a derived line spanning gaps: ignored
        _event(2, 1, 150, 10, "host work"),  # host events do not count
        _event(1, 7, 250, 10),  # outside the window
    ]
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    got = profiling.execution_fraction(path)
    assert got["fraction"] == pytest.approx(0.5)
    assert got["busy_seconds"] == pytest.approx(50e-6)
    assert got["window_seconds"] == pytest.approx(100e-6)
    assert got["lines"] == ["/device:GPU:0 / Stream #7(compute)",
                            "/device:GPU:0 / Stream #8(memcpy)"]


def test_phase_table_sums_kernels_by_the_phase_of_their_operation(tmp_path):
    text = "\n".join([
        'ENTRY %main (p: f32[8]) -> f32[8] {',
        '  %fusion.1 = f32[8]{0} fusion(f32[8]{0} %p), kind=kLoop, calls=%fc, '
        'metadata={op_name="jit(run)/while/body/sample/sort" source_file="a.py"}',
        '  ROOT %custom-call.2 = f32[8]{0} custom-call(f32[8]{0} %fusion.1), '
        'metadata={op_name="jit(run)/transpose(jvp(Model))/dot_general"}',
        '}'])
    assert profiling.op_names(text) == {
        "fusion_1": "jit(run)/while/body/sample/sort",
        "custom_call_2": "jit(run)/transpose(jvp(Model))/dot_general"}
    events = [_meta(1, None, "process_name", "/device:GPU:0"),
              _meta(1, 7, "thread_name", "Stream #7(compute)")]
    for hlo_op, dur in (("fusion.1", 30), ("fusion.1", 30), ("custom-call.2", 10), (None, 5)):
        events.append(dict(_event(1, 7, 0, dur, "memset" if hlo_op is None else "k"),
                           args={} if hlo_op is None else {"hlo_op": hlo_op}))
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    phase = lambda op: ("none" if op is None else "sampling" if "/sample/" in op
                        else "other")
    assert profiling.phase_table(path, text, 2, phase) == {
        "sampling": [30.0, 1.0], "other": [5.0, 0.5], "none": [2.5, 0.5]}
    rows = profiling.step_profile(path, text, 2, phase, top=2)["kernels"]
    assert [(r[0], r[1], r[-1]) for r in rows] == [
        ("fusion_1", 30.0, "jit(run)/while/body/sample/sort"),
        ("custom_call_2", 5.0, "jit(run)/transpose(jvp(Model))/dot_general")]
    # a compiled program's instructions carry the named scopes they were traced under
    def scoped(x):
        with jax.named_scope("sample"):
            return jnp.sort(x) * 2
    names = profiling.op_names(jax.jit(scoped).lower(jnp.ones(8)).compile().as_text())
    assert any("sample/" in op for op in names.values())


def test_a_kernels_phase_is_its_first_named_scope_found_whole():
    scopes = (("embedding_update", "embedding"), ("update", "optimizer"),
              ("transpose", "backward"))
    phase = lambda op: profiling.scope_phase(op, scopes)
    assert phase("jit(run)/while/body/embedding_update/pallas_call") == "embedding"
    assert phase("jit(run)/while/body/update/add") == "optimizer"
    assert phase("jit(run)/transpose(jvp(GNN))/dot_general") == "backward"
    assert phase("jit(run)/jvp(GNN)/updated_rows/mul") == "forward and other"  # no part
    assert phase(None) == "unnamed"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="traces a run on the CPU backend")
def test_a_cpu_trace_has_no_device_fraction(tmp_path):
    double = jax.jit(lambda x: x * 2)
    with profiling.traced_window(tmp_path):
        jax.block_until_ready(double(jnp.ones(8)))
    assert profiling.execution_fraction(profiling.find_trace(tmp_path)) is None
    with pytest.raises(FileNotFoundError):
        profiling.find_trace(tmp_path / "missing")


def test_summary_and_table_from_records():
    options = bench.BenchOptions(TrainConfig(dataset="tiny"))
    base = {"kind": "config", "status": "ok", "extrapolated": False, "batch_size": 1024,
            "steps_per_epoch": 100, "dataset": "products-like", "scale": 1.0}
    records = [
        {**dict.fromkeys(FIELDS), **base, "config": "host-exact", "epoch_seconds": 2.0,
         "gpu_fraction": 0.2},
        {**dict.fromkeys(FIELDS), **base, "config": "scan-xla", "epoch_seconds": 0.25,
         "gpu_fraction": 0.97},
        {**bench.blank_record("config", "scan-pallas", options), "status": "skipped",
         "reason": "kernels not importable: no module"},
    ]
    summary = bench_report.summarize(records)
    assert summary["speedup_vs_host-exact"]["scan-xla"] == pytest.approx(8.0)
    assert summary["goals"]["scan-xla"] == {"speedup_vs_host_exact": True,
                                            "gpu_fraction": True, "epoch_seconds": True}
    table = bench_report.format_table([*records, summary])
    assert "scan-pallas    skipped: kernels not importable" in table
    assert "goals scan-xla: speedup_vs_host_exact met" in table
    assert "step time (ms) vs batch size" not in table  # one batch size: no sweep
    # a name longer than the column widens it (scan-dedup-bf16's row was shifted)
    longer = [{**records[1], "config": "scan-dedup-bf16"}, records[1]]
    lines = bench_report.format_table(longer).splitlines()
    column = lines[0].index("epoch s") + len("epoch s")  # right-aligned under it
    assert [line.index("0.250") + len("0.250") for line in lines[2:]] == [column, column]
    # the epoch's goal was set on products-like at batch 1024: another epoch is no
    # measure of it (tiny's was reported as meeting it)
    tiny = [{**r, "dataset": "tiny"} for r in records[:2]]
    assert bench_report.summarize(tiny)["goals"]["scan-xla"]["epoch_seconds"] is None


def test_appended_runs_are_rendered_each_on_its_own(tmp_path, capsys):
    """Two runs appended to one file (`--out` appends) give two summaries, each run's
    speedup over its own host-exact (not the last run's); a line that is not JSON, or
    not a bench record, is named."""
    base = {**dict.fromkeys(FIELDS), "kind": "config", "status": "ok",
            "extrapolated": False, "batch_size": 1024, "steps_per_epoch": 100}
    runs = [[{**base, "config": "host-exact", "epoch_seconds": exact},
             {**base, "config": "scan-xla", "epoch_seconds": scan}]
            for exact, scan in ((2.0, 0.25), (3.0, 1.0))]
    lines = [json.dumps(r) for run in runs for r in (*run, {"kind": "summary"})]
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert bench_report.runs_of([json.loads(line) for line in lines]) == runs
    assert bench_report.main([str(path)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()
               if line.startswith("{")]
    assert [p["speedup_vs_host-exact"]["scan-xla"] for p in printed] == [8.0, 3.0]
    path.write_text(lines[0] + "\nnot json\n")
    with pytest.raises(SystemExit) as stop:
        bench_report.main([str(path)])
    assert stop.value.code == 2
    assert f"{path}, line 2, is not a JSON record" in capsys.readouterr().err
    # JSON that is not a bench record (another command's line, a list): named, where it
    # raised a KeyError or an AttributeError from inside the report
    for foreign in ('{"summary": true, "dataset": "cora"}', "[1, 2]",
                    '{"kind": "config", "status": "ok"}'):
        path.write_text(lines[0] + "\n" + foreign + "\n")
        with pytest.raises(SystemExit) as stop:
            bench_report.main([str(path)])
        assert stop.value.code == 2
        assert f"{path}, line 2, is not a record of zerognn bench" in \
            capsys.readouterr().err


def test_children_get_no_blank_xla_flags(monkeypatch):
    # XLA takes a non-empty XLA_FLAGS without "--" for a file name and aborts.
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert "XLA_FLAGS" not in bench.child_env()
    assert bench.child_env(" --xla_a=1 ")["XLA_FLAGS"] == "--xla_a=1"
    monkeypatch.setenv("XLA_FLAGS", "--xla_b=2")
    assert bench.child_env("--xla_a=1")["XLA_FLAGS"] == "--xla_b=2 --xla_a=1"


def test_git_commit_marks_a_dirty_tree(tmp_path, monkeypatch):
    """A checkout's commit, "+dirty" after an edit; None outside a checkout, and for a
    copy installed into site-packages inside another repository (it gave that
    repository's commit)."""
    from zerognn_jax._src.bench import workload as bench_workload

    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True,
                                    capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "f.txt").write_text("one\n")
    (tmp_path / "site-packages").mkdir()
    monkeypatch.setattr(bench_workload, "REPO", tmp_path / "site-packages")
    read = bench_workload.git_commit.__wrapped__
    assert read() is None  # (nothing committed yet either: no repository of ours)
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "zerognn_jax").mkdir()
    git("add", "f.txt", "pyproject.toml")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    monkeypatch.setattr(bench_workload, "REPO", tmp_path)
    head = git("rev-parse", "HEAD")
    assert read() == head
    (tmp_path / "f.txt").write_text("two\n")
    assert read() == head + "+dirty"
    monkeypatch.setattr(bench_workload, "REPO", tmp_path / "absent")
    assert read() is None


def test_a_signal_stops_the_bench_between_measurements(tmp_path):
    """SIGINT after the first record: the run ends after the measurement in progress with
    exit code 130, one line on stderr, and every record written so far intact."""
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "zerognn_jax.cli", "bench", "--dataset", "tiny",
           "--layers", "1", "--fanouts", "4", "--hidden", "16", "--batch-size", "128",
           "--epochs", "1", "--host-steps", "2",
           "--configs", "scan-xla,scan-tree,scan-bf16,host-exact,host-bucketed",
           "--out", str(out), "--no-progress"]
    env = dict(os.environ, XLA_FLAGS=FAST_XLA, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    while not (out.exists() and out.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, "no record was written"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert re.fullmatch(r"zerognn: interrupted by SIGINT after config [a-z-]+",
                        err.strip().splitlines()[-1])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert 1 <= len(records) - 1 < 5 and all(r["status"] == "ok" for r in records[:-1])
    # the summary says the run was stopped (it said "ok", as if it had measured all)
    assert records[-1]["kind"] == "summary" and records[-1]["status"] == "interrupted"
    assert records[-1]["stopped_after"] == err.strip().rsplit(" after ", 1)[1]


def test_collective_breakdown_splits_each_device(tmp_path):
    events = [
        _meta(1, None, "process_name", "/device:GPU:0"),
        _meta(1, 7, "thread_name", "Stream #7(compute)"),
        _meta(3, None, "process_name", "/device:GPU:1"),
        _meta(3, 7, "thread_name", "Stream #7(compute)"),
        _event(1, 7, 0, 50, "fusion"),
        _event(1, 7, 50, 30, "ncclDevKernel_AllReduce_Sum_f32"),  # waits for GPU:1
        _event(1, 7, 90, 10, "fusion"),  # a 10 us gap before it
        _event(3, 7, 0, 75, "fusion"),
        _event(3, 7, 75, 5, "ncclDevKernel_AllReduce_Sum_f32"),
    ]
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    got = profiling.collective_breakdown(path)
    assert got["/device:GPU:0"] == pytest.approx({
        "span_seconds": 100e-6, "busy_seconds": 90e-6, "idle_seconds": 10e-6,
        "collective_seconds": 30e-6, "collectives": 1})
    assert got["/device:GPU:1"]["collective_seconds"] == pytest.approx(5e-6)
    assert got["/device:GPU:1"]["span_seconds"] == pytest.approx(80e-6)


def test_hlo_bytes_count_gathered_rows_and_scatter_updates():
    """A fused gather counts the rows it reads (not the table), a scatter its index,
    its updates and the rows it reads and writes (not the whole target); a plain copy
    its operand and result."""
    from zerognn_jax._src.bench import hlo_bytes

    def f(table, ids, h, idx, upd):
        return jnp.sum(table[ids] * 2.0, axis=1), h.at[idx].add(upd)

    args = (jnp.ones((1000, 64)), jnp.zeros((10, 5), jnp.int32), jnp.ones((500, 32)),
            jnp.zeros(20, jnp.int32), jnp.ones((20, 32)))
    # the counts of XLA's own fusions: the suite's faster IR emitters (conftest.py) split
    # this scatter differently, so this program compiles with the fusion emitters
    emitters = "xla_cpu_use_fusion_emitters"
    deterministic = "xla_gpu_exclude_nondeterministic_ops"
    flags = os.environ.get("XLA_FLAGS", "")
    options = {emitters: True} if emitters in flags else {}
    if deterministic in flags:  # XLA:GPU's deterministic scatter is another program
        options[deterministic] = False
    compiled = jax.jit(f).lower(*args).compile(compiler_options=options or None)
    counts = hlo_bytes.instruction_bytes(compiled.as_text())
    row, upd = 64 * 4, 20 * 32 * 4
    assert 50 * row + 50 * 4 + 10 * row in counts.values()  # rows, ids, result
    assert 20 * 4 + 3 * upd in counts.values()  # index, updates, target rows read + written
    assert max(counts.values()) < 1000 * row  # no instruction counts the whole table
    assert hlo_bytes.shape_bytes("(f32[2,3]{1,0}, bf16[4])") == 32
    assert hlo_bytes.kernel_key("loop_select_fusion.2") == "loop_select_fusion_2"


def _benchmark_script(name: str):
    """A script of benchmarks/ loaded as a module (its main does not run), its folder on
    the import path as when it runs (for the modules the scripts share)."""
    folder = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
    if os.path.abspath(folder) not in map(os.path.abspath, sys.path):
        sys.path.append(os.path.abspath(folder))
    path = os.path.join(folder, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compile_time_reads_the_epoch_programs_pass_times_from_xlas_log():
    ct = _benchmark_script("compile_time")
    log = "\n".join([
        "I1204 06:59:09.1 792 hlo_pass_pipeline.cc:302] Running HLO pass pipeline on "
        "module jit_init: optimization",
        "I1204 06:59:11.5 792 hlo_pass_pipeline.cc:206] HLO pass: priority-fusion time: "
        "2.42 s (2415881 us) (cumulative: 4.1 s, max: 2.42 s, #called: 947)",
        "I1204 06:59:17.2 792 hlo_pass_pipeline.cc:302] Running HLO pass pipeline on "
        "module jit_run: fusion",
        "I1204 06:59:36.7 792 hlo_pass_pipeline.cc:206] HLO pass: priority-fusion time: "
        "19.5 s (19480361 us) (cumulative: 25.3 s, max: 19.5 s, #called: 2052)",
        "I1204 06:59:38.6 792 hlo_pass_pipeline.cc:206] HLO pass: multi_output_fusion "
        "time: 1.93 s (1930053 us) (cumulative: 27.6 s, max: 19.5 s, #called: 2055)",
        "I1204 06:59:38.7 792 hlo_pass_pipeline.cc:302] Running HLO pass pipeline on "
        "module jit_run: post-fusion",
        "I1204 06:59:38.8 792 hlo_pass_pipeline.cc:206] HLO pass: cse time: 437 us (437 us)",
        "I1204 06:59:38.9 792 hlo_pass_pipeline.cc:206] HLO pass: priority-fusion time: "
        "95.5 ms (95500 us)",
        "I1204 06:59:39.0 792 gpu_compiler.cc:2345] GpuCompiler::RunHloPasses for jit_run "
        "time: 24.2 s (24200000 us) (cumulative: 28.6 s, max: 24.2 s, #called: 6)",
        "I1204 06:59:45.7 792 gpu_compiler.cc:3017] GpuCompiler::RunBackend for jit_run "
        "time: 7.04 s (7040888 us) (cumulative: 8.46 s, max: 7.04 s, #called: 6)",
        "I1204 06:59:46.0 792 gpu_compiler.cc:3017] GpuCompiler::RunBackend for jit_add "
        "time: 44.1 ms (44088 us)",
    ])
    seconds = ct.pass_seconds(log)
    assert seconds == pytest.approx({"priority-fusion": 19.5955, "multi_output_fusion": 1.93,
                                     "cse": 0.000437, "RunHloPasses": 24.2,
                                     "RunBackend": 7.04})
    assert ct.pass_seconds(log, "jit_init") == {"priority-fusion": 2.42}
    assert ct.pass_seconds("no XLA lines here") == {}


def test_compile_time_variants_name_one_change_each():
    ct = _benchmark_script("compile_time")
    assert ct.variant_config("f32") == {"dtype": "float32"}
    assert ct.variant_config("bf16-ahead1") == {"dtype": "bfloat16", "sample_ahead": 1}
    assert ct.variant_config("f32-ahead12") == {"dtype": "float32", "sample_ahead": 12}
    assert ct.variant_config("bf16-gin-virtual") == {"dtype": "bfloat16",
                                                     "model": "gin-virtual"}
    for bad in ("fp16", "bf16-fast", "", "bf16-ahead0", "bf16-ahead"):
        with pytest.raises(ValueError, match=f"variant {bad!r}: expected DTYPE"):
            ct.variant_config(bad)


def test_graph_forms_split_encoder_is_the_library_encoder_rewritten():
    """benchmarks/graph_forms.py's `split-encoders` form must compute the same function
    with the same parameters, value and gradient, as the library's encoder, and put an
    optimisation barrier before each encoder's codes."""
    from zerognn_jax._src.nn import graph_models
    forms = _benchmark_script("graph_forms")
    vocab = (5, 6, 2)
    ids = jax.random.randint(jax.random.PRNGKey(1), (40, 3), 0, jnp.array(vocab))
    ours, theirs = graph_models.CategoricalEncoder(vocab, 8), forms._SplitEncoder(vocab, 8)
    params = ours.init(jax.random.PRNGKey(0), ids)
    assert jax.tree.structure(params) == jax.tree.structure(
        theirs.init(jax.random.PRNGKey(0), ids))
    loss = lambda module: lambda p: jnp.sum(jnp.sin(module.apply(p, ids)))
    assert jnp.array_equal(ours.apply(params, ids), theirs.apply(params, ids))
    for a, b in zip(jax.tree.leaves(jax.grad(loss(ours))(params)),
                    jax.tree.leaves(jax.grad(loss(theirs))(params))):
        assert jnp.array_equal(a, b)
    assert "optimization_barrier" in jax.jit(theirs.apply).lower(params, ids).as_text()
    with forms.swapped("split-encoders"):
        assert isinstance(graph_models.encoder(vocab, 8, jnp.float32, "e"), forms._SplitEncoder)
    assert not isinstance(graph_models.encoder(vocab, 8, jnp.float32, "e"), forms._SplitEncoder)


def test_graph_forms_saved_masks_drop_what_the_library_drops():
    """The `saved-masks` form's dropout equals the library's hash dropout, values and
    gradient, and models built inside the form use it."""
    from zerognn_jax._src.nn import graph_models
    from zerognn_jax._src.nn.models import hash_dropout
    forms = _benchmark_script("graph_forms")
    x = jax.random.normal(jax.random.PRNGKey(2), (33, 7), jnp.bfloat16)
    seed = jnp.uint32(12345)
    ours = lambda v: hash_dropout(v, 0.5, seed)
    theirs = lambda v: forms._saved_mask_dropout(v, 0.5, seed)
    assert jnp.array_equal(ours(x), theirs(x)) and 0 < int(jnp.sum(ours(x) == 0)) < x.size
    loss = lambda f: lambda v: jnp.sum(jnp.sin(f(v).astype(jnp.float32)))
    assert jnp.array_equal(jax.grad(loss(ours))(x), jax.grad(loss(theirs))(x))
    with forms.swapped("saved-masks"):
        assert graph_models.hash_dropout is forms._saved_mask_dropout
    assert graph_models.hash_dropout is hash_dropout


def test_graph_forms_materialised_virtual_node_is_the_library_broadcast():
    """The `vn-materialised` form's broadcast equals the library's, values and gradient,
    behind an optimisation barrier, and models built inside the form use it."""
    from zerognn_jax._src.nn import graph_models
    forms = _benchmark_script("graph_forms")
    rows = jax.random.normal(jax.random.PRNGKey(3), (4, 5))
    graphs = SimpleNamespace(node_graph=jnp.array([0, 0, 1, 2, 2, 2, 3]))
    ours = lambda r: graph_models.broadcast(r, graphs)
    theirs = lambda r: forms._materialised_broadcast(r, graphs)
    assert jnp.array_equal(ours(rows), theirs(rows))
    loss = lambda f: lambda r: jnp.sum(jnp.sin(f(r)) * jnp.arange(5.0))
    assert jnp.array_equal(jax.grad(loss(ours))(rows), jax.grad(loss(theirs))(rows))
    assert "optimization_barrier" in jax.jit(theirs).lower(rows).as_text()
    with forms.swapped("vn-materialised"):
        assert graph_models.broadcast is forms._materialised_broadcast
    assert graph_models.broadcast is forms._library_broadcast


def test_graph_forms_product_pooling_is_the_library_pooling():
    """The `product-pooling` form's sums, means and broadcasts equal the library's up to
    the order of float32 sums (bfloat16 rows pooled in float32), gradients too; max is
    the library's; models built inside the form use them."""
    from zerognn_jax._src.nn import graph_models
    forms = _benchmark_script("graph_forms")
    graphs = SimpleNamespace(node_graph=jnp.array([0, 0, 1, 1, 1, 3, 4, 4]),
                             n_node=jnp.array([2, 3, 0, 1, 2]), num_graphs=5)
    for dtype, tol in ((jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)):
        h = jax.random.normal(jax.random.PRNGKey(4), (8, 6), dtype)
        for how in ("sum", "mean", "max"):
            ours, theirs = (f(h, graphs, how) for f in (graph_models.pool, forms._product_pool))
            assert theirs.dtype == ours.dtype == dtype
            assert jnp.allclose(ours.astype(jnp.float32), theirs.astype(jnp.float32), rtol=tol,
                                atol=tol)
        rows = h[:5]
        assert jnp.array_equal(graph_models.broadcast(rows, graphs),
                               forms._product_broadcast(rows, graphs))
    h = jax.random.normal(jax.random.PRNGKey(5), (8, 6))
    for how in ("sum", "mean"):
        loss = lambda f, how=how: lambda v: jnp.sum(jnp.sin(f(v, graphs, how))
                                                    * jnp.arange(6.0))
        assert jnp.allclose(jax.grad(loss(graph_models.pool))(h),
                            jax.grad(loss(forms._product_pool))(h), rtol=1e-6, atol=1e-6)
    loss = lambda f: lambda r: jnp.sum(jnp.sin(f(r, graphs)) * jnp.arange(6.0))
    assert jnp.allclose(jax.grad(loss(graph_models.broadcast))(h[:5]),
                        jax.grad(loss(forms._product_broadcast))(h[:5]), rtol=1e-6, atol=1e-6)
    with forms.swapped("product-pooling"):
        assert graph_models.pool is forms._product_pool
        assert graph_models.broadcast is forms._product_broadcast
    assert graph_models.pool is forms._library_pool
    assert graph_models.broadcast is forms._library_broadcast


def test_task_devices_names_a_device_count_the_process_lacks(capsys):
    """benchmarks/task_devices.py refuses, before loading any data, more devices than
    the process sees and a task it does not time, naming what was asked."""
    td = _benchmark_script("task_devices")
    with pytest.raises(SystemExit):
        td.main(["--devices", f"1,{jax.local_device_count() + 1}"])
    assert f"asks for {jax.local_device_count() + 1} devices; this process sees" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        td.main(["--tasks", "node"])
    assert "--tasks takes graph and link" in capsys.readouterr().err


def test_the_sampling_phase_samples_in_tree_layout():
    """Its program returned the level counts only, which in tree layout do not depend on
    the draws: XLA left the sampling out (0.000 s an epoch). Its checksum of the sampled
    ids does, so another seed gives another one."""
    import numpy as np
    from conftest import random_graph

    from zerognn_jax import Envelope, SamplerConfig
    from zerognn_jax._src.bench.workload import _sample_epoch
    from zerognn_jax._src.ops.registry import XLA

    graph = random_graph(300, 3000, seed=4)
    config = SamplerConfig((4, 3), dedup=False).resolve(graph.max_degree())
    assert all(config.positional)  # the tree layout
    perm = jnp.asarray(np.random.default_rng(0).permutation(300)[:256], jnp.int32)
    static = dict(batch_size=64, config=config, envelope=config.fit_envelope(
        Envelope(64, (256, 1024))), kernels=XLA)
    sums = {int(_sample_epoch(graph.to_device(), perm, seed, 0, **static)) for seed in (0, 1)}
    assert len(sums) == 2


def test_link_benchmark_times_runs_without_what_they_compile(monkeypatch):
    """host-exact meets new shapes in each epoch's order, and its timed runs held their
    compiles (19.8 s of compiling in three 4.4 s runs on a CPU)."""
    link = _benchmark_script("link")
    clock = [0.0]
    monkeypatch.setattr(link, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    class Compiling:  # each run takes 5 s on the clock, 4 of them compiling
        compile_seconds = 0.0

        def run_epoch(self, state, data, items, epoch, env):
            clock[0] += 5.0
            self.compile_seconds += 4.0
            return SimpleNamespace(state=SimpleNamespace(params=jnp.zeros(())), envelope=env)

    seconds, _ = link._timed(Compiling(), None, None, None, None, repeats=3)
    assert seconds == 1.0


@pytest.mark.parametrize(("script", "argv", "message"), [
    ("link", ["--engines", "scan,bogus"], "unknown engine(s) 'bogus'; choose from scan, "),
    ("embeddings", ["--variants", "bogus"], "unknown variant(s) 'bogus'; choose from none, "),
    ("graph", ["--batch-sizes", "x"], "expected comma-separated integers, got 'x'"),
])
def test_benchmark_scripts_refuse_bad_arguments_in_one_line(script, argv, message, capsys):
    """A KeyError, a ValueError after the data were prepared, an int() traceback."""
    with pytest.raises(SystemExit):
        _benchmark_script(script).main(argv)
    assert message in capsys.readouterr().err


def test_a_trace_without_device_kernels_measures_nothing_rather_than_zeros(tmp_path):
    """A CPU's trace has no device stream lines: its records said 0.0 us a step."""
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": [_meta(1, None, "process_name", "/host:CPU")]}, handle)
    got = profiling.step_kernel_table(path, "", steps=4)
    assert got == {"kernels": [], "busy_us_per_step": None, "kernels_per_step": None,
                   "hlo_mb_per_step": None, "time_share_with_bytes": None}


def test_the_samplers_script_runs_labor(tmp_path, monkeypatch, capsys):
    """benchmarks/samplers.py's first example (LABOR) raised a TypeError once the LABOR
    window became a per-hop method; each hop's window is recorded."""
    script = _benchmark_script("samplers")
    out = tmp_path / "s.jsonl"
    monkeypatch.setattr(sys, "argv", [
        "samplers.py", "--dataset", "tiny", "--fanouts", "3,2", "--batch-size", "256",
        "--samplers", "labor", "--repeats", "1", "--cut-steps", "1", "--out", str(out)])
    script.main()
    record = json.loads(out.read_text())
    assert record["sampler"] == "labor" and len(record["labor_span"]) == 2
    assert all(0 <= cut <= 1 for cut in record["rows_cut"])


def test_bias_grad_forms_each_give_the_column_sum():
    """benchmarks/bias_grad.py's forms reformulate one sum: each gives the float32 column
    sum of the gradient (rows a block divides, and rows it does not)."""
    bg = _benchmark_script("bias_grad")
    for rows in (2048, 1000):
        g = jax.random.normal(jax.random.key(rows), (rows, 16)).astype(jnp.bfloat16)
        want = g.astype(jnp.float32).sum(0)
        for form in ("f32", "split", "ones", "barrier"):
            assert jnp.allclose(bg.bias_gradient(form, g), want, rtol=1e-5, atol=1e-4), form


def test_source_gradient_forms_equal_the_library():
    """benchmarks/source_gradient.py's packed forms compute the library's source gradient:
    float32 `packed` bit for bit (its list, and every slot past it; the list alone where
    it holds every repeated slot), `packed-rows` the
    same sums rounded once to bfloat16; `use` swaps the weighted sum's backward and back."""
    sg = _benchmark_script("source_gradient")
    r = np.random.default_rng(3)
    c, k, s, shares = 40, 4, 200, []
    for nbr in (r.permutation(s)[:c * k].reshape(c, k), r.integers(0, 12, (c, k))):
        nbr = nbr.astype(np.int32)
        nbr[:, 0] = 5  # a row read by every row's first slot
        live = r.random((c, k)) < 0.9
        shares.append((live.sum() - np.unique(nbr[live]).size) / live.size)
        w = jnp.asarray(r.random((c, k, 2)) * live[..., None], jnp.float32)
        g = jnp.asarray(r.standard_normal((c, 2, 3)), jnp.float32)
        args = (g, jnp.asarray(nbr), w, jnp.asarray(live), s)
        want = aggregate.source_gradient(*args)
        np.testing.assert_array_equal(np.asarray(sg.packed(*args)), np.asarray(want))
        if len(shares) == 1:  # under half the slots repeat: the list alone suffices
            np.testing.assert_array_equal(np.asarray(sg.packed(*args, fallback=False)),
                                          np.asarray(want))
        half = sg.packed_rows(*args, jnp.bfloat16)
        np.testing.assert_allclose(np.asarray(half, np.float32), np.asarray(want),
                                   rtol=2 ** -8, atol=1e-6)
    assert shares[0] < 0.5 < shares[1]  # the packed list, then every slot
    h = jnp.asarray(r.standard_normal((s, 2, 3)), jnp.bfloat16)
    grad = jax.grad(lambda h: aggregate.weighted_sum_reference(h, jnp.asarray(nbr), w.astype(
        jnp.bfloat16)).astype(jnp.float32).sum())
    library = grad(h)
    try:
        sg.use("packed")
        swapped = grad(h)
    finally:
        sg.use("library")
    assert swapped.dtype == library.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(swapped, np.float32),
                               np.asarray(library, np.float32), rtol=2 ** -7)
    np.testing.assert_array_equal(np.asarray(grad(h)), np.asarray(library))


def _probed(probe):
    """fn -> a scalar loss of fn's outputs: each one's float32 dot with its probe."""
    return lambda fn: lambda *a: sum(jnp.sum(o.astype(jnp.float32) * p)
                                     for o, p in zip(fn(*a), probe))


def test_layer0_mosaic_pair_gives_autodiffs_gradient_and_its_kernel_lowers_for_cuda():
    """benchmarks/layer0_mosaic.py: the layer pair's outputs are what the library's layers
    compute apart (to bfloat16 rounding: one product there, two here); its backward (the
    XLA slot gradient) gives autodiff's gradients through its forward (the weight
    gradient's product kept in float32 where autodiff rounds it to bfloat16); the Mosaic
    GPU kernel traces and lowers for CUDA."""
    lm = _benchmark_script("layer0_mosaic")
    r = np.random.default_rng(5)
    c, k, f, h = 64, 3, 64, 64
    mask = jnp.asarray(r.random((c, k)) < 0.7)
    w = mask / jnp.maximum(mask.sum(1, keepdims=True), 1).astype(jnp.float32)
    args = (jnp.asarray(r.standard_normal((c, f)), jnp.bfloat16),
            jnp.asarray(r.standard_normal((c * k, f)), jnp.bfloat16),
            jnp.asarray(r.standard_normal((f, h)) * 0.1, jnp.float32),
            jnp.asarray(r.standard_normal(h) * 0.1, jnp.float32), w, mask, jnp.uint32(7))
    loss = _probed([jnp.asarray(r.standard_normal((c, h)), jnp.float32) for _ in range(2)])
    plain = lambda *a: lm.layer_pair_forward(0.5, *a)[0]
    fused = lm.layer_pair(0.5, False)
    # what the library's layers compute apart: one Dense over the level, ReLU, hash
    # dropout over the whole level, the positional view's mean over each row's slots
    from flax import linen as nn

    from zerognn_jax import EllView
    from zerognn_jax._src.nn.models import hash_dropout

    x = jnp.concatenate(args[:2])
    z = nn.Dense(h, dtype=jnp.bfloat16).apply(
        {"params": {"kernel": args[2], "bias": args[3]}}, x)
    level = hash_dropout(jax.nn.relu(z), 0.5, args[6])
    view = EllView(jnp.zeros((c, k), jnp.int32), mask, jnp.ones(c, bool),
                   mask.sum(1).astype(jnp.int32), jnp.ones(c * (1 + k), jnp.int32),
                   positional=True)
    library = (level[:c], view.weighted_sum(level[:, None, :], w[..., None])[:, 0, :])
    for a, b in zip(fused(*args), library):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=2 ** -7, atol=1e-6)
    want = jax.grad(loss(plain), argnums=(0, 1, 2, 3))(*args)
    got = jax.grad(loss(fused), argnums=(0, 1, 2, 3))(*args)
    for name, a, b in zip(("x_self", "x_slots", "kernel", "bias"), want, got):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a).max() > 0, name
        np.testing.assert_allclose(b, a, rtol=2 ** -6, atol=2 ** -6 * np.abs(a).max(),
                                   err_msg=name)
    z = jnp.asarray(r.standard_normal((c, k * h)), jnp.bfloat16)
    kernel = jax.jit(functools.partial(lm.slot_gradient, c=c, k=k, rate=0.5))
    text = kernel.trace(z, args[1].reshape(c, -1), z[:, :h], w.T, args[6]).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


def test_layer0_mosaic_level_pair_reads_the_level_as_it_lies():
    """benchmarks/layer0_mosaic.py's level form: its reference gives layer0_backward's
    reference gradient (own rows and slot rows laid out as the tree level holds them);
    the op's outputs are its forward's, bit for bit, and its backward gives autodiff's
    gradients through that forward (the weight gradient's product kept in float32); the
    Mosaic GPU kernel over the whole level lowers for CUDA."""
    lm = _benchmark_script("layer0_mosaic")
    import layer0_backward as lb

    c, k, f, h = 64, 3, 64, 64
    x, z, g_self, g_slots, live, seed = lb.inputs(c * (1 + k), c, f, h, jnp.bfloat16)
    gsrc = jnp.concatenate([g_self, g_slots])
    wrow = jnp.concatenate([jnp.ones(c, jnp.float32), live.astype(jnp.float32)])
    want = lb.reference(x, z, g_self, g_slots, live, seed, c=c, k=k)
    got = lm.level_gradient_reference(z, x, gsrc, wrow, seed, c=c, k=k, rate=lb.RATE)
    for a, b in zip(want, got):
        assert np.abs(np.asarray(a)).max() > 0
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))

    r = np.random.default_rng(6)
    mask = jnp.asarray(r.random((c, k)) < 0.7)
    w = mask / jnp.maximum(mask.sum(1, keepdims=True), 1).astype(jnp.float32)
    args = (x, jnp.asarray(r.standard_normal((f, h)) * 0.1, jnp.float32),
            jnp.asarray(r.standard_normal(h) * 0.1, jnp.float32), w, jnp.uint32(7))
    loss = _probed([jnp.asarray(r.standard_normal((c, h)), jnp.float32) for _ in range(2)])
    plain = lambda *a: lm.level_pair_forward(0.5, *a)[0]
    op = lm.level_pair(0.5, False)
    for a, b in zip(plain(*args), op(*args)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(*args)
    got = jax.grad(loss(op), argnums=(0, 1, 2))(*args)
    for name, a, b in zip(("x", "kernel", "bias"), want, got):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a).max() > 0, name
        np.testing.assert_allclose(b, a, rtol=2 ** -6, atol=2 ** -6 * np.abs(a).max(),
                                   err_msg=name)
    kernel = jax.jit(functools.partial(lm.level_gradient, c=c, k=k, rate=0.5))
    text = kernel.trace(z, x, gsrc, wrow, seed).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text
