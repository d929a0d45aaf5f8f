#!/usr/bin/env bash
# zerognn-jax against PyTorch peers on one graph and one GPU, in one call.
#
#   bash benchmarks/peers.sh [OUT_DIR]            (on the device machine, repo root)
#   bash benchmarks/peers.sh --check [OUT_DIR]    (small graph: do the baselines'
#                                                  sampled subgraphs obey the fanouts?)
#   bash benchmarks/peers.sh --cora [OUT_DIR]     (accuracy: is each baseline's mean
#                                                  Cora test accuracy within 2 points
#                                                  of zerognn-jax's?)
#
# Same graph (products-like, generated once into $ROOT as a neutral .npz), same model
# (GraphSAGE-mean 3x256, dropout 0.5), fanouts 15,10,5, batch 1024, Adam lr 3e-3,
# EPOCHS epochs each, each system's own exact layer-wise inference for test accuracy:
#   zerognn        zerognn-jax's scan engine (python3 -m zerognn_jax.cli train)
#   torch-eager    benchmarks/peers/torch_gpu_sage.py: GPU sampling driven by the host
#   torch-compiled the same with torch.compile
#   pyg            benchmarks/peers/pyg_sage.py: PyG NeighborLoader, CPU worker processes
#   zerognn-bf16   the same with --dtype bfloat16 (features and computation)
#   zerognn-host   (not run by default) zerognn-jax's host-mediated engine, host-exact
# Everything fits BUDGET seconds (default 560): each system runs under `timeout` with
# what is left, less MIN_NEXT seconds kept for each system after it. JSON lines go to
# OUT_DIR/peers.jsonl as they come (a kill loses nothing written), logs to
# OUT_DIR/peers.log; the table (benchmarks/peers/table.py) ends the output and is saved
# as OUT_DIR/table.md. Overrides: EPOCHS, SCALE, SYSTEMS (comma list of the names above),
# BUDGET, MIN_NEXT, ROOT, WORKERS, WHEELS (folder of the torch-scatter / torch-sparse
# wheels, installed into $ROOT/pyg-wheels when torch_sparse does not import), PYTHON.
#
# --cora: Cora (Planetoid split, written by zerognn-jax's save_npz to $ROOT/cora.npz
# from the Planetoid files in PLANETOID, default shared/datasets/planetoid), GraphSAGE-
# mean 2x64, full neighbourhoods (zerognn -1,-1; the baselines 200,200, above Cora's
# largest degree 168), batch 140 (the whole train split: one step an epoch), Adam lr
# 0.01, weight decay 5e-4, dropout 0.5, features row-normalised in all three (zerognn
# does it for Planetoid names; the baselines by --normalize-features), EPOCHS=200
# epochs, seeds SEEDS=0,1,2, SYSTEMS=zerognn,torch-eager,pyg; test accuracy from exact
# full-neighbourhood inference after the last epoch. Ends with table.py --accuracy
# (exit 1 when the 2-point goal fails). BUDGET defaults to 7200 s on a CPU-only host.
# On a host where torch and zerognn-jax live in two environments, PYTHON names the
# torch one and PYTHONPATH adds zerognn-jax's site-packages.
set -uo pipefail

MODE=products
case ${1:-} in
  --check) MODE=check; shift ;;
  --cora) MODE=cora; shift ;;
esac
CHECK=0
[ "$MODE" = check ] && CHECK=1
if [ "$MODE" = cora ]; then
  EPOCHS=${EPOCHS:-200}
  MIN_NEXT=${MIN_NEXT:-20}
  SYSTEMS=${SYSTEMS:-zerognn,torch-eager,pyg}
fi
SEEDS=${SEEDS:-0,1,2}
OUT_DIR=${1:-${OUT:-peers_out}}
BUDGET=${BUDGET:-}
MIN_NEXT=${MIN_NEXT:-60}
EPOCHS=${EPOCHS:-5}
ROOT=${ROOT:-.cache/zerognn}
SYSTEMS=${SYSTEMS:-zerognn,zerognn-bf16,torch-eager,torch-compiled,pyg}
PY=${PYTHON:-python3}
if [ "$CHECK" = 1 ]; then SCALE=${SCALE:-0.005}; else SCALE=${SCALE:-1}; fi
DATA=$ROOT/products.npz
[ "$SCALE" != 1 ] && DATA=$ROOT/products-$SCALE.npz
WORKLOAD=(--fanouts 15,10,5 --batch 1024 --hidden 256 --layers 3 --lr 3e-3)

export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$ROOT/inductor}
mkdir -p "$OUT_DIR" "$ROOT"
JSONL=$OUT_DIR/peers.jsonl
LOG=$OUT_DIR/peers.log
rm -f "$JSONL" "$LOG"
source benchmarks/peers/budget.sh

source benchmarks/peers/wheels.sh
WORKERS=$(pyg_workers)

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null \
  || echo "no nvidia-smi"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
DEVICE=$($PY -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
if [ -z "$BUDGET" ]; then
  BUDGET=560
  [ "$MODE" = cora ] && [ "$DEVICE" = cpu ] && BUDGET=7200
fi
wanted pyg && pyg_backend

if [ "$MODE" = cora ]; then
  DATA=$ROOT/cora.npz
  PLANETOID=${PLANETOID:-}
  for dir in shared/datasets/planetoid ../shared/datasets/planetoid; do
    [ -z "$PLANETOID" ] && [ -d "$dir" ] && PLANETOID=$dir
  done
  echo "== data: cora from ${PLANETOID:-the default root} -> $DATA [$(left) s left]"
  if [ ! -f "$DATA" ]; then
    $PY -c 'import sys, zerognn_jax as zg
zg.save_npz(zg.load_dataset("cora", sys.argv[1] or None), sys.argv[2])' \
      "$PLANETOID" "$DATA" 2>>"$LOG" || { echo "   could not write $DATA (see $LOG)"; exit 1; }
  fi
  MODEL=(--layers 2 --hidden 64 --lr 0.01 --weight-decay 5e-4 --dropout 0.5)
  IFS=, read -ra seeds <<<"$SEEDS"
  order=()
  for s in zerognn torch-eager torch-compiled pyg; do wanted "$s" && order+=("$s"); done
  total=$(( ${#seeds[@]} * ${#order[@]} ))
  k=0
  for seed in "${seeds[@]}"; do
    for s in "${order[@]}"; do
      k=$((k + 1))
      peer=(--data "$DATA" --device "$DEVICE" --epochs "$EPOCHS" --seed "$seed"
            --fanouts 200,200 --batch 140 --normalize-features --out "$JSONL" "${MODEL[@]}")
      case $s in
        zerognn) run "zerognn seed $seed" $((total - k)) $PY -m zerognn_jax.cli train \
                   --dataset "$DATA" --model sage --fanouts=-1,-1 --batch-size 140 \
                   "${MODEL[@]}" --epochs "$EPOCHS" --seed "$seed" --eval-every 0 \
                   --metrics-out "$JSONL" --no-progress ;;
        torch-eager) run "torch-eager seed $seed" $((total - k)) $PY \
                   benchmarks/peers/torch_gpu_sage.py "${peer[@]}" ;;
        torch-compiled) run "torch-compiled seed $seed" $((total - k)) $PY \
                   benchmarks/peers/torch_gpu_sage.py "${peer[@]}" --compile ;;
        pyg) run "pyg seed $seed" $((total - k)) $PY benchmarks/peers/pyg_sage.py \
                   "${peer[@]}" ;;
      esac
    done
  done
  echo "== cora test accuracy [$(left) s left; $EPOCHS epochs, seeds $SEEDS]"
  $PY benchmarks/peers/table.py --accuracy "$JSONL" | tee "$OUT_DIR/table.md"
  exit "${PIPESTATUS[0]}"
fi

echo "== data: products-like, scale $SCALE -> $DATA [$(left) s left]"
if [ ! -f "$DATA" ]; then
  $PY -m zerognn_jax.cli data generate products-like --scale "$SCALE" --out "$DATA" \
    2>>"$LOG" | tail -n 1
fi

if [ "$CHECK" = 1 ]; then
  wanted torch-eager && run torch-check 2 $PY benchmarks/peers/torch_gpu_sage.py \
    --data "$DATA" --device "$DEVICE" --check --out "$JSONL" "${WORKLOAD[@]}"
  wanted torch-compiled && run torch-compiled-check 1 $PY benchmarks/peers/torch_gpu_sage.py \
    --data "$DATA" --device "$DEVICE" --check --compile --out "$JSONL" "${WORKLOAD[@]}"
  wanted pyg && run pyg-check 0 $PY benchmarks/peers/pyg_sage.py \
    --data "$DATA" --device cpu --check --out "$JSONL" "${WORKLOAD[@]}"
  $PY benchmarks/peers/table.py "$JSONL" | tee "$OUT_DIR/table.md"
  grep -q '"ok": false' "$JSONL" && exit 1
  exit 0
fi

order=()
for s in zerognn zerognn-bf16 zerognn-host torch-eager torch-compiled pyg; do
  wanted "$s" && order+=("$s")
done
for i in "${!order[@]}"; do
  later=$(( ${#order[@]} - i - 1 ))
  common_flags=(--data "$DATA" --epochs "$EPOCHS" --device "$DEVICE" --out "$JSONL"
                "${WORKLOAD[@]}")
  case ${order[$i]} in
    zerognn|zerognn-bf16|zerognn-host)
      engine=scan dtype=float32
      [ "${order[$i]}" = zerognn-host ] && engine=host-exact
      [ "${order[$i]}" = zerognn-bf16 ] && dtype=bfloat16
      run "${order[$i]}" "$later" $PY -m zerognn_jax.cli train --dataset "$DATA" \
        --engine "$engine" --dtype "$dtype" --epochs "$EPOCHS" --layers 3 --hidden 256 \
        --fanouts 15,10,5 --batch-size 1024 --lr 3e-3 --eval-every 0 \
        --metrics-out "$JSONL" --no-progress ;;
    torch-eager) run torch-eager "$later" $PY benchmarks/peers/torch_gpu_sage.py \
               "${common_flags[@]}" ;;
    torch-compiled) run torch-compiled "$later" $PY benchmarks/peers/torch_gpu_sage.py \
               "${common_flags[@]}" --compile ;;
    pyg) run pyg "$later" $PY benchmarks/peers/pyg_sage.py "${common_flags[@]}" \
               --workers "$WORKERS" ;;
  esac
done

echo "== results [$(left) s left; $EPOCHS epochs, scale $SCALE, $WORKERS PyG workers]"
$PY benchmarks/peers/table.py "$JSONL" | tee "$OUT_DIR/table.md"
