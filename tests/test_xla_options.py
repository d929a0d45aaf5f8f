"""The XLA options the engines compile step programs with (xla_options.py): cuBLAS for
matrix products and kernels side by side on a GPU unless the user chose otherwise,
nothing elsewhere, and option names and values this XLA still knows."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

from zerognn_jax import TrainConfig, train
from zerognn_jax._src.training import scan, xla_options
from zerognn_jax._src.training.host import HostEngine
from zerognn_jax._src.training.scan import ScanEngine
from zerognn_jax._src.training.xla_options import (
    SCHEDULING,
    TRITON_GEMM,
    compiler_options,
    on_nvidia_gpu,
)


def test_cublas_and_concurrent_kernels_on_an_nvidia_gpu_only(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    both = {TRITON_GEMM: False, SCHEDULING: "CONCURRENT"}
    assert compiler_options("cublas", nvidia=True) == both
    assert compiler_options("cublas", nvidia=False) is None
    assert compiler_options("xla", nvidia=True) == {SCHEDULING: "CONCURRENT"}


def _device(platform: str, kind: str, version: str):
    """A stand-in for a jax Device: its platform, name and client's platform version
    (the strings the CUDA and ROCm PJRT plugins report)."""
    return SimpleNamespace(platform=platform, device_kind=kind,
                           client=SimpleNamespace(platform_version=version))


CUDA = "PJRT C API\ncuda 12080\ncudnn 91000"
NVIDIA = [_device("gpu", "Tesla V100-SXM2-16GB", CUDA),
          _device("gpu", "NVIDIA H100 80GB HBM3", CUDA),
          _device("gpu", "Quadro RTX 6000", "cuda 11080")]
OTHERS = [_device("gpu", "AMD Instinct MI300X", "PJRT C API\nrocm 60200"),
          _device("cpu", "cpu", "cpu")]


@pytest.mark.parametrize("device", NVIDIA + OTHERS, ids=lambda d: d.device_kind)
def test_nvidia_is_told_by_the_platform_not_the_name(device, monkeypatch):
    """A CUDA client makes an NVIDIA GPU whatever the card calls itself (a V100 says
    "Tesla"); a ROCm GPU and the CPU get no option."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    nvidia = device in NVIDIA
    assert on_nvidia_gpu(device) is nvidia
    monkeypatch.setattr(xla_options.jax, "devices", lambda: [device])
    assert on_nvidia_gpu() is nvidia
    want = {TRITON_GEMM: False, SCHEDULING: "CONCURRENT"} if nvidia else None
    assert compiler_options("cublas") == want


def test_the_users_choices_win(monkeypatch):
    for flags in (f"--{TRITON_GEMM}=true", f"--xla_dump_to=/tmp/x --{TRITON_GEMM}=false"):
        monkeypatch.setenv("XLA_FLAGS", flags)
        assert compiler_options("cublas", nvidia=True) == {SCHEDULING: "CONCURRENT"}
    monkeypatch.setenv("XLA_FLAGS", f"--{TRITON_GEMM}_int4=true")  # another flag
    assert compiler_options("cublas", nvidia=True) == {TRITON_GEMM: False,
                                                       SCHEDULING: "CONCURRENT"}
    monkeypatch.setenv("XLA_FLAGS", f"--{SCHEDULING}=LHS --{TRITON_GEMM}=true")
    assert compiler_options("cublas", nvidia=True) is None
    monkeypatch.delenv("XLA_FLAGS")
    extra = {TRITON_GEMM: True, "xla_gpu_enable_latency_hiding_scheduler": True}
    assert compiler_options("cublas", extra, nvidia=True) == {**extra,
                                                              SCHEDULING: "CONCURRENT"}
    assert compiler_options("xla", extra, nvidia=False) == extra


def test_this_xla_knows_the_options(monkeypatch):
    # An unknown name fails the compile ("No such compile option"), and so does an
    # unknown enum value; these compile on any backend, though only a GPU's compiler
    # reads them.
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    x = jnp.ones((8, 8))
    options = compiler_options("cublas", nvidia=True)
    assert set(options) == {TRITON_GEMM, SCHEDULING}
    out = jax.jit(jnp.dot).lower(x, x).compile(compiler_options=options)(x, x)
    assert float(out[0, 0]) == 8.0
    with pytest.raises(Exception, match="not a valid enum value"):
        jax.jit(jnp.dot).lower(x, x).compile(compiler_options={SCHEDULING: "SIDEWAYS"})


def test_engines_refuse_an_unknown_backend():
    for engine in (ScanEngine, HostEngine):
        with pytest.raises(ValueError, match="gemm_backend must be one of cublas, xla, "
                                             "got 'triton'"):
            engine(None, gemm_backend="triton")


def test_training_compiles_with_the_configs_backend(monkeypatch):
    # The default is the same on every engine, so without this a config's choice could
    # be dropped on the way to the compiler and no other test would notice.
    asked = []
    real = scan.compiler_options

    def spy(backend, extra=None, **kwargs):
        asked.append(backend)
        return real(backend, extra, **kwargs)

    monkeypatch.setattr(scan, "compiler_options", spy)
    train(TrainConfig(epochs=1, hidden=8, layers=2, fanouts=(2, 2), batch_size=64,
                      eval_mode="none", progress=False, gemm_backend="xla"))
    assert asked and set(asked) == {"xla"}


@pytest.mark.skipif(not on_nvidia_gpu(), reason="reads a CUDA compile")
def test_on_a_gpu_products_go_to_cublas(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    x = jnp.ones((1024, 300), jnp.float32)
    w = jnp.ones((300, 600), jnp.float32)
    f = jax.jit(lambda x, w: jax.nn.relu(x @ w) @ w.T)
    text = f.lower(x, w).compile(compiler_options=compiler_options("cublas")).as_text()
    assert "__cublas" in text and "triton_gemm" not in text
