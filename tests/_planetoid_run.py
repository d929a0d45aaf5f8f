"""A Planetoid learning run of test_train.py, trained in a process of its own under
XLA's default flags: the suite's fast-compiling flags run these hundreds of
full-neighbourhood epochs about twice as slowly as the runs take optimised (CPU, JAX
0.10.2, seed 0: GAT in its paper's form 111 s against 50 s; GCN on Cora 39 s against
22 s, on CiteSeer 41 s against 25 s; the same accuracies). Imports nothing of
conftest.py, which sets those flags. The run's `TrainConfig` comes as JSON in
ZEROGNN_TEST_CONFIG, the Planetoid folder in ZEROGNN_TEST_PLANETOID."""

from __future__ import annotations

import json
import os

import zerognn_jax as zg


def all_runs() -> dict:
    """{"test_acc": the last epoch's model's test accuracy}."""
    cfg = zg.TrainConfig(**json.loads(os.environ["ZEROGNN_TEST_CONFIG"]))
    dataset = zg.load_dataset(cfg.dataset, os.environ["ZEROGNN_TEST_PLANETOID"])
    return {"test_acc": zg.train(cfg, dataset).summary["test_acc"]}
