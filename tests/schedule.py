"""The order in which ``make test``'s workers take the test modules: the longest first.

pytest-xdist's ``--dist loadscope`` hands each worker whole modules (so that a module's
fixtures are built once), largest number of tests first. The suite's longest modules have
few tests each (five notebooks, the card, the resumed commands), so they came last and one
worker ran the last of them while the other had finished. :class:`LongestFirst` hands out
the modules in the order of their measured CPU time instead (:data:`SECONDS`); a module not
listed counts :data:`PER_TEST` seconds a test. Only the order depends on these numbers:
a stale or missing entry changes no result.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

#: CPU seconds of the longest modules, measured per test (setup + call + teardown, child
#: processes included) in two runs of the whole suite (2026-12-06), averaged and rounded;
#: the five modules whose torchrun launches are forked (:mod:`tests.forks`), the notebooks
#: (kernels forked, :mod:`tests.notebook_kernels`) and attribution (its reference batched)
#: measured again after those changes
SECONDS: dict[str, float] = {
    "tests/card/test_replicate.py": 98,
    "tests/system/test_notebooks.py": 95,
    "tests/activations/test_prefix.py": 53,
    "tests/system/test_demo_figures.py": 47,
    "tests/cli/test_work.py": 41,
    "tests/card/test_power.py": 34,
    "tests/system/test_faults.py": 41,
    "tests/system/test_docs.py": 39,
    "tests/core/test_families.py": 38,
    "tests/system/test_packaging.py": 34,
    "tests/activations/test_decoding.py": 28,
    "tests/system/test_bad_inputs.py": 28,
    "tests/analyses/recall/patching/test_passes.py": 25,
    "tests/analyses/recall/test_steer_eval.py": 22,
    "tests/analyses/recall/test_attribution.py": 21,
    "tests/analyses/decoders/test_tuned_lens_interop.py": 21,
    "tests/system/test_distributed.py": 19,
    "tests/scoring/test_scorers.py": 15,
    "tests/system/test_interop.py": 15,
    "tests/analyses/decoders/test_tuned_lens.py": 14,
    "tests/system/test_reports_browser.py": 14,
    "tests/cli/test_main.py": 12,
    "tests/system/test_layout.py": 12,
    "tests/analyses/recall/test_trace.py": 11,
    "tests/system/test_transformer_lens_3.py": 11,
    "tests/activations/test_shards.py": 9,
    "tests/core/test_models.py": 9,
}
#: the guess for a test of a module not in :data:`SECONDS`
PER_TEST = 0.15


def seconds(scope: str, n_tests: int) -> float:
    """The expected CPU seconds of one work unit (a module, or a class in it)."""
    return SECONDS.get(scope.split("::")[0], PER_TEST * n_tests)


class LongestFirst(LoadScopeScheduling):
    """``--dist loadscope``, the modules handed out longest first (:func:`seconds`)."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._ordered = False

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered:  # the queue is complete at the first assignment
            units = sorted(self.workqueue.items(), key=lambda kv: -seconds(kv[0], len(kv[1])))
            self.workqueue.clear()
            self.workqueue.update(units)
            self._ordered = True
        super()._assign_work_unit(node)
