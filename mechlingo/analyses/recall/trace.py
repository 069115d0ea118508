"""The recall pipeline tracer: where does factual recall in language L succeed or fail?

Lu et al. (2025) describe multilingual factual recall as a pipeline: the query is read, the
fact is recalled with the English mechanism (the English answer becomes decodable by the logit
lens in the middle layers), and the last layers convert it into the prompt's language.
:func:`trace_recall` puts every query into one of six classes (``correct``,
``wrong_language``, ``translation_failure``, ``recall_failure``, ``shared_form``, ``other``:
:mod:`mechlingo.analyses.recall.classes`) and flags its answer
(:func:`~mechlingo.data.fact_answers.answer_flags`) by combining the
greedy answer (:func:`mechlingo.scoring.evaluate.evaluate_facts`) with the logit lens on the
same prompt (:func:`mechlingo.analyses.decoders.lens.lens_facts`), as a :class:`TraceResult`.
:func:`run_trace` is the whole ``mechlingo trace`` (:class:`TraceRun`): the trace, the
per-language patching (:mod:`mechlingo.analyses.recall.trace_patching`) and the measured
circuits (:mod:`mechlingo.analyses.recall.trace_circuit`). The classes and what
the embedded model shows: ``docs/methods/recall-pipeline.md``."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from mechlingo.analyses.decoders.lens import LensResult, logit_lens
from mechlingo.analyses.recall.classes import (
    CLASSES,
    classify,
    failure_split,
    flag_counts,
)
from mechlingo.analyses.recall.patching import (
    PatchingError,
)
from mechlingo.analyses.recall.trace_circuit import TraceCircuit, trace_circuit
from mechlingo.analyses.recall.trace_options import TraceOptions
from mechlingo.analyses.recall.trace_patching import (
    LanguagePatching,
    patch_language,
    pipeline_phases,
    unpatched_reason,
)
from mechlingo.analyses.results import WritesFolder
from mechlingo.core.defaults import BATCH_SIZE, MAX_NEW_TOKENS, PROGRESS
from mechlingo.core.errors import InputError
from mechlingo.core.jsonable import jsonable
from mechlingo.core.sites import site_map
from mechlingo.core.tokens import prepends_bos
from mechlingo.core.types import Model
from mechlingo.data.fact_answers import trace_answers
from mechlingo.kernels.significance import bootstrap_mean, wilson
from mechlingo.scoring.evaluate import DecodeOptions, EvalResult, evaluate_facts
from mechlingo.scoring.scorers import skip_reason, split_usable
from mechlingo.viz.trace import class_fractions_figure, class_profiles_figure

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from mechlingo.data import Fact


def default_mid_layers(n_layers: int) -> list[int]:
    """Lens entries ``n // 3 .. n - 2`` (entry ``l`` = after ``l`` blocks): from the end of the
    first third (before it the lens reads mostly the input tokens) up to the entry that still
    has the last two blocks ahead of it (the last blocks do the conversion to the output
    language, so decoding there is not "mid-network"). For an 18-layer model: 6..16.

    Not a steering grid: the layers the steering vectors are tried at are
    :func:`mechlingo.core.sites.every_second_layer` (``steer eval``) and
    :func:`~mechlingo.core.sites.layers_at` (the transfer matrix, the card)."""
    return list(range(n_layers // 3, n_layers - 1))


@dataclass
class TraceResult:
    """The recall pipeline per query.

    Attributes:
        records: one dict per fact: ``id``, ``lang``, ``prompt``, ``answer``, ``answer_en``,
            ``generation``, ``correct``, ``class``, ``answered_in`` (language of a
            wrong-language answer), ``first_en_layer`` / ``first_answer_layer`` (first lens
            entry where the English / L answer reaches rank <= ``max_rank``, -1 if never; the
            output entry counts for the L answer only), ``en_decodable_mid``,
            ``answer_decodable_mid`` (reached rank <= ``max_rank`` inside the middle window),
            ``best_en_rank_mid``, ``final_answer_rank``, and ``gold_rank`` (the gold
            candidate's rank under candidate ranking, 1 = best; ``None`` for facts without
            candidates); the answer's flags ``shared_form`` (written as the English answer),
            ``continues_prompt`` (glued onto the prompt's last word), ``echoes_subject``
            ``decided_at`` and ``generation_lang``
            (:func:`~mechlingo.data.fact_answers.answer_flags`).
        lens: the logit lens on the same prompts (tracks ``answer`` and ``en``).
        eval: the greedy evaluation.
        max_rank, mid_layers: the parameters of the classification.
    """

    records: list[dict[str, Any]]
    lens: LensResult
    eval: EvalResult
    max_rank: int
    mid_layers: list[int]
    n_layers: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def langs(self) -> list[str]:
        return list(dict.fromkeys(r["lang"] for r in self.records))

    def classes(self) -> list[str]:
        return [r["class"] for r in self.records]

    def counts(self) -> dict[str, dict[str, int]]:
        """``{lang: {class: count}}`` (every class present, zeros included)."""
        out = {lg: dict.fromkeys(CLASSES, 0) for lg in self.langs}
        for r in self.records:
            out[r["lang"]][r["class"]] += 1
        return out

    def fractions(self) -> dict[str, dict[str, float]]:
        """``{lang: {class: fraction of that language's queries}}``."""
        out = {}
        for lg, c in self.counts().items():
            n = sum(c.values())
            out[lg] = {k: v / n for k, v in c.items()}
        return out

    def headline_layers(self) -> dict[str, dict[str, float | None]]:
        """Per language, the median first lens entry where the English answer / the L answer
        reach rank <= ``max_rank`` (over the queries where they do), and the share of queries
        whose English answer is decodable mid-network."""
        out: dict[str, dict[str, float | None]] = {}
        for lg in self.langs:
            rs = [r for r in self.records if r["lang"] == lg]
            en = [r["first_en_layer"] for r in rs if r["first_en_layer"] >= 0]
            ans = [r["first_answer_layer"] for r in rs if r["first_answer_layer"] >= 0]
            out[lg] = {
                "median_first_en_layer": float(statistics.median(en)) if en else None,
                "median_first_answer_layer": float(statistics.median(ans)) if ans else None,
                "en_decodable_mid": sum(r["en_decodable_mid"] for r in rs) / len(rs),
                "accuracy": sum(r["correct"] for r in rs) / len(rs),
            }
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-ready headline: class counts and fractions per language, headline layers, the
        flagged answers per language (``flags``), the recall and translation failures and
        the recall share among them per language, without and with the flagged answers
        (``failure_split``, :func:`mechlingo.analyses.recall.classes.failure_split`), and
        the classification parameters."""
        return {
            "classification": self.counts(),
            "fractions": self.fractions(),
            "layers": self.headline_layers(),
            "max_rank": self.max_rank,
            "mid_layers": [self.mid_layers[0], self.mid_layers[-1]] if self.mid_layers else [],
            "n_layers": self.n_layers,
            "n_queries": {lg: sum(c.values()) for lg, c in self.counts().items()},
            "flags": flag_counts(self.records),
            "failure_split": {
                "without_flagged": failure_split(self.records),
                "with_flagged": failure_split(self.records, keep_flagged=True),
            },
            **({"gold_rank_by_class": self.gold_rank_by_class()} if self._ranked() else {}),
            **self.meta,
        }

    def _ranked(self) -> bool:
        return any(r.get("gold_rank") is not None for r in self.records)

    def gold_rank_by_class(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per language and class, the gold candidate's mean rank under candidate ranking
        (1 = best) with a bootstrap interval and ``n`` (facts with candidates only), as
        :meth:`~mechlingo.kernels.significance.Interval.to_json` dicts."""
        out: dict[str, dict[str, list[int]]] = {}
        for r in self.records:
            if r.get("gold_rank") is not None:
                out.setdefault(r["lang"], {}).setdefault(r["class"], []).append(r["gold_rank"])
        return {
            lg: {c: bootstrap_mean(v).to_json() for c, v in by.items()}
            for lg, by in sorted(out.items())
        }

    def to_dataframe(self) -> pd.DataFrame:
        """One row per query (the records)."""
        import pandas as pd

        return pd.DataFrame(self.records)

    def profile(self) -> pd.DataFrame:
        """Layer profile per (language, class, track): median rank and interquartile range,
        mean of log10(rank + 1) with its standard deviation, mean probability, count."""
        import pandas as pd

        rows = []
        cls = self.classes()
        langs = self.lens.langs
        for t_name in ("en", "answer"):
            t = self.lens.track_index(t_name)
            rank = self.lens.rank[:, :, t].float()
            prob = self.lens.logprob[:, :, t].exp()
            for lg in self.langs:
                for c in CLASSES:
                    idx = [i for i in range(len(cls)) if cls[i] == c and langs[i] == lg]
                    if not idx:
                        continue
                    sel = torch.tensor(idx)
                    r, p = rank[:, sel], prob[:, sel]
                    q = torch.quantile(r, torch.tensor([0.25, 0.5, 0.75]), dim=1)
                    lr = torch.log10(r + 1)
                    for li, layer in enumerate(self.lens.layers):
                        rows.append(
                            {
                                "lang": lg,
                                "class": c,
                                "track": t_name,
                                "layer": layer,
                                "median_rank": float(q[1, li]),
                                "q25_rank": float(q[0, li]),
                                "q75_rank": float(q[2, li]),
                                "mean_log_rank": float(lr[li].mean()),
                                "std_log_rank": float(lr[li].std()) if len(idx) > 1 else 0.0,
                                "mean_prob": float(p[li].mean()),
                                "n": len(idx),
                            }
                        )
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------ figures
    def fig_class_fractions(self) -> go.Figure:
        """Stacked bars: share of each class per language."""

        return class_fractions_figure(self.counts())

    def fig_profiles(self, langs: Sequence[str] | None = None) -> go.Figure:
        """Latent-language curves per class: median rank (log scale, IQR band) of the English
        and the L answer per lens entry, one panel per class, pooled over ``langs``."""

        if langs is None:
            langs = [lg for lg in self.langs if lg != "en"] or self.langs
        lens = self.lens
        return class_profiles_figure(
            lens.rank[:, :, lens.track_index("en")],
            lens.rank[:, :, lens.track_index("answer")],
            classes=self.classes(),
            prompt_langs=lens.langs,
            layers=lens.layers,
            langs=langs,
            max_rank=self.max_rank,
        )

    def _repr_html_(self) -> str:
        counts = self.counts()
        head = "".join(f"<th>{c}</th>" for c in CLASSES)
        body = "".join(
            f"<tr><td>{lg}</td>" + "".join(f"<td>{c[k]}</td>" for k in CLASSES) + "</tr>"
            for lg, c in counts.items()
        )
        return f"<b>TraceResult</b><table><tr><th>lang</th>{head}</tr>{body}</table>"


#: The rule of :func:`trace_recall`'s classes (:func:`mechlingo.analyses.recall.classes.classify`).
_classify = classify


def _usable(model: Model, facts: Sequence[Fact], langs: Sequence[str] | None, max_rank: int,
            metric: str) -> tuple[list[Fact], dict[str, int], list[Fact]]:  # fmt: skip
    """The facts :func:`trace_recall` scores (of ``langs``, usable by ``metric``), the
    skipped ones counted by reason, and those of them candidate ranking can score (the gold
    candidate's rank of each is reported).

    Raises:
        InputError: no fact left, a negative ``max_rank`` or an unknown ``metric``."""
    facts = [f for f in facts if langs is None or f.lang in set(langs)]
    if not facts:
        raise InputError(
            "no facts to trace" + (f" in languages {list(langs)}" if langs is not None else "")
        )
    if max_rank < 0:
        raise InputError("max_rank must be >= 0")
    if metric not in ("generate", "rank"):
        raise InputError(f"trace metric must be 'generate' or 'rank', got {metric!r}")
    bos = prepends_bos(model)
    keep, skipped = split_usable(facts, metric, bos=bos)
    facts = [facts[i] for i in keep]
    if not facts:
        raise InputError(f"no fact can be scored with {metric!r}", fix="give facts with "
                         "candidates for rank (mechlingo.data.candidates.with_candidates)")  # fmt: skip
    return facts, skipped, [f for f in facts if skip_reason(f, "rank", bos=bos) is None]


def trace_recall(
    model: Model,
    facts: Sequence[Fact],
    langs: Sequence[str] | None = None,
    *,
    max_rank: int = 10,
    mid_layers: Sequence[int] | None = None,
    max_new_tokens: int = MAX_NEW_TOKENS,
    batch_size: int = BATCH_SIZE,
    pool: Sequence[Fact] | None = None,
    progress: bool = PROGRESS,
    metric: str = "generate",
) -> TraceResult:
    """Classify each query into the recall-pipeline classes (``correct``, ``wrong_language``,
    ``translation_failure``, ``recall_failure``, ``shared_form``, ``other``:
    :func:`mechlingo.analyses.recall.classes.classify`) and flag what its answer did.

    Args:
        model: a TransformerLens model.
        facts: the queries.
        langs: keep only facts in these languages (default all given).
        max_rank: an answer counts as *decodable* at a lens entry when its best token has rank
            <= ``max_rank`` (0 = top-1; why 10: ``docs/methods/recall-pipeline.md``).
        mid_layers: the lens entries that count as "mid-network" (default
            :func:`default_mid_layers`: the middle third up to the entry before the last two
            blocks).
        max_new_tokens: greedy tokens for the eval rule.
        pool: more facts (other languages of the same ids) used to recognise answers given in
            the wrong language; the bundled data is used as well when the ids come from it.
        metric: what makes a query ``correct``: ``"generate"`` (the greedy answer matches) or
            ``"rank"`` (a gold candidate ranks first; every fact needs candidates, and no
            query is ``wrong_language``: the candidates are in L). The classes of the wrong
            queries keep the lens rule either way.

    Returns:
        A :class:`TraceResult`; each record also has ``first_mismatch_en_layer``: the first
        lens entry where *another* fact's English answer (the next id of the same relation,
        :func:`mismatched_english`) reaches rank <= ``max_rank`` before the output, -1 never
        or when the relation has no other fact with a distinct English answer: the control
        of ``first_en_layer`` (a lens that surfaces any English city name is no evidence);
        and :func:`~mechlingo.data.fact_answers.answer_flags`: ``shared_form``,
        ``continues_prompt``, ``echoes_subject`` and ``decided_at`` (the prefix of
        ``generation``, the whole greedy first line, at which the verdict was decided).
    """
    facts, skipped, ranked = _usable(model, facts, langs, max_rank, metric)
    n = site_map(model).n_layers
    mid = default_mid_layers(n) if mid_layers is None else sorted({int(x) for x in mid_layers})
    if not mid or any(not 0 <= x <= n for x in mid):
        raise InputError(f"mid_layers must be a non-empty subset of lens entries 0..{n}")
    decoding = DecodeOptions(max_new_tokens=max_new_tokens, batch_size=batch_size,
                             progress=progress, early_stop=False)  # the whole answer  # fmt: skip
    ev = evaluate_facts(model, facts, metric=metric, decoding=decoding)
    wrong = [None if r["correct"] or metric == "rank" else r["generation"] for r in ev.records]
    answers = trace_answers(facts, wrong, pool, ev.continuations)
    lens = logit_lens(model, [f.prompt for f in facts], answers.tracks,
                      langs=[f.lang for f in facts], ids=[f.id for f in facts],
                      batch_size=batch_size, progress=progress)  # fmt: skip
    if metric == "rank":
        ranking = ev.records
    elif ranked:  # the gold candidate's rank of the facts that have candidates
        ranking = evaluate_facts(model, ranked, metric="rank", decoding=decoding).records
    else:
        ranking = []
    gold_rank = {(r["id"], r["lang"]): int(r["gold_rank"]) for r in ranking}
    first_mis = lens.first_layer_within("mismatch_en", max_rank, before_last=True)
    en_t, l_t = lens.track_index("en"), lens.track_index("answer")
    entries = torch.tensor(lens.layers)
    in_mid = torch.tensor([e in set(mid) for e in lens.layers])
    en_rank, l_rank = lens.rank[:, :, en_t], lens.rank[:, :, l_t]
    first_en = lens.first_layer_within("en", max_rank, before_last=True)
    first_l = lens.first_layer_within("answer", max_rank)
    records = []
    for i, (f, r) in enumerate(zip(facts, ev.records, strict=True)):
        en_mid = en_rank[in_mid, i]
        rec = {
            "id": f.id,
            "relation": f.relation,
            "lang": f.lang,
            "prompt": f.prompt,
            "answer": f.answer,
            "answer_en": f.answer_en,
            "generation": r["generation"],
            "correct": bool(r["correct"]),
            "answered_in": answers.answered_in[i],
            "first_en_layer": int(first_en[i]),
            "first_mismatch_en_layer": -1 if answers.mismatch[i] is None else int(first_mis[i]),
            "first_answer_layer": int(first_l[i]),
            "en_decodable_mid": bool((en_mid <= max_rank).any()),
            "answer_decodable_mid": bool((l_rank[in_mid, i] <= max_rank).any()),
            "best_en_rank_mid": int(en_mid.min()),
            "best_en_layer_mid": int(entries[in_mid][int(en_mid.argmin())]),
            "final_answer_rank": int(l_rank[-1, i]),
            "gold_rank": gold_rank.get((f.id, f.lang)),
            **answers.flags[i],
        }
        rec["class"] = classify(rec)
        records.append(rec)
    return TraceResult(
        records=records,
        lens=lens,
        eval=ev,
        max_rank=max_rank,
        mid_layers=mid,
        n_layers=n,
        meta={
            "max_new_tokens": max_new_tokens,
            "metric": metric,
            **({"skipped": skipped} if skipped else {}),
        },  # fmt: skip
    )


# --------------------------------------------------------------------------------------
# The whole trace: what `mechlingo trace` runs (the patching: :mod:`.trace_patching`)
# --------------------------------------------------------------------------------------

#: The fields of every query in ``trace.json``.
TRACE_FIELDS = (
    "id",
    "lang",
    "prompt",
    "answer",
    "answer_en",
    "generation",
    "correct",
    "class",
    "answered_in",
    "first_en_layer",
    "first_answer_layer",
    "en_decodable_mid",
    "answer_decodable_mid",
    "best_en_rank_mid",
    "best_en_layer_mid",
    "final_answer_rank",
    "gold_rank",
    "decided_at",
    "shared_form",
    "continues_prompt",
    "echoes_subject",
    "generation_lang",
)


@dataclass
class TraceRun(WritesFolder):
    """What ``mechlingo trace`` computes (:func:`run_trace`): the ``trace`` of every fact,
    the ``patched`` languages, ``unpatched`` (``{lang: why no patching}``),
    ``seconds_trace`` (the seconds of the trace alone) and the measured ``circuits``
    (``{lang: TraceCircuit, or why there is none}``)."""

    trace: TraceResult
    patched: list[LanguagePatching] = field(default_factory=list)
    seconds_trace: float = 0.0
    unpatched: dict[str, str] = field(default_factory=dict)
    circuits: dict[str, TraceCircuit | str] = field(default_factory=dict)

    def summary(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trace's summary with the Wilson 95% interval of each class's fraction
        (``classification_ci``) and ``meta`` (when given) last: ``summary.json``."""
        summary = self.trace.summary()
        summary["classification_ci"] = {
            lg: {c: wilson(n, sum(cnt.values())).to_json() for c, n in cnt.items()}
            for lg, cnt in summary["classification"].items()
        }
        if meta is not None:
            summary["meta"] = meta
        return summary

    def patching(self) -> dict[str, Any]:
        """``{lang: LanguagePatching.to_json()}``: ``patching.json`` (NaN left as is); a
        language without patching has ``{"unpatched": reason}``."""
        out: dict[str, Any] = {p.lang: p.to_json() for p in self.patched}
        out.update({lg: {"unpatched": why} for lg, why in self.unpatched.items()})
        return out

    def files(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``trace.json``, ``patching.json``, ``summary.json`` and, with measured circuits,
        ``circuits.json`` (``{lang: circuit, or {"none": why}}``) as ``mechlingo trace``
        writes them (NaN written as ``null``)."""
        out = {
            "trace.json": [{k: r[k] for k in TRACE_FIELDS} for r in self.trace.records],
            "patching.json": jsonable(self.patching()),
            "summary.json": jsonable(self.summary(meta)),
        }
        if self.circuits:
            out["circuits.json"] = jsonable({lg: {"none": c} if isinstance(c, str) else
                                             c.to_json() for lg, c in self.circuits.items()})  # fmt: skip
        return out


def run_trace(
    model: Model,
    facts: Sequence[Fact],
    options: TraceOptions | None = None,
) -> TraceRun:
    """The recall trace of every fact (:func:`trace_recall`) and, for each language, the
    corrupted-subject patching of ``patch_prompts`` prompts at ``patch_sites`` with
    ``method`` (``"exact"``, ``"atp"`` or ``"both"``) and the attention knockout
    (:func:`patch_language`; ``patch_prompts=0`` skips both), then the measured circuit of
    ``circuit_prompts`` prompts per language (EAP-IG, :func:`.trace_circuit.trace_circuit`; 0
    skips it), as ``mechlingo trace`` runs it.
    Patching uses correctly answered clean prompts only, unless ``unanswered``; a language
    without one is listed in the run's ``unpatched`` with the reason. The settings named
    here are ``options``' (:class:`~mechlingo.analyses.recall.trace_options.TraceOptions`,
    its defaults when ``None``; the command builds it from its flags).

    Raises:
        InputError: ``patch_prompts`` < 0 or an unknown ``method``.
        PatchingError: a language's patching cannot be done (the message names it).
    """
    o = TraceOptions() if options is None else options
    t0 = time.time()
    trace = trace_recall(model, facts, max_rank=o.max_rank, mid_layers=o.mid_layers,
                         max_new_tokens=o.max_new_tokens, batch_size=o.batch_size,
                         progress=o.progress)  # fmt: skip
    run = TraceRun(trace, seconds_trace=time.time() - t0)
    for lang in trace.langs if o.patch_prompts else []:
        try:
            res = patch_language(model, trace, facts, lang, o)
        except PatchingError as err:
            raise PatchingError(f"patching {lang}: {err}") from err
        if res is not None:
            run.patched.append(res)
        else:
            run.unpatched[lang] = unpatched_reason(trace, lang, unanswered=o.unanswered) or "none"
    phases = {p.lang: p.phases for p in run.patched}
    for lang in trace.langs if o.circuit_prompts else []:
        run.circuits[lang] = trace_circuit(
            model, trace, facts, lang, o.circuit_prompts, unanswered=o.unanswered,
            phases=phases.get(lang, pipeline_phases(None, trace, lang)), batch_size=o.batch_size,
        )  # fmt: skip
    return run
