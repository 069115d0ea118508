"""Activation patching sweeps (batched), cross-language patching and attention knockout.

**Activation patching.** Two runs: the *source* (TransformerLens calls it "clean") and the
*target* ("corrupted"). For one *cell* -- a site (``resid_pre``, ``resid_post``, ``resid_mid``,
``attn_out``, ``mlp_out``, or one attention ``head``'s output ``attn_z``), a layer and a token
position -- the target run is repeated with its activation at that cell replaced by the
source run's, and a metric is read at the target's last real token. A large effect says that
the information carried by that activation is enough to move the target towards the source's
behaviour. :func:`patch_sweep` does this for a whole grid of cells:

* the source activations are read once, and only at the hooks and positions the grid needs;
* many patched copies of the target share one forward pass, each copy carrying the patch of one
  cell. By default (``batching="grow"``) a pass runs one example: it starts as the unpatched
  target alone, and at each layer's block input the batch grows by one copy of the unpatched
  row per cell of that layer, so the work below a cell's layer is done once and a copy patched
  at layer ``l`` only computes layers ``l`` and above (over all layers, about half the work of
  running every copy through the whole model). ``batching="stack"`` runs every copy of every
  example through the whole model instead (for models that cannot grow a batch mid-pass);
* each pass stops at the final residual stream, and the last real token of every row is
  unembedded in one batched readout (the unembedding dominates the cost on large
  vocabularies).

For same-shape inputs the values equal TransformerLens's ``transformer_lens.patching``
functions (``get_act_patch_resid_pre`` ...), per example.

**Cross-language patching.** When source and target differ in length (an English prompt and a
French one), each target position must be told which source position it takes its activation
from: an *alignment*. ``"last"`` aligns positions counted back from each prompt's last real
token (``-1`` to ``-1``, ``-2`` to ``-2``, ...); ``"subject"`` additionally aligns the subject
span: ``"subject_first"`` and ``"subject_last"`` are the first and last token of each prompt's
subject (from :attr:`Fact.subject_span` character offsets), so when the two subjects take a
different number of tokens the first subject token maps to the first and the last to the last;
a dict ``{target_pos: source_pos}`` gives the map explicitly.

**Metrics** (:class:`Metric`): log-probability (or probability) of an answer token set (see
:func:`mechlingo.core.tokens.answer_tokens`), e.g. the answer in the target language or the English
answer, and the logit difference between two answers (difference of the two sets' log
probability masses; for single-token sets exactly the logit difference). The *normalised
effect* of a cell is ``(patched - corrupted) / (clean - corrupted)`` on the mean over examples:
0 = the patch does nothing, 1 = it restores the source run's value. Per-example values are kept
and bootstrap 95% intervals resample examples.

**Attention knockout** (Geva et al. 2023): :func:`attention_knockout` blocks the attention
edges from the last token to the subject tokens in a window of layers (the pre-softmax scores
``blocks.{l}.attn.hook_attn_scores`` are set to ``-inf`` for all heads, so each row's softmax
renormalises over the remaining keys, as in the paper) and measures the drop in the answer's
probability, per window; the windows are batched like the sweep's cells.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.activations.runs import StopForward, final_resid_name, run_batch
from mechlingo.core.errors import MechlingoError
from mechlingo.core.families import grows_mid_pass
from mechlingo.core.figures import draw
from mechlingo.core.sites import RESIDUAL_SITES, resolve_layers, resolve_site, site_map
from mechlingo.core.tokens import AnswerTokens, TokenBatch, answer_tokens, encode, pack_token_sets
from mechlingo.core.types import Model
from mechlingo.kernels.readout import read_logits

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from mechlingo.data import Fact

#: Sites a sweep can patch: the residual-shaped sites and ``"head"`` (one head's ``attn_z``).
PATCH_SITES: tuple[str, ...] = (*RESIDUAL_SITES, "head")

PositionLabel = int | str


class PatchingError(MechlingoError, ValueError):
    """Bad input to a patching sweep (shapes, positions, alignment, sites)."""


# --------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """A per-example number read from the next-token distribution at the last real token.

    Attributes:
        name: label used in tables and figures.
        kind: ``"logprob"`` (log of the answer set's probability mass), ``"prob"`` (the mass)
            or ``"logit_diff"`` (log mass of set A minus log mass of set B).
        sets: per example, the answer set (and for ``logit_diff`` the second set).
    """

    name: str
    kind: str
    sets: tuple[tuple[AnswerTokens, ...], ...]

    def __post_init__(self) -> None:
        want = 2 if self.kind == "logit_diff" else 1
        if self.kind not in ("logprob", "prob", "logit_diff"):
            raise PatchingError(f"unknown metric kind {self.kind!r}; use logprob, prob, logit_diff")
        if not self.sets:
            raise PatchingError(f"metric {self.name!r} has no examples")
        if any(len(s) != want for s in self.sets):
            raise PatchingError(f"metric kind {self.kind!r} needs {want} answer set(s) per example")

    @property
    def n_examples(self) -> int:
        return len(self.sets)

    def combine(self, set_logprob: Float[Tensor, "row track"]) -> Float[Tensor, " row"]:
        """The metric from the log masses of this metric's tracks."""
        if self.kind == "logprob":
            return set_logprob[:, 0]
        if self.kind == "prob":
            return set_logprob[:, 0].exp()
        return set_logprob[:, 0] - set_logprob[:, 1]


def _sets(model: Model, words: Sequence[str], langs: Sequence[str] | None) -> list[AnswerTokens]:
    langs = list(langs) if langs is not None else [None] * len(words)  # type: ignore[list-item]
    if len(langs) != len(words):
        raise PatchingError(f"{len(langs)} languages for {len(words)} answers")
    return [answer_tokens(model, w, lang=lg) for w, lg in zip(words, langs, strict=True)]


def answer_logprob(
    model: Model,
    answers: Sequence[str],
    langs: Sequence[str] | None = None,
    *,
    name: str = "answer_logprob",
    prob: bool = False,
) -> Metric:
    """Log-probability (``prob=True``: probability) of each example's answer token set."""
    sets = _sets(model, answers, langs)
    return Metric(name, "prob" if prob else "logprob", tuple((s,) for s in sets))


def logit_diff(
    model: Model,
    answers_a: Sequence[str],
    answers_b: Sequence[str],
    langs: Sequence[str] | None = None,
    *,
    name: str = "logit_diff",
) -> Metric:
    """Log mass of answer A minus log mass of answer B per example (positive = prefers A)."""
    if len(answers_a) != len(answers_b):
        raise PatchingError(f"{len(answers_a)} answers A for {len(answers_b)} answers B")
    a, b = _sets(model, answers_a, langs), _sets(model, answers_b, langs)
    return Metric(name, "logit_diff", tuple(zip(a, b, strict=True)))


def fact_metrics(model: Model, facts: Sequence[Fact], *, prob: bool = False) -> list[Metric]:
    """The two standard metrics for facts read in their own language: the log-probability of
    the answer in the prompt's language (``"answer_logprob"``) and of the English answer
    (``"en_logprob"``, continuing the same prompt)."""
    facts = list(facts)
    langs = [f.lang for f in facts]
    return [
        answer_logprob(model, [f.answer for f in facts], langs, name="answer_logprob", prob=prob),
        answer_logprob(
            model, [f.answer_en or f.answer for f in facts], langs, name="en_logprob", prob=prob
        ),
    ]


def _pack_metrics(
    metrics: Sequence[Metric], n_rows: int
) -> tuple[Int[Tensor, "row track member"], Int[Tensor, "row track"], list[slice]]:
    for m in metrics:
        if m.n_examples != n_rows:
            raise PatchingError(
                f"metric {m.name!r} has {m.n_examples} examples but the batch has {n_rows} rows"
            )
    rows = [[s for m in metrics for s in m.sets[i]] for i in range(n_rows)]
    ids, primary = pack_token_sets(rows)
    slices, k = [], 0
    for m in metrics:
        width = len(m.sets[0])
        slices.append(slice(k, k + width))
        k += width
    return ids, primary, slices


def _evaluate(
    model: Model,
    resid: Float[Tensor, "row d_model"],
    metrics: Sequence[Metric],
    packed: tuple[Tensor, Tensor, list[slice]],
    example: Int[Tensor, " row"],
) -> Float[Tensor, "metric row"]:
    ids, primary, slices = packed
    ex = example.to(ids.device)
    # large row chunks: the unembedding streams W_U once per chunk (256 x 262k floats = 268 MB)
    r = read_logits(model, resid, ids[ex], primary[ex], top_k=0, ranks=False, chunk_rows=256)
    return torch.stack(
        [m.combine(r.set_logprob[:, s]) for m, s in zip(metrics, slices, strict=True)]
    )


# --------------------------------------------------------------------------------------
# Inputs, subject spans and positions
# --------------------------------------------------------------------------------------


def subject_token_span(
    model: Model, prompt: str, span: tuple[int, int], *, has_bos: bool | None = None
) -> tuple[int, int]:
    """Token positions ``(first, last)`` (inclusive, in the :func:`~mechlingo.core.tokens.encode`
    batch, BOS counted) of the tokens overlapping the character span ``span`` of ``prompt``.

    Raises:
        PatchingError: an empty or out-of-range span, or one no token overlaps.
    """
    start, end = int(span[0]), int(span[1])
    if not 0 <= start < end <= len(prompt):
        raise PatchingError(
            f"subject span {span} is empty or outside the prompt {prompt!r} (length "
            f"{len(prompt)}); give (start, end) character offsets with start < end"
        )
    bos = bool(getattr(model.cfg, "default_prepend_bos", True)) if has_bos is None else has_bos
    shift = 1 if bos else 0
    ids = [int(i) for i in model.to_tokens(prompt, prepend_bos=False, truncate=False)[0]]
    tok = model.tokenizer
    offsets = None
    if getattr(tok, "is_fast", False):  # only fast tokenizers report character offsets
        enc = tok(prompt, add_special_tokens=False, return_offsets_mapping=True)
        if [int(i) for i in enc["input_ids"]] == ids:  # else the model tokenizes differently
            offsets = [tuple(o) for o in enc["offset_mapping"]]
    if offsets is None:  # no usable offsets: count the tokens of prefixes
        # without the space before the subject: BPE tokenizers attach it to the subject's
        # first token, so "of " alone would count one token too many
        head = prompt[:start].rstrip()
        first = len(model.to_tokens(head, prepend_bos=False)[0]) if head else 0
        last = len(model.to_tokens(prompt[:end], prepend_bos=False)[0]) - 1
        return first + shift, max(first, last) + shift
    hit = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
    if not hit:
        raise PatchingError(f"no token of {prompt!r} overlaps the subject span {span}")
    return hit[0] + shift, hit[-1] + shift


def _as_batch(model: Model, x: Any, what: str) -> tuple[TokenBatch, list[tuple[int, int]] | None]:
    """A TokenBatch and, for facts, each row's subject token span."""
    if isinstance(x, TokenBatch):
        return x, None
    if isinstance(x, str):
        x = [x]
    items = list(x)
    if not items:
        raise PatchingError(f"the {what} inputs are empty")
    if all(isinstance(i, str) for i in items):
        return encode(model, items), None
    if all(hasattr(i, "prompt") and hasattr(i, "subject_span") for i in items):
        batch = encode(model, [f.prompt for f in items])
        spans = [
            subject_token_span(model, f.prompt, f.subject_span, has_bos=batch.has_bos)
            for f in items
        ]
        return batch, spans
    raise PatchingError(f"the {what} inputs must be prompts (str), Facts or a TokenBatch")


def _check_spans(spans: Any, batch: TokenBatch, what: str) -> list[tuple[int, int]] | None:
    if spans is None:
        return None
    spans = [(int(a), int(b)) for a, b in spans]
    if len(spans) != batch.batch_size:
        raise PatchingError(f"{len(spans)} {what} subject spans for {batch.batch_size} rows")
    for i, (a, b) in enumerate(spans):
        if not 0 <= a <= b < int(batch.lengths[i]):
            raise PatchingError(
                f"{what} subject token span {(a, b)} of row {i} is empty or outside the prompt "
                f"({int(batch.lengths[i])} tokens); spans are inclusive (first, last) positions"
            )
    return spans


@dataclass
class _Positions:
    labels: list[str]
    target: Int[Tensor, "position row"]
    source: Int[Tensor, "position row"]


def _resolve_one(
    spec: PositionLabel, lengths: Tensor, spans: list[tuple[int, int]] | None, what: str
) -> Tensor:
    if isinstance(spec, str):
        if spec == "last":
            return lengths - 1
        if spec in ("subject_first", "subject_last"):
            if spans is None:
                raise PatchingError(
                    f"position {spec!r} needs the {what} subject spans: pass Facts, or "
                    f"{what}_subject=[(first, last) token positions per row]"
                )
            k = 0 if spec == "subject_first" else 1
            return torch.tensor([s[k] for s in spans], dtype=torch.long)
        raise PatchingError(
            f"unknown position {spec!r}; use ints (negative = from each row's last token), "
            "'last', 'subject_first' or 'subject_last'"
        )
    p = int(spec)
    return lengths - 1 + 1 + p if p < 0 else torch.full_like(lengths, p)


def _resolve_positions(
    positions: Sequence[PositionLabel] | None,
    alignment: Any,
    src: TokenBatch,
    tgt: TokenBatch,
    src_spans: list[tuple[int, int]] | None,
    tgt_spans: list[tuple[int, int]] | None,
) -> _Positions:
    same = tuple(src.tokens.shape) == tuple(tgt.tokens.shape) and torch.equal(
        src.lengths.cpu(), tgt.lengths.cpu()
    )
    src_len, tgt_len = src.lengths.cpu(), tgt.lengths.cpu()
    pairs: list[tuple[PositionLabel, PositionLabel]]
    if isinstance(alignment, Mapping):
        if positions is not None:
            raise PatchingError("with an explicit alignment map, leave positions=None")
        if not alignment:
            raise PatchingError("the alignment map is empty")
        pairs = [(k, v) for k, v in alignment.items()]
    elif alignment is None:
        if not same:
            raise PatchingError(
                "source and target have different token lengths "
                f"(source {src_len.tolist()}, target {tgt_len.tolist()}); pass "
                "alignment='last' (positions counted back from each last token), "
                "alignment='subject' (subject span to subject span; needs Facts or subject "
                "spans) or alignment={target_pos: source_pos}"
            )
        if positions is None:
            positions = list(range(int(tgt_len.min())))
        if src_spans is None:
            src_spans = tgt_spans
        if tgt_spans is None:
            tgt_spans = src_spans
        pairs = [(p, p) for p in positions]
    elif alignment in ("last", "subject"):
        if positions is None:
            positions = [-1] if alignment == "last" else ["subject_first", "subject_last", -1]
        pairs = []
        for p in positions:
            if isinstance(p, int) and p >= 0:
                raise PatchingError(
                    f"absolute position {p} has no counterpart under alignment={alignment!r}: "
                    "use negative positions (counted back from each last token), subject "
                    "labels, or an explicit alignment map {target_pos: source_pos}"
                )
            if alignment == "last" and isinstance(p, str) and p.startswith("subject"):
                raise PatchingError(f"position {p!r} needs alignment='subject'")
            pairs.append((p, p))
    else:
        raise PatchingError(
            f"unknown alignment {alignment!r}; use None, 'last', 'subject' or a dict "
            "{target_pos: source_pos}"
        )
    if not pairs:
        raise PatchingError("the position selection is empty")
    labels, t_rows, s_rows = [], [], []
    for tp, sp in pairs:
        t = _resolve_one(tp, tgt_len, tgt_spans, "target")
        s = _resolve_one(sp, src_len, src_spans, "source")
        for pos, lens, what, spec in ((t, tgt_len, "target", tp), (s, src_len, "source", sp)):
            bad = (pos < 0) | (pos >= lens)
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise PatchingError(
                    f"{what} position {spec!r} is out of range in row {i} (that prompt has "
                    f"{int(lens[i])} tokens, positions 0..{int(lens[i]) - 1}; negative "
                    "positions count back from the last token)"
                )
        labels.append(str(tp) if tp == sp or not isinstance(alignment, Mapping) else f"{tp}<-{sp}")
        t_rows.append(t)
        s_rows.append(s)
    return _Positions(labels, torch.stack(t_rows), torch.stack(s_rows))


# --------------------------------------------------------------------------------------
# Reading runs
# --------------------------------------------------------------------------------------


def _read_run(
    model: Model,
    batch: TokenBatch,
    reads: Mapping[str, Tensor],
    extra_hooks: Sequence[tuple[str, Callable]] = (),
) -> tuple[dict[str, Tensor], Tensor]:
    """Run ``batch``; for each hook in ``reads`` keep ``act[row, positions[row, :]]``
    (``[row, P, ...]``) and the final residual at each last real token; stop there."""
    final = final_resid_name(model)
    out: dict[str, Tensor] = {}
    rows = torch.arange(batch.batch_size)

    def reader(name: str, pos: Tensor) -> Callable:
        def hook(t: Tensor, hook: Any) -> None:
            out[name] = t[rows.to(t.device)[:, None], pos.to(t.device)].detach().float()

        return hook

    def final_hook(t: Tensor, hook: Any) -> None:
        last = batch.last_index.to(t.device)
        out["__final__"] = t[rows.to(t.device), last].detach()
        raise StopForward

    hooks = list(extra_hooks) + [(n, reader(n, p)) for n, p in reads.items()]
    hooks.append((final, final_hook))
    with torch.no_grad():
        run_batch(model, batch, hooks)
    missing = [n for n in reads if n not in out]
    if "__final__" not in out or missing:
        raise RuntimeError(f"hooks {missing or [final]} did not fire during the forward pass")
    return out, out.pop("__final__")


def _repeat(batch: TokenBatch, copies: int) -> TokenBatch:
    return TokenBatch(
        batch.tokens.repeat(copies, 1),
        batch.lengths.repeat(copies),
        batch.pad_id,
        batch.has_bos,
        batch.prompt_lengths.repeat(copies),
    )


# --------------------------------------------------------------------------------------
# Sweep result
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One patched place: site, layer, position label (index into the position axis) and
    head (``-1`` for whole-site patches)."""

    site: str
    layer: int
    position: int
    head: int = -1


def metric_index(names: Sequence[str], metric: str | int = 0) -> int:
    """Position of ``metric`` (a name or an index) among a result's metric ``names``."""
    if isinstance(metric, int):
        return metric
    if metric not in names:
        raise KeyError(f"unknown metric {metric!r}; metrics: {list(names)}")
    return list(names).index(metric)


@dataclass
class PatchSweep:
    """The result of :func:`patch_sweep`.

    Attributes:
        cells: the patched cells, in the order of ``values``' cell axis.
        metric_names: names of the metrics (first axis of ``values``).
        values: ``[metric, cell, example]`` metric of each patched target run.
        clean: ``[metric, example]`` metric of the source ("clean") run.
        corrupted: ``[metric, example]`` metric of the unpatched target ("corrupted") run.
        sites, layers, heads: the grid axes (``heads`` empty without head sites).
        position_labels: label of each position of the grid (``"-1"`` = last token, ...).
        target_positions, source_positions: ``[position, example]`` resolved token positions.
        alignment: how positions were aligned (``"same"``, ``"last"``, ``"subject"``, ``"map"``).
    """

    cells: list[Cell]
    metric_names: list[str]
    values: Float[Tensor, "metric cell example"]
    clean: Float[Tensor, "metric example"]
    corrupted: Float[Tensor, "metric example"]
    sites: list[str]
    layers: list[int]
    heads: list[int]
    position_labels: list[str]
    target_positions: Int[Tensor, "position example"]
    source_positions: Int[Tensor, "position example"]
    alignment: str
    meta: dict[str, Any] = field(default_factory=dict)

    def metric_index(self, metric: str | int = 0) -> int:
        return metric_index(self.metric_names, metric)

    def mean(self, metric: str | int = 0) -> Float[Tensor, " cell"]:
        """Mean over examples of the patched metric per cell."""
        return self.values[self.metric_index(metric)].mean(-1)

    def effect(self, metric: str | int = 0) -> Float[Tensor, " cell"]:
        """Mean of (patched - corrupted) per cell, in the metric's units."""
        m = self.metric_index(metric)
        return (self.values[m] - self.corrupted[m]).mean(-1)

    def normalized(self, metric: str | int = 0) -> Float[Tensor, " cell"]:
        """``(patched - corrupted) / (clean - corrupted)`` on the means over examples:
        0 = no effect, 1 = restores the source run (NaN when clean == corrupted)."""
        m = self.metric_index(metric)
        return _norm(self.values[m].mean(-1), self.clean[m].mean(), self.corrupted[m].mean())

    def bootstrap_ci(
        self,
        metric: str | int = 0,
        *,
        normalized: bool = True,
        n_boot: int = 1000,
        seed: int = 0,
        level: float = 0.95,
    ) -> tuple[Float[Tensor, " cell"], Float[Tensor, " cell"]]:
        """Bootstrap interval (resampling examples) of :meth:`normalized` or
        :meth:`effect` per cell."""
        m = self.metric_index(metric)
        n = self.values.shape[-1]
        g = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, n, (n_boot, n), generator=g)
        v = self.values[m][:, idx].mean(-1)  # [cell, boot]
        c = self.clean[m][idx].mean(-1)
        k = self.corrupted[m][idx].mean(-1)
        stat = _norm(v, c, k) if normalized else v - k
        a = (1 - level) / 2
        q = torch.tensor([a, 1 - a])
        lo_hi = torch.nanquantile(stat, q, dim=-1)
        return lo_hi[0], lo_hi[1]

    def grid(
        self, site: str, metric: str | int = 0, value: str = "normalized"
    ) -> Float[Tensor, "layer position ..."]:
        """The ``[layer, position]`` (heads: ``[layer, position, head]``) grid of one site:
        ``value`` is ``"normalized"``, ``"effect"`` or ``"mean"``; NaN where not swept."""
        fn = {"normalized": self.normalized, "effect": self.effect, "mean": self.mean}[value]
        vals = fn(metric)
        shape = [len(self.layers), len(self.position_labels)]
        if site == "head":
            shape.append(max(1, len(self.heads)))
        out = torch.full(shape, float("nan"))
        li = {layer: i for i, layer in enumerate(self.layers)}
        hi = {h: i for i, h in enumerate(self.heads)}
        for c, cell in enumerate(self.cells):
            if cell.site != site:
                continue
            key = (li[cell.layer], cell.position) + ((hi[cell.head],) if site == "head" else ())
            out[key] = vals[c]
        return out

    def top_cells(self, k: int = 10, metric: str | int = 0) -> list[dict[str, Any]]:
        """The ``k`` cells with the largest absolute normalised effect."""
        vals = self.normalized(metric)
        order = torch.argsort(torch.nan_to_num(vals.abs(), nan=-1.0), descending=True)[:k]
        return [
            {**self._cell_dict(self.cells[int(i)]), "normalized": float(vals[int(i)])}
            for i in order
        ]

    def _cell_dict(self, cell: Cell) -> dict[str, Any]:
        return {
            "site": cell.site,
            "layer": cell.layer,
            "position": self.position_labels[cell.position],
            "head": cell.head if cell.head >= 0 else None,
        }

    def to_dataframe(self, *, per_example: bool = False) -> pd.DataFrame:
        """One row per (metric, cell): mean, effect, normalised effect and its 95% bootstrap
        interval; with ``per_example`` one row per (metric, cell, example) instead."""
        import pandas as pd

        rows = []
        for m, name in enumerate(self.metric_names):
            if per_example:
                v = self.values[m].tolist()
                for c, cell in enumerate(self.cells):
                    for e, x in enumerate(v[c]):
                        rows.append(
                            {
                                "metric": name,
                                **self._cell_dict(cell),
                                "example": e,
                                "patched": x,
                                "clean": float(self.clean[m, e]),
                                "corrupted": float(self.corrupted[m, e]),
                            }
                        )
                continue
            mean, eff, nrm = self.mean(m), self.effect(m), self.normalized(m)
            lo, hi = self.bootstrap_ci(m)
            for c, cell in enumerate(self.cells):
                rows.append(
                    {
                        "metric": name,
                        **self._cell_dict(cell),
                        "mean": float(mean[c]),
                        "effect": float(eff[c]),
                        "normalized": float(nrm[c]),
                        "ci_low": float(lo[c]),
                        "ci_high": float(hi[c]),
                    }
                )
        return pd.DataFrame(rows)

    def summary(self) -> dict[str, Any]:
        """Baselines per metric and the top cells of the first metric (JSON-ready)."""
        return {
            "metrics": {
                name: {
                    "clean": float(self.clean[m].mean()),
                    "corrupted": float(self.corrupted[m].mean()),
                }
                for m, name in enumerate(self.metric_names)
            },
            "alignment": self.alignment,
            "n_examples": int(self.values.shape[-1]),
            "n_cells": len(self.cells),
            "top_cells": self.top_cells(10),
            **self.meta,
        }

    def fig_heatmap(self, metric: str | int = 0, value: str = "normalized") -> go.Figure:
        """Layer-by-position heatmaps, one panel per site (heads: averaged over positions as a
        layer-by-head panel)."""

        return draw("patching_heatmaps", self, metric=metric, value=value)


def _norm(v: Tensor, clean: Tensor, corrupted: Tensor) -> Tensor:
    denom = clean - corrupted
    denom = torch.where(denom.abs() < 1e-12, torch.full_like(denom, float("nan")), denom)
    return (v - corrupted) / denom


# --------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------


def _site_hook(model: Model, site: str, layer: int) -> str:
    return resolve_site(model, "attn_z" if site == "head" else site, layer).hook_name


def patch_sweep(
    model: Model,
    source: Any,
    target: Any,
    sites: Sequence[str] | str = ("resid_pre",),
    layers: Any = None,
    positions: Sequence[PositionLabel] | None = None,
    metric: Metric | Sequence[Metric] | None = None,
    *,
    alignment: str | Mapping[int, int] | None = None,
    heads: Sequence[int] | None = None,
    source_subject: Sequence[tuple[int, int]] | None = None,
    target_subject: Sequence[tuple[int, int]] | None = None,
    cells_per_batch: int | None = None,
    batching: Literal["grow", "stack"] = "grow",
) -> PatchSweep:
    """Patch source activations into the target run, cell by cell, in batched passes.

    Args:
        model: a TransformerLens model.
        source: the run whose activations are patched in ("clean"): prompts, Facts or a
            :class:`~mechlingo.core.tokens.TokenBatch`.
        target: the run that is patched ("corrupted"), same number of rows as ``source``.
        sites: any of :data:`PATCH_SITES`; ``"head"`` patches one head's ``attn_z`` and adds
            the head axis (``heads``, default all).
        layers: layers to sweep (default all; negatives from the end).
        positions: grid positions: ints (non-negative = absolute token index; negative =
            counted back from each row's last real token), ``"last"``, ``"subject_first"``,
            ``"subject_last"``. Default: every position for same-shape inputs, ``[-1]`` under
            ``alignment="last"``, subject first/last and the last token under ``"subject"``.
        metric: a :class:`Metric` or several (all read from the same patched passes); default
            when the source is Facts: :func:`fact_metrics` of the source facts (their answer and
            English answer). For cross-language sweeps pass the metric of the target facts.
        alignment: ``None`` (same shapes), ``"last"``, ``"subject"``, or ``{target: source}``.
        source_subject, target_subject: inclusive subject token spans per row when the inputs
            are not Facts.
        cells_per_batch: patched copies per forward pass (memory grows with it). Default:
            256 with ``batching="grow"`` (a pass holds one example), 32 with ``"stack"`` (a
            pass holds every example that many times).
        batching: ``"grow"`` (default): one pass per example; the target's activations below
            a cell's layer are computed once and the batch grows by that layer's patched
            copies at its block input, so a copy patched at layer ``l`` only computes layers
            ``l`` and above (about half the work of ``"stack"`` over all layers). ``"stack"``:
            every copy runs the whole model, all examples together (for models whose attention
            masks or position embeddings do not broadcast over a batch that grows mid-pass).
            Both give the same numbers.

    Returns:
        A :class:`PatchSweep` with per-example values and the clean/corrupted baselines.

    Raises:
        PatchingError: mismatched rows, unknown sites, positions out of range, lengths that
            differ without an alignment, an unknown ``batching``, or a model that cannot run a
            batch grown mid-pass (the message says to use ``batching="stack"``).
    """
    src, src_spans = _as_batch(model, source, "source")
    tgt, tgt_spans = _as_batch(model, target, "target")
    if src.batch_size != tgt.batch_size:
        raise PatchingError(
            f"source has {src.batch_size} rows and target {tgt.batch_size}; patching pairs "
            "row i of the source with row i of the target"
        )

    if batching == "grow" and not grows_mid_pass(model):
        batching = "stack"  # same numbers; ALiBi biases cannot grow mid-pass (docs/models.md)
    if cells_per_batch is None:
        cells_per_batch = 256 if batching == "grow" else 32
    if cells_per_batch < 1:
        raise PatchingError("cells_per_batch must be >= 1")
    if batching not in ("grow", "stack"):
        raise PatchingError(f"batching must be 'grow' or 'stack', got {batching!r}")
    src_spans = _check_spans(source_subject, src, "source") or src_spans
    tgt_spans = _check_spans(target_subject, tgt, "target") or tgt_spans
    sites = [sites] if isinstance(sites, str) else list(sites)
    if not sites:
        raise PatchingError("no sites to patch")
    for s in sites:
        if s not in PATCH_SITES:
            raise PatchingError(f"unknown patching site {s!r}; use one of {list(PATCH_SITES)}")
    sm = site_map(model)

    layer_list = resolve_layers(model, layers)
    head_list: list[int] = []
    if "head" in sites:
        head_list = list(range(sm.n_heads)) if heads is None else [int(h) for h in heads]
        bad = [h for h in head_list if not 0 <= h < sm.n_heads]
        if bad or not head_list:
            raise PatchingError(f"heads {bad or head_list} invalid: this model has {sm.n_heads}")
    pos = _resolve_positions(positions, alignment, src, tgt, src_spans, tgt_spans)
    if metric is None:
        if isinstance(source, Sequence) and source and hasattr(source[0], "answer"):
            metric = fact_metrics(model, list(source))
        else:
            raise PatchingError("pass a metric (e.g. answer_logprob(model, answers, langs))")
    metrics = [metric] if isinstance(metric, Metric) else list(metric)
    packed = _pack_metrics(metrics, tgt.batch_size)
    B, P = tgt.batch_size, len(pos.labels)

    # Source activations: once, only the hooks and positions the grid needs.
    names = {(s, layer): _site_hook(model, s, layer) for s in sites for layer in layer_list}
    reads = {n: pos.source.T.contiguous() for n in dict.fromkeys(names.values())}
    src_acts, src_final = _read_run(model, src, reads)
    rows = torch.arange(B)
    clean = _evaluate(model, src_final, metrics, packed, rows)

    cells = [
        Cell(s, layer, p, h)
        for s in sites
        for layer in layer_list
        for p in range(P)
        for h in (head_list if s == "head" else [-1])
    ]
    sweep = _sweep_grown if batching == "grow" else _sweep_stacked
    values, corrupted = sweep(
        _Plan(model, tgt, cells, names, src_acts, pos.target, metrics, packed, cells_per_batch)
    )
    kind = (
        "map"
        if isinstance(alignment, Mapping)
        else ("same" if alignment is None else str(alignment))
    )
    return PatchSweep(
        cells=cells,
        metric_names=[m.name for m in metrics],
        values=values,
        clean=clean.cpu(),
        corrupted=corrupted,
        sites=sites,
        layers=layer_list,
        heads=head_list,
        position_labels=pos.labels,
        target_positions=pos.target,
        source_positions=pos.source,
        alignment=kind,
    )


def _cell_values(
    cells: Sequence[Cell], name: str, src_acts: Mapping[str, Tensor], example: Tensor
) -> Tensor:
    """The source activation each cell writes, for the given example of each cell:
    ``[n, width]`` (whole site) or ``[n, d_head]`` (one head)."""
    p_idx = torch.tensor([c.position for c in cells])
    vals = src_acts[name][example, p_idx]  # [n, width] or [n, head, d_head]
    if cells[0].site == "head":
        vals = vals[torch.arange(len(cells)), torch.tensor([c.head for c in cells])]
    return vals


class _Plan(NamedTuple):
    """What a sweep strategy needs: the target batch, the cells in result order, each
    (site, layer)'s hook name, the source activations read at the grid positions, the target
    positions ``[label, row]``, the metrics and their packed token sets, and the cells per pass.
    Each strategy returns ``values [metric, cell, row]`` and ``corrupted [metric, row]``."""

    model: Model
    tgt: TokenBatch
    cells: Sequence[Cell]
    names: Mapping[tuple[str, int], str]
    src_acts: Mapping[str, Tensor]
    tgt_pos: Tensor
    metrics: Sequence[Metric]
    packed: tuple[Tensor, Tensor, list[slice]]
    cells_per_batch: int


def _sweep_stacked(plan: _Plan) -> tuple[Tensor, Tensor]:
    """Every patched copy of every example runs the whole model: ``cells_per_batch`` copies of
    the whole target batch per pass (copy ``j`` carries cell ``j``), plus one unpatched copy
    in the first pass (the corrupted baseline)."""
    model, tgt, cells, names, src_acts, tgt_pos, metrics, packed, cells_per_batch = plan
    B = tgt.batch_size
    rows = torch.arange(B)
    values = torch.empty(len(metrics), len(cells), B)
    corrupted = torch.empty(len(metrics), B)
    for start in range(0, len(cells), cells_per_batch):
        chunk = cells[start : start + cells_per_batch]
        by_hook: dict[str, list[tuple[int, Cell]]] = {}
        for j, cell in enumerate(chunk):
            by_hook.setdefault(names[(cell.site, cell.layer)], []).append((j, cell))
        hooks = []
        for name, items in by_hook.items():
            copy = torch.tensor([j for j, _ in items]).repeat_interleave(B)
            row = rows.repeat(len(items))
            rep = [c for _, c in items for _ in range(B)]
            t_pos = tgt_pos[torch.tensor([c.position for c in rep]), row]
            head = torch.tensor([c.head for c in rep])
            vals = _cell_values(rep, name, src_acts, row)
            hooks.append((name, _writer(copy * B + row, t_pos, head, vals, rep[0].site == "head")))
        extra = 1 if start == 0 else 0
        big = _repeat(tgt, len(chunk) + extra)
        _, final = _read_run(model, big, {}, extra_hooks=hooks)
        ex = rows.repeat(len(chunk) + extra)
        v = _evaluate(model, final, metrics, packed, ex).reshape(len(metrics), -1, B).cpu()
        if extra:
            corrupted = v[:, -1]
        values[:, start : start + len(chunk)] = v[:, : len(chunk)]
    return values, corrupted


def _sweep_grown(plan: _Plan) -> tuple[Tensor, Tensor]:
    """One pass per example and group of ``cells_per_batch`` cells (in layer order). The pass
    starts with the unpatched target alone (row 0, which stays unpatched: the corrupted
    baseline); at the block input ``blocks.{l}.hook_resid_pre`` of each layer ``l`` with
    cells, copies of row 0 are appended, one per cell of that layer, and the cells' hooks
    write into their own rows. So the shared computation below layer ``l`` is done once."""
    model, tgt, cells, names, src_acts, tgt_pos, metrics, packed, cells_per_batch = plan
    B = tgt.batch_size
    values = torch.empty(len(metrics), len(cells), B)
    corrupted = torch.empty(len(metrics), B)
    order = sorted(range(len(cells)), key=lambda i: cells[i].layer)  # stable
    branch = {layer: _site_hook(model, "resid_pre", layer) for layer in {c.layer for c in cells}}
    finals: list[Tensor] = []
    for g, start in enumerate(range(0, len(order), cells_per_batch)):
        group = order[start : start + cells_per_batch]
        # rows of the grown batch: 0 = unpatched, then each layer's copies in layer order
        new_rows: dict[int, int] = {}
        row_of: dict[int, int] = {}
        for i in group:
            row_of[i] = 1 + len(row_of)
            new_rows[cells[i].layer] = new_rows.get(cells[i].layer, 0) + 1
        by_hook: dict[str, list[int]] = {}
        for i in group:
            by_hook.setdefault(names[(cells[i].site, cells[i].layer)], []).append(i)
        for b in range(B):
            hooks: list[tuple[str, Callable]] = [
                (branch[layer], _brancher(n)) for layer, n in sorted(new_rows.items())
            ]  # before the writers: at a shared hook point the copies must exist first
            for name, idx in by_hook.items():
                sel = [cells[i] for i in idx]
                t_pos = tgt_pos[torch.tensor([c.position for c in sel]), b]
                head = torch.tensor([c.head for c in sel])
                vals = _cell_values(sel, name, src_acts, torch.full((len(sel),), b))
                rows = torch.tensor([row_of[i] for i in idx])
                hooks.append((name, _writer(rows, t_pos, head, vals, sel[0].site == "head")))
            finals.append(_grown_final(model, tgt.select([b]), hooks, 1 + len(group)))
        # one readout for the whole group: the unembedding streams W_U once, not per example
        final = torch.cat(finals)
        finals.clear()
        ex = torch.arange(B).repeat_interleave(1 + len(group))
        v = _evaluate(model, final, metrics, packed, ex).cpu().view(len(metrics), B, -1)
        if g == 0:
            corrupted = v[:, :, 0]
        values[:, group] = v[:, :, [row_of[i] for i in group]].transpose(1, 2)
    return values, corrupted


def _brancher(copies: int) -> Callable:
    """A hook appending ``copies`` copies of row 0 (the unpatched run) to the batch."""

    def hook(t: Tensor, hook: Any) -> Tensor:
        return torch.cat([t, t[:1].expand(copies, *t.shape[1:])])

    return hook


def _grown_final(
    model: Model, one: TokenBatch, hooks: Sequence[tuple[str, Callable]], expect_rows: int
) -> Float[Tensor, "row d_model"]:
    """Run the one-row batch ``one`` with the growing hooks; the final residual stream of
    every row of the grown batch at the example's last real token."""
    out: dict[str, Tensor] = {}
    last = int(one.last_index[0])

    def final_hook(t: Tensor, hook: Any) -> None:
        out["final"] = t[:, last].detach()
        raise StopForward

    try:
        run_batch(model, one, [*hooks, (final_resid_name(model), final_hook)])
    except (RuntimeError, ValueError) as e:  # ValueError: transformers' mask-shape checks
        raise PatchingError(
            f"the forward pass failed with a batch grown mid-pass ({e}); if this model's "
            "attention masks or position embeddings do not broadcast over a larger batch, use "
            "patch_sweep(..., batching='stack')"
        ) from e
    if "final" not in out:
        raise RuntimeError(f"hook {final_resid_name(model)} did not fire during the forward pass")
    if out["final"].shape[0] != expect_rows:
        raise PatchingError(
            f"the batch grew to {out['final'].shape[0]} rows instead of {expect_rows}: this "
            "model does not pass a grown batch through; use patch_sweep(..., batching='stack')"
        )
    return out["final"]


def _writer(rows: Tensor, positions: Tensor, heads: Tensor, values: Tensor, per_head: bool):
    """A hook writing ``values`` at ``(rows, positions[, heads])`` of the activation."""
    cache: dict[torch.device, tuple[Tensor, ...]] = {}

    def hook(t: Tensor, hook: Any) -> Tensor:
        if t.device not in cache:
            cache[t.device] = (
                rows.to(t.device),
                positions.to(t.device),
                heads.to(t.device),
                values.to(t.device),
            )
        r, p, h, v = cache[t.device]
        t = t.clone()
        if per_head:
            t[r, p, h] = v.to(t.dtype)
        else:
            t[r, p] = v.to(t.dtype)
        return t

    return hook


# --------------------------------------------------------------------------------------
# Attention knockout
# --------------------------------------------------------------------------------------


@dataclass
class KnockoutResult:
    """The result of :func:`attention_knockout`.

    Attributes:
        windows: ``(first, last)`` inclusive layer windows whose last-token -> key attention
            was blocked.
        metric_name: name of the metric (a probability by default).
        values: ``[window, example]`` metric with the edges blocked.
        base: ``[example]`` metric of the unmodified run.
        keys: which key positions were blocked (``"subject"``, ``"last"``, ...).
    """

    windows: list[tuple[int, int]]
    metric_name: str
    values: Float[Tensor, "window example"]
    base: Float[Tensor, " example"]
    keys: str
    meta: dict[str, Any] = field(default_factory=dict)

    def relative_change(self) -> Float[Tensor, " window"]:
        """``(blocked - base) / base`` of the mean over examples (−0.4 = a 40% drop)."""
        b = self.base.mean()
        return (self.values.mean(-1) - b) / b

    def bootstrap_ci(
        self, *, n_boot: int = 1000, seed: int = 0
    ) -> tuple[Float[Tensor, " window"], Float[Tensor, " window"]]:
        """95% bootstrap interval of :meth:`relative_change` (resampling examples)."""
        n = self.values.shape[-1]
        g = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, n, (n_boot, n), generator=g)
        b = self.base[idx].mean(-1)
        v = self.values[:, idx].mean(-1)
        stat = (v - b) / b
        q = torch.nanquantile(stat, torch.tensor([0.025, 0.975]), dim=-1)
        return q[0], q[1]

    def to_dataframe(self) -> pd.DataFrame:
        import pandas as pd

        rel = self.relative_change()
        lo, hi = self.bootstrap_ci()
        return pd.DataFrame(
            [
                {
                    "first_layer": a,
                    "last_layer": b,
                    "keys": self.keys,
                    "metric": self.metric_name,
                    "blocked_mean": float(self.values[i].mean()),
                    "base_mean": float(self.base.mean()),
                    "relative_change": float(rel[i]),
                    "ci_low": float(lo[i]),
                    "ci_high": float(hi[i]),
                }
                for i, (a, b) in enumerate(self.windows)
            ]
        )

    def fig(self) -> go.Figure:
        """Relative change of the metric per layer window (with the 95% interval)."""

        return draw("knockout_figure", self)


def sliding_windows(n_layers: int, size: int) -> list[tuple[int, int]]:
    """Windows ``(l, min(l + size, n) - 1)`` centred nowhere: one starting at every layer."""
    if size < 1:
        raise PatchingError("window size must be >= 1")
    return [(start, min(start + size, n_layers) - 1) for start in range(n_layers)]


def attention_knockout(
    model: Model,
    facts: Any,
    windows: Sequence[tuple[int, int]] | int | None = None,
    *,
    metric: Metric | None = None,
    keys: str = "subject",
    subject: Sequence[tuple[int, int]] | None = None,
    windows_per_batch: int = 16,
) -> KnockoutResult:
    """Block attention from each prompt's last token to key positions in windows of layers.

    Args:
        model: a TransformerLens model with ``attn.hook_attn_scores``.
        facts: Facts (their subject spans are used), or prompts / a TokenBatch with
            ``subject`` token spans.
        windows: inclusive ``(first, last)`` layer windows, an int window size (one window
            starting at every layer), or ``None`` (size ``max(1, n_layers // 6)``). An empty
            window ``(l, l - 1)`` blocks nothing.
        metric: default the probability of each fact's answer set.
        keys: ``"subject"`` (the subject tokens) or ``"last"`` (the last token itself).

    Returns:
        A :class:`KnockoutResult`; windows are batched ``windows_per_batch`` at a time.
    """
    batch, spans = _as_batch(model, facts, "knockout")
    spans = _check_spans(subject, batch, "knockout") or spans
    n = site_map(model).n_layers
    if windows is None:
        windows = max(1, n // 6)
    if isinstance(windows, int):
        windows = sliding_windows(n, windows)
    windows = [(int(a), int(b)) for a, b in windows]
    for a, b in windows:
        if not (0 <= a < n and -1 <= b < n and b >= a - 1):
            raise PatchingError(f"layer window {(a, b)} is out of range for {n} layers")
    if keys == "subject":
        if spans is None:
            raise PatchingError("keys='subject' needs Facts or subject=[(first, last)] spans")
        key_mask = torch.zeros(batch.tokens.shape, dtype=torch.bool)
        for i, (a, b) in enumerate(spans):
            key_mask[i, a : b + 1] = True
    elif keys == "last":
        key_mask = torch.zeros(batch.tokens.shape, dtype=torch.bool)
        key_mask[torch.arange(batch.batch_size), batch.last_index.cpu()] = True
    else:
        raise PatchingError(f"unknown keys {keys!r}; use 'subject' or 'last'")
    if metric is None:
        if not (isinstance(facts, Sequence) and facts and hasattr(facts[0], "answer")):
            raise PatchingError("pass a metric when the inputs are not Facts")
        metric = answer_logprob(
            model, [f.answer for f in facts], [f.lang for f in facts], name="answer_prob", prob=True
        )
    packed = _pack_metrics([metric], batch.batch_size)
    B = batch.batch_size
    rows = torch.arange(B)
    _, final = _read_run(model, batch, {})
    base = _evaluate(model, final, [metric], packed, rows)[0].cpu()
    values = torch.empty(len(windows), B)
    for start in range(0, len(windows), windows_per_batch):
        chunk = windows[start : start + windows_per_batch]
        C = len(chunk)
        big = _repeat(batch, C)
        last = big.last_index.cpu()
        km = key_mask.repeat(C, 1)
        hooks = []
        for layer in range(n):
            copies = [j for j, (a, b) in enumerate(chunk) if a <= layer <= b]
            if not copies:
                continue
            sel = torch.zeros(C * B, dtype=torch.bool)
            for j in copies:
                sel[j * B : (j + 1) * B] = True
            r = sel.nonzero()[:, 0]
            hooks.append(
                (
                    f"blocks.{layer}.attn.hook_attn_scores",
                    _blocker(r, last[r], km[r]),
                )
            )
        missing = [h for h, _ in hooks if h not in model.hook_dict]
        if missing:
            raise PatchingError(f"this model has no attention-score hooks {missing[:2]}")
        _, final = _read_run(model, big, {}, extra_hooks=hooks)
        v = _evaluate(model, final, [metric], packed, rows.repeat(C))[0]
        values[start : start + C] = v.reshape(C, B).cpu()
    return KnockoutResult(windows, metric.name, values, base, keys)


def _blocker(rows: Tensor, query: Tensor, key_mask: Tensor) -> Callable:
    """Set scores ``[row, :, query[row], key]`` to ``-inf`` where ``key_mask[row, key]``."""

    def hook(t: Tensor, hook: Any) -> Tensor:
        r, q, km = rows.to(t.device), query.to(t.device), key_mask.to(t.device)
        t = t.clone()
        sub = t[r, :, q]  # [n, head, key]
        blocked = km[:, None, : sub.shape[-1]].expand_as(sub)
        t[r, :, q] = sub.masked_fill(blocked, float("-inf"))
        return t

    return hook
