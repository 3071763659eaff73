# Sourced by the deploy tests: systemd's own checks of trainctl's units and snippets, run against
# an alternate root (a directory laid out as / is on a node), so no unit is rewritten and nothing
# outside the directory is touched.

# systemd_root ROOT: the host's units (sysinit.target and the rest that ours pull in) under ROOT,
# so `systemd-analyze verify --root=ROOT` can load them; /bin is /usr/bin as on Debian 12, and
# holds kill (procps, on every node) for the coordinator's ExecReload.
systemd_root() {
  mkdir -p "$1/lib/systemd" "$1/usr/bin" "$1/etc"
  ln -s usr/bin "$1/bin"
  cp /usr/bin/kill "$1/usr/bin/"
  cp -a /lib/systemd/system "$1/lib/systemd/"
}

# verify_unit ROOT UNIT: systemd-analyze verify of /lib/systemd/system/UNIT in ROOT (its ExecStart
# binaries must be executable there). Fails on any diagnostic, not just on errors: verify only
# warns about an unknown key or a value it cannot parse, and ignores the line.
verify_unit() {
  local out rc=0
  out=$(systemd-analyze verify --man=no --root="$1" "/lib/systemd/system/$2" 2>&1) || rc=$?
  if [[ $rc -ne 0 || -n "$out" ]]; then
    echo "systemd-analyze verify $2 (rc $rc): $out" >&2
    return 1
  fi
}

# apply_snippets ROOT: systemd-sysusers and systemd-tmpfiles on ROOT's trainctl.conf snippets;
# the user, its group and the state directories must then exist in ROOT.
apply_snippets() {
  local root=$1 out
  out=$(systemd-sysusers --root="$root" trainctl.conf 2>&1) || {
    echo "systemd-sysusers: $out" >&2
    return 1
  }
  grep -q '^trainctl:x:[0-9]*:[0-9]*:trainctl daemons:/var/lib/trainctl:' "$root/etc/passwd" || {
    echo "no trainctl user in $root/etc/passwd: $(cat "$root/etc/passwd")" >&2
    return 1
  }
  grep -q '^trainctl:x:' "$root/etc/group" || { echo "no trainctl group" >&2; return 1; }
  out=$(systemd-tmpfiles --root="$root" --create trainctl.conf 2>&1) || {
    echo "systemd-tmpfiles: $out" >&2
    return 1
  }
  local d
  for d in /var/lib/trainctl /var/lib/trainctl/coordinator /var/lib/trainctl/worker; do
    [[ "$(stat -c '%a %U' "$root$d" 2>/dev/null)" == "750 "* ]] || {
      echo "$d: $(stat -c '%a %U:%G' "$root$d" 2>&1) in $root, wanted 0750" >&2
      return 1
    }
  done
}
