# Sourced by benchmarks/peers.sh and benchmarks/link_peers.sh: one time budget shared by
# the systems a script runs. Needs BUDGET (seconds, may be set after sourcing), MIN_NEXT
# (seconds kept for each system still to run), SYSTEMS (comma list) and LOG; the clock
# starts when this file is sourced.
T0=$SECONDS

left() { echo $((BUDGET - (SECONDS - T0))); }
wanted() { [[ ",$SYSTEMS," == *",$1,"* ]]; }

# run NAME LATER CMD...: CMD under timeout with what is left minus LATER * MIN_NEXT,
# its output appended to LOG; returns CMD's exit code, 1 when skipped for lack of time.
run() {
  local name=$1 later=$2 limit
  shift 2
  limit=$(( $(left) - later * MIN_NEXT - 10 ))
  if [ "$limit" -lt 20 ]; then
    echo "== $name: skipped, $(left) s left"
    return 1
  fi
  echo "== $name [limit $limit s, $(left) s left]"
  echo "== $name: $*" >>"$LOG"
  timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    [ $rc -eq 124 ] && echo "   $name: stopped at its time limit" || echo "   $name: exit $rc"
    grep -v '^{' "$LOG" | tail -n 5 | cut -c1-300
  fi
  return $rc
}
