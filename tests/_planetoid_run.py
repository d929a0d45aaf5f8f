"""A Planetoid learning run of the tests (test_train.py, test_link.py), trained in a
process of its own under XLA's default flags: the suite's fast-compiling flags run
these hundreds of full-neighbourhood steps about twice as slowly as the runs take
optimised (CPU, JAX 0.10.2, seed 0: GAT in its paper's form 111 s against 50 s; GCN on
Cora 39 s against 22 s; GCN link prediction on Cora with 64 shared negatives 43 s
against 16 s; the same accuracies). Imports nothing of conftest.py, which sets those
flags. The run's `TrainConfig` comes as JSON in ZEROGNN_TEST_CONFIG (its `root` the
Planetoid folder)."""

from __future__ import annotations

import json
import os

import zerognn_jax as zg


def all_runs() -> dict:
    """The run's summary record."""
    return zg.train(zg.TrainConfig(**json.loads(os.environ["ZEROGNN_TEST_CONFIG"]))).summary
