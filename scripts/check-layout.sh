#!/usr/bin/env bash
# The layout check: ARCHITECTURE.md names every room, and no source file grows past 800 lines.
#
#   scripts/check-layout.sh      # exit 0 when both hold; else exit 1, one line per problem
#
# Which folders must be named. The files considered are the tracked ones (`git ls-files`; outside a
# git checkout, every file found), leaving out build/, .fixtures/ and node_modules/ wherever they
# are. A folder must be named in ARCHITECTURE.md when
#   - it is a top-level folder holding any such file (configs/, deploy/, ...), or
#   - it holds, directly, a file of code or build: .cc .h .cu .cuh .proto .sh .py .cmake .cjs .js,
#     or a CMakeLists.txt.
# So folders of data only (fuzz corpora, test fixtures of images or logs, model configs, Grafana
# provisioning) need no entry, while a fixture folder that carries a generator script does.
# "Named" means the folder's path from the repository root appears in ARCHITECTURE.md as a whole
# path: "worker/trainer/zero" or "worker/trainer/zero/", not as part of a longer name
# ("worker/trainer/zero_x" does not count).
#
# Size: every .cc .h .cu .cuh file (same selection) has at most 800 lines.
#
# Needs bash, git and awk only; runs in well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly kMaxLines=800
readonly kMap=ARCHITECTURE.md

if [[ ! -f "$kMap" ]]; then
  echo "check-layout: $kMap is missing" >&2
  exit 1
fi

list_files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files
  else
    find . -type f | sed 's|^\./||'
  fi | awk '
    /(^|\/)(build|\.fixtures|node_modules|\.git)\// { next }
    { print }'
}

files="$(list_files)"

# 1. Folders that must be named, then the ones ARCHITECTURE.md does not name.
missing="$(
  printf '%s\n' "$files" | awk '
    index($0, "/") == 0 { next }  # a file at the root
    {
      top = $0; sub(/\/.*/, "", top); need[top] = 1
      dir = $0; sub(/\/[^\/]*$/, "", dir)
      name = $0; sub(/.*\//, "", name)
      if (name == "CMakeLists.txt" || name ~ /\.(cc|h|cu|cuh|proto|sh|py|cmake|cjs|js)$/) need[dir] = 1
    }
    END { for (d in need) print d }' | sort |
  awk -v map="$kMap" '
    BEGIN {
      while ((getline line < map) > 0) text = text "\n" line
      text = text "\n"  # starts and ends with a newline: every match has a character each side
    }
    # A path character: anything that may continue a folder name.
    function pathchar(c) { return c ~ /[A-Za-z0-9_.\/-]/ }
    {
      dir = $0; found = 0; pos = 1
      while ((i = index(substr(text, pos), dir)) > 0) {
        at = pos + i - 1  # where this occurrence starts in text (text starts with a newline)
        before = substr(text, at - 1, 1)
        after = substr(text, at + length(dir), 1)
        after2 = substr(text, at + length(dir) + 1, 1)
        # Named: no path character just before; after it, a non-path character, or "/" or "."
        # (the end of a sentence) followed by one.
        if (!pathchar(before) &&
            (!pathchar(after) || ((after == "/" || after == ".") && !pathchar(after2)))) {
          found = 1
          break
        }
        pos = at + 1
      }
      if (!found) print dir
    }'
)"

# 2. Source files over the limit.
too_long="$(
  printf '%s\n' "$files" | awk '/\.(cc|h|cu|cuh)$/' | while IFS= read -r f; do
    if [[ -f "$f" ]]; then printf '%s\0' "$f"; fi
  done | xargs -0 -r awk -v max="$kMaxLines" '
    FNR == 1 && NR > 1 { if (n > max) print prev ": " n " lines (limit " max ")" }
    { n = FNR; prev = FILENAME }
    END { if (NR > 0 && n > max) print prev ": " n " lines (limit " max ")" }'
)"

status=0
if [[ -n "$missing" ]]; then
  while IFS= read -r d; do
    echo "check-layout: folder $d/ is not named in $kMap (which folders must be: this script's header)" >&2
  done <<<"$missing"
  status=1
fi
if [[ -n "$too_long" ]]; then
  while IFS= read -r line; do
    echo "check-layout: $line" >&2
  done <<<"$too_long"
  status=1
fi
if [[ $status -eq 0 ]]; then
  echo "check-layout: ok ($kMap names every room; no source file over $kMaxLines lines)"
fi
exit $status
