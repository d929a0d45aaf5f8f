#!/usr/bin/env bash
# Link prediction: zerognn-jax against PyTorch peers on one split and one GPU, in one call
# (issue #37).
#
#   bash benchmarks/link_peers.sh [OUT_DIR]        (on the device machine, repo root)
#
# One split (products-like at SCALE, split by zerognn-jax's random_link_split with SEED,
# written once to $ROOT/products-link-$SCALE-$SEED-$METRIC.npz by
# benchmarks/peers/link_data.py),
# one workload: GraphSAGE-mean 3x256 (dropout 0.5), fanouts 15,10,5, 1024 positive edges
# per step, 1 negative per positive (destination corruption), dot-product decoder,
# binary cross-entropy, Adam lr 3e-3, the step's positive edges kept out of message
# passing. Every system trains STEPS steps from its initial parameters, reports its
# time per step, positive edges per second and the epoch extrapolated from them, then
# its test AUC (and MRR with METRIC=mrr) from exact layer-wise inference, on the same
# fixed negatives:
#   zerognn       benchmarks/peers/zerognn_link.py: zerognn-jax's scan engine, its SAGE
#                 layers started as INIT says (default torch: as the peers' layers start;
#                 flax: the library's default, TrainConfig.init), its pairs scored by
#                 DECODER (default dot: the peers' product; scaled-dot: the library's
#                 default, the product over sqrt(256))
#   zerognn-bf16  the same with bfloat16 features and computation
#   torch-eager   benchmarks/peers/torch_gpu_link.py: GPU sampling driven by the host
#   pyg           benchmarks/peers/pyg_link.py: PyG LinkNeighborLoader, CPU workers
#   linkpy        (not run by default) benchmarks/link.py --engines scan --steps
#                 LINK_STEPS: the repository's link throughput benchmark, which builds
#                 the same split again on the host (about two minutes at scale 1) and
#                 reports no metric; it has no --dtype flag
# Everything fits BUDGET seconds (default 560): the split file and each system run under
# `timeout` with what is left, less MIN_NEXT seconds kept for each system after it.
# JSON lines go to OUT_DIR/link.jsonl as they come, logs to OUT_DIR/link.log; the table
# (benchmarks/peers/link_table.py) ends the output and is saved as OUT_DIR/table.md.
# Overrides: STEPS (200), LINK_STEPS (2000), SCALE (1), SEED (0), METRIC (auc or mrr), INIT,
# DECODER, SYSTEMS (comma list of the names above), BUDGET, MIN_NEXT (45), ROOT, WORKERS, WHEELS
# (as in benchmarks/peers.sh), PYTHON.
set -uo pipefail

OUT_DIR=${1:-${OUT:-link_peers_out}}
BUDGET=${BUDGET:-560}
MIN_NEXT=${MIN_NEXT:-45}
STEPS=${STEPS:-200}
LINK_STEPS=${LINK_STEPS:-2000}
SCALE=${SCALE:-1}
SEED=${SEED:-0}
METRIC=${METRIC:-auc}
INIT=${INIT:-torch}
DECODER=${DECODER:-dot}
ROOT=${ROOT:-.cache/zerognn}
SYSTEMS=${SYSTEMS:-zerognn,torch-eager,pyg,zerognn-bf16}
PY=${PYTHON:-python3}
DATA=$ROOT/products-link-$SCALE-$SEED-$METRIC.npz
WORKLOAD=(--fanouts 15,10,5 --batch 1024 --hidden 256 --negatives 1 --lr 3e-3
          --seed "$SEED" --steps "$STEPS")

export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR" "$ROOT"
JSONL=$OUT_DIR/link.jsonl
LOG=$OUT_DIR/link.log
rm -f "$JSONL" "$LOG"
source benchmarks/peers/budget.sh
source benchmarks/peers/wheels.sh
WORKERS=$(pyg_workers)

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null \
  || echo "no nvidia-smi"
DEVICE=$($PY -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')" \
  2>/dev/null || echo cpu)
echo "torch device: $DEVICE"
wanted pyg && pyg_backend

order=()
for s in zerognn torch-eager pyg zerognn-bf16 linkpy; do wanted "$s" && order+=("$s"); done
if [ ! -f "$DATA" ]; then
  run "split file $DATA" "${#order[@]}" $PY benchmarks/peers/link_data.py \
    --dataset products-like --scale "$SCALE" --seed "$SEED" --root "$ROOT" \
    --link-metric "$METRIC" --out "$DATA" || { echo "   no split file: nothing to run"; exit 1; }
fi
for i in "${!order[@]}"; do
  later=$(( ${#order[@]} - i - 1 ))
  peer=(--data "$DATA" --device "$DEVICE" --out "$JSONL" "${WORKLOAD[@]}")
  case ${order[$i]} in
    zerognn|zerognn-bf16)
      dtype=float32
      [ "${order[$i]}" = zerognn-bf16 ] && dtype=bfloat16
      run "${order[$i]}" "$later" $PY benchmarks/peers/zerognn_link.py --data "$DATA" \
        --dtype "$dtype" --fanouts 15,10,5 --batch 1024 --hidden 256 --negatives 1 \
        --lr 3e-3 --seed "$SEED" --steps "$STEPS" --init "$INIT" --decoder "$DECODER" \
        --out "$JSONL" ;;
    torch-eager) run torch-eager "$later" $PY benchmarks/peers/torch_gpu_link.py "${peer[@]}" ;;
    pyg) run pyg "$later" $PY benchmarks/peers/pyg_link.py "${peer[@]}" --workers "$WORKERS" ;;
    linkpy) run linkpy "$later" $PY benchmarks/link.py --dataset products-like \
              --root "$ROOT" --scale "$SCALE" --seed "$SEED" --engines scan \
              --steps "$LINK_STEPS" --out "$JSONL" ;;
  esac
done

echo "== results [$(left) s left; $STEPS steps, scale $SCALE, $WORKERS PyG workers]"
$PY benchmarks/peers/link_table.py "$JSONL" | tee "$OUT_DIR/table.md"
