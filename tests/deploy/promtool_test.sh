#!/usr/bin/env bash
# deploy/prometheus checked with Debian's promtool (scripts/setup.sh installs `prometheus`):
# the scrape config and the rules load, workers.yml yields the documented targets, every alert in
# alerts.yml has a unit test in tests/deploy/alerts_test.yml, and those unit tests pass
# (`promtool test rules`: each alert fires on synthetic series with its labels and annotations, and
# stays quiet on healthy ones). The live side (real Prometheus, real daemons) is
# tests/deploy/prometheus_test.cc.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v promtool >/dev/null; then
  echo "promtool_test: promtool not found; install Debian's prometheus package (scripts/setup.sh)" >&2
  exit 1
fi

fail() {
  echo "promtool_test: $*" >&2
  exit 1
}

promtool check config deploy/prometheus/prometheus.yml || fail "promtool check config failed"
promtool check rules deploy/prometheus/alerts.yml || fail "promtool check rules failed"

# File-based discovery reads workers.yml (relative to prometheus.yml) into targets.
sd=$(promtool check service-discovery --timeout=1s deploy/prometheus/prometheus.yml \
  trainctl-worker 2>/dev/null)
grep -q '"instance": "gpu-node-1:9402"' <<<"$sd" ||
  fail "workers.yml gives no gpu-node-1:9402 target to trainctl-worker: $sd"

# Every alert has a unit test, and every alert has a severity and both annotations.
alerts=$(sed -n 's/^ *- alert: *\([A-Za-z0-9_]*\).*/\1/p' deploy/prometheus/alerts.yml)
[ -n "$alerts" ] || fail "no alerts in deploy/prometheus/alerts.yml"
for a in $alerts; do
  grep -q "alertname: $a\$" tests/deploy/alerts_test.yml ||
    fail "alert $a has no test in tests/deploy/alerts_test.yml"
done
n_alerts=$(wc -w <<<"$alerts")
for key in 'severity:' 'summary:' 'description:'; do
  n=$(grep -c "^ *$key" deploy/prometheus/alerts.yml || true)
  [ "$n" = "$n_alerts" ] || fail "$n_alerts alerts but $n '$key' lines in alerts.yml"
done

promtool test rules tests/deploy/alerts_test.yml || fail "promtool test rules failed"
echo "promtool_test: $n_alerts alerts checked and unit-tested"
