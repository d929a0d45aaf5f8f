"""Velickovic et al.'s GAT on Cora, trained for test_train.py in a process of its own
under XLA's default flags: the suite's fast-compiling flags run its 200 epochs of
full-neighbourhood attention about twice as slowly as the run takes optimised (CPU,
JAX 0.10.2: 111 s against 50 s). Imports nothing of conftest.py, which sets those
flags; the Planetoid folder comes in ZEROGNN_TEST_PLANETOID."""

from __future__ import annotations

import os

import zerognn_jax as zg


def all_runs() -> dict:
    """{"test_acc": the last epoch's model's test accuracy at seed 0}."""
    cfg = zg.TrainConfig(dataset="cora", model="gat", hidden=64, heads=8, layers=2,
                         fanouts=(-1, -1), batch_size=140, lr=0.005, weight_decay=5e-4,
                         dropout=0.6, input_dropout=0.6, activation="elu",
                         attention_dropout=0.6, epochs=200, eval_every=0, progress=False,
                         seed=0)
    dataset = zg.load_dataset("cora", os.environ["ZEROGNN_TEST_PLANETOID"])
    return {"test_acc": zg.train(cfg, dataset).summary["test_acc"]}
