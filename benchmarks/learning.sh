#!/usr/bin/env bash
# Learning on products-like at full scale, on one GPU: default SAGE (3x256, [15,10,5],
# batch 1024, Adam 3e-3, dropout 0.5 on hidden activations) against the MLP baseline,
# 10 epochs each, exact full-neighbourhood test accuracy after epochs 5 and 10.
#
#   bash benchmarks/learning.sh [OUT_DIR]        (on the device machine, repo root)
#
# OUT_DIR (default $OUT, else learning_out) gets one metrics JSONL and one log per model
# and prints a table. Override with MODELS, EPOCHS, ROOT, EXTRA (more `zerognn train` flags).
set -uo pipefail

OUT_DIR=${1:-${OUT:-learning_out}}
ROOT=${ROOT:-.cache/zerognn}
MODELS=${MODELS:-sage mlp}
EPOCHS=${EPOCHS:-10}
EXTRA=${EXTRA:-}
PY=${PYTHON:-python3}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR" "$ROOT"

for model in $MODELS; do
  rm -f "$OUT_DIR/learn-$model.jsonl"
  # shellcheck disable=SC2086
  $PY -m zerognn_jax.cli train --dataset products-like --root "$ROOT" --model "$model" \
    --epochs "$EPOCHS" --eval-every 5 --no-progress \
    --metrics-out "$OUT_DIR/learn-$model.jsonl" $EXTRA >"$OUT_DIR/learn-$model.log" 2>&1 \
    || echo "$model: exit $? (see $OUT_DIR/learn-$model.log)"
done

$PY - "$OUT_DIR" $MODELS <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("| model | epoch | train loss | val acc | test acc | epoch s |")
print("|---|---|---|---|---|---|")
for model in sys.argv[2:]:
    path = out / f"learn-{model}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    summary = next((r for r in rows if r.get("summary")), {})
    for r in rows:
        if "test_acc" in r and not r.get("summary"):
            print(f"| {model} | {r['epoch'] + 1} | {r['loss']:.3f} | {r['val_acc']:.4f} | "
                  f"{r['test_acc']:.4f} | {r['epoch_seconds']:.3f} |")
    if summary:
        last = [r for r in rows if not r.get("summary")][-1]
        print(f"| {model} | {last['epoch'] + 1} | {last['loss']:.3f} | "
              f"{summary['val_acc']:.4f} | {summary['test_acc']:.4f} | "
              f"{summary['median_epoch_seconds']:.3f} (median) |")
        print(f"<!-- {model}: {summary['device']}, jax {summary['jax_version']} -->")
PYEOF
