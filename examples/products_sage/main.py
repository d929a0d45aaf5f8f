"""GraphSAGE-mean on the products-like synthetic graph (the benchmark workload).

    python examples/products_sage/main.py --scale 1.0 --epochs 10   # full size, on a GPU
    python examples/products_sage/main.py --scale 0.01 --epochs 2   # a quick CPU run
"""

import argparse
import json

import zerognn_jax as zg
from zerognn_jax.cli.flags import run_main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--scale", type=float, default=1.0, help="size factor of the graph")
    p.add_argument("--root", default=None, help="cache folder for the generated graph")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--kernels", default="auto", help="auto (the library's default: the "
                   "Pallas sampler on a GPU), xla, pallas, or per op (TrainConfig.kernels)")
    args = p.parse_args(argv)
    config = zg.TrainConfig(dataset="products-like", root=args.root, scale=args.scale,
                            model="sage", hidden=256, layers=3, fanouts=(15, 10, 5),
                            batch_size=args.batch_size, lr=3e-3, epochs=args.epochs,
                            kernels=args.kernels, eval_every=0)
    result = zg.train(config)
    print(json.dumps(result.summary))
    return result


if __name__ == "__main__":
    run_main(main)
