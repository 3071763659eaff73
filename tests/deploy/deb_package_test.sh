#!/usr/bin/env bash
# The Debian package as a node gets it: `cpack -G DEB` in the build tree (binaries already built;
# cpack only strips and packs), then the .deb's file list, control fields, conffiles and scripts,
# --version of every binary run from the extracted package, and systemd's checks of the packaged
# units (with the packaged binaries at their paths) and snippets in the extracted tree.
#   deb_package_test.sh BUILD_DIR VERSION REVISION
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$src/tests/deploy/systemd_checks.sh"
[[ $# -eq 3 ]] || { echo "usage: $0 BUILD_DIR VERSION REVISION" >&2; exit 2; }
build=$1 version=$2 revision=$3
fail() {
  echo "deb_package_test: $*" >&2
  exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s%N)
elapsed() { awk -v ns=$(($(date +%s%N) - start)) 'BEGIN { printf "%.1f", ns / 1e9 }'; }
(cd "$build" && cpack -G DEB -B "$work/out") >"$work/cpack.log" 2>&1 ||
  fail "cpack failed: $(tail -n 30 "$work/cpack.log")"
echo "cpack: $(elapsed) s"
arch=$(dpkg --print-architecture)
deb=$work/out/trainctl_${version}_${arch}.deb
[[ -f $deb ]] || fail "no $deb; cpack wrote: $(ls "$work/out")"
echo "package: $(basename "$deb"), $(stat -c %s "$deb") bytes"

# Files: path, and for some the mode.
dpkg-deb -c "$deb" >"$work/files"
expect_file() {  # PATH [MODE]
  local line
  line=$(awk -v p="./$1" '$6 == p' "$work/files")
  [[ -n $line ]] || fail "no $1 in the package: $(awk '{print $6}' "$work/files")"
  [[ $# -lt 2 || $line == "$2 root/root"* ]] || fail "$1: '$line', wanted mode $2 root/root"
}
for bin in trainctl trainctl-coordinator trainctl-worker trainctl-trainer; do
  expect_file "usr/bin/$bin" -rwxr-xr-x
done
expect_file lib/systemd/system/trainctl-coordinator.service -rw-r--r--
expect_file lib/systemd/system/trainctl-worker.service -rw-r--r--
expect_file usr/lib/sysusers.d/trainctl.conf -rw-r--r--
expect_file usr/lib/tmpfiles.d/trainctl.conf -rw-r--r--
expect_file etc/trainctl/coordinator.env -rw-r--r--
expect_file etc/trainctl/worker.env -rw-r--r--
expect_file usr/share/doc/trainctl/README.md -rw-r--r--
expect_file usr/share/doc/trainctl/docs/deploy.md -rw-r--r--
! grep -q '/opt/\|/usr/local' "$work/files" || fail "files outside the FHS paths: $(cat "$work/files")"

# Control fields.
field() { dpkg-deb -f "$deb" "$1"; }
[[ $(field Package) == trainctl ]] || fail "Package: $(field Package)"
[[ $(field Version) == "$version" ]] || fail "Version: $(field Version), wanted $version"
[[ $(field Architecture) == "$arch" ]] || fail "Architecture: $(field Architecture)"
[[ -n $(field Maintainer) && -n $(field Description) ]] || fail "no Maintainer or Description"
depends=$(field Depends)
echo "Depends: $depends"
# From the shared libraries, not written by hand: libc, gRPC, SQLite, libsystemd, LibTorch.
for lib in libc6 'libgrpc++1' libsqlite3-0 libsystemd0 libyaml-cpp0 libtorch; do
  grep -q "\(^\|, \)$lib" <<<"$depends" || fail "Depends lacks $lib: $depends"
done

# conffiles and maintainer scripts.
dpkg-deb -e "$deb" "$work/control"
diff <(sort "$work/control/conffiles") <(printf '/etc/trainctl/coordinator.env\n/etc/trainctl/worker.env\n') ||
  fail "conffiles differ"
for script in postinst prerm postrm; do
  [[ -x $work/control/$script ]] || fail "no executable $script"
  sh -n "$work/control/$script" || fail "$script: syntax"
done

# The binaries from the extracted package (stripped, at /usr/bin): --version.
root=$work/root
dpkg-deb -x "$deb" "$root"
for bin in trainctl trainctl-coordinator trainctl-worker trainctl-trainer; do
  out=$("$root/usr/bin/$bin" --version) || fail "$bin --version failed: $out"
  [[ $out == "$bin $version (git $revision)" ]] ||
    fail "$bin --version: '$out', wanted '$bin $version (git $revision)'"
  echo "ok: $out"
done
# The packaged units are the ones in deploy/systemd, and systemd accepts them on that tree.
for unit in trainctl-coordinator.service trainctl-worker.service; do
  cmp "$root/lib/systemd/system/$unit" "$src/deploy/systemd/$unit" || fail "$unit differs"
done
systemd_root "$root"
for unit in trainctl-coordinator.service trainctl-worker.service; do
  verify_unit "$root" "$unit" || fail "packaged $unit does not verify"
done
apply_snippets "$root" || fail "packaged sysusers/tmpfiles snippets"
echo "deb_package_test: ok ($(elapsed) s)"
