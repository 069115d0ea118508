# Sourced by scripts/check_hooked_transformer.sh and scripts/build_tunedlens_env.sh: a side
# virtual environment beside .venv, built from what .venv already has.
#   side_venv VENV SPEC...   create VENV (once), hard-link from .venv the distributions that
#                            satisfy torch==2.13.0 and SPEC... (scripts/link_packages.py), and
#                            make sure torch is the CPU build;
#   side_lock VENV           hold VENV.lock until the script ends: a build that `make test`
#                            runs beside pytest and a test that needs the environment take turns;
#   side_install VENV ARG... install into VENV the rest: with uv where .venv has it (the same
#                            registry, its cache already warm from `make setup`), else with pip.
# torch always goes through pip (a no-op where it was linked): pip reads this machine's settings,
# which point it at the CPU build on disk; uv does not read them and would take PyPI's build.
DEV_PY="${DEV_PY:-.venv/bin/python}"
UV="${UV:-$(dirname "$DEV_PY")/uv}"

side_lock() {
    exec 9>"${1%/}.lock"
    flock 9
}

side_venv() {
    local venv="$1"
    shift
    if [[ ! -x "$venv/bin/python" ]]; then
        if [[ -x "$UV" && -x "$DEV_PY" ]]; then
            "$UV" venv -q --python "${PY:-python3}" "$venv"
        else
            "${PY:-python3}" -m venv "$venv"
        fi
    fi
    echo '*' > "$venv/.gitignore"  # never committed, even before .gitignore lists it
    if [[ -x "$DEV_PY" ]]; then
        "$DEV_PY" scripts/link_packages.py "$venv" "torch==2.13.0" "$@" || true
        "$DEV_PY" -m pip --python "$venv/bin/python" install -q "torch==2.13.0"
    else
        "$venv/bin/python" -m pip install -q "torch==2.13.0"
    fi
}

side_install() {
    local venv="$1"
    shift
    if [[ -x "$UV" ]]; then
        "$UV" pip install -q --python "$venv/bin/python" -c constraints.txt "$@"
    elif [[ -x "$DEV_PY" ]]; then
        "$DEV_PY" -m pip --python "$venv/bin/python" install -q -c constraints.txt "$@"
    else
        "$venv/bin/python" -m pip install -q -c constraints.txt "$@"
    fi
}
