# Sourced by benchmarks/peers.sh, link_peers.sh and hetero_peers.sh.
#
# pyg_workers: the PyG loaders' worker processes: WORKERS where set, else the cores less
# two, at most 14; never below 0.
pyg_workers() {
  local n=${WORKERS:-$(( $(nproc) - 2 < 14 ? $(nproc) - 2 : 14 ))}
  [ "$n" -lt 0 ] && n=0
  echo "$n"
}

# pyg_backend: makes torch_sparse importable for PyG's neighbour loaders. Without
# torch_sparse, installs the torch-scatter and torch-sparse wheels of WHEELS (default:
# shared/wheels or ../shared/wheels) into $ROOT/pyg-wheels, emptied first, and adds that
# folder to PYTHONPATH. (pip's --target keeps what a folder already holds: on a warm
# machine, a second call over an earlier call's folder left PyG without torch_sparse.)
# Reads PY, ROOT and LOG.
pyg_backend() {
  $PY -c "import torch_sparse" 2>/dev/null && return
  local wheels=${WHEELS:-}
  for dir in shared/wheels ../shared/wheels; do
    [ -z "$wheels" ] && [ -d "$dir" ] && wheels=$dir
  done
  if [ -z "$wheels" ]; then echo "   no torch-sparse and no wheels folder"; return; fi
  rm -rf "$ROOT/pyg-wheels"
  $PY -m pip install -q --no-index --no-deps --target "$ROOT/pyg-wheels" \
    "$wheels"/torch_scatter-*.whl "$wheels"/torch_sparse-*.whl >>"$LOG" 2>&1
  export PYTHONPATH=$PYTHONPATH:$ROOT/pyg-wheels
  $PY -c "import torch_sparse; print('torch_sparse', torch_sparse.__version__)" \
    || echo "   torch_sparse still does not import: PyG's neighbour loaders will fail"
}
