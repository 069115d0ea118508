"""``mechlingo experts`` as one call: the expert neurons, their clamps and controls, the k
curve of every target and the k its rule chose.

:func:`run_experts` is the command's analysis (the card's expert checkpoints call the same pieces:
:func:`~mechlingo.analyses.experts.selection.find_experts`,
:func:`~mechlingo.analyses.experts.kcurve.k_curve`), each step a resumable checkpoint of a
:class:`~mechlingo.core.checkpoints.Checkpoints` (the CLI's ``--work``). It returns an
:class:`ExpertsRun`: :meth:`~ExpertsRun.choices` applies the k rule,
:meth:`~ExpertsRun.summary` is the headline record, :meth:`~ExpertsRun.write` puts
``summary.json``, ``experts.csv``, ``kcurve.csv`` and the clamp folders into a folder in one
step. :class:`ExpertSettings` holds every setting that changes a number, each default written
once. The stored forms of the statistics, scores and clamps: :func:`staged_stats`,
:func:`staged_scores`, :func:`staged_folder`."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from safetensors.torch import save_file

from mechlingo.activations.pooled import NeuronStats
from mechlingo.analyses.experts.kcurve import (
    PPL_BUDGET,
    KCurve,
    KCurveOptions,
    OthersRule,
    k_curve,
)
from mechlingo.analyses.experts.selection import ExpertResult
from mechlingo.analyses.experts.stats import (
    NeuronScores,
    Pool,
    ScoreName,
    collect_neuron_stats,
    score_neurons,
)
from mechlingo.core.artifacts import write_files
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS, SAMPLE_NEW_TOKENS, SEED
from mechlingo.core.distributed import is_main
from mechlingo.core.errors import ArtifactError, ExpertError
from mechlingo.core.inert import inert_csv
from mechlingo.core.types import Model
from mechlingo.core.untrusted import inside, load_tensors

__all__ = [
    "ExpertSettings",
    "ExpertsRun",
    "kcurve_checkpointer",
    "pooled_store",
    "run_experts",
    "staged_folder",
    "staged_scores",
    "staged_stats",
]

#: the tokens per held-out line of the k curve's perplexity when ``max_tokens`` is unset
KCURVE_MAX_TOKENS = 64


@dataclass(frozen=True)
class ExpertSettings:
    """How :func:`run_experts` finds, clamps and measures the expert neurons.

    Attributes:
        pool: pooling of each neuron over a sentence's real tokens (``"mean"``, ``"max"``).
        score: how neurons are ranked as experts (``"auroc"``, ``"ap"``, ``"lape"``).
        value: the clamp value, the ``"mean"`` or ``"median"`` pooled activation.
        layers: the layers searched (``None``: all).
        seed: seed of the random-neuron control and of the sampling.
        samples: samples from a bare BOS per k of the k curve.
        max_new_tokens: greedy tokens generated per BOS sample.
        max_tokens: keep only the first N tokens of each sentence (``None``: all; the k
            curve's perplexity then reads :data:`KCURVE_MAX_TOKENS`).
        ppl_budget: the k rule's bound on the target's held-out perplexity ratio.
        ppl_others: how the other languages' perplexity ratios enter the rule.
        batch_size: sentences per forward pass.
        progress: show progress bars.
    """

    pool: Pool = "mean"
    score: ScoreName = "auroc"
    value: Literal["mean", "median"] = "mean"
    layers: tuple[int, ...] | None = None
    seed: int = SEED
    samples: int = 32
    max_new_tokens: int = SAMPLE_NEW_TOKENS
    max_tokens: int | None = None
    ppl_budget: float = PPL_BUDGET
    ppl_others: OthersRule = "none"
    batch_size: int = BATCH_SIZE
    progress: bool = PROGRESS

    def __post_init__(self) -> None:
        choices = {"pool": ("mean", "max"), "score": ("auroc", "ap", "lape"),
                   "value": ("mean", "median"), "ppl_others": ("geomean", "max", "none")}  # fmt: skip
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ExpertError(
                    f"{name} {getattr(self, name)!r}: pass one of {', '.join(allowed)}"
                )
        for name in ("samples", "max_new_tokens", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ExpertError(f"{name} must be an integer of at least 1, got {v!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ExpertError(
                f"max_tokens must be at least 1 (or None: all), got {self.max_tokens}"
            )
        if not self.ppl_budget > 0:
            raise ExpertError(f"ppl_budget must be above 0, got {self.ppl_budget}")


@dataclass
class ExpertsRun:
    """The expert neurons of ``targets`` at every k, with the k curve and the k rule.

    Attributes:
        experts: the scored neurons (:class:`~mechlingo.analyses.experts.selection.ExpertResult`).
        targets: the target languages.
        ks: the expert counts, sorted and distinct.
        clamps: ``{name: folder}`` of the saved clamps (``es-k100``) and their random-neuron
            controls (``es-k100-random``).
        curves: ``{target: KCurve}`` (empty when the k curve was skipped).
        ppl_budget: the k rule's bound on the target's held-out perplexity ratio.
        ppl_others: how the other languages' perplexity ratios enter the rule.
        scratch: the temporary folder that holds the clamps when :func:`run_experts` was
            given no checkpoints (removed with the run).
    """

    experts: ExpertResult
    targets: list[str]
    ks: list[int]
    clamps: Mapping[str, Path] = field(default_factory=dict)
    curves: Mapping[str, KCurve] = field(default_factory=dict)
    ppl_budget: float = PPL_BUDGET
    ppl_others: OthersRule = "none"
    scratch: Any = field(default=None, repr=False, compare=False)

    @property
    def k_show(self) -> int:
        """The k of the summary's neuron tables: the smallest k, at most every neuron."""
        return min(self.ks[0], self.experts.stats.n_features)

    def choices(self) -> dict[str, dict[str, Any]]:
        """``{target: choice}`` of the k rule on each target's k curve (``choice["k"]`` is
        ``None`` when no k keeps the perplexity within the budget)."""
        return {t: c.choose(self.ppl_budget, self.ppl_others) for t, c in self.curves.items()}

    def summary(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """The experts' summary at :attr:`k_show`, then ``targets``, ``clamps``, the k curves
        (``k_curve``), the rule's choice (``k_choice``, ``chosen_k``; with the papers' rule
        also the stricter geomean rule's as ``k_choice_stricter``), the paired tests of each
        k (``k_tests``) and ``meta`` as given."""
        choices = self.choices()
        out = self.experts.summary(self.k_show)
        out["targets"] = self.targets
        out["clamps"] = sorted(self.clamps)
        out["k_curve"] = {t: c.records() for t, c in self.curves.items()}
        out["k_choice"] = choices
        if self.ppl_others == "none":  # the stricter rule beside the papers'
            out["k_choice_stricter"] = {
                t: c.choose(self.ppl_budget, "geomean") for t, c in self.curves.items()
            }
        out["chosen_k"] = {t: ch["k"] for t, ch in choices.items()}
        out["k_tests"] = {t: c.tests() for t, c in self.curves.items()}
        if meta is not None:
            out["meta"] = meta
        return out

    def kcurve_csv(self) -> str:
        """The k curves of every target as one CSV (a ``lang`` column names the target)."""
        import pandas as pd

        frames = [c.to_dataframe().assign(lang=t) for t, c in self.curves.items()]
        return inert_csv(pd.concat(frames))

    def files(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``summary.json``, ``experts.csv`` (the top neurons up to the largest k),
        ``kcurve.csv`` (with a k curve) and every file of every clamp folder
        (``es-k100/...``)."""
        files: dict[str, Any] = {
            "summary.json": self.summary(meta),
            "experts.csv": inert_csv(self.experts.to_dataframe(max(self.ks))),
        }
        if self.curves:
            files["kcurve.csv"] = self.kcurve_csv()
        for name, folder in self.clamps.items():
            files.update(
                {
                    f"{name}/{p.name}": p.read_bytes()
                    for p in sorted(Path(folder).iterdir())
                    if p.is_file()
                }  # fmt: skip
            )
        return files

    def write(
        self, out: str | Path, *, meta: dict[str, Any] | None = None, extra: dict | None = None
    ) -> Path:
        """Write :meth:`files` (and ``extra`` ones, e.g. the report) into ``out`` in one
        step, dropping whatever else was there (no stale clamp of an earlier k survives);
        under torchrun on rank 0 only. Returns the folder."""
        if not is_main():
            return Path(out)
        return write_files(out, {**self.files(meta), **(extra or {})}, keep_others=False)


def run_experts(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    targets: Sequence[str],
    ks: Sequence[int],
    *,
    heldout: Mapping[str, Sequence[str]] | None = None,
    settings: ExpertSettings | None = None,
    checkpoints: Checkpoints | None = None,
    shard_dir: str | Path | None = None,
    shard_always: bool = False,
    max_memory: int | None = None,
) -> ExpertsRun:
    """The expert neurons of every target and k, as ``mechlingo experts`` finds them.

    Every neuron is pooled over ``texts`` (``{lang: sentences}``) and scored one language
    against the rest; for each target and k the clamp ``{target}-k{k}`` and its random-neuron
    control ``{target}-k{k}-random`` are saved; with ``heldout`` (the lines after those, never
    fitted on) the k curve of every target is measured. Each step is a checkpoint of ``checkpoints``
    (``stats``, ``scores``, ``clamp-NAME``, ``kcurve-TARGET-ARM``), so a stopped run goes on
    from the finished ones; without ``checkpoints`` they are kept in a temporary folder that
    lives as long as the returned run. The pooled activations stream to ``shard_dir`` when
    ``shard_always`` or when they would take more than half of ``max_memory`` bytes
    (:func:`pooled_store`; out of core the statistics are not a checkpoint).

    Raises:
        ExpertError: fewer than two languages, an unknown target, a k larger than the
            neurons searched, no held-out tokens.
    """
    opt = settings or ExpertSettings()
    ks = sorted(set(ks))
    scratch = None
    if checkpoints is None:
        scratch = tempfile.TemporaryDirectory(prefix="mechlingo-experts-")
        checkpoints = Checkpoints(scratch.name, {"temporary": True})
    store = pooled_store(model, texts, opt.layers, shard_dir, max_memory, always=shard_always)
    try:
        res = _staged_experts(model, texts, opt, checkpoints, store, max_memory)
        clamps = _saved_clamps(model, res, targets, ks, opt, checkpoints)
    except ExpertError:
        raise
    except ValueError as err:
        raise ExpertError(str(err)) from err
    curves: dict[str, KCurve] = {}
    if heldout is not None:
        curves = {t: _k_curve(model, res, t, ks, heldout, opt, checkpoints) for t in targets}
    return ExpertsRun(
        res, list(targets), ks, clamps, curves, opt.ppl_budget, opt.ppl_others, scratch
    )


def pooled_store(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    layers: Sequence[int] | None,
    folder: str | Path | None,
    max_memory: int | None,
    *,
    always: bool = False,
) -> Path | None:
    """Where the pooled activations of ``texts`` go: ``folder`` when ``always`` or when they
    would take more than half of ``max_memory`` bytes (4 bytes per sentence, layer and
    neuron), else ``None`` (memory). ``None`` without a folder."""
    if folder is None:
        return None
    n_rows = sum(len(v) for v in texts.values())
    n_layers = len(layers or range(model.cfg.n_layers))
    need = 4 * n_rows * n_layers * int(model.cfg.d_mlp or 0)
    big = max_memory is not None and need > max_memory // 2
    return Path(folder) if always or big else None


def _staged_experts(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    opt: ExpertSettings,
    checkpoints: Checkpoints,
    store: Path | None,
    mem: int | None,
) -> ExpertResult:
    """The pooled statistics (checkpoint ``stats``; out of core they are recomputed: they live in
    the shard folder) and the scores (checkpoint ``scores``) of every neuron."""

    def collect() -> NeuronStats:
        return collect_neuron_stats(
            model, texts, pool=opt.pool, layers=None if opt.layers is None else list(opt.layers),
            batch_size=opt.batch_size, max_tokens=opt.max_tokens, progress=opt.progress,
            store=store, max_memory=mem,
        )  # fmt: skip

    stats = collect() if store is not None else staged_stats(checkpoints, "stats", collect)
    scores = staged_scores(checkpoints, "scores", lambda: score_neurons(stats, max_memory=mem))
    return ExpertResult(stats, scores, opt.score)


def _saved_clamps(
    model: Model,
    res: ExpertResult,
    targets: Sequence[str],
    ks: Sequence[int],
    opt: ExpertSettings,
    checkpoints: Checkpoints,
) -> dict[str, Path]:
    """The saved clamps ``{target}-k{k}`` and their random controls ``{target}-k{k}-random``
    of every target and k (each a checkpoint ``clamp-NAME``): ``{name: folder}``."""
    arms: tuple[tuple[str, Callable[..., Any], dict[str, Any]], ...] = (
        ("", res.clamp, {}),
        ("-random", res.random_clamp, {"seed": opt.seed}),
    )
    return {
        f"{t}-k{k}{suffix}": staged_folder(
            checkpoints,
            f"clamp-{t}-k{k}{suffix}",
            lambda dest, t=t, k=k, fn=fn, kw=kw: fn(t, k, value=opt.value, **kw).save(dest, model),
        )  # fmt: skip
        for t in targets
        for k in ks
        for suffix, fn, kw in arms
    }


def _k_curve(
    model: Model,
    res: ExpertResult,
    target: str,
    ks: Sequence[int],
    heldout: Mapping[str, Sequence[str]],
    opt: ExpertSettings,
    checkpoints: Checkpoints,
) -> KCurve:
    """The k curve of one target (BOS language rate and held-out perplexity per k; each arm
    of each k a checkpoint ``kcurve-TARGET-ARM``). Each arm runs alone (``stack=False``) so that a
    resumed run writes the same bytes as an uninterrupted one: a stacked pass over the arms
    left to compute rounds in the last digits differently."""
    return k_curve(
        model,
        res,
        target,
        ks,
        heldout,
        KCurveOptions(
            n_samples=opt.samples,
            max_new_tokens=opt.max_new_tokens,
            value=opt.value,
            seed=opt.seed,
            max_tokens=opt.max_tokens or KCURVE_MAX_TOKENS,
            progress=opt.progress,
            stack=False,
        ),
        checkpoint=kcurve_checkpointer(checkpoints, f"kcurve-{target}-"),
    )


# --------------------------------------------------------------------------------------
# Stored results back into objects
# --------------------------------------------------------------------------------------


def staged_stats(
    checkpoints: Checkpoints, name: str, collect: Callable[[], NeuronStats]
) -> NeuronStats:
    """In-memory neuron statistics as checkpoint ``name`` (the tensors in a safetensors file)."""

    def fn(tmp: Path) -> dict[str, Any]:
        st = collect()
        tensors = {"pooled": st.pooled, "lang_ids": st.lang_ids, "prob_active": st.prob_active}
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                  str(tmp / "stats.safetensors"))  # fmt: skip
        return {"langs": st.langs, "layers": st.layers, "d_mlp": st.d_mlp, "pool": st.pool,
                "meta": st.meta, "device": str(st.prob_active.device)}  # fmt: skip

    d = checkpoints.run(name, fn, folder=True)
    t = _stage_tensors(checkpoints, name, "stats.safetensors", d)
    return NeuronStats(d["langs"], t["pooled"], t["lang_ids"], t["prob_active"], d["layers"],
                       d["d_mlp"], d["pool"], d["meta"])  # fmt: skip


def staged_scores(
    checkpoints: Checkpoints, name: str, score: Callable[[], NeuronScores]
) -> NeuronScores:
    """Neuron scores as checkpoint ``name`` (the tensors in a safetensors file)."""

    def fn(tmp: Path) -> dict[str, Any]:
        sc = score()
        tensors = {"auroc": sc.auroc, "ap": sc.ap, "lape": sc.lape}
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                  str(tmp / "scores.safetensors"))  # fmt: skip
        return {"device": str(sc.auroc.device)}

    d = checkpoints.run(name, fn, folder=True)
    t = _stage_tensors(checkpoints, name, "scores.safetensors", d)
    return NeuronScores(t["auroc"], t["ap"], t["lape"])


def _stage_tensors(checkpoints: Checkpoints, name: str, file: str, d: Mapping[str, Any]) -> dict:
    """The tensors a checkpoint stored, read with the checks of any file from a stranger (the
    header against the file's size, no link out of the checkpoint folder); the device the
    checkpoint recorded when it is a plain device name."""
    device = str(d.get("device", "cpu"))
    if not re.fullmatch(r"(cpu|cuda|mps)(:\d{1,3})?", device):
        device = "cpu"
    path = inside(checkpoints.folder, checkpoints.path(name) / file, ArtifactError)
    return load_tensors(path, ArtifactError, finite=False, device=device,
                        fix="delete the work folder (or rerun with --fresh)")  # fmt: skip


def staged_folder(checkpoints: Checkpoints, name: str, save: Callable[[Path], Any]) -> Path:
    """A saved artifact (``save(folder)``, e.g. a clamp) as checkpoint ``name``; its folder."""

    def fn(tmp: Path) -> dict[str, Any]:
        save(tmp / "saved")
        return {"saved": "saved"}

    checkpoints.run(name, fn, folder=True)
    return checkpoints.path(name) / "saved"


def kcurve_checkpointer(
    checkpoints: Checkpoints, prefix: str
) -> Callable[[str, Callable[[], dict]], dict]:
    """The ``checkpoint`` of :func:`mechlingo.analyses.experts.kcurve.k_curve`: each arm the checkpoint
    ``{prefix}{arm}``."""
    return lambda name, fn: checkpoints.run(f"{prefix}{name}", fn)
