"""`zerognn export`: a run's checkpoint written as a jax.export artifact that gives the
live model's outputs; bad input ends in one line and writes nothing."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zerognn_jax as zg
from zerognn_jax._src.sampling.envelope import conservative
from zerognn_jax.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    cfg = zg.TrainConfig(dataset="tiny", hidden=8, layers=2, fanouts=(4, 3), batch_size=64,
                         epochs=1, eval_mode="none", progress=False,
                         checkpoint_dir=str(folder / "ckpt"))
    return folder, zg.train(cfg)


def test_the_artifact_gives_the_checkpointed_models_outputs(run, capsys):
    folder, result = run
    out = folder / "model.bin"
    assert main(["export", str(folder / "ckpt"), "--out", str(out), "--batch-size", "16"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["arguments"] == ["indptr", "indices", "features", "seeds", "valid", "key"]
    assert printed["bytes"] == out.stat().st_size and printed["batch_size"] == 16
    call = jax.export.deserialize(out.read_bytes()).call
    p, v, d = result.program, result.variables, result.data
    seeds, valid, key = jnp.arange(16, dtype=jnp.int32), jnp.arange(16) < 10, jnp.uint32(3)
    got = call(d.graph.indptr, d.graph.indices, d.features, seeds, valid, key)
    caps = conservative(16, p.sampler.slots, d.graph.num_nodes).capacities
    want, _, _ = p.forward(v, d, seeds, valid, key, caps, train=False)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "batch_size must be a positive int, got 0"),
    (["--platforms", "cpu,nope"], "platforms must be among cpu, cuda, rocm, tpu; got 'nope'"),
    (["--node-type", "paper"], "node_type picks a node type of a typed graph's model; this "
                               "program's graph has one type"),
])
def test_bad_input_is_one_line_and_writes_nothing(run, capsys, args, message):
    folder, _ = run
    out = folder / "bad" / "model.bin"
    assert main(["export", str(folder / "ckpt"), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zerognn: error:") and message in err and "\n" not in err
    assert not out.exists()


def test_a_missing_checkpoint_is_one_line(tmp_path, capsys):
    out = tmp_path / "model.bin"
    assert main(["export", str(tmp_path / "none"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zerognn: error:") and "\n" not in err
    assert not out.exists()
