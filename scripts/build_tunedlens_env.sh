#!/usr/bin/env bash
# The tuned-lens package's own environment ($TUNEDLENS_VENV, default .venv-tunedlens), for
# scripts/check_tuned_lens_interop.py (the reference check of mechlingo's tuned-lens interop).
#
# tuned-lens 0.2.0 (PyPI, 2023) is installed with --no-deps: its lens classes import only
# torch, transformers, huggingface_hub and numpy, while its declared dependencies (wandb,
# torchdata, accelerate, simple-parsing, ...) serve its training CLI and include pins that
# no longer resolve with current torch. torch is pinned to the CPU build mechlingo's setup
# uses, transformers to the dev environment's version (the tiny Gemma 3 test model needs
# transformers >= 4.50). mechlingo itself is NOT installed there: the check exchanges only
# files. A stamp marks a finished environment. torch, transformers and the rest, in the dev
# environment's versions, are hard-linked from there instead of being downloaded, unpacked and
# compiled again (scripts/side_env.sh). Usage: bash scripts/build_tunedlens_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
VENV="${TUNEDLENS_VENV:-.venv-tunedlens}"
STAMP="$VENV/.mechlingo-tunedlens-ready"
[[ -f "$STAMP" ]] && { echo "$VENV is ready"; exit 0; }
# shellcheck source=scripts/side_env.sh
source scripts/side_env.sh
side_lock "$VENV"
[[ -f "$STAMP" ]] && { echo "$VENV is ready"; exit 0; }  # built while this one waited
TF="${TRANSFORMERS_VERSION:-$("$DEV_PY" -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo 5.24.0)}"
start=$(date +%s)
side_venv "$VENV" "transformers==$TF" numpy huggingface_hub safetensors
side_install "$VENV" "transformers==$TF" numpy huggingface_hub safetensors
side_install "$VENV" --no-deps "tuned-lens==0.2.0"
"$VENV/bin/python" -c "import tuned_lens, torch, transformers; print('tuned-lens env: torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$STAMP"
echo "$VENV built in $(( $(date +%s) - start ))s"
