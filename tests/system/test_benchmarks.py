"""Every benchmark in ``benchmarks/`` runs at smoke size, so that an API change that breaks one
fails here instead of rotting unseen.

Each runs in this process (its ``main(argv)`` imported from the file) with ``--smoke`` on the
tests' tiny random model: the smallest sizes that go through its whole code path, the peers
that need their own environment left out with a printed note. The test checks that it ran to
its end and that its last lines are its ``name: N.Nx`` ratios, ending with the speed-up over
the alternative it measures (the names below); their values mean nothing at this size.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"

#: ``name: N.Nx`` (the ratio lines every benchmark ends with); anything after the ``x`` is a note
RATIO = re.compile(r"^(?P<name>\S[^:]*): (?P<value>\d+\.\d+)x(?:\s|$)")

#: per benchmark: the names of its last ratio lines, in order (the last is its speed-up over
#: the alternative it measures; a peer that needs its own environment adds its lines after
#: these outside the suite)
LAST: dict[str, list[str]] = {
    "bench_attribution": [
        "atp vs exact (attn_out+mlp_out)",
        "atp vs exact (heads)",
        "atp vs exact (resid_pre)",
        "atp vs exact (attn_out+mlp_out+heads in one pass)",
    ],
    "bench_circuit": [
        "eap-ig over its floor",
        "eap-ig batched vs per prompt",
        "eap-ig vs exact edge patching (extrap.)",
    ],
    "bench_clamp_population": ["bench_clamp_population_cost", "bench_clamp_population"],
    "bench_conditions": ["bench_conditions_floor", "bench_conditions"],
    "bench_decoders": [
        "tuned lens over the logit lens (floor)",
        "patchscope over the logit lens (floor)",
        "patchscope + 4 tokens over the logit lens (floor)",
    ],
    "bench_experts_memory": ["disk_vs_memory_time_n48", "memory_vs_disk_peak_rss_n48"],
    "bench_generate": [
        "cached decoding over bare forward steps (floor)",
        "bf16 screen vs plain arg-max (cached)",
        "cached vs uncached (line-break stops)",
        "cached vs uncached",
        "cached vs transformers generate",
    ],
    "bench_gpu": [
        "logit lens vs TL logit_lens/prompt",
        "activation patching (grow) vs batching='stack'",
        "neuron AUROC+AP vs sklearn loop (extrap.)",
        "steering conditions vs one at a time",
        "candidate ranking vs one by one (extrap.)",
    ],
    "bench_lens": ["mechlingo readout vs TransformerLens logit_readout"],
    "bench_neuron_scores": [
        "auroc+AP over one sort (floor)",
        "all languages, grouped kernel over one sort (floor)",
        "all languages, grouped kernel vs one-language kernel per language",
        "all languages, grouped kernel vs scikit-learn",
        "auroc+AP vs scikit-learn",
    ],
    "bench_patching": [
        "patching over the unavoidable work (floor)",
        "prefix reuse vs every position (reuse_prefix=False)",
        "patching vs TransformerLens per cell",
    ],
    "bench_random_population": ["bench_random_population_cost", "bench_random_population"],
    "bench_rank": ["bench_rank_floor", "bench_rank"],
    "bench_steering": ["apply vs TransformerLens run_with_hooks"],
}

#: benchmarks that build their inputs without a model
NO_MODEL = {"bench_neuron_scores"}


def trailing_ratios(out: str) -> list[tuple[str, float]]:
    """The ``name: N.Nx`` lines at the end of ``out`` (after its last other line)."""
    found: list[tuple[str, float]] = []
    for line in reversed(out.rstrip().splitlines()):
        m = RATIO.match(line)
        if m is None:
            break
        found.append((m["name"], float(m["value"])))
    return found[::-1]


def test_ratio_lines_are_parsed():
    out = "x: 1\nsame scores: 3 of 3\n\nbench_rank_floor: 2.5x\nbench_rank: 11.0x   (a note)\n"
    assert trailing_ratios(out) == [("bench_rank_floor", 2.5), ("bench_rank", 11.0)]
    assert trailing_ratios("bench_rank: 1.0x\nthen a note\n") == []


def test_every_benchmark_is_run_here():
    assert set(LAST) == {p.stem for p in BENCH.glob("bench_*.py")}


@pytest.fixture
def torch_state():
    """The benchmarks set the grad mode and the thread count for their process."""
    grad, threads = torch.is_grad_enabled(), torch.get_num_threads()
    yield
    torch.set_grad_enabled(grad)
    torch.set_num_threads(threads)


def _main(name: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCH))  # benchmarks/smoke.py, bench_rank for bench_gpu
    spec = importlib.util.spec_from_file_location(f"_smoke_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("name", sorted(LAST))
def test_benchmark_runs_to_its_end_at_smoke_size(name, tiny_dir, capsys, monkeypatch,
                                                 torch_state):  # fmt: skip
    argv = ["--smoke"] + ([] if name in NO_MODEL else ["--model", str(tiny_dir)])
    _main(name, monkeypatch)(argv)
    out = capsys.readouterr().out
    expected = LAST[name]
    if name == "bench_gpu" and torch.cuda.is_available():
        expected = expected[-1:]  # with CUDA, more alternatives (the same code on the CPU)
    names = [n for n, _ in trailing_ratios(out)]
    assert names[-len(expected) :] == expected, out[-2000:]
