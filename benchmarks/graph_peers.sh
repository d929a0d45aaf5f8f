#!/usr/bin/env bash
# Graph-level training on molhiv-like (or molpcba-like): zerognn-jax against PyG and a
# jraph-style loop (issue #33), batch 32 and 256, GIN-virtual 5 x 300 (OGB's bond-aware
# gin-virtual).
#
#   bash benchmarks/graph_peers.sh [OUT_DIR]      (on the device machine, repo root)
#
# Overrides: DATASET (molhiv-like; molpcba-like: 128 tasks with missing labels, OGB's
# metric AP), EPOCHS (default 5), SCALE (1), BATCHES ("32 256"), PYTHON (python3),
# SYSTEMS ("zerognn jraph pyg"), DTYPES (zerognn-jax's dtypes, "float32"; the peers run
# float32). JSON lines go to OUT_DIR/graph.jsonl as they come; logs to OUT_DIR/graph.log.
# The PyG run reads the same molecules from OUT_DIR/DATASET.npz (written by
# `zerognn data generate`).
set -uo pipefail
OUT=${1:-${OUT:-out}}; mkdir -p "$OUT"
DATASET=${DATASET:-molhiv-like}
EPOCHS=${EPOCHS:-5}; SCALE=${SCALE:-1}; BATCHES=${BATCHES:-"32 256"}
DTYPES=${DTYPES:-float32}
PY=${PYTHON:-python3}; SYSTEMS=${SYSTEMS:-"zerognn jraph pyg"}
export PYTHONPATH=${PYTHONPATH:-}:$PWD
for s in $SYSTEMS; do
  for b in $BATCHES; do
    case $s in
      zerognn) for d in $DTYPES; do
                 $PY benchmarks/graph.py --dataset "$DATASET" --scale "$SCALE" \
                   --epochs "$EPOCHS" --batch-sizes "$b" --dtype "$d" --out "$OUT"
               done ;;
      jraph) $PY benchmarks/peers/jraph_gin.py --dataset "$DATASET" --scale "$SCALE" \
               --epochs "$EPOCHS" --batch-size "$b" | tee -a "$OUT/graph.jsonl" ;;
      pyg) [ -f "$OUT/$DATASET.npz" ] || $PY -m zerognn_jax.cli data generate "$DATASET" \
             --scale "$SCALE" --out "$OUT/$DATASET.npz" >/dev/null
           $PY benchmarks/peers/pyg_gin.py --data "$OUT/$DATASET.npz" --epochs "$EPOCHS" \
             --batch-size "$b" | tee -a "$OUT/graph.jsonl" ;;
    esac
  done 2>>"$OUT/graph.log"
done
echo "| system | dataset | dtype | batch | graphs/s | test ROC-AUC | test AP |"
echo "|---|---|---|---|---|---|---|"
$PY - "$OUT/graph.jsonl" <<'PYEOF'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"| {r['system']} | {r.get('dataset', 'molhiv-like')} | "
              f"{r.get('dtype', 'float32')} | {r['batch_size']} | {r['graphs_per_s']:,.0f} | "
              f"{r['test_rocauc']:.4f} | {r.get('test_ap', float('nan')):.4f} |")
PYEOF
