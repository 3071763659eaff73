#!/usr/bin/env bash
# The README's main command as a test: scripts/demo.sh runs the seed's pipeline (a served teacher,
# then distill -> SFT -> GRPO -> eval as one pipeline job on 2 ranks) through a real coordinator
# and worker. Passes when the demo exits 0 and its eval table shows the pipeline's model answering
# in the reasoning format more often than the base model (which never does). It writes
# ./var/demo like the demo itself; the ports are free ones found here.
set -euo pipefail
cd "$(dirname "$0")/.."

free_port() {
  local port
  for _ in $(seq 100); do
    port=$((20000 + RANDOM % 20000))
    if ! (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  echo "demo_test: no free port" >&2
  exit 1
}
TRAINCTL_DEMO_PORT=$(free_port)
TRAINCTL_DEMO_TEACHER_PORT=$(free_port)
while [ "$TRAINCTL_DEMO_TEACHER_PORT" = "$TRAINCTL_DEMO_PORT" ]; do
  TRAINCTL_DEMO_TEACHER_PORT=$(free_port)
done
export TRAINCTL_DEMO_PORT TRAINCTL_DEMO_TEACHER_PORT

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
if ! scripts/demo.sh >"$LOG" 2>&1; then
  tail -80 "$LOG"
  echo "demo_test: scripts/demo.sh failed" >&2
  exit 1
fi
# "[rank 0]   format_rate    0.000    0.958": baseline, then model.
row=$(grep -E '^\[rank 0\] +format_rate ' "$LOG" | tail -1)
read -r baseline model <<<"$(awk '{print $(NF-1), $NF}' <<<"$row")"
echo "format_rate: baseline $baseline, pipeline $model"
grep -E 'demo: job-[0-9]+ succeeded' "$LOG"
if ! awk -v b="$baseline" -v m="$model" 'BEGIN { exit !(m > b) }'; then
  tail -40 "$LOG"
  echo "demo_test: the pipeline's model does not beat the base model's format rate" >&2
  exit 1
fi
