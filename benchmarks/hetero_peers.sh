#!/usr/bin/env bash
# Typed node classification on mag-like: zerognn-jax's rsage against PyG's
# to_hetero(SAGE) with the hetero NeighborLoader, on one graph and one GPU, in one call
# (issue #32).
#
#   bash benchmarks/hetero_peers.sh [OUT_DIR]      (on the device machine, repo root)
#
# The workload of docs/hetero.md ("The PyG peer"): 2 layers of 256, fanouts 25,20 for
# every relation, batch 1024 papers, Adam at 3e-3, featureless types' rows learned by
# lazy Adam, EPOCHS epochs, test accuracy from the test papers sampled at the training
# fanouts. zerognn-jax runs first for each dtype of DTYPES; its first run writes the
# graph ($ROOT/$DATASET-$SCALE-peer.npz) that PyG reads. Every run fits BUDGET seconds
# (default 560): each runs under `timeout` with what is left, less MIN_NEXT seconds kept
# for each run after it. Logs and JSON lines go to OUT_DIR/hetero.log; the systems' table rows end the
# output. Overrides: EPOCHS (3), SCALE (1), DTYPES ("bfloat16 float32"), SYSTEMS
# (zerognn,pyg), BUDGET, MIN_NEXT (60), ROOT, WORKERS, WHEELS (as in
# benchmarks/peers.sh), PYTHON.
#
# TASK=link: link prediction on LINK_RELATION (writes) instead, fanouts 10,5 for every
# relation, batch 1024 positives with one negative each, test AUC (zerognn-jax exact,
# PyG sampled at the training fanouts); PyG is benchmarks/peers/pyg_hetero_link.py, and
# with PYG_STEPS=N it times the first N steps of each epoch and extrapolates (no AUC
# then compares: fewer steps trained). DATASET (mag-like) may name shop-like (users who
# buy items; LINK_RELATION then defaults to buys). zerognn-jax scores pairs with
# DECODER (default dot: PyG's plain product; scaled-dot: the library's default, the
# product over sqrt(256)).
set -uo pipefail

OUT_DIR=${1:-${OUT:-hetero_peers_out}}
BUDGET=${BUDGET:-560}
MIN_NEXT=${MIN_NEXT:-60}
EPOCHS=${EPOCHS:-3}
SCALE=${SCALE:-1}
DTYPES=${DTYPES:-"bfloat16 float32"}
ROOT=${ROOT:-.cache/zerognn}
SYSTEMS=${SYSTEMS:-zerognn,pyg}
TASK=${TASK:-node}

PYG_STEPS=${PYG_STEPS:-0}
PY=${PYTHON:-python3}
DATASET=${DATASET:-mag-like}
LINK_RELATION=${LINK_RELATION:-$([ "$DATASET" = shop-like ] && echo buys || echo writes)}
DATA=$ROOT/$DATASET-$SCALE-peer.npz

export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR" "$ROOT"
LOG=$OUT_DIR/hetero.log
rm -f "$LOG"
source benchmarks/peers/budget.sh
source benchmarks/peers/wheels.sh
WORKERS=$(pyg_workers)

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null \
  || echo "no nvidia-smi"
wanted pyg && pyg_backend

runs=()
if wanted zerognn; then for d in $DTYPES; do runs+=("zerognn:$d"); done; fi
wanted pyg && runs+=(pyg)
for i in "${!runs[@]}"; do
  later=$(( ${#runs[@]} - i - 1 ))
  case ${runs[$i]} in
    zerognn:*)
      dtype=${runs[$i]#zerognn:}
      write=()
      [ -f "$DATA" ] || write=(--write-npz "$DATA")
      task=()
      [ "$TASK" = link ] && task=(--task link --link-relation "$LINK_RELATION" \
        --fanouts 10,5 --eval-mode full --decoder "${DECODER:-dot}")
      run "zerognn-jax rsage $dtype $TASK" "$later" $PY benchmarks/hetero.py --scale "$SCALE" \
        --dataset "$DATASET" --epochs "$EPOCHS" --dtype "$dtype" --root "$ROOT" "${write[@]}" \
        "${task[@]}" ;;
    pyg)
      if [ ! -f "$DATA" ]; then
        run "graph file $DATA" "$later" $PY benchmarks/hetero.py --scale "$SCALE" \
          --dataset "$DATASET" --epochs 1 --eval-mode none --root "$ROOT" --write-npz "$DATA" \
          || { echo "   no graph file: PyG not run"; continue; }
      fi
      if [ "$TASK" = link ]; then
        run "PyG to_hetero(SAGE) link" "$later" $PY benchmarks/peers/pyg_hetero_link.py \
          --data "$DATA" --link-relation "$LINK_RELATION" --epochs "$EPOCHS" \
          --max-steps "$PYG_STEPS" --workers "$WORKERS"
      else
        run "PyG to_hetero(SAGE)" "$later" $PY benchmarks/peers/pyg_hetero_sage.py \
          --data "$DATA" --epochs "$EPOCHS" --workers "$WORKERS"
      fi ;;
  esac
done
echo
grep -h '^| system\|^|---' "$LOG" | head -n 2
grep -h '^| zerognn-jax' "$LOG"
echo
if [ "$TASK" = link ]; then
  grep -h '"summary": true' "$LOG"
else
  echo "| system | epoch (median) | test acc |"
  echo "|---|---|---|"
  grep -h '^| PyG' "$LOG"
fi
