"""Every example runs on a tiny CPU configuration."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / name / "main.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_products_sage_example(tmp_path):
    result = _load("products_sage").main(["--scale", "0.002", "--epochs", "1",
                                          "--batch-size", "128", "--root", str(tmp_path)])
    assert result.summary["epochs"] == 1 and result.summary["overflows"] >= 0


def test_cora_gcn_example(planetoid_root):
    accs = _load("cora_gcn").main(["--root", planetoid_root, "--epochs", "30"])
    assert len(accs) == 1 and accs[0] > 0.5


@pytest.mark.parametrize("epochs", [2])
def test_custom_model_example(epochs):
    acc = _load("custom_model").main(["--epochs", str(epochs)])
    assert 0.0 <= acc <= 1.0


def test_own_loop_example():
    losses = _load("own_loop").main(["--epochs", "3"])
    assert len(losses) == 3 and losses[-1] < losses[0]
