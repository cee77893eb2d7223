#!/bin/bash
# Fill a sweep on a lent accelerator: several shards of `python -m experiments.sweep` share the one GPU
# (XLA_PYTHON_CLIENT_PREALLOCATE=false, JAX_DEFAULT_MATMUL_PRECISION=highest, so float32 as on the CPU; every
# record names its device and precision), stopped at a deadline; the finished runs' records come back packed.
#
#   tools/device_sweep.sh DEADLINE_S SWEEP[:ARG] PREPARE GROUP [GROUP ...]
#     PREPARE  what tools/prepare_data.py prepares there first, in the background ("-": nothing), e.g. listops,uea
#     GROUP    TABLES:N[:after]: N shards of `--only=TABLES` (comma-separated); ":after" starts them once
#              PREPARE has finished (runs that read its data), the others at once
#   e.g. tools/device_sweep.sh 520 experiments/sweeps/lra.py listops image,pathfinder:7 listops:9:after
#
# Environment: OUT (where records.tgz and logs.tgz go; the device tool's $OUT), PY (python3), W (/tmp/w, one
# workdir per group), PRIMAL_JAX_COMMIT (the commit of the copied tree: it has no .git there), WHEELS (.whl;
# empty: none): wheels installed to /tmp/site first. Data caches in .data/ are copied (a *.tgz unpacked) into
# $PRIMAL_JAX_DATA (/tmp/pjdata): the device has no network. Back here, the records join the sweep's folder with
# `tar xzf records.tgz --strip-components=2 -C experiments/results/<family>/sweep`, then `--mode=aggregate`.
# BUILD_NOTES.md ("A sweep on a lent accelerator") says what to carry within the 64 MiB a call takes.
set -u
[ $# -ge 4 ] || { sed -n 2,17p "$0"; exit 2; }
deadline=$1 sweep=$2 prepare=$3
shift 3
t0=$SECONDS
PY=${PY:-python3}
W=${W:-/tmp/w}
: "${OUT:?OUT must name the folder the records go to}" "${PRIMAL_JAX_COMMIT:?PRIMAL_JAX_COMMIT must name the commit of the copied tree}"
WHEELS=${WHEELS-.whl}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # tools/prepare_data.py imports the checkout's package
if [ -n "$WHEELS" ] && [ -d "$WHEELS" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
export PRIMAL_JAX_DATA=${PRIMAL_JAX_DATA:-/tmp/pjdata} PRIMAL_JAX_COMMIT
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest PYTHONUNBUFFERED=1
mkdir -p "$PRIMAL_JAX_DATA" "$W/logs"
if [ -d .data ]; then
  for f in .data/*; do
    case $f in *.tgz) tar xzf "$f" -C "$PRIMAL_JAX_DATA" ;; *) cp -r "$f" "$PRIMAL_JAX_DATA/" ;; esac
  done
fi
$PY -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 1
if [ "$prepare" != - ]; then
  ($PY tools/prepare_data.py ${prepare//,/ } > "$W/logs/prepare.log" 2>&1; touch "$W/prepared") &
else
  touch "$W/prepared"
fi
pids=()
start_group() {  # TABLES N: N shards of --only=TABLES, in their own workdir
  local i
  for i in $(seq 0 $(($2 - 1))); do
    $PY -m experiments.sweep --sweep="$sweep" --workdir="$W/${1//,/+}" --only="$1" --shard="$i/$2" \
      > "$W/logs/${1//,/+}_$i.log" 2>&1 &
    pids+=($!)
  done
}
later=()
for group in "$@"; do
  IFS=: read -r tables count when <<< "$group"
  if [ "${when:-}" = after ]; then later+=("$tables:$count"); else start_group "$tables" "$count"; fi
done
while [ ! -e "$W/prepared" ] && [ $((SECONDS - t0)) -lt "$deadline" ]; do sleep 2; done
echo "prepared at $((SECONDS - t0)) s:"; cat "$W/logs/prepare.log" 2>/dev/null
if [ -e "$W/prepared" ]; then
  for group in "${later[@]}"; do start_group "${group%%:*}" "${group##*:}"; done
fi
alive() { local p; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while alive && [ $((SECONDS - t0)) -lt "$deadline" ]; do sleep 3; done
echo "stopping at $((SECONDS - t0)) s"
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
for _ in $(seq 30); do alive || break; sleep 1; done
# Only finished runs (a result.json): a stopped run's summary.json alone is no record.
(cd "$W" && for result in $(find . -path '*/runs/*' -name result.json); do
  run=$(dirname "$result")
  for name in result.json summary.json provenance.json; do [ -e "$run/$name" ] && echo "$run/$name"; done
done | tar czf "$OUT/records.tgz" -T -)
tar czf "$OUT/logs.tgz" -C "$W" logs
echo "finished runs: $(find "$W" -path '*/runs/*' -name result.json | wc -l) at $((SECONDS - t0)) s"
