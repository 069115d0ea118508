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
# environment's versions, are hard-linked from there (scripts/link_packages.py) instead of
# being downloaded, unpacked and compiled again. Usage: bash scripts/build_tunedlens_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
VENV="${TUNEDLENS_VENV:-.venv-tunedlens}"
STAMP="$VENV/.mechlingo-tunedlens-ready"
[[ -f "$STAMP" ]] && { echo "$VENV is ready"; exit 0; }
TF="${TRANSFORMERS_VERSION:-$("${DEV_PY:-.venv/bin/python}" -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo 5.24.0)}"
start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
echo '*' > "$VENV/.gitignore"
DEV="${DEV_PY:-.venv/bin/python}"
if [[ -x "$DEV" ]]; then
    "$DEV" scripts/link_packages.py "$VENV" "torch==2.13.0" "transformers==$TF" numpy \
        huggingface_hub safetensors || true
fi
"$VENV/bin/python" -m pip install -q -c constraints.txt "torch==2.13.0"
"$VENV/bin/python" -m pip install -q -c constraints.txt "transformers==$TF" numpy huggingface_hub safetensors
"$VENV/bin/python" -m pip install -q --no-deps "tuned-lens==0.2.0"
"$VENV/bin/python" -c "import tuned_lens, torch, transformers; print('tuned-lens env: torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$STAMP"
echo "$VENV built in $(( $(date +%s) - start ))s"
