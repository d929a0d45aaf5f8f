"""The XLA compiler options the engines compile their training programs with.

On an NVIDIA GPU, XLA writes most matrix products of a step as Triton kernels of its
own (autotuned tiles, often split-K with a reduction after) and sends the rest to
cuBLAS. For the shapes a GNN step multiplies (a few thousand rows by a few hundred
columns) cuBLAS was as fast or faster on an H100 in every workload measured, 1.01x to
1.16x a step (docs/benchmarks.md, "Matrix products by cuBLAS"): `gemm_backend="cublas"`,
the default, turns XLA's Triton GEMMs off (`xla_gpu_enable_triton_gemm=false`), so that
the products it would have given Triton go to cuBLAS; "xla" leaves XLA's own choice.
Other devices get no option (AMD GPUs too: unmeasured there). A user's XLA_FLAGS that
set the Triton GEMM flag win over the default, and options passed explicitly
(`ScanEngine.compiler_options`) over both. Evaluation programs compile with XLA's
defaults.
"""

from __future__ import annotations

import os
import re

import jax

GEMM_BACKENDS = ("cublas", "xla")
TRITON_GEMM = "xla_gpu_enable_triton_gemm"
# the flag itself in XLA_FLAGS, not a longer one it begins (xla_gpu_enable_triton_gemm_int4)
_SET_BY_USER = re.compile(rf"(^|\s)--?{TRITON_GEMM}(=|\s|$)")


def check_gemm_backend(backend: str) -> None:
    if backend not in GEMM_BACKENDS:
        raise ValueError(f"gemm_backend must be one of {', '.join(GEMM_BACKENDS)}, "
                         f"got {backend!r}")


def on_nvidia_gpu() -> bool:
    """Whether JAX's default devices are NVIDIA GPUs."""
    device = jax.devices()[0]
    return device.platform == "gpu" and "nvidia" in device.device_kind.lower()


def compiler_options(gemm_backend: str, extra: dict | None = None,
                     nvidia: bool | None = None) -> dict | None:
    """The options to compile a training program with (module docstring): the GEMM
    backend's where the program runs on an NVIDIA GPU (`nvidia`, default
    `on_nvidia_gpu()`), then `extra` over them; None when there are none."""
    check_gemm_backend(gemm_backend)
    options = {}
    if (gemm_backend == "cublas" and not _SET_BY_USER.search(os.environ.get("XLA_FLAGS", ""))
            and (on_nvidia_gpu() if nvidia is None else nvidia)):
        options[TRITON_GEMM] = False
    options.update(extra or {})
    return options or None
