#!/usr/bin/env bash
# deploy/systemd checked by systemd itself: `systemd-analyze verify` on each unit exactly as
# shipped, in an alternate root that has the build's binaries at the units' ExecStart paths
# (/usr/bin); the sysusers and tmpfiles snippets applied there. Then broken units (a missing
# binary, a misspelt key, a bad value) must fail the same check, so it can fail.
#   systemd_verify_test.sh COORDINATOR_BIN WORKER_BIN CLI_BIN TRAINER_BIN
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$src/tests/deploy/systemd_checks.sh"
[[ $# -eq 4 ]] || { echo "usage: $0 COORDINATOR_BIN WORKER_BIN CLI_BIN TRAINER_BIN" >&2; exit 2; }
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not found (Debian's systemd)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
systemd_root "$root"
for bin in "$@"; do
  # A hard link when the build is on the same file system (no copy of the debug info), else a copy.
  ln "$bin" "$root/usr/bin/" 2>/dev/null || cp "$bin" "$root/usr/bin/"
done
units=(trainctl-coordinator.service trainctl-worker.service)
for unit in "${units[@]}"; do
  cp "$src/deploy/systemd/$unit" "$root/lib/systemd/system/$unit"
  verify_unit "$root" "$unit"
  echo "ok: $unit verifies"
done
mkdir -p "$root/usr/lib/sysusers.d" "$root/usr/lib/tmpfiles.d"
cp "$src/deploy/systemd/trainctl.sysusers" "$root/usr/lib/sysusers.d/trainctl.conf"
cp "$src/deploy/systemd/trainctl.tmpfiles" "$root/usr/lib/tmpfiles.d/trainctl.conf"
apply_snippets "$root"
echo "ok: sysusers and tmpfiles snippets apply"

# Each unit is Type=notify with a watchdog, restarts on failure, and reads its env file.
for unit in "${units[@]}"; do
  daemon=${unit%.service}
  for line in Type=notify WatchdogSec=60s Restart=on-failure NoNewPrivileges=yes \
    ProtectSystem=strict "EnvironmentFile=-/etc/trainctl/${daemon#trainctl-}.env" \
    "ExecStart=/usr/bin/$daemon "; do
    grep -q "^$line" "$src/deploy/systemd/$unit" || { echo "$unit: no '$line'" >&2; exit 1; }
  done
done

# The check must be able to fail.
expect_failure() {  # NAME: a unit in $root/lib/systemd/system that verify_unit must reject
  if verify_unit "$root" "$1" 2>"$work/err"; then
    echo "broken unit $1 passed verification" >&2
    exit 1
  fi
  echo "ok: $1 rejected: $(head -c 300 "$work/err")"
}
sysdir=$root/lib/systemd/system
sed 's/^WatchdogSec=/WatchdogSecs=/' "$sysdir/trainctl-worker.service" >"$sysdir/broken-key.service"
expect_failure broken-key.service
sed 's/^Type=notify/Type=notifyy/' "$sysdir/trainctl-coordinator.service" >"$sysdir/broken-type.service"
expect_failure broken-type.service
rm "$root/usr/bin/trainctl-worker"
expect_failure trainctl-worker.service
echo "systemd_verify_test: ok"
