"""Times the scan engine's epoch under alternative formulations of the model step.

    PYTHONPATH=. python3 benchmarks/step_forms.py --root .cache/zerognn [--forms a,b] \
        [--profile a,b]

Workload: products-like, SAGE-mean 3x256, fanouts 15,10,5, batch 1024, Adam, XLA
kernels, calibrated envelope. `library` is the code as it stands; every other form
swaps one piece (how the neighbour weighted sum is written and differentiated
(`autodiff-*`: its gradient by autodiff's scatter instead of the gathering backward), one or
two matmuls per SAGE layer, dropout, computation dtype, `flat-*`: the outermost hop not
deduplicated, `tree-*`: no level deduplicated (every layer reads by position, no
scatter in the backward), `*ahead-8`: steps sampled 8 at a time, `*grad-bf16`: the
source gradient kept in bfloat16, `*-nodrop`: no dropout, `*-bias-in-product`: SAGE's
bias folded into its product as a column of ones) and prints one JSON line:
median epoch seconds over `--repeats` replays after a warm-up epoch, compile seconds,
and the mean loss of the last replay (forms that only reformulate must match
`library` to rounding; `two-matmul` and `*-bias-in-product` initialise differently).
`--profile` adds, for the named forms, the busiest device kernels per step with the
bytes their HLO instructions move (`hlo_bytes`) and the achieved bandwidth, and the
step's kernel count and bytes.
`--kernels` picks the op implementations (default xla). docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from zerognn_jax._src.bench import profiling
from zerognn_jax._src.nn import models
from zerognn_jax._src.ops import aggregate
from zerognn_jax._src.ops.aggregate import gather_live
from zerognn_jax._src.sampling.calibrate import choose_envelope
from zerognn_jax._src.sampling.envelope import EnvelopePolicy
from zerognn_jax._src.training import trainer
from zerognn_jax._src.training.config import TrainConfig
from zerognn_jax._src.training.program import init_state
from zerognn_jax._src.training.scan import ScanEngine


def sum_autodiff(h_src, nbr, weights):
    """Slot-major sum, gradient left to autodiff: padded slots (row 0, weight 0) are
    gathered and scatter-added like real ones (the library before the gathering
    backward)."""
    acc = jnp.promote_types(h_src.dtype, jnp.float32)
    w = jnp.swapaxes(weights, 0, 1)[..., None].astype(acc)
    return jnp.sum(h_src.astype(acc)[nbr.T] * w, axis=0).astype(h_src.dtype)


def sum_autodiff_live(h_src, nbr, weights):
    """Slot-major sum of live slots only (dead ones fill, their gradient is dropped),
    gradient left to autodiff."""
    acc = jnp.promote_types(h_src.dtype, jnp.float32)
    live = jnp.any(weights != 0, axis=-1)
    w = jnp.swapaxes(weights, 0, 1)[..., None].astype(acc)
    return jnp.sum(gather_live(h_src.astype(acc), nbr.T, live.T) * w, axis=0).astype(
        h_src.dtype)


def sum_middle_axis(h_src, nbr, weights):
    """Gather [C, K, ...] and reduce over the middle (fanout) axis."""
    gathered = h_src[nbr]
    return jnp.sum(gathered * weights[..., None].astype(h_src.dtype), axis=1)


def sum_unrolled(h_src, nbr, weights):
    """sum_k h_src[nbr[:, k]] * weights[:, k]: K row gathers added in one loop fusion."""
    out = None
    for k in range(nbr.shape[1]):
        term = h_src[nbr[:, k]] * weights[:, k, :, None].astype(h_src.dtype)
        out = term if out is None else out + term
    return out


def sum_same_dtype(h_src, nbr, weights):
    """The library's slot-major form, but summed (and scattered) in the input's dtype."""
    w = jnp.swapaxes(weights, 0, 1)[..., None].astype(h_src.dtype)
    return jnp.sum(h_src[nbr.T] * w, axis=0)


def with_flat_scatter(forward):
    """`forward` with a custom VJP: the source gradient as one scatter in [C * K] order."""

    @jax.custom_vjp
    def op(h_src, nbr, weights):
        return forward(h_src, nbr, weights)

    def fwd(h_src, nbr, weights):
        return forward(h_src, nbr, weights), (h_src, nbr, weights)

    def bwd(res, g):
        h_src, nbr, weights = res
        c, k = nbr.shape
        contrib = (g[:, None] * weights[..., None].astype(g.dtype)).reshape(
            (c * k,) + g.shape[1:])
        dh = jax.ops.segment_sum(contrib, nbr.reshape(-1), num_segments=h_src.shape[0])
        dw = jnp.einsum("chf,ckhf->ckh", g, h_src[nbr]).astype(weights.dtype)
        return dh.astype(h_src.dtype), None, dw

    op.defvjp(fwd, bwd)
    return op


@jax.custom_vjp
def sum_grad_in_dtype(h_src, nbr, weights):
    """The library's weighted sum, but its source gradient gathered and scatter-added in
    the input's dtype (bfloat16 in, bfloat16 gradient buffer) instead of float32."""
    return aggregate.weighted_sum_reference(h_src, nbr, weights)


def _grad_in_dtype_fwd(h_src, nbr, weights):
    return sum_grad_in_dtype(h_src, nbr, weights), (h_src, nbr, weights)


def _grad_in_dtype_bwd(res, g):
    h_src, nbr, weights = res
    _, vjp = jax.vjp(aggregate.weighted_sum_reference, h_src, nbr, weights)
    _, _, dw = vjp(g)
    live = jnp.any(weights != 0, axis=-1)
    dh = aggregate.source_gradient(g.astype(h_src.dtype), nbr, weights.astype(h_src.dtype),
                                   live, h_src.shape[0])
    return dh, None, dw


sum_grad_in_dtype.defvjp(_grad_in_dtype_fwd, _grad_in_dtype_bwd)


class SAGETwoMatmul(nn.Module):
    """SAGE-mean as W_self h_i + W_neigh mean_j h_j: two matmuls, two outputs added."""

    features: int
    dtype: object = jnp.float32

    @nn.compact
    def __call__(self, h_src, h_dst, view):
        w = models.mean_weights(view).astype(h_src.dtype)
        agg = view.weighted_sum(h_src[:, None, :], w)[:, 0, :]
        neigh = nn.Dense(self.features, use_bias=False, dtype=self.dtype)(agg)
        return nn.Dense(self.features, dtype=self.dtype)(h_dst) + neigh


class TwoMatmulGNN(models.GNN):
    def _make_conv(self, width, last):
        return SAGETwoMatmul(width, dtype=self.dtype)


class SAGEBiasInProduct(models.SAGEConv):
    """SAGE-mean with its bias folded into the product: [h_i ; agg ; 1 ; 0 x 7] times
    [W ; b ; 0 x 7], so that the bias gradient comes out of the weight gradient's product
    instead of a row reduction fused into the output gradient's kernel."""

    @nn.compact
    def __call__(self, h_src, h_dst, view):
        agg = self.aggregate(h_src, view)
        n, d = h_dst.shape[0], h_dst.shape[-1] + agg.shape[-1]
        ones = jnp.ones((n, 1), h_dst.dtype)
        both = jnp.concatenate([h_dst, agg.astype(h_dst.dtype), ones,
                                jnp.zeros((n, 7), h_dst.dtype)], axis=-1)
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (d, self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        w = jnp.concatenate([kernel, bias[None], jnp.zeros((7, self.features))], axis=0)
        return jnp.dot(both, w.astype(self.dtype))


class BiasInProductGNN(models.GNN):
    def _make_conv(self, width, last):
        return SAGEBiasInProduct(width, dtype=self.dtype)


@dataclasses.dataclass(frozen=True)
class Form:
    name: str
    weighted_sum: object = None  # None: the library's
    two_matmul: bool = False
    bias_in_product: bool = False
    dropout: float = 0.5
    dtype: object = jnp.float32
    flat_outer: bool = False  # SamplerConfig.flat_outer
    dedup: bool = True  # SamplerConfig.dedup (False: tree mode, every level positional)
    ahead: int = 1  # ScanEngine.sample_ahead


FORMS = {f.name: f for f in (
    Form("library"),
    Form("library-bf16", dtype=jnp.bfloat16),
    Form("autodiff-scatter", weighted_sum=sum_autodiff),
    Form("autodiff-scatter-bf16", weighted_sum=sum_autodiff, dtype=jnp.bfloat16),
    Form("autodiff-live", weighted_sum=sum_autodiff_live),
    Form("middle-axis", weighted_sum=sum_middle_axis),
    Form("unrolled", weighted_sum=sum_unrolled),
    Form("unrolled-flat-scatter", weighted_sum=with_flat_scatter(sum_unrolled)),
    Form("two-matmul", two_matmul=True),
    Form("previous", weighted_sum=sum_middle_axis, two_matmul=True),
    Form("bf16-sum-in-bf16", weighted_sum=sum_same_dtype, dtype=jnp.bfloat16),
    Form("no-dropout", dropout=0.0),
    Form("flat-outer", flat_outer=True),
    Form("flat-outer-bf16", flat_outer=True, dtype=jnp.bfloat16),
    Form("ahead-8", ahead=8),
    Form("ahead-8-bf16", ahead=8, dtype=jnp.bfloat16),
    Form("flat-ahead-8", flat_outer=True, ahead=8),
    Form("flat-ahead-8-bf16", flat_outer=True, ahead=8, dtype=jnp.bfloat16),
    Form("flat-ahead-16-bf16", flat_outer=True, ahead=16, dtype=jnp.bfloat16),
    Form("flat-ahead-8-bf16-grad-bf16", flat_outer=True, ahead=8, dtype=jnp.bfloat16,
         weighted_sum=sum_grad_in_dtype),
    Form("tree-ahead-8", dedup=False, ahead=8),
    Form("tree-ahead-8-bf16", dedup=False, ahead=8, dtype=jnp.bfloat16),
    Form("tree-ahead-8-nodrop", dedup=False, ahead=8, dropout=0.0),
    Form("tree-ahead-8-bf16-nodrop", dedup=False, ahead=8, dtype=jnp.bfloat16, dropout=0.0),
    Form("tree-ahead-8-bias-in-product", dedup=False, ahead=8, bias_in_product=True),
    Form("tree-ahead-8-bf16-bias-in-product", dedup=False, ahead=8, dtype=jnp.bfloat16,
         bias_in_product=True),
)}


def build(form: Form, base_program, base_data, num_classes):
    cls = (TwoMatmulGNN if form.two_matmul else BiasInProductGNN if form.bias_in_product
           else models.GNN)
    model = cls("sage", 256, 3, num_classes, dropout=form.dropout, dtype=form.dtype)
    data = base_data._replace(features=base_data.features.astype(form.dtype))
    kernels = base_program.kernels
    if form.weighted_sum is not None:
        kernels = dataclasses.replace(kernels, weighted_sum=form.weighted_sum)
    sampler = dataclasses.replace(base_program.sampler, flat_outer=form.flat_outer,
                                  dedup=form.dedup)
    return dataclasses.replace(base_program, model=model, kernels=kernels,
                               sampler=sampler), data


def measure(form, program, data, envelope, train_idx, repeats, profile, hlo_dir=None):
    state = init_state(program, data, envelope, train_idx)
    engine = ScanEngine(program, sample_ahead=form.ahead)
    epoch = lambda st: engine.run_epoch(st, data, train_idx, 0, envelope)
    res = epoch(state)
    jax.block_until_ready(res.state.params)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = epoch(res.state)
        jax.block_until_ready(res.state.params)
        times.append(time.perf_counter() - t0)
    record = {"form": form.name, "epoch_seconds": round(statistics.median(times), 4),
              "runs": [round(t, 4) for t in times],
              "compile_seconds": round(engine.compile_seconds, 1),
              "loss": round(res.loss, 5), "overflows": res.overflows}
    if profile:
        with tempfile.TemporaryDirectory() as tmp:
            with profiling.traced_window(tmp):
                res = epoch(res.state)
                jax.block_until_ready(res.state.params)
            (compiled,) = engine.programs.values()
            text = compiled.as_text()
            record.update(profiling.step_kernel_table(profiling.find_trace(tmp), text,
                                                         res.steps, limit=30))
            if hlo_dir:
                pathlib.Path(hlo_dir, f"{form.name}.hlo.txt").write_text(text)
    return record


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="products-like")
    p.add_argument("--root", default=None)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--profile", default="")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kernels", default="xla")
    p.add_argument("--multiple", type=int, default=128,
                   help="round the envelope's capacities up to a multiple of this")
    p.add_argument("--hlo-dir", default=None,
                   help="write each profiled form's optimized HLO here (<form>.hlo.txt)")
    args = p.parse_args()
    forms = [f for f in args.forms.split(",") if f]
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        p.error(f"unknown forms {unknown}; choose from {', '.join(FORMS)}")
    cfg = TrainConfig(dataset=args.dataset, root=args.root, scale=args.scale,
                              model="sage", hidden=256, layers=3, fanouts=(15, 10, 5),
                              flat_outer=False, sample_ahead=1,
                              batch_size=1024, kernels=args.kernels, eval_mode="none",
                              progress=False)
    dataset, data, program = trainer.prepare(cfg)
    base_envelope, _ = choose_envelope(data.graph, dataset.train_idx, cfg.batch_size,
                                       program.sampler,
                                       policy=EnvelopePolicy(multiple=args.multiple))
    print(json.dumps({"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                      "envelope": list(base_envelope.levels)}), flush=True)
    profile = set(args.profile.split(","))
    train_idx = jnp.asarray(dataset.train_idx, jnp.int32)
    for name in forms:
        form = FORMS[name]
        prog, dat = build(form, program, data, dataset.num_classes)
        envelope = prog.sampler.fit_envelope(base_envelope)
        record = measure(form, prog, dat, envelope, train_idx, args.repeats, name in profile,
                         args.hlo_dir)
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
