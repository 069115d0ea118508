#!/usr/bin/env bash
# CI step: mechlingo's core on a classic TransformerLens 3.9 HookedTransformer.
#
# Creates (once; later runs reuse it) a separate virtual environment in .venv-tl3 with
# torch (CPU build), transformer-lens==3.9.0 and mechlingo installed with --no-deps, then runs
# tests/system/test_hooked_transformer.py there (`--build-only`: the environment only, as
# `make test` builds it before pytest, whose tests/system/test_transformer_lens_3.py runs this
# script). The main environment (TransformerLens 4) is untouched.
# What .venv already has in a version the requirements accept (torch and its dependencies,
# transformers, scipy, ...) is hard-linked from there; uv installs the rest (scripts/side_env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
VENV="${VENV_TL3:-.venv-tl3}"
BIN="$VENV/bin"
STAMP="$VENV/.mechlingo-tl3-ready"
REQ="ci/requirements-tl3.txt"
# shellcheck source=scripts/side_env.sh
source scripts/side_env.sh
start=$(date +%s)
side_lock "$VENV"
if [[ ! -f "$STAMP" || "$REQ" -nt "$STAMP" ]]; then
    echo "[tl3] creating $VENV (TransformerLens 3.9)"
    # shellcheck disable=SC2046  # one requirement per line, none with spaces
    side_venv "$VENV" $(grep -v -e '^#' -e '^transformer-lens' -e '^ *$' "$REQ")
    side_install "$VENV" -r "$REQ"
    side_install "$VENV" --no-deps -e .
    touch "$STAMP"
fi
[[ "${1:-}" == "--build-only" ]] && { echo "[tl3] $VENV ready in $(( $(date +%s) - start ))s"; exit 0; }
"$BIN/python" -c "from importlib.metadata import version as v; \
print('[tl3] transformer-lens', v('transformer-lens'), 'torch', v('torch'))"
"$BIN/python" -m pytest -q -ra -p no:cacheprovider tests/system/test_hooked_transformer.py
echo "[tl3] done in $(( $(date +%s) - start ))s"
