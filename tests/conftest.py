"""Shared fixtures.

* ``tiny``: a tiny random Gemma-3-architecture model (2 layers, d_model 64) with a byte-level
  tokenizer (:func:`mechlingo.testing.build_tiny_folder`, the one builder of tiny models),
  for fast unit tests of mechanics (shapes, hooks, positions, equalities).
* ``gemma``: the embedded default model (google/gemma-3-270m, float32, CPU), for integration
  tests of what the methods find. Tests using it are marked ``embedded`` and ``slow``. It is
  one instance per worker process: a command run in process on the default model (CPU,
  float32, no ``--compat``) gets the same instance after the cache check, instead of
  loading the weights again (:func:`share_embedded_model`).
* ``work_dir``: a fresh folder of this test under /tmp with a short path (AF_UNIX sockets).

Marks (``embedded``, ``subprocess``, ``browser``, ``slow``) are derived from what each test
uses (:mod:`tests.marks`); a guard fails a test whose behaviour its marks do not say.

Runtime shape checks: before any ``mechlingo`` module is imported, jaxtyping's import hook
wraps every function of the package with an array annotation (and every dataclass) in a
checking wrapper (:mod:`tests.shape_checks`), so within the tests every call checks
its tensor arguments and tensor result against their jaxtyping annotations
(``Float[Tensor, "batch pos d_model"]``: the dtype, the rank, and each named axis the same
size everywhere in one call). A mismatch raises at the call. The other annotations are
mypy's (``make lint``). ``MECHLINGO_NO_SHAPE_CHECKS=1`` turns the checks off.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from tests.workers import is_xdist_controller, one_thread_per_worker

ONE_THREAD = one_thread_per_worker(os.environ)  # before torch is imported
#: pytest-xdist's controller runs no test: it imports neither torch nor the package
CONTROLLER = is_xdist_controller(sys.argv, os.environ)


def _bytecode_is_cold() -> bool:
    """Whether torch has no bytecode cache yet (a fresh environment), read without importing
    it."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    origin = spec.origin if spec is not None else None
    return bool(origin) and not os.path.exists(importlib.util.cache_from_source(origin))


#: On a fresh environment (as the controller found it, before any worker started) the xdist
#: workers import and collect one at a time (this file locked until collection ends): the
#: first compiles the bytecode of torch, the package and the tests, which the others then
#: read instead of compiling the same files at the same time.
_SERIAL = "MECHLINGO_TESTS_SERIAL_COLLECTION"
if CONTROLLER and sys.platform != "win32" and _bytecode_is_cold():
    os.environ[_SERIAL] = "1"
_COLLECTING = None
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(_SERIAL) == "1":
    import fcntl

    _COLLECTING = open(__file__, "rb")  # noqa: SIM115 - held until pytest_collection_finish
    fcntl.flock(_COLLECTING, fcntl.LOCK_EX)

if not os.environ.get("MECHLINGO_NO_SHAPE_CHECKS") and not CONTROLLER:
    assert "mechlingo" not in sys.modules, "mechlingo was imported before the shape-check hook"
    from jaxtyping import install_import_hook

    import tests.shape_checks  # the hook finds the checker by its dotted name

    tests.shape_checks.skip_unannotated()
    install_import_hook("mechlingo", tests.shape_checks.HOOK_CHECKER)

import pytest  # noqa: E402

if not CONTROLLER:
    import torch

    if ONE_THREAD:  # in case torch was imported before this file
        torch.set_num_threads(1)

    from mechlingo.core.tokens import TokenBatch, encode

from tests import marks  # noqa: E402

SHARED = Path(os.environ.get("MECHLINGO_SHARED", Path(__file__).resolve().parents[2] / "shared"))
NTREX = SHARED / "data" / "ntrex" / "dev"


_GUARD = marks.Guard()
if not CONTROLLER:
    marks.install(_GUARD)

#: the worker's embedded model, by the real path of its cache folder (one entry at most)
_EMBEDDED: dict[str, object] = {}


def embedded_model():
    """The worker's one embedded model (float32, CPU), loaded on first use."""
    from mechlingo.core import models

    key = os.path.realpath(models.ensure_default_model())
    if key not in _EMBEDDED:
        _EMBEDDED.clear()
        _EMBEDDED[key] = models.load_model(device="cpu")
    return _EMBEDDED[key]


def share_embedded_model() -> None:
    """Commands run in process (``mechlingo.cli.main``) on the embedded model get the
    worker's instance: where the command would load the default model on the CPU in float32
    without ``--compat``, and the cache check (``ensure_default_model``, which the marks
    guard records) finds the real cache, the weights are not read again. Any other load (a
    model folder, a test's own cache, another dtype or device) is the command's own."""
    from mechlingo.cli import common
    from mechlingo.core import models

    real = common.load_model
    home = os.path.realpath(models.cache_dir())

    def load_model(name=None, *, device=None, dtype=None, compat=False, **kw):
        plain = name is None and dtype is None and not compat and not kw
        if plain and (device or models.default_device()) == "cpu":
            folder = os.path.realpath(models.ensure_default_model())
            if folder.startswith(home + os.sep):
                model = embedded_model()
                model.eval()
                return model
        return real(name, device=device, dtype=dtype, compat=compat, **kw)

    common.load_model = load_model


if not CONTROLLER:
    share_embedded_model()


def pytest_collection_finish(session):
    """Let the next worker import and collect (:data:`_COLLECTING`)."""
    global _COLLECTING
    if _COLLECTING is not None:
        _COLLECTING.close()  # closing the file releases the lock
        _COLLECTING = None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Add each test's derived marks before ``-m`` selects."""
    for item in items:
        for name in sorted(marks.marks_for(item)):
            if item.get_closest_marker(name) is None:
                item.add_marker(name)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; the TL3 environment has no xdist
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with the longest modules handed out first (tests/schedule.py)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from tests.schedule import LongestFirst

    return LongestFirst(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _GUARD.start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    problems = _GUARD.problems({m.name for m in item.iter_markers()})
    if problems:
        pytest.fail(f"{item.nodeid} {'; '.join(problems)}: add the mark (tests/marks.py)")
    return result


@pytest.fixture
def work_dir():
    """A fresh folder under /tmp with a short path, removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="ml-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _torch_setup():
    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    yield


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from mechlingo.testing import build_tiny_folder

    return build_tiny_folder(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    from mechlingo.core.models import load_model

    model = load_model(tiny_dir, device="cpu")
    model.cfg.model_name = "mechlingo-tiny-gemma3"
    return model


@pytest.fixture(scope="session")
def gemma():
    return embedded_model()


def count_hooks(model) -> int:
    """Number of forward hooks attached to the model's hook points (ours would show here)."""
    total = 0
    seen = set()
    for hp in model.hook_dict.values():
        if id(hp) in seen:
            continue
        seen.add(id(hp))
        total += len(getattr(hp, "_forward_hooks", {}))
    return total


def corrupted_pair(model, prompts=("The cat sat on the", "A dog ran to th")):
    """Same-shape source/target batches without padding, the target with one token (the
    third) replaced: the smallest patching pair."""
    clean = encode(model, list(prompts))
    width = int(clean.lengths.min())
    tokens = clean.tokens[:, :width].clone()
    lengths = torch.full((tokens.shape[0],), width)
    src = TokenBatch(tokens, lengths, clean.pad_id, clean.has_bos)
    bad = tokens.clone()
    bad[:, 2] = (bad[:, 2] + 11) % 200 + 3
    return src, TokenBatch(bad, lengths.clone(), clean.pad_id, clean.has_bos)
