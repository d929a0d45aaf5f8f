"""The XLA compiler options the engines compile their training programs with.

On an NVIDIA GPU, XLA writes most matrix products of a step as Triton kernels of its
own (autotuned tiles, often split-K with a reduction after) and sends the rest to
cuBLAS. For the shapes a GNN step multiplies (a few thousand rows by a few hundred
columns) cuBLAS was as fast or faster on an H100 in every workload measured, 1.01x to
1.16x a step (docs/benchmarks.md, "Matrix products by cuBLAS"): `gemm_backend="cublas"`,
the default, turns XLA's Triton GEMMs off (`xla_gpu_enable_triton_gemm=false`), so that
the products it would have given Triton go to cuBLAS; "xla" leaves XLA's own choice.

XLA runs a step's kernels as CUDA graphs (command buffers), by default one after another
in the order of its schedule. Training programs compile with
`xla_gpu_command_buffer_scheduling_mode=CONCURRENT`, which lets kernels that share no
buffer run side by side: a GNN step has many small kernels on independent branches
(relations, a virtual node beside the node MLP). On one H100 that made molhiv-like's
batch-32 epoch 1.35x faster, mag-like's 1.15x and products-like's bfloat16 one 1.07x
(docs/benchmarks.md, "Kernels side by side"); over 2 and 4 H200s, data-parallel
epochs 2-6 % faster on products-like and 4-7 % on mag-like, with the same losses
(docs/multi_gpu.md, "Kernels side by side on several GPUs").

Other devices get no option (AMD GPUs too: unmeasured there). A user's XLA_FLAGS that
set either flag win over its default, and options passed explicitly
(`ScanEngine.compiler_options`) over both. Evaluation programs compile with XLA's
defaults.
"""

from __future__ import annotations

import os
import re

import jax

GEMM_BACKENDS = ("cublas", "xla")
TRITON_GEMM = "xla_gpu_enable_triton_gemm"
SCHEDULING = "xla_gpu_command_buffer_scheduling_mode"


def _set_by_user(flag: str) -> bool:
    """Whether XLA_FLAGS sets `flag` itself, not a longer one it begins
    (xla_gpu_enable_triton_gemm_int4)."""
    return re.search(rf"(^|\s)--?{flag}(=|\s|$)", os.environ.get("XLA_FLAGS", "")) is not None


def check_gemm_backend(backend: str) -> None:
    if backend not in GEMM_BACKENDS:
        raise ValueError(f"gemm_backend must be one of {', '.join(GEMM_BACKENDS)}, "
                         f"got {backend!r}")


def on_nvidia_gpu(device=None) -> bool:
    """Whether `device` (default: JAX's first default device) is an NVIDIA GPU: a "gpu"
    device whose client runs CUDA, as JAX's own DLPack export tells CUDA from ROCm.

    Not by the device's name: older cards report "Tesla V100-SXM2-16GB", without
    "NVIDIA"; an AMD GPU is a "gpu" device too, its client's version naming ROCm."""
    device = jax.devices()[0] if device is None else device
    if device.platform != "gpu":
        return False
    version = device.client.platform_version.lower()
    return "cuda" in version and "rocm" not in version


def compiler_options(gemm_backend: str, extra: dict | None = None,
                     nvidia: bool | None = None) -> dict | None:
    """The options to compile a training program with (module docstring): where it runs
    on NVIDIA GPUs (`nvidia`, default `on_nvidia_gpu()`), the GEMM backend's and
    concurrent kernels; then `extra` over them; None when there are none."""
    check_gemm_backend(gemm_backend)
    options = {}
    if on_nvidia_gpu() if nvidia is None else nvidia:
        if gemm_backend == "cublas" and not _set_by_user(TRITON_GEMM):
            options[TRITON_GEMM] = False
        if not _set_by_user(SCHEDULING):
            options[SCHEDULING] = "CONCURRENT"
    options.update(extra or {})
    return options or None
