"""The XLA compiler options the engines compile their step programs with.

On a GPU, XLA writes most matrix products of a step as Triton kernels of its own
(autotuned tiles, often split-K with a reduction after) and sends the rest to cuBLAS.
For the shapes a GNN step multiplies (a few thousand rows by a few hundred columns)
cuBLAS was faster on an H100 in every workload measured (docs/benchmarks.md, "Matrix
products by cuBLAS"): `gemm_backend="cublas"`, the default, asks XLA for cuBLAS
everywhere (`xla_gpu_enable_triton_gemm=false`); "xla" leaves XLA's own choice. Other
platforms get no option. A user's own XLA_FLAGS naming the Triton GEMM option win over
the default, as do options passed explicitly (`ScanEngine.compiler_options`).
"""

from __future__ import annotations

import os

import jax

GEMM_BACKENDS = ("cublas", "xla")
TRITON_GEMM = "xla_gpu_enable_triton_gemm"


def check_gemm_backend(backend: str) -> None:
    if backend not in GEMM_BACKENDS:
        raise ValueError(f"gemm_backend must be one of {', '.join(GEMM_BACKENDS)}, "
                         f"got {backend!r}")


def compiler_options(gemm_backend: str, extra: dict | None = None,
                     platform: str | None = None) -> dict | None:
    """The options to compile a step program with on `platform` (default: JAX's default
    backend): the GEMM backend's (module docstring), then `extra` over them; None when
    there are none."""
    check_gemm_backend(gemm_backend)
    platform = platform or jax.default_backend()
    options = {}
    if (gemm_backend == "cublas" and platform == "gpu"
            and TRITON_GEMM not in os.environ.get("XLA_FLAGS", "")):
        options[TRITON_GEMM] = False
    options.update(extra or {})
    return options or None
