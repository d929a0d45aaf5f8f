#!/usr/bin/env bash
# The GPU benchmark of the scan engine against the host-mediated baseline, in one call.
#
#   bash benchmarks/run_gpu.sh [OUT_DIR]        (on the device machine, repo root)
#
# Fits a 9-minute call on an H100 (BUDGET seconds, default 520): every step gets what is
# left, and measurements that would start too late are reported as skipped.
#   1. products-like at full scale, generated once into $ROOT (about a minute);
#   2. the configurations, each in its own process (peak memory per configuration),
#      SAGE 3x256, fanouts 15,10,5, batch 1024; host engines time HOST_STEPS steps;
#   3. the scan-vs-host-exact subgraph check, the phase split with copy bandwidth and
#      roofline, and the step-time-vs-batch-size sweep;
#   4. the table of everything (bench_report), last in the output.
# OUT_DIR (default $OUT, else bench_out) gets bench.jsonl, bench.png, bench.log and the
# profiler traces of scan-xla, scan-cmdbuf and host-exact. Override the workload with
# PRESET, SCALE, LAYERS, HIDDEN, FANOUTS, BATCH, SWEEP, HOST_STEPS, CHECK_STEPS, EPOCHS,
# CONFIGS; the data's folder with ROOT (default .cache/zerognn), the seconds kept for step
# 3 with RESERVE (default 170), the interpreter with PYTHON (default python3).
set -uo pipefail

OUT_DIR=${1:-${OUT:-bench_out}}
BUDGET=${BUDGET:-520}
ROOT=${ROOT:-.cache/zerognn}
PRESET=${PRESET:-products-like}
SCALE=${SCALE:-1}
LAYERS=${LAYERS:-3}
HIDDEN=${HIDDEN:-256}
FANOUTS=${FANOUTS:-15,10,5}
BATCH=${BATCH:-1024}
SWEEP=${SWEEP:-256,4096,8192}
HOST_STEPS=${HOST_STEPS:-12}
CHECK_STEPS=${CHECK_STEPS:-4}
EPOCHS=${EPOCHS:-3}
CONFIGS=${CONFIGS:-scan-xla,host-exact,host-bucketed,scan-cmdbuf,scan-pallas,scan-tree,scan-bf16}
RESERVE=${RESERVE:-170}  # seconds kept for step 3
PY=${PYTHON:-python3}

export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR" "$ROOT"
rm -f "$OUT_DIR/bench.jsonl" "$OUT_DIR/bench.log"
TRACES=$(mktemp -d)
T0=$SECONDS
left() { echo $((BUDGET - (SECONDS - T0))); }
WORKLOAD=(--dataset "$PRESET" --root "$ROOT" --scale "$SCALE" --layers "$LAYERS"
          --hidden "$HIDDEN" --fanouts "$FANOUTS" --batch-size "$BATCH"
          --epochs "$EPOCHS" --host-steps "$HOST_STEPS"
          --envelope-cache "$ROOT/envelope-$PRESET-$SCALE-$BATCH.json"
          --out "$OUT_DIR/bench.jsonl" --no-progress)

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv \
  2>/dev/null || echo "no nvidia-smi"
$PY -c "import jax; print('jax', jax.__version__, jax.devices())"

echo "== 1. data ($PRESET, scale $SCALE) [$(left) s left]"
$PY - "$PRESET" "$ROOT" "$SCALE" <<'EOF'
import sys, time
from zerognn_jax._src.data.loaders import load_dataset
t0 = time.perf_counter()
ds = load_dataset(sys.argv[1], sys.argv[2], scale=float(sys.argv[3]))
print(f"{ds.name}: {ds.num_nodes:,} nodes, {ds.graph.num_edges:,} edges, "
      f"{len(ds.train_idx):,} train; {time.perf_counter() - t0:.1f} s")
EOF

echo "== 2. configurations [$(left) s left]"
timeout -s KILL "$(left)" $PY -m zerognn_jax.cli bench "${WORKLOAD[@]}" \
  --configs "$CONFIGS" --isolate --deadline "$(($(left) - RESERVE))" \
  --trace-dir "$TRACES" >>"$OUT_DIR/bench.log" 2>&1

echo "== 3. check, phases, sweep [$(left) s left]"
timeout -s KILL "$(($(left) - 10))" $PY -m zerognn_jax.cli bench "${WORKLOAD[@]}" \
  --configs "" --check-steps "$CHECK_STEPS" --phases --batch-sizes "$SWEEP" \
  --deadline "$(($(left) - 60))" >>"$OUT_DIR/bench.log" 2>&1

for config in scan-xla scan-cmdbuf host-exact; do
  trace=$(find "$TRACES/$config" -name '*.trace.json.gz' 2>/dev/null | head -n 1)
  [ -n "$trace" ] && cp "$trace" "$OUT_DIR/trace-$config.json.gz"
done
rm -rf "$TRACES"

echo "== 4. results [$(left) s left]; the log ends:"
grep -v '^{' "$OUT_DIR/bench.log" | tail -n 8 | cut -c1-400
$PY -m zerognn_jax._src.bench.report "$OUT_DIR/bench.jsonl" --plot "$OUT_DIR/bench.png"
