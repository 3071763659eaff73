#!/usr/bin/env bash
# Gathers the trainer's non-torch dependencies (protobuf with protoc, Abseil, yaml-cpp,
# nlohmann_json, PCRE2, ICU, stb, libjpeg-turbo, GoogleTest, cpp-httplib with the OpenSSL, zlib and
# brotli it was built with) from this machine's Debian packages into one
# relocatable prefix laid out like /usr, for building the CUDA trainer on a machine that has a CUDA
# LibTorch but none of these (the GPU machine: see scripts/gpu-check.sh).
#
#   scripts/gpu-deps.sh [--no-archive] [OUT_DIR]     # default .gpu/deps (git-ignored)
#
# Writes OUT_DIR/ (usable in place: cmake -DTRAINCTL_DEPS_DIR=OUT_DIR) and OUT_DIR.tar.xz (what
# travels: ICU's 31 MB data library compresses to ~7 MB), and prints both sizes. Run
# scripts/setup.sh first. The layout mirrors /usr so that the packages' own CMake configs and
# pkg-config files (rewritten to be relative) work from anywhere:
#   include/  lib/x86_64-linux-gnu/{*.so*, *.a, cmake/, pkgconfig/}  share/cmake/
#   bin/protoc (a wrapper finding libexec/protoc's libraries here)  trainctl-deps.txt
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHIVE=1
if [[ ${1:-} == --no-archive ]]; then
  ARCHIVE=0
  shift
fi
OUT=${1:-.gpu/deps}
ARCH=$(gcc -dumpmachine)  # x86_64-linux-gnu
SYS=/usr/lib/$ARCH

rm -rf "$OUT" "$OUT.tar.xz"
mkdir -p "$OUT"/{include,bin,libexec,lib/$ARCH/cmake,lib/$ARCH/pkgconfig,share/cmake}
LIB="$OUT/lib/$ARCH"

copy() {  # copy SRC... into DIR, keeping symlinks
  local dir=${*: -1}
  cp -a "${@:1:$#-1}" "$dir"/
}

# Headers.
for h in absl google nlohmann yaml-cpp unicode stb gtest gmock pcre2.h jpeglib.h jerror.h \
  jmorecfg.h "$ARCH/jconfig.h" httplib.h openssl brotli zlib.h zconf.h; do
  [[ -e /usr/include/$h ]] || { echo "gpu-deps: /usr/include/$h missing: run scripts/setup.sh" >&2; exit 1; }
  copy "/usr/include/$h" "$OUT/include"
done
rm -rf "$OUT/include/google/protobuf/compiler/"{java,csharp,objectivec,php,python,ruby}
# OpenSSL's configuration headers live in the multiarch folder; here beside the others.
copy "/usr/include/$ARCH/openssl/"* "$OUT/include/openssl"
# NCCL's header: CUDA LibTorch wheels compile c10d's NCCL header against it; the nvidia-nccl wheel
# usually has it, the CUDA toolkit here does too.
NCCL_H=${NCCL_HOME:-/usr/local/cuda}/include/nccl.h
if [[ -f $NCCL_H ]]; then
  mkdir -p "$OUT/include/nccl"
  copy "$NCCL_H" "$(dirname "$NCCL_H")"/nccl_device* "$OUT/include/nccl"
fi

# Libraries: shared ones with their SONAME links, static ones where Debian's configs name them.
copy "$SYS"/libabsl_*.so* "$LIB"
copy "$SYS"/libprotobuf.so* "$SYS"/libprotoc.so* "$LIB"
copy "$SYS"/libyaml-cpp.so* "$LIB"
copy "$SYS"/libpcre2-8.so* "$LIB"
copy "$SYS"/libicuuc.so* "$SYS"/libicudata.so* "$LIB"
copy "$SYS"/libstb.so* "$LIB"
copy "$SYS"/libjpeg.so* "$LIB"
copy "$SYS"/libgtest*.a "$SYS"/libgmock*.a "$LIB"
# cpp-httplib (the endpoint teacher's HTTP client) and what it was built with.
copy "$SYS"/libcpp-httplib.so* "$SYS"/libssl.so* "$SYS"/libcrypto.so* "$SYS"/libz.so.1* \
  "$SYS"/libbrotlicommon.so* "$SYS"/libbrotlidec.so* "$SYS"/libbrotlienc.so* "$LIB"

# CMake package configs (they locate their files relative to themselves).
copy "$SYS/cmake/absl" "$SYS/cmake/yaml-cpp" "$SYS/cmake/GTest" "$LIB/cmake"
copy /usr/share/cmake/nlohmann_json "$OUT/share/cmake"

# pkg-config files, made relative to where they lie.
for pc in libpcre2-8 icu-uc stb cpp-httplib openssl libssl libcrypto zlib libbrotlicommon \
  libbrotlidec libbrotlienc; do
  sed -E -e 's|^prefix *= */usr$|prefix=${pcfiledir}/../../..|' "$SYS/pkgconfig/$pc.pc" \
    >"$LIB/pkgconfig/$pc.pc"
done

# protoc, with a wrapper that finds its libraries here.
cp /usr/bin/protoc "$OUT/libexec/protoc"
cat >"$OUT/bin/protoc" <<WRAP
#!/bin/sh
here=\$(cd "\$(dirname "\$0")/.." && pwd)
LD_LIBRARY_PATH="\$here/lib/$ARCH\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/libexec/protoc" "\$@"
WRAP
chmod +x "$OUT/bin/protoc"

{
  echo "# trainctl GPU-build dependencies, gathered by scripts/gpu-deps.sh on $(date -u +%F)"
  echo "arch $ARCH"
  for pkg in libprotobuf-dev protobuf-compiler libabsl-dev libyaml-cpp-dev nlohmann-json3-dev \
    libpcre2-dev libicu-dev libstb-dev libjpeg62-turbo-dev libgtest-dev libgmock-dev \
    libcpp-httplib-dev libssl-dev zlib1g-dev libbrotli-dev; do
    dpkg-query -W -f='${Package} ${Version}\n' "$pkg"
  done
} >"$OUT/trainctl-deps.txt"

echo "gpu-deps: $OUT $(du -sh "$OUT" | cut -f1)"
if ((ARCHIVE)); then
  tar -C "$(dirname "$OUT")" -cf - "$(basename "$OUT")" | xz -T0 -6 >"$OUT.tar.xz"
  echo "gpu-deps: $OUT.tar.xz $(du -sh "$OUT.tar.xz" | cut -f1) (what travels)"
fi
