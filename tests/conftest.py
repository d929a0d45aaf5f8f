"""Shared fixtures; tests marked `gpu` skip unless JAX's default backend is a GPU."""

from __future__ import annotations

import atexit
import dataclasses
import gc
import importlib.metadata
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile

# XLA_FLAGS that compile faster: the suite checks results, not speed, and its programs
# are small, so compiling is most of its time (on a 2-core CPU, 2026-11-30: two
# recorded-loss and host-table files 136 -> 103 s, two training files 172 -> 159 s).
# They change float results in the last bits, so tests compare runs under the same
# flags, or within a tolerance; the recorded-loss tests, bit for bit against runs
# recorded under XLA's defaults, train in a child process under the flags the suite was
# started with (`start_flag_runs`). Set before JAX starts its backends; a user's
# XLA_FLAGS are kept. The start flags travel in the environment to pytest-xdist's
# workers, which inherit the fast flags from the process that started them.
FAST_XLA = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
# XLA:CPU's older IR emitters compile a fusion in about half the time of its MLIR fusion
# emitters (2026-11-30, JAX 0.10.2, 2-core CPU: two link-training tests 54.6 -> 26.3 CPU
# seconds). JAX 0.11's XLA no longer has the flag and refuses unknown ones at start.
if tuple(int(p) for p in importlib.metadata.version("jaxlib").split(".")[:2]) < (0, 11):
    FAST_XLA += " --xla_cpu_use_fusion_emitters=false"
_UNSET = "(unset)"
os.environ.setdefault("ZEROGNN_TESTS_START_XLA_FLAGS", os.environ.get("XLA_FLAGS", _UNSET))
START_XLA = os.environ["ZEROGNN_TESTS_START_XLA_FLAGS"]
START_XLA = None if START_XLA == _UNSET else START_XLA
os.environ.setdefault("XLA_FLAGS", FAST_XLA)

# pytest-xdist's workers (pyproject's addopts) share the machine's GPU where it has one:
# each allocates as it needs instead of taking 75 % of the GPU's memory at start.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# A suite started in the background (`cmd &` in a script) has SIGINT ignored,
# and so would every child it starts: the signal tests need SIGINT as a process in the
# foreground has it (a process that ignores it keeps ignoring it inside
# `interrupts.deferred`, as it should). A Python handler here becomes the default
# action in a child, whose Python then raises KeyboardInterrupt as usual.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# JAX's persistent compilation cache, a folder of this process's own (pytest-xdist's
# workers each theirs: JAX writes an entry without a lock), removed at exit: a program
# built again by a later test (a resumed run, a second engine over the same config, a
# module's programs after `_fresh_compile_caches`) is loaded instead of compiled. Child
# processes get none. A user's JAX_COMPILATION_CACHE_DIR is kept.
if not jax.config.jax_compilation_cache_dir:
    _XLA_CACHE = tempfile.mkdtemp(prefix="zerognn-tests-xla-")
    atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)
# The `zerognn` commands the tests start keep no cache in the user's home either (a test
# gives --compile-cache where it wants one); in this process the folder above is kept.
os.environ.setdefault("ZEROGNN_COMPILE_CACHE", "none")

from zerognn_jax import from_edge_list  # noqa: E402

TESTS = pathlib.Path(__file__).resolve().parent
SHARED = TESTS.parents[1] / "shared" / "datasets"


def _under_start_flags(module: str, timeout: float = 900, **variables: str) -> dict:
    """`module.all_runs()` (a test module of this folder, JSON-able), computed in a child
    process under the XLA_FLAGS the suite started with (none: XLA's defaults), with the
    environment `variables` added. The module must not import this file, which would set
    the fast flags there too."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | variables
    if START_XLA is not None:
        env["XLA_FLAGS"] = START_XLA
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent),
                                         env.get("PYTHONPATH", "")])
    code = f"import json, {module}; print(json.dumps({module}.all_runs()))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def summary_under_start_flags(cfg) -> dict:
    """The summary of `zg.train(cfg)` (a `TrainConfig` that names its dataset and root),
    trained in a child process under the flags the suite started with
    (tests/_planetoid_run.py says why)."""
    return _under_start_flags("_planetoid_run",
                              ZEROGNN_TEST_CONFIG=json.dumps(dataclasses.asdict(cfg)))


@pytest.fixture(scope="module")
def start_flag_runs(request):
    """The requesting module's `all_runs()`, trained in one child process under the
    flags the suite started with (`_under_start_flags`); as a fixture, the module
    imports nothing from here."""
    return _under_start_flags(request.module.__name__)


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (JAX backend is "
                                   f"{jax.default_backend()})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _full_float32_products_on_a_gpu():
    """float32 matrix products in full float32 on a GPU, as on a CPU: a GPU's default
    (TF32) rounds them to ~1e-3 (seen on an H200), above the tolerances of the tests
    that compare two computations of one function. In the workers, not at import: the
    process that starts pytest-xdist's workers must not claim the GPU."""
    if jax.default_backend() == "gpu":
        jax.config.update("jax_default_matmul_precision", "highest")
    yield


@pytest.fixture(scope="session", autouse=True)
def _own_build_cache(tmp_path_factory):
    """The host-row gather (ops/host_rows.py) is built into a folder of this run, not the
    user's cache; worker processes inherit it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ZEROGNN_CACHE", str(tmp_path_factory.mktemp("build")))
        yield


@pytest.fixture(scope="module", autouse=True)
def _fresh_compile_caches():
    """Drops JAX's compiled programs after each test module, so one process does not
    hold every module's executables to the end of the suite (a full run of ~1,070
    tests crashed inside an XLA CPU compile at 94 %, a test that passes alone)."""
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def planetoid_root():
    root = SHARED / "planetoid"
    if not root.is_dir():
        pytest.skip(f"shared Planetoid files not found at {root}")
    return str(root)


def random_graph(num_nodes: int, num_edges: int, seed: int = 0, isolated: int = 0):
    """An undirected random graph; the last `isolated` nodes get no edges."""
    rs = np.random.default_rng(seed)
    hi = num_nodes - isolated
    src, dst = rs.integers(0, hi, num_edges), rs.integers(0, hi, num_edges)
    return from_edge_list(src, dst, num_nodes, make_undirected=True, remove_self_loops=True,
                          remove_duplicates=True)


@pytest.fixture(scope="session")
def small_graph():
    return random_graph(300, 1500, seed=1, isolated=5)


def labelled_dataset(name: str, num_nodes: int, dim: int, classes: int, *, seed: int,
                     edges: int, splits=(0.6, 0.2)):
    """A random undirected graph whose labels its nodes' own features decide (the
    arg-max of the first `classes` columns: learnable in an epoch or two), split at
    random into train/val/test."""
    from zerognn_jax import make_dataset

    rs = np.random.default_rng(seed)
    g = random_graph(num_nodes, edges, seed=seed)
    x = rs.normal(size=(num_nodes, dim)).astype(np.float32)
    order = rs.permutation(num_nodes)
    a, b = int(splits[0] * num_nodes), int((splits[0] + splits[1]) * num_nodes)
    return make_dataset(name, g.indptr, g.indices, x, np.argmax(x[:, :classes], -1),
                        order[:a], order[a:b], order[b:], classes)


def mean_layer(dense, h_src, h_dst, view):
    """A user's SAGE-mean layer: `dense([h_dst ; mean of h_src over the edges])`;
    `h_dst=None` takes the first `view.num_dst` rows of `h_src` (sampled blocks)."""
    import jax.numpy as jnp

    from zerognn_jax import mean_weights

    h_dst = h_src[: view.num_dst] if h_dst is None else h_dst
    neigh = view.weighted_sum(h_src[:, None, :], mean_weights(view))[:, 0, :]
    return dense(jnp.concatenate([h_dst, neigh], -1))


def neighbour_labelled_npz(path, num_nodes: int = 600, dim: int = 8, classes: int = 4,
                           seed: int = 0):
    """Writes (and returns the path of) a dataset whose labels its nodes' neighbours
    decide (the arg-max of the mean of the neighbours' first `classes` feature columns
    plus a little of the node's own: a GNN learns them, a feature-only model cannot),
    and whose edges its features predict (8 clusters, 4 in 5 edges inside one, the
    features a cluster centre plus noise); edge weights in [0.5, 1.5] for the weighted
    sampler; splits 50/20/30."""
    from zerognn_jax import from_edge_list, make_dataset, save_npz

    rs = np.random.default_rng(seed)
    cluster = rs.integers(0, 8, num_nodes)
    x = (rs.normal(size=(8, dim))[cluster] + rs.normal(size=(num_nodes, dim))).astype(
        np.float32)
    members = [np.flatnonzero(cluster == c) for c in range(8)]
    src = rs.integers(0, num_nodes, 4 * num_nodes)
    dst = np.where(rs.random(src.size) < 0.8,
                   [rs.choice(members[cluster[s]]) for s in src],
                   rs.integers(0, num_nodes, src.size))
    g = from_edge_list(src, dst, num_nodes, make_undirected=True, remove_self_loops=True,
                       remove_duplicates=True)
    deg = np.maximum(np.diff(g.indptr), 1)
    rows = np.repeat(np.arange(num_nodes), np.diff(g.indptr))
    mean = np.zeros((num_nodes, classes))
    np.add.at(mean, rows, x[g.indices, :classes])
    labels = np.argmax(mean / deg[:, None] + 0.3 * x[:, :classes], -1)
    order = rs.permutation(num_nodes)
    a, b = num_nodes // 2, num_nodes // 2 + num_nodes // 5
    weights = rs.uniform(0.5, 1.5, g.num_edges).astype(np.float32)
    ds = make_dataset("neighbours", g.indptr, g.indices, x, labels, order[:a], order[a:b],
                      order[b:], classes, weights)
    save_npz(ds, path)
    return str(path)


def lexsort_csr(src, dst, num_rows, *, undirected=False, loops=True, distinct=False):
    """The CSR arrays (indptr, indices) of edges src -> dst by plain NumPy, a reference for
    `from_edge_list`'s builds: reverses appended when `undirected` (none for a loop, its own
    reverse), loops dropped unless kept, edges ordered by (row, neighbour), each pair once
    when `distinct`."""
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    if undirected:
        turn = src != dst
        src, dst = np.concatenate([src, dst[turn]]), np.concatenate([dst, src[turn]])
    if not loops:
        src, dst = src[src != dst], dst[src != dst]
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    if distinct and src.size:
        first = np.ones(src.shape, bool)
        first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
        src, dst = src[first], dst[first]
    return np.concatenate([[0], np.cumsum(np.bincount(src, minlength=num_rows))]), dst


def runs_rtol() -> float:
    """How close two runs of one computation come: on a CPU to float32 rounding; XLA:GPU's
    scatter-adds sum in any order, so there the losses of two runs drift apart (seen on
    an H200: 1e-5 relative after one epoch, 2e-4 after three). A function, not a
    constant: asking for the backend at import would claim the GPU in pytest-xdist's
    controller."""
    return 1e-6 if jax.default_backend() == "cpu" else 1e-3


def assert_same_runs(a, b):
    """Arrays of two runs of one computation: equal on a CPU, within `runs_rtol` on a
    GPU."""
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        if jax.default_backend() == "cpu":
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=runs_rtol(),
                                       atol=runs_rtol() * 1e-2)


def assert_same_rankings(ids_a, scores_a, ids_b, scores_b):
    """Top-k lists (ids[rows, k] and their scores) of two runs of one computation: equal
    on a CPU; on a GPU the scores within `runs_rtol` and an id placed otherwise only
    where its score ties, within that tolerance, its score in the other list (or that
    list's last, where it fell out of it): two near-equal scores may swap."""
    assert_same_runs(scores_a, scores_b)
    ids_a, ids_b, scores_a, scores_b = (np.asarray(x) for x in (ids_a, ids_b, scores_a,
                                                                 scores_b))
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(ids_a, ids_b)
        return
    for row in range(len(ids_a)):
        for k in np.flatnonzero(ids_a[row] != ids_b[row]):
            there = np.flatnonzero(ids_b[row] == ids_a[row, k])
            other = scores_b[row, there[0]] if there.size else scores_b[row, -1]
            np.testing.assert_allclose(scores_a[row, k], other, rtol=runs_rtol(),
                                       atol=runs_rtol() * 1e-2)


def assert_grown_run_agrees(small, big):
    """A run whose forced-small envelope overflowed and grew (`small`) against one whose
    envelope never overflowed (`big`): the first epoch's loss to 1e-6 relative and
    every variable to 1e-5 (sums over padded buffers of other sizes may round
    differently; on a GPU, `runs_rtol`)."""
    assert small.history[0]["overflows"] > 0 and big.history[0]["overflows"] == 0
    np.testing.assert_allclose(small.history[0]["loss"], big.history[0]["loss"],
                               rtol=runs_rtol())
    tol = max(1e-5, runs_rtol())
    for a, b in zip(jax.tree_util.tree_leaves(small.variables),
                    jax.tree_util.tree_leaves(big.variables)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)
