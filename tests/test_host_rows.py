"""Feature tables left in host memory (`HostTable`): the row gather against its XLA twin,
its CUDA lowering, bad input, placement, and training that equals a device table's."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import neighbour_labelled_npz, random_graph

import zerognn_jax as zg
from zerognn_jax._src.ops import host_rows
from zerognn_jax._src.ops.gather import gather_rows, gather_rows_reference
from zerognn_jax._src.ops.registry import Kernels
from zerognn_jax._src.training.memory import Resident
from zerognn_jax._src.training.placement import PlacementWarning, choose_placement
from zerognn_jax._src.training.scan import read_ahead_limit


def _ids(rng, n: int, rows: int):
    """ids with some out of range on both sides, and a mask with some rows off."""
    ids = rng.integers(-3, rows + 3, n).astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(rng.random(n) < 0.8)


def _reads_like(table, reference, ids, valid) -> None:
    """`table.gather` equals `reference.gather` bit for bit, under jit with one trace for
    two calls."""
    traces = []

    def run(t, i, v):
        traces.append(1)
        return t.gather(i, v)

    jitted = jax.jit(run)
    want = np.asarray(reference.gather(ids, valid))
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(jitted(table, ids, valid)), want)
    assert len(traces) == 1


@pytest.mark.parametrize("dtype,width", [(np.float32, 16), (np.float32, 3),
                                         (ml_dtypes.bfloat16, 3), (np.float16, 8)])
def test_gather_equals_the_device_table(dtype, width):
    """Every word width the kernel picks (16, 4, 2 bytes), out-of-range and masked ids
    zeroed, bit for bit against the reference on the same table on the device."""
    rng = np.random.default_rng(width)
    table = rng.standard_normal((50, width)).astype(dtype)
    host = zg.HostTable(table)
    ids, valid = _ids(rng, 40, 50)
    # the reference clamps nothing: give it in-range ids, masked where out of range
    inside = (ids >= 0) & (ids < 50)
    want = gather_rows_reference(jnp.asarray(table), jnp.where(inside, ids, 0), valid & inside)
    traces = []

    def run(i, v):
        traces.append(1)
        return gather_rows(Kernels(), host, i, v)

    jitted = jax.jit(run)
    for got in (run(ids, valid), jitted(ids, valid), jitted(ids, valid)):
        assert got.dtype == want.dtype and got.shape == (40, width)
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8),
                                      np.asarray(want).view(np.uint8))
    assert len(traces) == 2  # eager, then one trace for both jitted calls


def test_gather_lowers_for_cuda_as_one_ffi_call():
    host = zg.HostTable(np.ones((8, 4), np.float32))
    lowered = jax.jit(host.gather).trace(jnp.zeros(3, jnp.int32), jnp.ones(3, bool)).lower(
        lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert text.count("zerognn_host_rows") == 1
    assert f"table = {host.number}" in text.replace(" : i64", "")


def test_programs_name_tables_by_number_not_address():
    """Two tables of one shape give one program but for their numbers, and neither holds
    its address: a later process that makes its tables in the same order compiles the
    same programs, which JAX's persistent cache then finds."""
    texts = []
    for host in (zg.HostTable(np.ones((8, 4), np.float32)),
                 zg.HostTable(np.zeros((8, 4), np.float32))):
        text = jax.jit(host.gather).trace(jnp.zeros(3, jnp.int32), jnp.ones(3, bool)).lower(
            lowering_platforms=("cuda",)).as_text().replace(" : i64", "")
        assert str(host.array.ctypes.data) not in text
        texts.append(text.replace(f"table = {host.number}", "table = N"))
    assert texts[0] == texts[1]


def test_copies_of_a_table_read_their_own_memory():
    """A copy kept the original's number without holding it, and a deep copy read the
    original's rows (its own array unread)."""
    import copy
    import gc

    array = np.arange(12, dtype=np.float32).reshape(4, 3)
    host = zg.HostTable(array)
    shallow, deep = copy.copy(host), copy.deepcopy(host)
    deep.array[:] = -1
    del host
    gc.collect()
    ids = jnp.arange(4)
    np.testing.assert_array_equal(np.asarray(shallow.gather(ids, ids >= 0)), array)
    np.testing.assert_array_equal(np.asarray(deep.gather(ids, ids >= 0)), -np.ones((4, 3)))


def test_a_program_run_after_its_table_is_collected_fails():
    """The numbers of collected tables are unbound: a call naming one is an error, not a
    read of freed memory."""
    import gc

    host = zg.HostTable(np.ones((8, 4), np.float32))
    number = host.number
    del host
    gc.collect()
    gone = types.SimpleNamespace(number=number, shape=(8, 4), dtype=np.dtype(np.float32))
    ids = jnp.arange(3, dtype=jnp.int32)
    with pytest.raises(Exception, match=f"host table {number} is not held any more"):
        jax.block_until_ready(host_rows.read_rows(gone, ids, ids >= 0, ids))


@pytest.mark.parametrize("dtype,width", [(np.float32, 16), (ml_dtypes.bfloat16, 3)])
def test_written_rows_land_where_numpy_puts_them(dtype, width):
    """Blocks stored at offsets from a compiled loop (a device scalar each), the rows
    past either end of the table skipped and counted out; the 16- and 2-byte words."""
    rng = np.random.default_rng(width)
    table = np.zeros((23, width), dtype)
    host = zg.HostTable(table)
    blocks = rng.standard_normal((4, 8, width)).astype(dtype)
    firsts = np.array([-3, 5, 9, 19], np.int32)  # the first and last run past the ends

    @jax.jit
    def store(blocks, firsts):
        return jax.lax.fori_loop(0, 4, lambda j, n: n + host_rows.write_rows(
            host, blocks[j], firsts[j]), jnp.int32(0))

    written = int(store(jnp.asarray(blocks), jnp.asarray(firsts)))
    want = np.zeros_like(table)
    for block, first in zip(blocks, firsts):
        lo, hi = max(first, 0), min(first + 8, 23)
        want[lo:hi] = block[lo - first:hi - first]
    assert written == 5 + 8 + 8 + 4
    np.testing.assert_array_equal(table.view(np.uint8), want.view(np.uint8))


def test_written_blocks_must_match_the_table():
    host = zg.HostTable(np.zeros((8, 4), np.float32))
    for block, got in ((jnp.zeros((2, 3), jnp.float32), r"float32\[2, 3\]"),
                       (jnp.zeros((2, 4), jnp.bfloat16), r"bfloat16\[2, 4\]")):
        with pytest.raises(ValueError, match=r"float32\[R, 4\], got " + got):
            host_rows.write_rows(host, block, 0)
    frozen = np.zeros((8, 4), np.float32)
    frozen.flags.writeable = False  # (the write killed the process: SIGSEGV)
    with pytest.raises(ValueError, match="this one's is read-only"):
        host_rows.write_rows(zg.HostTable(frozen), jnp.zeros((2, 4), jnp.float32), 0)


def test_write_lowers_for_cuda_as_one_call_kept_for_its_effect():
    host = zg.HostTable(np.ones((8, 4), np.float32))
    lowered = jax.jit(lambda b: host_rows.write_rows(host, b, 2)).trace(
        jnp.zeros((3, 4), jnp.float32)).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert text.count("zerognn_rows_to_host") == 1 and "has_side_effect = true" in text


def test_uploaded_table_equals_the_host_array():
    """A table copied to the device in blocks that do not divide it (the last one moved
    back over the one before), bit for bit."""
    table = np.random.default_rng(0).standard_normal((37, 5)).astype(ml_dtypes.bfloat16)
    got = host_rows.uploaded(zg.HostTable(table), block_bytes=8 * 5 * 2)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), table.view(np.uint8))


def test_a_reordered_table_reads_like_the_stored_one(tmp_path):
    """A bfloat16 file memory-mapped for reading, laid out in a random order as float32:
    every gather (masked and out-of-range ids included, under jit with one trace for two
    calls) and the whole upload equal the stored table's, bit for bit."""
    rng = np.random.default_rng(5)
    stored = rng.standard_normal((70, 6)).astype(ml_dtypes.bfloat16)
    np.save(tmp_path / "x.npy", stored.view(np.uint16))
    source = np.load(tmp_path / "x.npy", mmap_mode="r").view(ml_dtypes.bfloat16)
    order = rng.permutation(70)
    table = host_rows.reordered_table(source, order, np.float32)
    assert table.dtype == np.float32 and table.shape == (70, 6)
    np.testing.assert_array_equal(table.array[:, 0], stored[order, 0].astype(np.float32))
    plain = zg.HostTable(stored.astype(np.float32))
    _reads_like(table, plain, *_ids(rng, 90, 70))
    np.testing.assert_array_equal(np.asarray(host_rows.uploaded(table, block_bytes=4 * 6 * 16)),
                                  plain.array)
    assert "rows reordered" in repr(table)


def test_jit_keeps_no_table_alive():
    """jit's cache keeps the static part of every argument it saw: a host table (plain
    or reordered) used by a compiled program is still collected, with its memory and
    its page-locking, once its user drops it."""
    import gc
    import weakref

    gather = jax.jit(lambda t, i: t.gather(i, i >= 0))
    for make in (lambda a: zg.HostTable(a),
                 lambda a: host_rows.reordered_table(a, np.arange(10)[::-1])):
        table = make(np.arange(40, dtype=np.float32).reshape(10, 4))
        np.testing.assert_array_equal(np.asarray(gather(table, jnp.arange(3)))[:, 0],
                                      [0, 4, 8])
        gone = weakref.ref(table)
        del table
        gc.collect()
        assert gone() is None


def test_a_table_rebuilt_from_its_pytree_outlives_the_original():
    """device_put and tree_map hand back rebuilt tables (data-parallel placement does):
    they keep reading after the table they came from is dropped."""
    import gc

    for make in (lambda a: zg.HostTable(a),
                 lambda a: host_rows.reordered_table(a, np.arange(10)[::-1])):
        table = make(np.arange(40, dtype=np.float32).reshape(10, 4))
        copies = [jax.device_put(table), jax.tree_util.tree_map(lambda x: x, table)]
        del table
        gc.collect()
        for copy in copies:
            got = jax.jit(lambda t, i: t.gather(i, i >= 0))(copy, jnp.arange(3))
            np.testing.assert_array_equal(np.asarray(got)[:, 0], [0, 4, 8])


@pytest.mark.parametrize("position,message", [
    ([0, 1], r"row positions for 3 rows must be int\[3\], got int64\[2\]"),
    ([5, -1, 1], "every row of \\[0, 3\\) once; 2 are missing"),
    (np.zeros(3, np.float32), "must be int"),
    (jnp.zeros(2, jnp.int32), r"must be int\[3\], got int32\[2\]"),
    # positions on the device are checked there (they were taken as they came)
    (jnp.array([0, 0, 2], jnp.int32), "every row of \\[0, 3\\) once; 1 are missing"),
    (jnp.array([100, 101, 102], jnp.int32), "3 are missing"),
])
def test_bad_row_positions_are_refused(position, message):
    with pytest.raises(ValueError, match=message):
        zg.HostTable(np.zeros((3, 2), np.float32), position)


def test_row_positions_of_a_narrow_int_type_are_checked_widened():
    """int8 positions of a 200-row table: compared with 200 in a wider type (an
    OverflowError before), a repeat named as the others are."""
    table = np.zeros((200, 2), np.float32)
    assert zg.HostTable(table, jnp.arange(200, dtype=jnp.int16)).shape == (200, 2)
    with pytest.raises(ValueError, match=r"every row of \[0, 200\) once; 72 are missing"):
        zg.HostTable(table, jnp.arange(200, dtype=jnp.int32).astype(jnp.int8))


def test_reordered_tables_edge_cases():
    """No rows: the gather gives zeros as a plain table's does; a 1-D source and a
    write into a reordered table are refused by name."""
    empty = host_rows.reordered_table(np.zeros((0, 3), np.float32), np.zeros(0, np.int64))
    got = empty.gather(jnp.array([0, 2], jnp.int32), jnp.array([True, False]))
    np.testing.assert_array_equal(np.asarray(got), np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"must be 2-D, got shape \(4,\)"):
        host_rows.reordered_table(np.zeros(4, np.float32), np.arange(4))
    table = host_rows.reordered_table(np.zeros((4, 2), np.float32), np.arange(4))
    with pytest.raises(ValueError, match="stored order; this one's rows are reordered"):
        host_rows.write_rows(table, jnp.zeros((1, 2), jnp.float32), jnp.int32(0))


def test_degree_order_needs_the_graph():
    from zerognn_jax._src.training.placement import Placement, place_features

    host = Placement("host", "asked for")
    features = np.ones((4, 2), np.float64)  # another dtype: "auto" would copy by degree
    table = place_features(features, np.float32, host, announce=False)
    assert table.position is None and table.dtype == np.float32
    with pytest.raises(ValueError, match="'degree' needs the graph's degrees"):
        place_features(features, np.float32, host, announce=False, row_order="degree")
    with pytest.raises(ValueError, match=r"degree must hold one value a row of the table "
                                         r"\(4\), got shape \(5,\)"):  # offsets, not degrees
        place_features(features, np.float32, host, announce=False, degree=np.arange(5))


def test_a_host_copy_that_does_not_fit_says_which_options_need_none(monkeypatch, capsys):
    """Host memory running out in the copy of the table ended in NumPy's traceback: a
    one-line error now names the copy and how to read the table in place."""
    from zerognn_jax._src.training import placement
    from zerognn_jax.cli import main

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 217. MiB")

    monkeypatch.setattr(placement, "reordered_table", no_memory)
    host = placement.Placement("host", "asked for")
    stored = np.ones((6, 2), ml_dtypes.bfloat16)
    with pytest.raises(MemoryError, match=r"^host memory ran out copying the feature table "
                                          r"\(6 x 2, reordered by degree: 0\.00 GiB\): free "
                                          r"host memory, or read the table in place: "
                                          r"--host-row-order stored with --dtype bfloat16 "
                                          r"\(the table's own dtype\)$"):
        placement.place_features(stored, np.float32, host, announce=False,
                                 degree=np.arange(6), row_order="degree")
    # the command line: one line, exit 1 (tiny's float32 rows, copied by degree)
    assert main(["train", "--no-progress", "--feature-placement", "host"]) == 1
    assert capsys.readouterr().err == (
        "zerognn: error: host memory ran out copying the feature table (4,898 x 100, "
        "reordered by degree: 0.00 GiB): free host memory, or read the table in place: "
        "--host-row-order stored\n")
    # any other allocation of host memory that fails is one line too
    from zerognn_jax._src.training import trainer
    monkeypatch.setattr(trainer, "prepare", no_memory)
    assert main(["train", "--no-progress"]) == 1
    assert capsys.readouterr().err == ("zerognn: error: host memory ran out (Unable to "
                                       "allocate 217. MiB)\n")


@pytest.mark.parametrize("order,message", [
    (np.arange(5), r"must be int\[6\], got int64\[5\]"),
    (np.array([0, 1, 2, 3, 4, 4]), "every row of \\[0, 6\\) once; 1 are missing"),
    (np.array([0, 1, 2, 3, 4, 6]), "1 are missing"),
    (np.zeros(6, np.float32), "must be int"),
])
def test_a_row_order_must_be_a_permutation(order, message):
    with pytest.raises(ValueError, match=message):
        host_rows.reordered_table(np.zeros((6, 2), np.float32), order)


def test_auto_row_order_copies_where_a_copy_is_made_or_fits():
    from zerognn_jax._src.training.placement import choose_row_order

    f32 = np.zeros((1024, 256), np.float32)  # 1 MiB
    read_only = f32.copy()
    read_only.flags.writeable = False
    mib = 2**20
    assert choose_row_order("stored", f32, np.float32, None)[0] == "stored"
    assert choose_row_order("degree", f32, np.float32, 0)[0] == "degree"
    cases = [(f32, "bfloat16", None, "degree", "converted from float32 anyway"),
             (f32[:, ::2], np.float32, None, "degree", "copied anyway (a strided array)"),
             (read_only, np.float32, None, "stored", "half of an unknown amount available"),
             (f32, np.float32, 2 * mib, "degree", "fits the host's 0.00 GiB available"),
             (f32, np.float32, 2 * mib - 1, "stored", "would not fit half of"),
             (f32, np.float32, None, "stored", "half of an unknown amount available")]
    for array, dtype, available, order, why in cases:
        got, reason = choose_row_order("auto", array, dtype, available)
        assert got == order and why in reason, (got, reason)


@pytest.mark.parametrize("array,message", [
    (np.zeros(5, np.float32), "2-D NumPy array"),
    (np.zeros((4, 6), np.float32)[:, ::2], "C-contiguous"),
    (np.zeros((4, 2), np.int32), "holds floats, got int32"),
    (np.zeros((4, 0), np.float32), "at least one column"),
])
def test_bad_tables_are_refused(array, message):
    with pytest.raises(ValueError, match=message):
        zg.HostTable(array)


def test_a_missing_compiler_is_named_and_leaves_no_library(tmp_path, monkeypatch):
    """Named by an OSError (one line from the command line; a RuntimeError's traceback
    before); a library built already is used without looking for a compiler."""
    monkeypatch.setenv("ZEROGNN_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(host_rows.BuildError, match="'no-such-compiler-here' is not on the "
                                                   "PATH"):
        host_rows._library.__wrapped__(None)
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with pytest.raises(OSError, match="building the host-row gather failed"):
        host_rows._library.__wrapped__(None)
    assert os.listdir(tmp_path) == []
    monkeypatch.delenv("CXX")
    host_rows._library.__wrapped__(None)
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    host_rows._library.__wrapped__(None)  # the cached library (refused before)
    # a library cut short no longer matches the digest beside it: built again (loading
    # it killed the process with a bus error), or, without a compiler, named as such
    library = next(tmp_path.glob("host_rows-cpu-*.so"))
    whole = library.read_bytes()

    def cut_short():  # a new file in its place: this process maps the library loaded
        # (writing into that file cut its mapping short: a bus error at the exit)
        (tmp_path / "cut").write_bytes(whole[:1000])
        os.replace(tmp_path / "cut", library)

    cut_short()
    with pytest.raises(host_rows.BuildError, match="'no-such-compiler-here' is not on the "
                                                   "PATH"):
        host_rows._library.__wrapped__(None)
    monkeypatch.delenv("CXX")
    host_rows._library.__wrapped__(None)
    assert library.read_bytes() != whole[:1000]
    assert sorted(p.name for p in tmp_path.iterdir()) == [library.name, library.name +
                                                          ".sha256"]
    # a build killed mid-compile left its temporary output: the next build removes it,
    # not a live build's, nor one of another host (its pid says nothing here)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = socket.gethostname()
    left, live, other = (tmp_path / f".{library.name}.{host}-{pid}.x1.part" for host, pid in
                         ((here, dead.pid), (here, os.getppid()), ("other-host", dead.pid)))
    left.write_bytes(b"half a library"), live.write_bytes(b""), other.write_bytes(b"")
    cut_short()
    host_rows._library.__wrapped__(None)
    assert not left.exists() and live.exists() and other.exists()
    monkeypatch.delenv("ZEROGNN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert host_rows._cache_dir() == tmp_path / "xdg" / "zerognn-jax" / "host_rows"


def test_a_cache_folder_it_cannot_write_is_one_line(tmp_path, monkeypatch):
    """A $ZEROGNN_CACHE it cannot write (read-only, or here under a file, which root
    cannot write either) gave the errno of a temporary file's name."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ZEROGNN_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(host_rows.BuildError, match=rf"^the host-row gather cannot be built "
                                                   rf"into {tmp_path / 'file' / 'cache'} \(Not "
                                                   rf"a directory\): set \$ZEROGNN_CACHE"):
        host_rows._library.__wrapped__(None)


def test_pieces_cover_the_table_at_page_aligned_cuts():
    start = host_rows._PIECE - 100
    pieces = host_rows._pieces(start, 3 * host_rows._PIECE)
    assert pieces[0] == (start, 100)
    assert all(a % host_rows._PIECE == 0 for a, _ in pieces[1:])
    assert sum(size for _, size in pieces) == 3 * host_rows._PIECE
    assert pieces[-1][0] + pieces[-1][1] == start + 3 * host_rows._PIECE


def test_auto_placement_keeps_room_for_the_step():
    gib = 2**30
    small = Resident(graph=10 * gib, features=40 * gib, model=gib)
    large = Resident(graph=10 * gib, features=57 * gib, model=gib)
    assert choose_placement("auto", small, 80 * gib).where == "device"
    chosen = choose_placement("auto", large, 80 * gib)
    assert chosen.where == "host" and "68.00 GiB of 80.00 GiB" in chosen.reason
    assert choose_placement("auto", large, None).where == "device"  # a CPU says no limit
    assert choose_placement("host", small, 80 * gib).where == "host"
    assert choose_placement("device", large, 80 * gib).where == "device"


def test_a_table_without_columns_stays_on_the_device():
    """A run on embeddings alone was refused under "host": its zero-column table could
    not be a host table, though the run needs none."""
    with pytest.warns(PlacementWarning, match="feature_placement 'host' is ignored"):
        chosen = choose_placement("host", Resident(graph=1, features=0, model=1), None,
                                  columns=0)
    assert chosen.where == "device"
    graph = random_graph(120, 600, seed=3)
    ds = zg.make_dataset("bare", graph.indptr, graph.indices, np.zeros((120, 0), np.float32),
                         np.arange(120) % 3, np.arange(60), [], [], 3)
    with pytest.warns(PlacementWarning):
        res = zg.train(zg.TrainConfig(layers=1, fanouts=(3,), hidden=8, batch_size=32,
                                      epochs=1, embedding_dim=4, feature_placement="host",
                                      eval_mode="none", progress=False), ds)
    assert res.summary["feature_placement"] == "device"


@pytest.mark.parametrize("overrides,message", [
    (dict(feature_placement="host", shard_features=True), "drop shard_features"),
    (dict(feature_placement="host", task="graph", dataset="molhiv-like", model="gin"),
     "keeps its graphs' features on the device"),
    (dict(feature_placement="gpu"), "feature_placement must be one of auto, device, host"),
    (dict(feature_cache_gib=-1.0), "feature_cache_gib must be >= 0"),
])
def test_config_refuses_host_placement_where_it_cannot_work(overrides, message):
    with pytest.raises(ValueError, match=message):
        zg.TrainConfig(**overrides)


def test_training_with_host_features_equals_device_features(planetoid_root, capsys):
    """Cora, on the device, on the host (rows as stored), and on the host by degree
    (the default here) with its 200 rows of highest degree cached (with a learnable
    embedding in the last): the same losses, bit for bit (the host runs sampling 16
    steps at once, the device runs 8; the uncached one reading a few steps' rows a call,
    `read_ahead_gib`, the others all 16), and the same exact layer-wise evaluation, whose
    first layer reads its chunks from the host table. (Conservative envelopes: each host
    table would be calibrated by a program of its own, and the claim holds for any
    envelope the runs share.)"""
    runs = {}
    row_gib = 1433 * 4 / 2**30
    for name, place, cache, emb, order in (
            ("device", "device", None, 0, "auto"), ("host", "host", 0, 0, "stored"),
            ("cached", "host", 200 * row_gib, 0, "auto"),
            ("device_emb", "device", None, 4, "auto"),
            ("cached_emb", "host", 200 * row_gib, 4, "auto")):
        cfg = zg.TrainConfig(dataset="cora", root=planetoid_root, epochs=2, layers=2,
                             fanouts=(5, 5), hidden=16, batch_size=256, embedding_dim=emb,
                             feature_placement=place, feature_cache_gib=cache, eval_every=0,
                             host_row_order=order, envelope="conservative",
                             read_ahead_gib=0.03 if name == "host" else None)
        runs[name] = zg.train(cfg)
        assert runs[name].summary["feature_placement"] == place
        assert runs[name].summary["feature_placement_why"] == "asked for (feature_placement)"
        on_device = 1 if jax.default_backend() == "cpu" else 8
        assert runs[name].summary["sample_ahead"] == (16 if place == "host" else on_device)
        if place == "host":
            assert runs[name].summary["host_row_order"] == \
                ("stored" if order == "stored" else "degree")
            assert runs[name].summary["feature_cache_rows"] == (0 if cache == 0 else 200)
            default = 2 << 30 if jax.default_backend() == "cpu" else read_ahead_limit()
            assert runs[name].summary["read_ahead_bytes"] == (
                int(0.03 * 2**30) if name == "host" else default)
        else:
            assert "read_ahead_bytes" not in runs[name].summary
    err = capsys.readouterr().err
    assert "features on the host (0.01 GiB): asked for (feature_placement); rows as " \
           "stored: asked for (host_row_order)" in err
    assert re.search(r"rows by degree: a copy of 0\.01 GiB fits the host's [0-9.]+ GiB "
                     r"available; its 200 rows of highest degree \(7%, 0\.00 GiB\) cached "
                     r"on the device", err)
    for name, ref in (("host", "device"), ("cached", "device"),
                      ("cached_emb", "device_emb")):
        got, want = runs[name], runs[ref]
        assert [r["loss"] for r in got.history] == [r["loss"] for r in want.history]
        for key in ("val_acc", "test_acc"):
            assert got.history[-1][key] == want.history[-1][key]


def test_exact_inference_of_host_features_and_an_embedding_outlives_its_joined_table():
    """Exact inference with a host table and a learnable embedding joins the two into a
    new host table that its programs read by address: every call gives the outputs of
    the same features on the device (the joined table freed before the programs ran
    gave other rows' bytes, in most calls)."""
    rs = np.random.default_rng(1)
    graph = random_graph(300, 1200, seed=2)
    features = rs.normal(size=(300, 8)).astype(np.float32)
    ds = zg.make_dataset("joined", graph.indptr, graph.indices, features,
                         rs.integers(0, 3, 300), np.arange(100), [], [], 3)
    res = zg.train(zg.TrainConfig(layers=2, fanouts=(4, 4), hidden=8, batch_size=32,
                                  epochs=1, embedding_dim=4, feature_placement="host",
                                  host_row_order="stored", eval_mode="none",
                                  progress=False), ds)
    want = np.asarray(zg.layerwise_logits(res.program, res.variables,
                                          res.data._replace(features=jnp.asarray(features))))
    for _ in range(6):  # close, not equal: a GPU's sums may add in another order
        np.testing.assert_allclose(
            np.asarray(zg.layerwise_logits(res.program, res.variables, res.data)), want,
            rtol=1e-5, atol=1e-6)


def test_one_engine_runs_epochs_over_two_host_tables():
    """A host table is part of the compiled program: an engine given a second table (or a
    device array after a table) compiles for it, and its epoch equals a fresh engine's
    over the same rows on the device (it once failed with a pytree mismatch)."""
    rs = np.random.default_rng(3)
    graph = random_graph(300, 1200, seed=4)
    first = rs.normal(size=(300, 8)).astype(np.float32)
    second = (3 * first + 1).astype(np.float32)
    ds = zg.make_dataset("two", graph.indptr, graph.indices, first, rs.integers(0, 3, 300),
                         np.arange(100), [], [], 3)
    res = zg.train(zg.TrainConfig(layers=2, fanouts=(4, 4), hidden=8, batch_size=32,
                                  epochs=0, eval_mode="none", progress=False), ds)
    env = zg.conservative(32, res.program.sampler.slots, 300)

    def epoch(engine, features):
        state = jax.tree_util.tree_map(jnp.copy, res.state)  # run_epoch donates it
        data = res.data._replace(features=features)
        return engine.run_epoch(state, data, ds.train_idx, 5, env).loss

    engine = zg.ScanEngine(res.program)
    losses = [epoch(engine, t) for t in (zg.HostTable(first), zg.HostTable(second),
                                         jnp.asarray(second))]
    fresh = epoch(zg.ScanEngine(res.program), jnp.asarray(second))
    assert losses[1] == losses[2] == fresh != losses[0]
    assert len(engine.programs) == 3


def test_host_features_under_labor_and_a_resume(planetoid_root, tmp_path):
    """Cora under the LABOR-0 sampler with the table on the host (by degree, 200 rows
    cached): the device table's losses, bit for bit; and the host run stopped after its
    first epoch and resumed from its checkpoint (the table is not part of it) ends with
    the uninterrupted run's losses and accuracy. (Conservative envelopes, as above.)"""
    base = dict(dataset="cora", root=planetoid_root, epochs=2, layers=2, fanouts=(5, 5),
                hidden=16, batch_size=256, sampler="labor", eval_every=0, progress=False,
                envelope="conservative")
    host = dict(feature_placement="host", feature_cache_gib=200 * 1433 * 4 / 2**30)
    device = zg.train(zg.TrainConfig(**base))
    whole = zg.train(zg.TrainConfig(**base, **host))
    assert [r["loss"] for r in whole.history] == [r["loss"] for r in device.history]
    folder = str(tmp_path / "ckpt")
    zg.train(zg.TrainConfig(**{**base, "epochs": 1}, **host, checkpoint_dir=folder))
    resumed = zg.train(zg.TrainConfig(**base, **host, checkpoint_dir=folder))
    assert resumed.summary["start_epoch"] == 1
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in whole.history]
    assert resumed.history[-1]["test_acc"] == whole.history[-1]["test_acc"]


@pytest.mark.parametrize("engine", ["scan", "host-bucketed"])
def test_host_features_under_the_weighted_sampler(tmp_path, engine):
    """A graph with edge weights, sampled by weight, its table on the host (rows as
    stored, nothing cached; 2 epochs of 5 steps): the device table's epoch losses bit for
    bit, on the scan engine and on the host-mediated one (conservative envelopes: each
    table would be calibrated by a program of its own). On the scan engine one step's
    loss, and the last layer's bias, may differ by one float32 ulp: the two programs
    gather differently, and XLA may order a sum differently in each."""
    ds = zg.load_dataset(neighbour_labelled_npz(tmp_path / "weighted.npz", num_nodes=300))
    base = dict(epochs=2, layers=2, fanouts=(4, 4), hidden=8, batch_size=32,
                sampler="weighted", engine=engine, eval_mode="none", progress=False,
                envelope="conservative")
    device = zg.train(zg.TrainConfig(**base), ds)
    host = zg.train(zg.TrainConfig(**base, feature_placement="host", feature_cache_gib=0,
                                   host_row_order="stored"), ds)
    assert host.summary["feature_placement"] == "host"
    assert [r["loss"] for r in host.history] == [r["loss"] for r in device.history]


def test_memory_check_counts_the_rows_read_ahead(planetoid_root, monkeypatch):
    """With the table on the host, the check before compiling is given the rows read
    ahead: those of the host table, at the checked envelope's outermost capacity, for
    the configured steps ahead (None: the default for a host table), under the
    configured read-ahead limit. (A conservative envelope: nothing to calibrate.)"""
    from zerognn_jax._src.training import memory, trainer

    class Checked(Exception):
        pass

    def check(envelope, *args, read_ahead_bytes=0, **kw):
        seen.append((envelope, read_ahead_bytes))
        raise Checked

    seen, asked = [], []
    monkeypatch.setattr(trainer, "read_ahead_bytes",
                        lambda *args: asked.append(args) or 54321)
    monkeypatch.setattr(memory, "check_fits", check)
    cfg = zg.TrainConfig(dataset="cora", root=planetoid_root, layers=2, fanouts=(5, 5),
                         hidden=16, feature_placement="host", progress=False,
                         read_ahead_gib=0.5, envelope="conservative")
    with pytest.raises(Checked):
        zg.train(cfg)
    ((env, extra),) = seen
    ((table, rows, ahead, limit),) = asked
    assert host_rows.is_host_resident(table) and table.shape == (2708, 1433)
    assert (rows, ahead, limit, extra) == (env.levels[-1], None, 1 << 29, 54321)


def test_host_table_is_the_table_a_cache_reads_from():
    host = zg.HostTable(np.ones((8, 2), np.float32))
    cached = host_rows.cache_hot_rows(host, np.array([1]))
    assert host_rows.host_table(host) is host and host_rows.host_table(cached) is host


def test_cached_rows_read_like_the_host_table():
    """Some rows cached, some not, ids out of range and masked: equal to the uncached
    table bit for bit, under jit with one trace."""
    rng = np.random.default_rng(3)
    table = rng.standard_normal((40, 5)).astype(np.float32)
    host = zg.HostTable(table)
    cached = host_rows.cache_hot_rows(host, np.array([7, 3, 39]))
    assert cached.rows.shape == (3, 5)
    assert host_rows.device_bytes(cached) == 3 * 5 * 4 + 40 * 4  # rows and slot map
    np.testing.assert_array_equal(np.asarray(cached.slot)[[7, 3, 39, 0]], [0, 1, 2, -1])
    np.testing.assert_array_equal(np.asarray(cached.cached(jnp.array([7, 0, 39]))),
                                  [True, False, True])
    _reads_like(cached, host, *_ids(rng, 60, 40))


def test_a_layout_caches_its_first_rows_without_a_slot_map():
    """The first K rows of a table laid out by degree (or as stored) cached and found
    through the table's own positions: equal to the uncached table bit for bit."""
    rng = np.random.default_rng(4)
    table = rng.standard_normal((40, 5)).astype(np.float32)
    order = rng.permutation(40)
    reordered = host_rows.reordered_table(table, order)
    assert host_rows.device_bytes(reordered) == 40 * 4  # its row positions
    for host in (reordered, zg.HostTable(table)):
        cached = host_rows.cache_leading_rows(host, 6)
        assert cached.slot is None
        assert host_rows.device_bytes(cached) == 6 * 5 * 4 + host_rows.device_bytes(host)
        _reads_like(cached, zg.HostTable(table), *_ids(rng, 80, 40))
        layout_row = order.argsort() if host is reordered else np.arange(40)
        np.testing.assert_array_equal(np.asarray(cached.cached(jnp.arange(40))),
                                      layout_row < 6)
    np.testing.assert_array_equal(np.asarray(host_rows.cache_leading_rows(reordered, 6).rows),
                                  table[order[:6]])  # the layout's first rows: order's first
    with pytest.raises(ValueError, match="at least one row, got 0"):
        host_rows.cache_leading_rows(reordered, 0)


def test_a_stored_table_pays_its_slot_map_from_the_cache():
    from zerognn_jax._src.training.placement import Placement, place_features

    features = np.arange(9 * 4, dtype=np.float32).reshape(9, 4)  # 16 B a row
    host = Placement("host", "asked for")
    degree = np.array([2, 5, 0, 5, 1, 0, 1, 2, 1])  # 9 nodes
    stored = place_features(features, np.float32, host, announce=False, cache_bytes=80,
                            degree=degree, row_order="stored")
    assert stored.rows.shape[0] == (80 - 9 * 4) // 16 and stored.slot is not None
    by_degree = place_features(features, np.float32, host, announce=False, cache_bytes=80,
                               degree=degree, row_order="degree")
    assert by_degree.rows.shape[0] == 80 // 16 and by_degree.slot is None
    no_degrees = place_features(features, np.float32, host, announce=False, cache_bytes=80)
    assert no_degrees.rows.shape[0] == 80 // 16 and no_degrees.slot is None
    np.testing.assert_array_equal(np.asarray(no_degrees.rows), features[:5])
    ids = jnp.arange(-1, 10, dtype=jnp.int32)
    for table in (stored, by_degree, no_degrees):
        _reads_like(table, zg.HostTable(features), ids, jnp.ones(11, bool))


def test_hottest_rows_come_first_and_the_cache_is_budgeted():
    from zerognn_jax._src.training.placement import Placement, cache_budget, hottest_first

    degree = np.array([2, 5, 0, 5, 1])
    np.testing.assert_array_equal(hottest_first(degree, 3), [1, 3, 0])
    np.testing.assert_array_equal(hottest_first(degree, 9), [1, 3, 0, 4, 2])
    for count in (3, 5):  # uint32 degrees (graphs of 2^31 edges or more): no wrap-around
        np.testing.assert_array_equal(hottest_first(degree.astype(np.uint32), count),
                                      [1, 3, 0, 4, 2][:count])
    # rows tied at the last degree taken: the lowest ids (argpartition picked any)
    tied = np.r_[np.ones(2000, np.int64), 9]
    np.testing.assert_array_equal(hottest_first(tied, 4), [2000, 0, 1, 2])
    gib = 2**30
    resident = Resident(graph=10 * gib, features=57 * gib, model=2 * gib)
    host, device = Placement("host", ""), Placement("device", "")
    assert cache_budget(None, host, resident, 80 * gib) == 24 * gib  # (60 - 12) / 2
    assert cache_budget(1.5, host, resident, 80 * gib) == int(1.5 * gib)
    assert cache_budget(None, host, resident, None) == 0
    assert cache_budget(None, device, resident, 80 * gib) == 0


def test_a_directed_graphs_hot_rows_are_those_drawn_most():
    """Rows were ranked by a node's own neighbour count, which on a directed graph says
    nothing of how often it is drawn: nodes 0-3, every other node's neighbour, were
    cached last. The count is how often a node is a neighbour, as on typed graphs."""
    n = 40
    src = np.r_[np.repeat(np.arange(4, n), 4), np.arange(4)]
    dst = np.r_[np.tile(np.arange(4), n - 4), 4 + np.arange(4)]  # nodes 0-3: 1 out, 36 in
    graph, rs = zg.from_edge_list(src, dst, n), np.random.default_rng(0)
    ds = zg.make_dataset("directed", graph.indptr, graph.indices,
                         rs.normal(size=(n, 3)).astype(np.float32), rs.integers(0, 2, n),
                         np.arange(30), np.arange(30, 35), np.arange(35, n), 2)
    cfg = zg.TrainConfig(hidden=8, layers=1, fanouts=(2,), batch_size=8, epochs=0,
                      feature_placement="host", host_row_order="stored",
                      feature_cache_gib=(4 * 3 * 4 + 4 * n) / 2**30,  # 4 rows, the slot map
                      eval_mode="none", progress=False)
    cached = zg.train(cfg, ds).data.features
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(cached.slot) >= 0), [0, 1, 2, 3])


# Tests that stand the CUDA build's page-locking in with `_FakeCuda` run where JAX's
# backend is the CPU: on a GPU the real handlers would read memory the fake never locked.
_FAKES_CUDA = pytest.mark.skipif(jax.default_backend() != "cpu",
                                 reason="fakes CUDA's page-locking: CPU backend only")


class _FakeCuda:
    """Stands in for the CUDA build's page-locking calls; refuses the `fail_at` piece.
    Tables are bound to their numbers in the real CPU library (made before any test
    patches `_gpu_arch`), whose handlers then read them."""

    def __init__(self, fail_at: int | None = None):
        self.locked, self.fail_at, self.read_only = set(), fail_at, set()
        real = host_rows._register_targets()
        self.zg_bind, self.zg_unbind = real.zg_bind, real.zg_unbind

    def zg_register(self, address: int, nbytes: int, read_only: int = 0) -> bytes:
        if address in self.locked:
            return b"part or all of the requested memory range is already mapped"
        if address == self.fail_at:
            return b"out of memory"
        self.locked.add(address)
        if read_only:
            self.read_only.add(address)
        return b""

    def zg_unregister(self, address: int) -> None:
        self.locked.remove(address)


@_FAKES_CUDA
def test_page_locking_is_shared_and_undone_by_the_last_table(monkeypatch):
    """Two tables over one array lock it once; the pages stay locked until both are gone;
    a refused piece leaves nothing locked."""
    import gc

    fake = _FakeCuda()
    monkeypatch.setattr(host_rows, "_gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(host_rows, "_register_targets", lambda: fake)
    array = np.ones((64, 4), np.float32)
    first, second = zg.HostTable(array), zg.HostTable(array)
    assert first.page_locked and fake.locked == {array.ctypes.data}
    del first
    gc.collect()
    assert fake.locked == {array.ctypes.data}
    del second
    gc.collect()
    assert fake.locked == set() and not host_rows._LOCKED
    monkeypatch.setattr(host_rows, "_PIECE", 64)  # four pieces, the third refused
    start = array.ctypes.data
    cuts = [a for a, _ in host_rows._pieces(start, array.nbytes)]
    fake.fail_at = cuts[2]
    with pytest.raises(RuntimeError, match=r"failed at byte .*: out of memory"):
        zg.HostTable(array)
    assert fake.locked == set() and not host_rows._LOCKED


@_FAKES_CUDA
def test_a_file_mapped_for_reading_is_locked_as_read_only_memory(monkeypatch, tmp_path):
    """CUDA refuses to register read-only pages unless told they are: a table over a file
    memory-mapped for reading is registered as read-only, a writable one is not; both
    are unlocked once dropped."""
    import gc

    fake = _FakeCuda()
    monkeypatch.setattr(host_rows, "_gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(host_rows, "_register_targets", lambda: fake)
    np.save(tmp_path / "x.npy", np.ones((64, 4), np.float32))
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    writable = np.ones((64, 4), np.float32)
    read_only, other = zg.HostTable(mapped), zg.HostTable(writable)
    assert read_only.page_locked and other.page_locked
    assert fake.read_only == {mapped.ctypes.data}
    assert fake.locked == {mapped.ctypes.data, writable.ctypes.data}
    del read_only, other
    gc.collect()
    assert fake.locked == set() and not host_rows._LOCKED


@_FAKES_CUDA
def test_tables_inside_a_locked_buffer_share_its_locking(monkeypatch):
    """A buffer locked once (exact inference's layer outputs) and tables over parts of
    it: no second registration; the pages stay locked while the buffer's lock lives."""
    import gc

    fake = _FakeCuda()
    monkeypatch.setattr(host_rows, "_gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(host_rows, "_register_targets", lambda: fake)
    buffer = np.zeros(4096, np.uint8)
    lock = host_rows.PageLock(buffer)
    part = zg.HostTable(buffer[1024:3072].view(np.float32).reshape(64, 8))
    assert part.page_locked and fake.locked == {buffer.ctypes.data}
    del lock
    gc.collect()
    assert fake.locked == {buffer.ctypes.data}
    del part
    gc.collect()
    assert fake.locked == set() and not host_rows._LOCKED


@_FAKES_CUDA
def test_pinned_buffer_locks_piece_by_piece_and_reports_failure(monkeypatch):
    """`ready(end)` returns once the pieces below `end` are locked (all of them in the
    end); tables inside share the buffer's locking, undone when both are gone; a refused
    piece surfaces in `ready` with the byte where it failed."""
    import gc

    fake = _FakeCuda()
    monkeypatch.setattr(host_rows, "_gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(host_rows, "_register_targets", lambda: fake)
    monkeypatch.setattr(host_rows, "_PIECE", 8192)
    buffer = host_rows.PinnedBuffer(5 * 8192)
    assert buffer.locked and buffer.ready(3 * 8192) >= 0
    buffer.ready(buffer.nbytes)
    start = buffer.array.ctypes.data
    assert fake.locked == {a for a, _ in host_rows._pieces(start, 5 * 8192)}
    part = zg.HostTable(buffer.array[8192:16384].view(np.float32).reshape(64, 32))
    assert len(fake.locked) == len(host_rows._pieces(start, 5 * 8192))  # nothing new
    del buffer
    gc.collect()
    assert fake.locked  # the table still holds it
    del part
    gc.collect()
    assert fake.locked == set() and not host_rows._LOCKED
    calls, register = [], fake.zg_register

    def third_refused(address: int, nbytes: int, read_only: int = 0) -> bytes:
        calls.append(address)
        return b"out of memory" if len(calls) == 3 else register(address, nbytes)

    monkeypatch.setattr(fake, "zg_register", third_refused)
    failing = host_rows.PinnedBuffer(4 * 8192)
    with pytest.raises(RuntimeError, match=r"failed at byte [0-9,]+: out of memory"):
        failing.ready(failing.nbytes)
    del failing
    gc.collect()
    assert fake.locked == set() and not host_rows._LOCKED  # the two locked pieces undone


@_FAKES_CUDA
def test_pinned_buffer_touches_its_pages_while_the_handlers_build(monkeypatch):
    """While the handlers are built (a first use: ~10 s) the locking thread touches the
    buffer's pieces ahead, and locks them once the build is done; with the handlers
    there, each piece is locked after its own pages. No piece is ever locked while
    pages are being touched, and the pieces are locked in address order."""
    import gc
    import threading
    import time

    fake, workers = _FakeCuda(), min(16, os.cpu_count() or 1)
    monkeypatch.setattr(host_rows, "_gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(host_rows, "_PIECE", 8192)
    busy, touched, events, parts = [0], [], [], []
    guard = threading.Lock()

    def touch(part):
        with guard:
            busy[0] += 1
        time.sleep(0.001)
        with guard:
            busy[0] -= 1
            touched.append(part.ctypes.data)

    def register(address, nbytes, read_only=0):
        events.append(("register", address, busy[0]))
        return _FakeCuda.zg_register(fake, address, nbytes)

    def building():  # returns once every part is touched (or after 60 s, to fail below)
        (span,) = host_rows._LOCKED  # the buffer's, made before its thread starts
        parts.append(len(host_rows._pieces(*span)) * workers)
        deadline = time.monotonic() + 60
        while len(touched) < parts[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        events.append(("built", len(touched)))
        return fake

    monkeypatch.setattr(host_rows, "_touch", touch)
    monkeypatch.setattr(fake, "zg_register", register)
    for build in (building, lambda: fake):
        events.clear()
        monkeypatch.setattr(host_rows, "_register_targets", build)
        buffer = host_rows.PinnedBuffer(4 * 8192)
        buffer.ready(buffer.nbytes)
        starts = [a for a, _ in host_rows._pieces(buffer.array.ctypes.data, 4 * 8192)]
        registered = [e for e in events if e[0] == "register"]
        assert [a for _, a, _ in registered] == starts and fake.locked == set(starts)
        assert all(n == 0 for _, _, n in registered)  # nothing touched meanwhile
        if build is building:
            assert events[0] == ("built", parts[0])
        del buffer
        gc.collect()
        assert fake.locked == set() and not host_rows._LOCKED


@_FAKES_CUDA
def test_a_table_locked_by_a_host_table_goes_to_the_device_by_the_gather(monkeypatch):
    """JAX's device_put of memory we page-locked fails on a GPU: device placement of an
    array a live HostTable holds uploads it through the host gather instead (bit for
    bit), and leaves any other array to device_put."""
    from zerognn_jax._src.training import placement

    fake = _FakeCuda()
    monkeypatch.setattr(host_rows, "_gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(host_rows, "_register_targets", lambda: fake)
    features = np.random.default_rng(1).standard_normal((40, 6)).astype(np.float32)
    held = zg.HostTable(features)
    calls = []
    upload = host_rows.uploaded
    monkeypatch.setattr(host_rows, "uploaded", lambda t: calls.append(t) or upload(t))
    where = placement.Placement("device", "test", measured=False)
    for array, through_gather in ((features, True), (features.copy(), False)):
        calls.clear()
        monkeypatch.setattr(host_rows, "_gpu_arch", lambda: None)  # the CPU handler runs
        got = placement.place_features(array, np.float32, where, announce=False)
        monkeypatch.setattr(host_rows, "_gpu_arch", lambda: "sm_90")
        assert bool(calls) == through_gather
        np.testing.assert_array_equal(np.asarray(got), features)
    del held
