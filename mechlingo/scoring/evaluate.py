"""Greedy generation, and facts scored under many conditions at once.

:func:`evaluate_facts` is the one function every caller scores facts through; ``metric=``
chooses the rule (``"generate"``, the default: the greedy continuation judged by the eval
rule, :func:`mechlingo.core.answers.is_correct`; ``"klar"``; ``"rank"``; see
:mod:`mechlingo.scoring.scorers`). Records a metric cannot use are skipped and counted by
reason in ``EvalResult.skipped``. :func:`evaluate_conditions` scores many conditions sharing
one prefix pass. Generation decodes with a key-value cache (:mod:`mechlingo.activations.decoding`);
prompts of similar lengths share right-padded batches, only each row's newest position is
unembedded, finished rows leave the batch, and ``cache=False`` gives the same tokens
(``docs/concepts.md``, "Generation and the KV cache")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from mechlingo.activations.decoding import decode
from mechlingo.activations.memo import current_memo
from mechlingo.activations.prefix import (
    decode_conditions,
    record_head,
    shared_decoding_supported,
)
from mechlingo.core.defaults import BATCH_SIZE, EARLY_STOP, KV_CACHE, MAX_NEW_TOKENS, PROGRESS
from mechlingo.core.distributed import gather_conditions, share_scoring
from mechlingo.core.errors import InputError
from mechlingo.core.tokens import TokenBatch, encode, prepends_bos, sorted_batches
from mechlingo.core.types import FwdHooks, Model
from mechlingo.interventions.apply import first_edit, intervention_hooks
from mechlingo.interventions.base import Intervention
from mechlingo.scoring.rank import rank_records
from mechlingo.scoring.scorers import (
    GenerationRule,
    Scorer,
    as_scorer,
    generation_rule,
    metric_summary,
    split_usable,
)
from mechlingo.viz.evaluate import accuracy_bars

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from mechlingo.data import Fact


@dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """How facts and prompts are decoded: the one ``decoding=`` argument of
    :func:`greedy_generate`, :func:`generate_conditions`, :func:`evaluate_facts` and
    :func:`evaluate_conditions` (``None`` there: these defaults), checked once, when made.

    Attributes:
        max_new_tokens: greedy tokens per prompt (the ``generate`` rule's length).
        batch_size: prompts per pass.
        progress: show a progress bar.
        cache: decode with a key-value cache (the same tokens without).
        early_stop: stop decoding a fact once its verdict is final.
    """

    max_new_tokens: int = MAX_NEW_TOKENS
    batch_size: int = BATCH_SIZE
    progress: bool = PROGRESS
    cache: bool = KV_CACHE
    early_stop: bool = EARLY_STOP

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InputError(f"batch_size (--batch-size) must be at least 1, got {self.batch_size}")
        if self.max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")


def greedy_generate(
    model: Model,
    prompts: Sequence[str],
    *,
    intervention: Intervention | None = None,
    fwd_hooks: FwdHooks = (),
    stop_at_newline: bool = True,
    stop: Callable[[int, str], bool] | None = None,
    decoding: DecodeOptions | None = None,
) -> list[str]:
    """Greedy continuations of ``prompts`` (the generated text only), as
    :func:`generate_conditions` gives them.

    With or without the key-value cache, batched or alone, the tokens are the same
    (``docs/concepts.md``, "Generation and the KV cache").

    Args:
        intervention: applied at every step; ``"last"`` is the prompt's last token (acted on
            in the prompt pass), ``"generated"`` the tokens generated so far.
        fwd_hooks: extra plain TransformerLens hooks, applied at every pass. Under the cache
            they see ``[batch, 1, ...]`` activations after the prompt pass (see
            :mod:`mechlingo.activations.decoding` for hooks that index positions).
        stop_at_newline: stop a row once it has produced a line break after some text.
        stop: ``stop(i, text)`` -> whether prompt ``i`` may stop with its continuation
            ``text`` so far (e.g. once the eval rule's verdict is final,
            :func:`~mechlingo.core.answers.decided`).
        decoding: :class:`DecodeOptions` (``max_new_tokens``: new tokens per prompt at most;
            ``batch_size``: prompts per pass; ``cache``: decode with a key-value cache where
            the model supports it, :func:`mechlingo.activations.decoding.kv_cache_path`;
            ``early_stop`` does not apply); ``None``: its defaults.

    Returns:
        One string per prompt, in input order.
    """
    gens, _ = generate_conditions(model, prompts, [intervention], fwd_hooks=fwd_hooks,
                                  stop_at_newline=stop_at_newline, stop=stop, shared=False,
                                  decoding=decoding)  # fmt: skip
    return gens[0]


def _shared_groups(
    batch: TokenBatch, ivs: Sequence[Intervention | None], max_rows: int
) -> list[tuple[int, list[int]]]:
    """The conditions of one batch as ``(d, conditions)`` groups that decode together: those
    that leave every row's positions before its last ``d`` unedited (``d`` below every row's
    length) share the prefix of the largest such ``d``, the others (``d = 0``) run every
    position; each group at most ``max_rows`` stacked rows."""
    n = batch.lengths
    short = int(n.min())
    tails = [int((n - torch.minimum(first_edit(iv, batch).to(n.device), n - 1)).max())
             for iv in ivs]  # fmt: skip
    pos = [c for c, t in enumerate(tails) if t < short]
    full = [c for c, t in enumerate(tails) if t >= short]
    per = max(1, max_rows // batch.batch_size)
    out = []
    for d, conds in ((max((tails[c] for c in pos), default=0), pos), (0, full)):
        out.extend((d, conds[i : i + per]) for i in range(0, len(conds), per))
    return out


def _decode_batch(
    model: Model, sub: TokenBatch, ivs: Sequence[Intervention | None], hooks: list[list],
    done: Callable[[int, list[int]], bool] | None, opts: dict[str, Any],
) -> tuple[list[list[list[int]]], bool]:  # fmt: skip
    """One batch's new tokens under every condition (``out[c][r]``) and whether they came
    from a shared prefix (:func:`decode_conditions`) or one condition at a time."""
    n_new, eos = opts["max_new_tokens"], opts["eos"]
    shared = opts["shared"] and len(ivs) > 1 and shared_decoding_supported(model, sub, n_new)
    if not shared:
        stop = None if done is None else (lambda r, ids: done(r, ids))
        outs = [decode(model, sub, max_new_tokens=n_new, fwd_hooks=h, stop=stop, eos=eos,
                       cache=opts["cache"]) for h in hooks]  # fmt: skip
        return outs, False
    outs: list[list[list[int]]] = [[] for _ in ivs]
    groups = _shared_groups(sub, ivs, opts["max_rows"])
    d_max = max(d for d, _ in groups)
    memo = current_memo()  # a caller that scores these prompts again keeps the pass
    rec = None
    if d_max > 0:
        rec = memo.record(model, sub, d_max) if memo else record_head(model, sub, d_max)
    for d, conds in groups:
        got = decode_conditions(
            model, sub, [hooks[c] for c in conds], d, max_new_tokens=n_new, eos=eos,
            stop=None if done is None else (lambda c, r, ids: done(r, ids)),
            record=rec if d > 0 else None,
        )  # fmt: skip
        for c, rows in zip(conds, got, strict=True):
            outs[c] = rows
    return outs, True


def generate_conditions(
    model: Model,
    prompts: Sequence[str],
    interventions: Sequence[Intervention | None],
    *,
    fwd_hooks: FwdHooks = (),
    stop_at_newline: bool = True,
    stop: Callable[[int, str], bool] | None = None,
    shared: bool = True,
    max_rows: int | None = None,
    decoding: DecodeOptions | None = None,
) -> tuple[list[list[str]], str]:
    """Greedy continuations of ``prompts`` under each of ``interventions`` (``None``: no
    intervention): ``gens[c][i]`` is what :func:`greedy_generate` gives prompt ``i`` under
    intervention ``c`` (the same tokens; tested), and the path they took.

    With ``shared`` (and a cache that can grow, :func:`mechlingo.activations.decoding.
    shared_decoding_supported`), each batch of prompts runs the positions before the first
    one any condition edits (:func:`first_edit`) once, and the conditions continue from that
    cache stacked in batches of at most ``max_rows`` rows (default ``max(batch_size,
    256)``): the path ``"shared-prefix"``. Otherwise, with extra ``fwd_hooks`` (plain hooks
    whose positions are unknown), one condition or ``cache=False``, each condition decodes
    alone as in :func:`greedy_generate`: ``"per-condition"`` (``"mixed"`` when batches
    differ). Inside :func:`mechlingo.core.distributed.sharded_scoring` under torchrun
    the batches are shared out among the ranks and the results gathered in order.
    ``decoding``: :class:`DecodeOptions` (``max_new_tokens``, ``batch_size``, ``progress``
    and ``cache``; ``None``: its defaults).
    """
    prompts = list(prompts)
    if not prompts:
        raise InputError("no prompts to generate from")
    o = decoding or DecodeOptions()
    max_new_tokens, batch_size, progress, cache = (
        o.max_new_tokens,
        o.batch_size,
        o.progress,
        o.cache,
    )
    ivs = list(interventions)
    hooks = [intervention_hooks(model, iv, fwd_hooks) for iv in ivs]
    batch = encode(model, prompts)
    chunks = sorted_batches(batch.lengths, batch_size)
    opts = {"max_new_tokens": max_new_tokens, "eos": getattr(model.tokenizer, "eos_token_id", None),
            "cache": cache, "shared": shared and cache and not fwd_hooks,
            "max_rows": max_rows or max(batch_size, 256)}  # fmt: skip

    def done(row: int, ids: list[int]) -> bool:
        text = model.tokenizer.decode(ids)
        if stop_at_newline and "\n" in text and bool(text.strip()):
            return True
        return stop is not None and stop(row, text)

    # under torchrun: batches shared by cost, or (fewer batches than ranks) the conditions
    cost = [len(rows) * (max(int(batch.lengths[r]) for r in rows) + max_new_tokens)
            for rows in chunks]  # fmt: skip
    mine, conds = share_scoring(cost, len(ivs))
    by_condition = len(conds) < len(ivs)
    local: dict[int, list[tuple[list[int], list[list[int]], bool]]] = {c: [] for c in conds}
    for rows in tqdm([chunks[i] for i in mine] if conds else [], desc="generating",
                     disable=not progress):  # fmt: skip
        stop_fn = (
            (lambda r, ids, rows=rows: done(rows[r], ids)) if (stop_at_newline or stop) else None
        )
        sub = [ivs[c] for c in conds], [hooks[c] for c in conds]
        outs, was_shared = _decode_batch(model, batch.select(rows), *sub, stop_fn, opts)
        for c, per in zip(conds, outs, strict=True):
            local[c].append((rows, per, was_shared))
    per_cond = gather_conditions(local, len(ivs), by_condition)
    gens = [[""] * len(prompts) for _ in ivs]
    for c, got in enumerate(per_cond):
        for rows, per, _ in got:
            for r, ids in zip(rows, per, strict=True):
                gens[c][r] = model.tokenizer.decode(ids)
    got = [x for part in per_cond for x in part]
    flags = {was for _, _, was in got}
    path = "mixed" if len(flags) > 1 else ("shared-prefix" if flags == {True} else "per-condition")
    return gens, path


@dataclass
class EvalResult:
    """Accuracy over facts under one metric (``meta["metric"]``; greedy generation by
    default).

    ``records`` holds one dict per scored fact: ``id``, ``relation``, ``lang``, ``prompt``
    (the text the model was given), ``answer``, ``generation`` (first line of the
    continuation; under ``klar`` the whole stripped continuation; under ``rank`` the
    best-scoring candidate), ``correct``, and ``in_english`` (for non-English prompts: the
    model gave the English answer instead of the target-language one). Under ``rank`` also
    ``candidates``, ``scores`` (mean token cross-entropy per candidate, nats; lower is
    better), ``ranking`` (candidate indices, best first), ``gold_rank`` (1 = a gold
    candidate scored best) and ``n_tokens``; under ``klar`` also ``shots``.

    ``skipped`` counts the facts the metric could not score, by reason (they have no
    record). ``continuations`` (generation metrics; ``None`` under ``rank`` and in a result
    read back from its records) holds each record's greedy continuation as decoded, before
    the first-line cut (to the stop rule, or to the decision under ``early_stop``): what a
    caller reads besides the verdict, e.g. the trace's flags of what an answer did. It is no
    part of the result's equality.
    """

    records: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    continuations: list[str] | None = field(default=None, compare=False, repr=False)

    @property
    def scorer(self) -> Scorer:
        """The scorer these records were scored with (``generate`` for older results)."""
        m = self.meta.get("metric") or {}
        return Scorer(
            str(m.get("metric", "generate")),
            str(m.get("rank_tokens", "sentence")),
            int(m.get("klar_shots", 3)),
        )

    def metric_summary(self) -> dict[str, Any]:
        """The metric's own statistics (rank: P@1, gold rank, RankC; klar: CLC), see
        :func:`mechlingo.scoring.scorers.metric_summary`."""
        return metric_summary(self.records, self.scorer)

    def accuracy(self) -> dict[str, float]:
        """Fraction correct per language (``{lang: x}``)."""
        out: dict[str, list[bool]] = {}
        for r in self.records:
            out.setdefault(r["lang"], []).append(bool(r["correct"]))
        return {lg: sum(v) / len(v) for lg, v in sorted(out.items())}

    def english_rate(self) -> dict[str, float]:
        """Fraction of answers given in English instead of the prompt's language."""
        out: dict[str, list[bool]] = {}
        for r in self.records:
            out.setdefault(r["lang"], []).append(bool(r["in_english"]))
        return {lg: sum(v) / len(v) for lg, v in sorted(out.items())}

    def to_dataframe(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.records)

    def fig_accuracy(self, title: str = "Greedy accuracy per language") -> go.Figure:
        """Bars of :meth:`accuracy` per language (the title gives the facts per language)."""
        per_lang: dict[str, int] = {}
        for r in self.records:
            per_lang[r["lang"]] = per_lang.get(r["lang"], 0) + 1
        return accuracy_bars({"accuracy": self.accuracy()}, title, n=list(per_lang.values()))

    def _repr_html_(self) -> str:
        acc = self.accuracy()
        cells = "".join(f"<tr><td>{lg}</td><td>{x:.2f}</td></tr>" for lg, x in acc.items())
        return f"<b>EvalResult</b> ({len(self.records)} facts)<table>{cells}</table>"


def evaluate_facts(
    model: Model,
    facts: Sequence[Fact],
    *,
    intervention: Intervention | None = None,
    metric: str | Scorer = "generate",
    prompts: Sequence[str] | None = None,
    prefixes: Sequence[str] | None = None,
    pool: Sequence[Fact] | None = None,
    fwd_hooks: FwdHooks = (),
    decoding: DecodeOptions | None = None,
) -> EvalResult:
    """Score the model on facts with ``metric`` (the eval rule by default), under
    ``intervention`` (default none).

    Args:
        metric: ``"generate"``, ``"klar"``, ``"rank"`` or a
            :class:`~mechlingo.scoring.scorers.Scorer` with options.
        prompts: (``generate`` only) prompts to use instead of each fact's zero-shot
            ``prompt`` (e.g. few-shot prompts); the answers are still the facts' answers.
        prefixes: text before each fact's query (few-shot demonstrations): ``generate``
            continues ``prefix + prompt``; ``rank`` scores the query's tokens only. Not for
            ``klar``, which draws its own demonstrations.
        pool: (``klar``) the facts demonstrations are drawn from (default: ``facts``
            themselves, other ids, as the benchmark's reference code does).
        fwd_hooks: extra plain TransformerLens hooks, applied at every pass.
        decoding: :class:`DecodeOptions` (``None``: its defaults): ``max_new_tokens``, the
            tokens of the ``generate`` rule (``klar`` always decodes the benchmark's 10);
            ``batch_size``, prompts per pass (``rank``: facts per pass, all their candidates
            together); ``progress``; ``cache`` (see :func:`greedy_generate`); ``early_stop``,
            stop decoding a fact once its verdict is final
            (:func:`~mechlingo.core.answers.decided`): the same verdicts, in less time;
            ``generation`` then holds the decided prefix.

    Raises:
        InputError: no facts, every fact skipped by the metric, or options that do not go
            with the metric.
    """
    return evaluate_conditions(model, facts, {"": intervention}, metric=metric, prompts=prompts,
                               prefixes=prefixes, pool=pool, fwd_hooks=fwd_hooks, shared=False,
                               decoding=decoding)[""]  # fmt: skip


def evaluate_conditions(
    model: Model,
    facts: Sequence[Fact],
    conditions: Mapping[str, Intervention | None],
    *,
    metric: str | Scorer = "generate",
    prompts: Sequence[str] | None = None,
    prefixes: Sequence[str] | None = None,
    pool: Sequence[Fact] | None = None,
    fwd_hooks: FwdHooks = (),
    shared: bool = True,
    decoding: DecodeOptions | None = None,
) -> dict[str, EvalResult]:
    """Score ``facts`` under every condition of ``conditions`` (``{name: intervention or
    None}``, e.g. ``{"orig": None, "task": iv1, "both": iv1 + iv2}``) at once: ``{name:
    EvalResult}``, each equal to :func:`evaluate_facts` with that intervention (the same
    records; tested), in much less time when there are several.

    Under ``generate`` and ``klar`` each batch of prompts computes the positions before the
    first one any condition edits once (the interventions' position rules say where:
    :func:`first_edit`; ``"last"`` steering shares all but the last prompt token), and the
    conditions decode from that shared cache several per batch
    (:func:`generate_conditions`). Where the model's cache cannot grow a batch, with plain
    ``fwd_hooks``, ``cache=False`` or ``shared=False``, every condition runs alone. Each
    result's ``meta["path"]`` says which: ``"shared-prefix"``, ``"per-condition"`` or
    ``"mixed"`` (batches differed). ``rank`` runs each batch's candidate stems once for
    every condition (cut before the earliest position any condition edits) and each
    condition's candidate tails on them (``"shared-stem"``). The options are those of
    :func:`evaluate_facts`, ``decoding`` among them (:class:`DecodeOptions`).

    Raises:
        InputError: no conditions, or what :func:`evaluate_facts` raises.
    """
    if not conditions:
        raise InputError("no conditions to score")
    o = decoding or DecodeOptions()
    return _evaluate(model, facts, dict(conditions), metric=metric, prompts=prompts,
                     prefixes=prefixes, pool=pool, max_new_tokens=o.max_new_tokens,
                     batch_size=o.batch_size, fwd_hooks=fwd_hooks, progress=o.progress,
                     cache=o.cache, early_stop=o.early_stop, shared=shared)  # fmt: skip


def _evaluate(
    model: Model,
    facts: Sequence[Fact],
    conditions: dict[str, Intervention | None],
    *,
    metric: str | Scorer,
    prompts: Sequence[str] | None,
    prefixes: Sequence[str] | None,
    pool: Sequence[Fact] | None,
    max_new_tokens: int,
    **kw: Any,
) -> dict[str, EvalResult]:
    """:func:`evaluate_conditions` (and :func:`evaluate_facts`, one condition)."""
    scorer = as_scorer(metric)
    facts = list(facts)
    if not facts:
        raise InputError("no facts selected for evaluation")
    for name, given in (("prompts", prompts), ("prefixes", prefixes)):
        if given is not None and len(given) != len(facts):
            raise InputError(f"{len(given)} {name} for {len(facts)} facts")
    if prompts is not None and (prefixes is not None or scorer.metric != "generate"):
        raise InputError("prompts= replaces generation prompts (generate only); use prefixes=")
    if prefixes is not None and scorer.metric == "klar":
        raise InputError("klar draws its own demonstrations (pool=); prefixes= does not apply")
    keep, skipped = split_usable(facts, scorer.metric, bos=prepends_bos(model), prefixes=prefixes)
    sub = [facts[i] for i in keep]
    names, ivs = list(conditions), list(conditions.values())
    gens: list[list[str]] | list[None] = [None] * len(ivs)
    if scorer.metric != "rank":  # generate (the default) or klar
        texts = [(prefixes[i] if prefixes else "") + facts[i].prompt for i in keep]
        if prompts is not None:
            texts = [prompts[i] for i in keep]
        rule = generation_rule(
            scorer, sub, texts, facts if pool is None else pool,
            max_new_tokens=max_new_tokens, early_stop=kw.pop("early_stop"),
        )  # fmt: skip
        per, path, gens = _generate_records(model, sub, rule, ivs, **kw)
    else:
        pre = [prefixes[i] for i in keep] if prefixes is not None else None
        per, path = rank_records(model, sub, ivs, prefixes=pre, tokens=scorer.rank_tokens,
                                 fwd_hooks=kw["fwd_hooks"], batch_size=kw["batch_size"],
                                 progress=kw["progress"], shared=kw["shared"] and kw["cache"])  # fmt: skip
    meta = {"max_new_tokens": max_new_tokens, "metric": scorer.to_json()}
    if kw["shared"]:  # evaluate_conditions says which path it took
        meta["path"] = path
    return {n: EvalResult(r, dict(meta), dict(skipped), g)
            for n, r, g in zip(names, per, gens, strict=True)}  # fmt: skip


def _generate_records(
    model: Model,
    facts: list[Fact],
    rule: GenerationRule,
    ivs: list[Intervention | None],
    **kw: Any,
) -> tuple[list[list[dict[str, Any]]], str, list[list[str]]]:
    """A generation metric's records under every condition: ``rule.record(fact, text,
    generation)`` of each fact's greedy continuation of its text (:func:`generate_conditions`
    with the rule's length, line-break and early-stop settings and ``kw``), the path they
    took and the continuations themselves."""
    decoding = DecodeOptions(max_new_tokens=rule.max_new_tokens, batch_size=kw.pop("batch_size"),
                             progress=kw.pop("progress"), cache=kw.pop("cache"))  # fmt: skip
    gens, path = generate_conditions(model, rule.texts, ivs, stop_at_newline=rule.stop_at_newline,
                                     stop=rule.stop, decoding=decoding, **kw)  # fmt: skip
    records = [[rule.record(*x) for x in zip(facts, rule.texts, per, strict=True)] for per in gens]
    return records, path, gens
