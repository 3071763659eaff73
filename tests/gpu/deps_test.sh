#!/usr/bin/env bash
# scripts/gpu-deps.sh against the CUDA build's CMake files, on a CPU machine: gathers the folder,
# configures the CUDA layout (TRAINCTL_CUDA=ON) from it alone, checks that every package was found
# there and not in /usr, and builds the non-torch libraries (protoc through the wrapper, the
# headers, pkg-config files). Fails when either side changes without the other. Then compiles the
# fused CUDA kernels (worker/trainer/model/cuda/) with nvcc, failing on any warning (ptxas's spills
# and local memory included); without an nvcc (on PATH or in /usr/local/cuda) it ends with 77,
# which CTest reports as skipped.
#   tests/gpu/deps_test.sh WORK_DIR
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$1
rm -rf "$WORK" && mkdir -p "$WORK"
fail() { echo "deps_test: $*" >&2; exit 1; }

NVCC=$(command -v nvcc || true)
[[ -z $NVCC && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
CUDA_ARGS=()
[[ -n $NVCC ]] && CUDA_ARGS=(-DCMAKE_CUDA_COMPILER="$NVCC")

"$SRC/scripts/gpu-deps.sh" --no-archive "$WORK/deps"
# At -O0: this checks where every package comes from and that every source compiles against the
# folder, not the code generated (the CUDA build itself is -O2): 149 CPU-s instead of 191 when
# measured, file by file.
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O0 \
  -DTRAINCTL_CUDA=ON \
  -DTRAINCTL_CUDA_CONFIGURE_CHECK=ON -DTRAINCTL_DEPS_DIR="$WORK/deps" "${CUDA_ARGS[@]}" \
  >"$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log"; fail "configuring the CUDA layout from the gathered folder failed"; }

# Every package the CUDA layout asks for came from the folder.
cache=$WORK/build/CMakeCache.txt
for key in absl_DIR yaml-cpp_DIR nlohmann_json_DIR GTest_DIR Protobuf_PROTOC_EXECUTABLE \
  Protobuf_LIBRARY JPEG_INCLUDE_DIR; do
  value=$(grep -E "^$key:" "$cache" | cut -d= -f2-) || fail "$key is not in the CMake cache"
  [[ $value == "$WORK/deps"* ]] || fail "$key = '$value', not from $WORK/deps"
done
for pc in PCRE2 ICU_UC STB HTTPLIB; do
  value=$(grep -E "^${pc}_INCLUDEDIR:" "$cache" | cut -d= -f2-) ||
    fail "pkg-config's $pc was not found"
  [[ $value == "$WORK/deps"* ]] || fail "pkg-config's $pc includedir = '$value', not from $WORK/deps"
done
# No gRPC in the CUDA layout.
if grep -q "^gRPC_DIR:.*[^D]$" "$cache" && ! grep -q "^gRPC_DIR:.*NOTFOUND" "$cache"; then
  grep "^gRPC_DIR:" "$cache"
  fail "the CUDA layout looked for gRPC"
fi

# The non-torch libraries build from the folder's headers and protoc.
cmake --build "$WORK/build" -j 2 --target trainctl_proto trainctl_common trainctl_tokenizer \
  trainctl_data trainctl_endpoint_teacher >"$WORK/build.log" 2>&1 ||
  { tail -50 "$WORK/build.log"; fail "build failed"; }
grep -q -- "-isystem $WORK/deps/include" "$WORK/build/compile_commands.json" ||
  fail "the folder's include directory is not on the compile lines"
# The endpoint teacher has its HTTP client there (not the UNIMPLEMENTED stub).
grep -q "TRAINCTL_WITH_HTTPLIB.*trainctl_endpoint_teacher\.dir" "$WORK/build/compile_commands.json" ||
  fail "trainctl_endpoint_teacher was built without cpp-httplib"
echo "deps_test: $(du -sh "$WORK/deps" | cut -f1) gathered; CUDA layout configured and built from it"

# The fused kernels, with nvcc and its host compiler, for the architectures the CUDA build uses.
if [[ -z $NVCC ]]; then
  rm -rf "$WORK"
  echo "deps_test: no nvcc on PATH or in /usr/local/cuda: the fused CUDA kernels were not compiled"
  exit 77
fi
cmake --build "$WORK/build" -j 2 --target trainctl_fused_kernels -- -v >"$WORK/kernels.log" 2>&1 ||
  { tail -50 "$WORK/kernels.log"; fail "nvcc could not build the fused kernels"; }
if grep -iE "warning" "$WORK/kernels.log"; then
  fail "compiling the fused kernels warned (above)"
fi
grep -q "code=\[sm_80\]" "$WORK/kernels.log" && grep -q "code=\[compute_90,sm_90\]" "$WORK/kernels.log" ||
  fail "the fused kernels were not compiled for sm_80 and sm_90"
echo "deps_test: fused kernels compiled by $("$NVCC" --version | tail -1 | sed 's/^Build //')" \
  "for $(grep -oE "TRAINCTL_CUDA_ARCHITECTURES:[A-Z]+=.*" "$WORK/build/CMakeCache.txt" | cut -d= -f2)"
rm -rf "$WORK"
