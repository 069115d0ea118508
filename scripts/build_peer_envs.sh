#!/usr/bin/env bash
# Benchmarks only (`make bench-peers`), not part of `make test`: build the peers' environments.
#
# Each peer whose pins conflict with mechlingo's gets its own virtual environment:
#   $PEER_NNTERP (default .venv-nnterp): nnterp 1.3.0 + nnsight 0.7.0 + transformers 5, plus
#       mechlingo (--no-deps) and TransformerLens 4 so the benchmark can run both sides;
#   $PEER_SV (default .venv-sv): steering-vectors 0.12.2 + transformers < 5; it only runs the
#       peer side (benchmarks/peer_sv.py), fed and checked by benchmarks/bench_steering.py;
#   $PEER_AUTOCIRCUIT (default .venv-autocircuit): auto-circuit 1.0.1 (--no-deps) on
#       TransformerLens 2.18 (it needs the classic HookedTransformer); it only runs the peer
#       side of benchmarks/peer_autocircuit.py, which runs mechlingo's side in the main one.
# torch is installed first and pinned (an unpinned torch pulls a multi-GB CUDA build). A stamp
# file marks a finished environment; it is rebuilt when its requirements file is newer.
# Usage: bash scripts/build_peer_envs.sh [nnterp] [sv] [autocircuit]   (default all three)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
build() {  # build NAME VENV REQ WITH_MECHLINGO [PACKAGES installed --no-deps]
    local name="$1" venv="$2" req="$3" with_pkg="$4" bare="${5:-}"
    local stamp="$venv/.mechlingo-peer-ready" start
    start=$(date +%s)
    if [[ -f "$stamp" && ! "$req" -nt "$stamp" ]]; then
        echo "[$name] $venv is ready"; return 0
    fi
    echo "[$name] creating $venv"
    [[ -x "$venv/bin/python" ]] || "$PY" -m venv "$venv"
    echo '*' > "$venv/.gitignore"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "torch==2.13.0"
    "$venv/bin/python" -m pip install -q -c constraints.txt -r "$req"
    if [[ -n "$bare" ]]; then
        "$venv/bin/python" -m pip install -q --no-deps $bare
    fi
    if [[ "$with_pkg" == 1 ]]; then
        "$venv/bin/python" -m pip install -q -c constraints.txt -e .
    fi
    touch "$stamp"
    echo "[$name] built in $(( $(date +%s) - start ))s"
}
which=("$@")
[[ ${#which[@]} -gt 0 ]] || which=(nnterp sv autocircuit)
for w in "${which[@]}"; do
    case "$w" in
        nnterp) build nnterp "${PEER_NNTERP:-.venv-nnterp}" ci/requirements-peers-nnterp.txt 1 ;;
        sv) build sv "${PEER_SV:-.venv-sv}" ci/requirements-peers-sv.txt 0 ;;
        autocircuit) build autocircuit "${PEER_AUTOCIRCUIT:-.venv-autocircuit}" \
            ci/requirements-peers-autocircuit.txt 0 "auto-circuit==1.0.1" ;;
        *) echo "unknown peer $w (nnterp, sv, autocircuit)" >&2; exit 2 ;;
    esac
done
