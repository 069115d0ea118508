"""Building the steering vectors once for many selections: per-(relation, language) sums.

The vectors of a transfer-matrix row are means over prompt sets, so the build facts are run
once, per (relation, language) group (:func:`group_stats`), and each row's vectors are the
pooled means of its groups (:func:`pooled_vectors`): exactly what
:func:`mechlingo.analyses.recall.steering.build_steering_vectors` gives on the same facts
(tested), at the cost of one build instead of one per row. Demonstrations (few-shot and
translation) are drawn from the same relation's build facts only. :func:`balance_relations`
keeps the same number of fact ids per relation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.runs import collect
from mechlingo.analyses.recall.steering import SteeringPair, vectors_from_means
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS
from mechlingo.core.errors import InputError
from mechlingo.core.sites import resolve_layers, resolve_site
from mechlingo.core.tokens import encode, sorted_batches
from mechlingo.core.types import Model
from mechlingo.data import RELATIONS, Fact, few_shot_prompt, translation_prompt

__all__ = ["GroupStats", "balance_relations", "group_stats", "pooled_vectors", "spread"]

PROMPT_SETS = ("few_shot", "zero_shot", "translation")


def _rank(key: str) -> float:
    h = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2**64


# --------------------------------------------------------------------------------------
# Balanced selections
# --------------------------------------------------------------------------------------


def _ids_by_relation(facts: Iterable[Fact]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in facts:
        ids = out.setdefault(f.relation, [])
        if f.id not in ids:
            ids.append(f.id)
    return {r: sorted(ids, key=lambda i: _rank(f"matrix|{i}")) for r, ids in out.items()}


def balance_relations(facts: Sequence[Fact], n: int | None = None) -> list[Fact]:
    """The same number of fact ids from every relation: ``n`` each, or (``None``) as many
    as the smallest relation has; the same ids in every language (ids picked by a hash)."""
    by_rel = _ids_by_relation(facts)
    if not by_rel:
        return []
    k = min(len(v) for v in by_rel.values()) if n is None else int(n)
    if k < 1:
        raise InputError(f"at least one fact id per relation is needed, got {k}")
    keep = {i for ids in by_rel.values() for i in ids[:k]}
    return [f for f in facts if f.id in keep]


def spread(facts: Sequence[Fact], n_ids: int) -> list[Fact]:
    """``n_ids`` fact ids in all, spread evenly over the relations (round robin)."""
    by_rel = _ids_by_relation(facts)
    order = [by_rel[r] for r in sorted(by_rel)]
    keep: list[str] = []
    depth = 0
    while len(keep) < n_ids and any(depth < len(ids) for ids in order):
        for ids in order:
            if depth < len(ids) and len(keep) < n_ids:
                keep.append(ids[depth])
        depth += 1
    chosen = set(keep)
    return [f for f in facts if f.id in chosen]


# --------------------------------------------------------------------------------------
# Building once: per-(relation, language) sums of the three prompt sets
# --------------------------------------------------------------------------------------


@dataclass
class GroupStats:
    """Sums of last-token ``resid_pre`` per (relation, language) group and prompt set.

    Attributes:
        groups: the ``(relation, lang)`` keys, in row order of the tensors.
        sums: ``{set: [group, layer, d_model]}`` float64 sums (``few_shot``, ``zero_shot``,
            ``translation``).
        counts: ``{set: [group]}`` prompt counts.
        norm_sums: ``[group, layer]`` sums of the zero-shot residual norms (the unit).
        fact_ids: the build fact ids of each group.
        options: ``k_shot`` and ``translation_shots``.
    """

    groups: list[tuple[str, str]]
    sums: dict[str, Float[Tensor, "group layer d_model"]]
    counts: dict[str, Int[Tensor, " group"]]
    norm_sums: Float[Tensor, "group layer"]
    fact_ids: dict[tuple[str, str], list[str]]
    options: dict[str, Any] = field(default_factory=dict)


def _group_prompts(
    facts: Sequence[Fact], k_shot: int, translation_shots: int
) -> dict[str, list[tuple[str, int]]]:
    """``{set: [(prompt, group index)]}``; demonstrations from the same relation only."""
    groups = sorted({(f.relation, f.lang) for f in facts})
    index = {g: i for i, g in enumerate(groups)}
    pools: dict[str, list[Fact]] = {}
    for f in facts:
        pools.setdefault(f.relation, []).append(f)
    out: dict[str, list[tuple[str, int]]] = {s: [] for s in PROMPT_SETS}
    for f in facts:
        g = index[(f.relation, f.lang)]
        pool = pools[f.relation]
        out["zero_shot"].append((f.prompt, g))
        try:
            out["few_shot"].append((few_shot_prompt(f, pool, k=k_shot, seed=0), g))
        except ValueError:
            pass  # too few demonstrations of this relation and language
        if f.lang != "en" and f.answer_en:
            try:
                p = translation_prompt(f, src="en", k=translation_shots, pool=pool, seed=0)
                out["translation"].append((p, g))
            except ValueError:
                pass
    return out


def _group_sums(
    model: Model,
    items: Sequence[tuple[str, int]],
    n_groups: int,
    *,
    batch_size: int,
    norms: bool = False,
    progress: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per-group float64 sums of the last-token ``resid_pre`` at every layer, the counts,
    and (``norms``) the per-group sums of their L2 norms."""
    names = [resolve_site(model, "resid_pre", i).hook_name for i in resolve_layers(model, None)]
    d = int(model.cfg.d_model)
    sums = torch.zeros(n_groups, len(names), d, dtype=torch.float64)
    counts = torch.zeros(n_groups, dtype=torch.long)
    nsum = torch.zeros(n_groups, len(names), dtype=torch.float64) if norms else None
    if not items:
        return sums, counts, nsum
    batch = encode(model, [p for p, _ in items])
    gidx = torch.tensor([g for _, g in items], dtype=torch.long)
    for rows in tqdm(sorted_batches(batch.lengths, batch_size), disable=not progress):
        acts = collect(model, batch.select(rows), names)
        x = torch.stack([acts[n].double().cpu() for n in names], dim=1)  # [b, layer, d]
        g = gidx[rows]
        sums.index_add_(0, g, x)
        counts.index_add_(0, g, torch.ones_like(g))
        if nsum is not None:
            nsum.index_add_(0, g, x.norm(dim=-1))
    return sums, counts, nsum


def group_stats(
    model: Model,
    facts: Sequence[Fact],
    *,
    k_shot: int = 3,
    translation_shots: int = 2,
    batch_size: int = BATCH_SIZE,
    progress: bool = PROGRESS,
) -> GroupStats:
    """Run the build facts once: per (relation, language) sums of the three prompt sets'
    last-token residuals and of the zero-shot norms, from which :func:`pooled_vectors`
    makes the vectors of any selection of relations and languages."""
    facts = list(facts)
    if not facts:
        raise InputError("no build facts")
    groups = sorted({(f.relation, f.lang) for f in facts})
    prompts = _group_prompts(facts, k_shot, translation_shots)
    sums, counts = {}, {}
    norm_sums = None
    for name in PROMPT_SETS:
        s, c, n = _group_sums(
            model,
            prompts[name],
            len(groups),
            batch_size=batch_size,
            norms=name == "zero_shot",
            progress=progress,
        )
        sums[name], counts[name] = s, c
        if n is not None:
            norm_sums = n
    assert norm_sums is not None
    ids: dict[tuple[str, str], list[str]] = {g: [] for g in groups}
    for f in facts:
        ids[(f.relation, f.lang)].append(f.id)
    opts = {"k_shot": k_shot, "translation_shots": translation_shots}
    return GroupStats(groups, sums, counts, norm_sums, ids, opts)


def pooled_vectors(
    stats: GroupStats,
    *,
    relations: Iterable[str] | None = None,
    langs: Iterable[str] | None = None,
    subtract_zero_shot: bool = True,
    unit: str = "resid",
    model: Model | None = None,
) -> SteeringPair:
    """The two vector stacks built from the groups of ``relations`` x ``langs`` only (every
    one by default): the pooled means of their prompt sets, as
    :func:`~mechlingo.analyses.recall.steering.build_steering_vectors` would build them from those facts
    (with demonstrations from the same relation). ``build["fact_ids"]``,
    ``build["relations"]`` and ``build["langs"]`` record what went in."""
    rel = None if relations is None else set(relations)
    lg = None if langs is None else set(langs)
    sel = [
        i
        for i, (r, la) in enumerate(stats.groups)
        if (rel is None or r in rel) and (lg is None or la in lg)
    ]
    if not sel:
        raise InputError(f"no build group for relations {rel} and languages {lg}")
    idx = torch.tensor(sel, dtype=torch.long)
    means, n_prompts = {}, {}
    for name in PROMPT_SETS:
        n = int(stats.counts[name][idx].sum())
        if n == 0:
            raise InputError(
                f"no {name} prompt in the selected build groups: they need "
                "more build facts (k_shot + 1 per relation and language)"
            )
        means[name] = stats.sums[name][idx].sum(0) / n
        n_prompts[name] = n
    resid_norm = stats.norm_sums[idx].sum(0) / n_prompts["zero_shot"]
    keys = [stats.groups[i] for i in sel]
    build = {
        "n_prompts": n_prompts,
        "langs": sorted({la for _, la in keys}),
        "relations": [r for r in RELATIONS if r in {r for r, _ in keys}]
        + sorted({r for r, _ in keys} - set(RELATIONS)),
        "n_facts": len({i for k in keys for i in stats.fact_ids[k]}),
        "fact_ids": sorted({i for k in keys for i in stats.fact_ids[k]}),
        "balanced": "same number of fact ids per relation",
        "demonstrations": "same relation (few-shot: same relation and language)",
        "site": "resid_pre",
        "positions": "last",
        **stats.options,
    }
    return vectors_from_means(
        means,
        resid_norm,
        subtract_zero_shot=subtract_zero_shot,
        unit=unit,
        model=model,
        build=build,
    )
