"""Candidate ranking (Qi et al. 2023, BMLAMA): each candidate filled in at the mask and the
filled sentence scored by the model's mean token cross-entropy (nats; lower is better).

* :func:`candidate_layout` -- where a filled sentence's tokens split into stem, candidate and
  suffix (the stem is each row's prompt length, so ``"last"`` is the token before the mask);
* :func:`score_candidates` / :func:`score_candidates_conditions` -- every candidate of a batch
  of facts scored, by default with each fact's shared tokens run once (within 1e-4 nats of
  running every row whole);
* :func:`rank_record` -- a fact's record under ``rank``: the ranking, the gold candidate's
  rank and whether a gold candidate scored best; :func:`rank_records` -- every fact's record
  under each of several interventions.

The rule, the token boundaries and where interventions act: ``docs/methods/scoring.md``;
shared stems and demonstrations across facts: ``docs/scaling.md``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.prefix import (
    PrefixRecord,
    cache_upto,
    prefix_reuse_supported,
    run_reads,
)
from mechlingo.activations.runs import StopForward, final_resid_name, run_batch
from mechlingo.core.answers import normalize
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS
from mechlingo.core.distributed import (
    gather_conditions,
    gather_lists,
    scoring_sharded,
    share_scoring,
)
from mechlingo.core.errors import InputError
from mechlingo.core.tokens import TokenBatch, prepends_bos
from mechlingo.core.types import FwdHooks, Model
from mechlingo.data import Fact
from mechlingo.interventions.apply import first_edit, intervention_hooks
from mechlingo.interventions.base import Intervention
from mechlingo.kernels.readout import token_logprobs
from mechlingo.scoring.scorers import fact_record, gold_indices, in_english

__all__ = [
    "RANK_TOKENS",
    "CandidateScores",
    "batch_order",
    "candidate_layout",
    "rank_record",
    "rank_records",
    "score_candidates",
    "score_candidates_conditions",
]

#: What the mean cross-entropy runs over: the whole (query) sentence, or the candidate only.
RANK_TOKENS = ("sentence", "candidate")


@dataclass(frozen=True)
class SentenceLayout:
    """One filled sentence as token ids and its boundaries (token positions).

    Attributes:
        ids: the token ids of ``prefix + fact.filled(candidate)`` (BOS first when the model
            adds one).
        query_start: the first token of the query sentence (after BOS and the prefix).
        stem_end: the number of tokens up to and including the token before the mask.
        cand_end: the end (exclusive) of the candidate's tokens.
    """

    ids: tuple[int, ...]
    query_start: int
    stem_end: int
    cand_end: int


def _pad(model: Model) -> int:
    tok = getattr(model, "tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    pad = getattr(tok, "eos_token_id", None) if pad is None else pad
    return int(pad) if pad is not None else 0


def _ids(model: Model, text: str, bos: bool) -> list[int]:
    if not text:
        return [int(getattr(model.tokenizer, "bos_token_id", 0) or 0)] if bos else []
    return [int(i) for i in model.to_tokens(text, prepend_bos=bos, truncate=False)[0].tolist()]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _before_candidate(fact: Fact, candidate: str) -> str:
    """The filled sentence up to the end of the candidate (its suffix cut)."""
    full = fact.filled(candidate)
    return full[: len(full) - len(fact.suffix)] if fact.suffix else full


def candidate_layout(
    model: Model,
    fact: Fact,
    candidate: str,
    prefix: str = "",
    *,
    stem_ids: Sequence[int] | None = None,
) -> SentenceLayout:
    """The token ids of ``prefix + fact.filled(candidate)`` and where its query sentence,
    stem and candidate end (see the module docstring).

    Raises:
        InputError: the model adds no BOS and nothing precedes the candidate (its first
            token would have no prediction).
    """
    bos = prepends_bos(model)
    ids = _ids(model, prefix + fact.filled(candidate), bos)
    stem = list(stem_ids) if stem_ids is not None else _ids(model, prefix + fact.prompt, bos)
    stem_end = _common(stem, ids)
    if stem_end == 0:
        raise InputError(
            f"fact {fact.id!r} ({fact.lang}): nothing precedes the mask and the model adds no "
            "BOS, so the candidate's first token has no prediction"
        )
    q_start = 1
    if prefix:
        q_start = max(1, min(_common(_ids(model, prefix, bos), stem), stem_end))
    if fact.suffix:
        upto = _ids(model, prefix + _before_candidate(fact, candidate), bos)
        shared = _common(upto, ids)
        cand_end = shared if shared == len(upto) else shared + 1
    else:
        cand_end = len(ids)
    cand_end = min(len(ids), max(cand_end, stem_end + 1))
    return SentenceLayout(tuple(ids), q_start, stem_end, cand_end)


@dataclass
class CandidateScores:
    """Mean token cross-entropy (nats per token; lower = more likely) of every candidate of
    every fact.

    Attributes:
        ce: per fact, one score per candidate (in the candidates' order).
        n_tokens: per fact, how many tokens each score averages.
        stem_end: per fact, the stem length of its first candidate (the position of the
            token before the mask is ``stem_end - 1``).
        tokens: ``"sentence"`` or ``"candidate"``.
    """

    ce: list[list[float]]
    n_tokens: list[list[int]]
    stem_end: list[int]
    tokens: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Reads:
    """The positions one pass reads: row, position, target token, and whose sum it joins
    (``owner >= 0``: that row's own; ``shared >= 0``: that fact's shared stem)."""

    row: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)

    def add(self, row: int, t: int, target: int, owner: int, shared: int) -> None:
        self.row.append(row)
        self.pos.append(t - 1)
        self.target.append(target)
        self.owner.append(owner)
        self.shared.append(shared)


def _plan(
    layouts: list[list[SentenceLayout]], tokens: str
) -> tuple[list[SentenceLayout], _Reads, list[range]]:
    """The rows of one pass (every candidate of each fact), the reads, and each fact's rows."""
    rows: list[SentenceLayout] = []
    reads = _Reads()
    spans = []
    for f, lays in enumerate(layouts):
        r0 = len(rows)
        rows.extend(lays)
        spans.append(range(r0, len(rows)))
        if tokens == "candidate":
            for r, lay in enumerate(lays, r0):
                for t in range(lay.stem_end, lay.cand_end):
                    reads.add(r, t, lay.ids[t], r, -1)
            continue
        same_stem = len({lay.stem_end for lay in lays}) == 1
        shared_end = lays[0].stem_end if same_stem else lays[0].query_start
        for t in range(lays[0].query_start, shared_end):
            reads.add(r0, t, lays[0].ids[t], -1, f)
        for r, lay in enumerate(lays, r0):
            for t in range(max(lay.query_start, shared_end), len(lay.ids)):
                reads.add(r, t, lay.ids[t], r, -1)
    return rows, reads, spans


def _rows_batch(model: Model, rows: list[SentenceLayout]) -> TokenBatch:
    """The filled sentences right-padded, each row's prompt length its stem length."""
    pad = _pad(model)
    width = max(len(lay.ids) for lay in rows)
    tokens = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, lay in enumerate(rows):
        tokens[i, : len(lay.ids)] = torch.tensor(lay.ids)
    lengths = torch.tensor([len(lay.ids) for lay in rows])
    stems = torch.tensor([lay.stem_end for lay in rows])
    return TokenBatch(tokens, lengths, pad, prepends_bos(model), stems)


def _stem_lengths(
    rows: list[SentenceLayout], spans: list[range], first: Tensor
) -> list[int] | None:
    """Per fact, how many leading tokens all its candidates' rows share and no intervention
    edits (at most each row's length minus one); ``None`` when some fact has none."""
    out = []
    for span in spans:
        ids = [rows[r].ids for r in span]
        shared = min(len(x) for x in ids) - 1
        for x in ids[1:]:
            shared = min(shared, _common(ids[0], x))
        shared = min([shared, *(int(first[r]) for r in span)])
        if shared < 1:
            return None
        out.append(shared)
    return out


@dataclass(frozen=True)
class _Demos:
    """The demonstrations the facts of one pass share: ``tokens`` (one row per group of
    facts whose query follows the same prefix tokens, right-padded), each group's shared
    length ``length`` and each fact's group ``of``."""

    tokens: Tensor
    length: Tensor
    of: Tensor


def _demo_groups(rows: list[SentenceLayout], spans: list[range], stems: list[int]) -> _Demos | None:
    """The facts of a pass grouped by the prefix before their query (few-shot
    demonstrations: a layout's tokens before ``query_start``), each group's shared length
    cut to leave every member at least one stem token of its own; ``None`` when no group of
    two or more facts shares more than one token (nothing to gain: every fact's stem runs
    whole, as before)."""
    keys: dict[tuple[int, ...], list[int]] = {}
    for g, span in enumerate(spans):
        lay = rows[span[0]]
        keys.setdefault(lay.ids[: lay.query_start], []).append(g)
    length = [max(1, min(len(k), *(stems[g] - 1 for g in gs))) for k, gs in keys.items()]
    if not any(n > 1 and len(gs) > 1 for n, gs in zip(length, keys.values(), strict=True)):
        return None
    of = torch.empty(len(spans), dtype=torch.long)
    tokens = torch.zeros((len(keys), max(length)), dtype=torch.long)
    for i, (key, gs) in enumerate(keys.items()):
        of[gs] = i
        tokens[i, : length[i]] = torch.tensor(key[: length[i]])
    return _Demos(tokens, torch.tensor(length), of)


def _demo_width(demos: _Demos | None, stems: list[int]) -> int:
    """The columns of the stem pass's cache on top of the demonstrations (0: none)."""
    if demos is None:
        return 0
    return int(demos.length.max()) + int((torch.tensor(stems) - demos.length[demos.of]).max())


def _stems_on_demos(
    model: Model, stems: TokenBatch, demos: _Demos, rows: Tensor, pos: Tensor
) -> tuple[PrefixRecord, Float[Tensor, "read d_model"]]:
    """:func:`run_reads` of the stem rows (``rows``, ``pos``: the reads) with each group's
    shared demonstrations run once: one pass over the demonstration rows, then every stem's
    own tokens against its group's cached demonstrations. Returns the stems' keys and
    values position by position (as one pass over the stems records them) and the reads'
    residuals in the reads' order."""
    c = demos.length[demos.of]  # per fact: the positions its demonstrations cover
    in_demo = pos < c[rows]
    demo_batch = TokenBatch(demos.tokens, demos.length, stems.pad_id, stems.has_bos)
    rec_d, resid_d = run_reads(model, demo_batch, demos.of[rows[in_demo]], pos[in_demo])
    cache = cache_upto(model, rec_d, demos.of, int(demos.length.max()))
    rec_s, resid_s = run_reads(model, stems, rows[~in_demo], pos[~in_demo], prefix=(cache, c))
    # column of fact g's position j in the grown cache: j inside its demonstrations, after
    # every group's demonstration columns for the rest
    j = torch.arange(int(stems.tokens.shape[1]))
    col = torch.where(j < c[:, None], j, int(demos.length.max()) + j - c[:, None])
    col = col.clamp(max=int(rec_s.keys[0].shape[-2]) - 1)

    def aligned(t: Tensor) -> Tensor:
        idx = col.to(t.device)[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[-1])
        return t.gather(2, idx)

    rec = PrefixRecord(tuple(map(aligned, rec_s.keys)), tuple(map(aligned, rec_s.values)),
                       rec_s.final)  # fmt: skip
    resid = torch.empty(len(rows), resid_s.shape[-1], dtype=resid_s.dtype, device=resid_s.device)
    resid[in_demo.to(resid.device)] = resid_d.to(resid.dtype)
    resid[~in_demo.to(resid.device)] = resid_s
    return rec, resid


def _shared_pass(
    model: Model, rows: list[SentenceLayout], reads: _Reads, spans: list[range],
    intervention: Intervention | None, hooks: FwdHooks,
) -> Float[Tensor, " read"] | None:  # fmt: skip
    """The log-probability of every read's target with each fact's shared stem run once:
    one pass over the stems (unedited, into a cache), then each candidate row's last
    positions against its fact's cached stem (``None`` where that cannot run: the model's
    cache, an intervention that edits the stem, rows too short)."""
    return _shared_conditions(model, rows, reads, spans, [intervention], [hooks])[0]


def _shared_conditions(
    model: Model, rows: list[SentenceLayout], reads: _Reads, spans: list[range],
    interventions: Sequence[Intervention | None], hooks_of: Sequence[FwdHooks],
) -> list[Float[Tensor, " read"] | None]:  # fmt: skip
    """:func:`_shared_pass` of several conditions at once: the conditions whose first edits
    agree share one stem pass (the same computation as each alone: the same records), then
    each runs its tail pass against a fresh copy of the stems' cache; ``None`` for a
    condition where that cannot run (what stops :func:`_shared_pass`)."""
    batch = _rows_batch(model, rows)
    out: list[Float[Tensor, " read"] | None] = [None] * len(interventions)
    if not prefix_reuse_supported(model, int(batch.tokens.shape[1])):
        return out
    firsts = [first_edit(iv, batch) for iv in interventions]
    same: dict[tuple[int, ...], list[int]] = {}
    for c, f in enumerate(firsts):
        same.setdefault(tuple(int(x) for x in f), []).append(c)
    for members in same.values():
        got = _stem_and_tails(model, batch, rows, reads, spans, firsts[members[0]],
                              [hooks_of[c] for c in members])  # fmt: skip
        for c, lp in zip(members, got or [None] * len(members), strict=True):
            out[c] = lp
    return out


def _stem_and_tails(
    model: Model, batch: TokenBatch, rows: list[SentenceLayout], reads: _Reads, spans: list[range],
    first: Tensor, hooks_of: Sequence[FwdHooks],
) -> list[Float[Tensor, " read"]] | None:  # fmt: skip
    """The stems before ``first`` run once, then one tail pass per hooks of ``hooks_of``."""
    stems = _stem_lengths(rows, spans, first)
    if stems is None:
        return None
    fact_of = torch.tensor([g for g, span in enumerate(spans) for _ in span])
    p_row = torch.tensor(stems)[fact_of]
    tail = int((batch.lengths - p_row).max())
    groups = _demo_groups(rows, spans, stems)
    widest = max(stems) + tail  # the tail pass's cache (and the stems' on demonstrations)
    if not prefix_reuse_supported(model, max(widest, _demo_width(groups, stems))):
        return None
    r_idx, q_idx = torch.tensor(reads.row), torch.tensor(reads.pos)
    in_stem = q_idx < p_row[r_idx]
    pad = _pad(model)
    stem_tok = torch.full((len(spans), max(stems)), pad, dtype=torch.long)
    for g, (span, n) in enumerate(zip(spans, stems, strict=True)):
        stem_tok[g, :n] = torch.tensor(rows[span[0]].ids[:n])
    stem_batch = TokenBatch(stem_tok, torch.tensor(stems), pad, batch.has_bos)
    if groups is not None:
        rec, stem_resid = _stems_on_demos(
            model, stem_batch, groups, fact_of[r_idx[in_stem]], q_idx[in_stem]
        )
    else:
        rec, stem_resid = run_reads(model, stem_batch, fact_of[r_idx[in_stem]], q_idx[in_stem])
    targets = torch.tensor(reads.target)
    a = token_logprobs(model, stem_resid, targets[in_stem]).cpu()
    out = []
    for hooks in hooks_of:  # a fresh cache each: a tail pass grows the one it is given
        cache = cache_upto(model, rec, fact_of, max(stems))
        _, tail_resid = run_reads(model, batch, r_idx[~in_stem], q_idx[~in_stem],
                                  prefix=(cache, p_row), fwd_hooks=hooks)  # fmt: skip
        b = token_logprobs(model, tail_resid, targets[~in_stem]).cpu()
        lp = torch.empty(len(reads.row), dtype=b.dtype)
        lp[in_stem], lp[~in_stem] = a.to(b.dtype), b
        out.append(lp)
    return out


def _pass(
    model: Model, rows: list[SentenceLayout], reads: _Reads, hooks: FwdHooks
) -> Float[Tensor, " read"]:
    """One padded forward pass over ``rows`` (stopped after the last block): the
    log-probability of every read's target."""
    batch = _rows_batch(model, rows)
    r_idx, p_idx = torch.tensor(reads.row), torch.tensor(reads.pos)
    out: dict[str, Tensor] = {}

    def read(t: Tensor, hook: Any) -> None:
        out["resid"] = t[r_idx.to(t.device), p_idx.to(t.device)].detach()
        raise StopForward

    run_batch(model, batch, [*hooks, (final_resid_name(model), read)])
    if "resid" not in out:
        raise RuntimeError("the final residual hook did not fire during the ranking pass")
    return token_logprobs(model, out["resid"], torch.tensor(reads.target))


def _sums(
    lp: Float[Tensor, " read"], reads: _Reads, n_rows: int, n_facts: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Summed log-probabilities and counts per row (own reads) and per fact (shared)."""
    lp = lp.double().cpu()
    owner, shared = torch.tensor(reads.owner), torch.tensor(reads.shared)
    own, share = owner >= 0, shared >= 0
    own_sum = torch.zeros(n_rows, dtype=torch.float64).index_add_(0, owner[own], lp[own])
    own_n = torch.zeros(n_rows, dtype=torch.long).index_add_(
        0, owner[own], torch.ones(int(own.sum()), dtype=torch.long)
    )
    sh_sum = torch.zeros(n_facts, dtype=torch.float64).index_add_(0, shared[share], lp[share])
    sh_n = torch.zeros(n_facts, dtype=torch.long).index_add_(
        0, shared[share], torch.ones(int(share.sum()), dtype=torch.long)
    )
    return own_sum, own_n, sh_sum, sh_n


def batch_order(prefixes: Sequence[str], layouts: Sequence[Sequence[SentenceLayout]]) -> list[int]:
    """The order in which :func:`score_candidates` batches facts: by prefix (facts with the
    same demonstrations share passes), then by their longest candidate row (less padding),
    then by index. ``layouts[i]``: fact ``i``'s :func:`candidate_layout` of each candidate."""
    return sorted(
        range(len(layouts)),
        key=lambda i: (prefixes[i], max(len(x.ids) for x in layouts[i]), i),
    )


def score_candidates(
    model: Model,
    facts: Sequence[Fact],
    *,
    candidates: Sequence[Sequence[str]] | None = None,
    prefixes: Sequence[str] | None = None,
    tokens: str = "sentence",
    intervention: Intervention | None = None,
    fwd_hooks: FwdHooks = (),
    batch_size: int = BATCH_SIZE,
    progress: bool = PROGRESS,
    shared: bool = True,
) -> CandidateScores:
    """The mean token cross-entropy of every candidate of every fact, filled in at the
    mask (see the module docstring).

    Args:
        candidates: per fact, the candidates to score (default each fact's ``candidates``).
        prefixes: per fact, text placed before the query sentence (few-shot
            demonstrations, ending with their separator); only the query's tokens are
            scored.
        tokens: ``"sentence"`` (every token of the query sentence, as the benchmark's
            reference code scores causal models) or ``"candidate"`` (the candidate's tokens
            only).
        intervention: applied in every pass (its ``"last"`` position is the token before
            the mask).
        batch_size: facts per forward pass (all their candidates together).
        shared: run each fact's stem (the tokens its candidates share, before any position
            the intervention edits) once and only the candidates' last tokens per row (the
            module docstring's *Shared stems*); ``False``, or plain ``fwd_hooks``, runs
            every row whole. ``meta["path"]`` says which ran (``"shared-stem"``,
            ``"full"`` or ``"mixed"``); the scores agree to float rounding (tested).

    Raises:
        InputError: no facts, a fact with no candidates, an unknown ``tokens``, or a fact
            whose first candidate token has nothing to be predicted from.
    """
    facts = list(facts)
    if not facts:
        raise InputError("no facts to rank candidates for")
    if tokens not in RANK_TOKENS:
        raise InputError(f"tokens must be one of {RANK_TOKENS}, got {tokens!r}")
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    cands = [list(c) for c in (candidates or [f.candidates for f in facts])]
    pre = list(prefixes) if prefixes is not None else [""] * len(facts)
    if len(cands) != len(facts) or len(pre) != len(facts):
        raise InputError(
            f"{len(cands)} candidate lists / {len(pre)} prefixes for {len(facts)} facts"
        )
    layouts = []
    for f, cs, p in zip(facts, cands, pre, strict=True):
        if not cs:
            raise InputError(f"fact {f.id!r} ({f.lang}) has no candidates to rank")
        stem = _ids(model, p + f.prompt, prepends_bos(model))
        layouts.append([candidate_layout(model, f, c, p, stem_ids=stem) for c in cs])
    return _score_conditions(model, layouts, pre, [intervention], tokens=tokens,
                             fwd_hooks=fwd_hooks, batch_size=batch_size, progress=progress,
                             shared=shared)[0]  # fmt: skip


def score_candidates_conditions(
    model: Model,
    facts: Sequence[Fact],
    interventions: Sequence[Intervention | None],
    *,
    prefixes: Sequence[str] | None = None,
    tokens: str = "sentence",
    batch_size: int = BATCH_SIZE,
    progress: bool = PROGRESS,
) -> list[CandidateScores]:
    """:func:`score_candidates` under every intervention of ``interventions`` (one result
    each, equal to its own call to float rounding; tested), with each batch's stems run once
    for all of them (cut before the earliest position any of them edits) and only the
    candidates' last tokens run per condition: a population of random vectors costs a tail
    pass per draw, not a whole ranking.

    Raises:
        InputError: no interventions, or what :func:`score_candidates` raises."""
    if not interventions:
        raise InputError("no conditions to rank candidates under")
    facts = list(facts)
    if not facts:
        raise InputError("no facts to rank candidates for")
    pre = list(prefixes) if prefixes is not None else [""] * len(facts)
    layouts = []
    for f, p in zip(facts, pre, strict=True):
        if not f.candidates:
            raise InputError(f"fact {f.id!r} ({f.lang}) has no candidates to rank")
        stem = _ids(model, p + f.prompt, prepends_bos(model))
        layouts.append([candidate_layout(model, f, c, p, stem_ids=stem) for c in f.candidates])
    return _score_conditions(model, layouts, pre, list(interventions), tokens=tokens,
                             fwd_hooks=(), batch_size=batch_size, progress=progress,
                             shared=True)  # fmt: skip


def _score_conditions(
    model: Model, layouts: list[list[SentenceLayout]], pre: list[str],
    interventions: list[Intervention | None], *, tokens: str, fwd_hooks: FwdHooks,
    batch_size: int, progress: bool, shared: bool,
) -> list[CandidateScores]:  # fmt: skip
    """The batches of :func:`score_candidates` under each condition (see there)."""
    hooks_of = [intervention_hooks(model, iv, fwd_hooks) for iv in interventions]
    # facts with the same prefix share passes (and their demonstrations, once per pass)
    order = batch_order(pre, layouts)
    passes = [order[k : k + batch_size] for k in range(0, len(order), batch_size)]
    # under torchrun: passes shared by cost, or (fewer passes than ranks) the conditions
    cost = [sum(len(x.ids) for i in group for x in layouts[i]) for group in passes]
    mine_p, conds = share_scoring(cost, len(interventions))
    by_condition = len(conds) < len(interventions)
    local: dict[int, list[tuple[int, list[float], list[int]]]] = {c: [] for c in conds}
    paths: set[str] = set()
    for group in tqdm([passes[i] for i in mine_p] if conds else [], desc="ranking",
                      disable=not progress):  # fmt: skip
        rows, reads, spans = _plan([layouts[i] for i in group], tokens)
        lps: list[Tensor | None] = [None] * len(conds)
        if shared and not fwd_hooks:
            lps = _shared_conditions(model, rows, reads, spans, [interventions[c] for c in conds],
                                     [hooks_of[c] for c in conds])  # fmt: skip
        for c, lp in zip(conds, lps, strict=True):
            paths.add("shared-stem" if lp is not None else "full")
            if lp is None:
                lp = _pass(model, rows, reads, hooks_of[c])
            own_sum, own_n, sh_sum, sh_n = _sums(lp, reads, len(rows), len(group))
            for g, i in enumerate(group):
                total = own_sum[spans[g]] + sh_sum[g]
                n = own_n[spans[g]] + sh_n[g]
                local[c].append((i, (-total / n.clamp_min(1)).tolist(), n.tolist()))
    if scoring_sharded():  # every rank reports the same path
        paths = {p for part in gather_lists([sorted(paths)]) for p in part}
    path = paths.pop() if len(paths) == 1 else ("mixed" if paths else "none")
    out = []
    for got in gather_conditions(local, len(interventions), by_condition):
        ce: list[list[float]] = [[] for _ in layouts]
        counts: list[list[int]] = [[] for _ in layouts]
        for i, scores, n in got:
            ce[i], counts[i] = scores, n
        out.append(CandidateScores(ce, counts, [lays[0].stem_end for lays in layouts], tokens,
                                   {"path": path}))  # fmt: skip
    return out


def rank_record(f: Fact, prompt: str, ce: Sequence[float], n_tokens: Any) -> dict[str, Any]:
    """``f``'s record under candidate ranking, from every candidate's mean cross-entropy
    ``ce`` (nats, in candidate order): the ranking (best first, ties by index), the best
    gold candidate's rank (1 = first) and whether a gold candidate is first."""
    ranking = sorted(range(len(ce)), key=lambda j: (ce[j], j))
    golds = set(gold_indices(f))
    best = f.candidates[ranking[0]]
    correct = ranking[0] in golds
    in_en = in_english(f, correct, best, lambda c, a: normalize(c) == normalize(a))
    return {
        **fact_record(f, prompt, best, correct, in_en),
        "candidates": list(f.candidates),
        "scores": [round(x, 6) for x in ce],
        "ranking": ranking,
        "gold_rank": 1 + min(ranking.index(g) for g in golds),
        "n_tokens": n_tokens,
    }


def rank_records(
    model: Model,
    facts: list[Fact],
    interventions: Sequence[Intervention | None],
    *,
    prefixes: list[str] | None = None,
    tokens: str = "sentence",
    fwd_hooks: FwdHooks = (),
    batch_size: int = BATCH_SIZE,
    progress: bool = PROGRESS,
    shared: bool = True,
) -> tuple[list[list[dict[str, Any]]], str]:
    """Every fact's :func:`rank_record` under each of ``interventions``, and the path. With
    ``shared``, several interventions and no plain ``fwd_hooks``, each batch's stems run once
    for all of them (:func:`score_candidates_conditions`): ``"shared-stem"``, else
    ``"per-condition"`` (a condition edits the stems: every row ran whole) or ``"mixed"``;
    otherwise each intervention is scored on its own (:func:`score_candidates`):
    ``"per-condition"``."""
    ivs = list(interventions)
    if shared and len(ivs) > 1 and not fwd_hooks:
        got = score_candidates_conditions(model, facts, ivs, prefixes=prefixes, tokens=tokens,
                                          batch_size=batch_size, progress=progress)  # fmt: skip
        path = {"shared-stem": "shared-stem", "full": "per-condition"}.get(
            got[0].meta["path"], "mixed"
        )
    else:
        got = [score_candidates(model, facts, prefixes=prefixes, tokens=tokens, intervention=iv,
                                fwd_hooks=fwd_hooks, batch_size=batch_size, progress=progress)
               for iv in ivs]  # fmt: skip
        path = "per-condition"
    records = [
        [rank_record(f, (prefixes[i] if prefixes else "") + f.prompt, sc.ce[i], sc.n_tokens[i])
         for i, f in enumerate(facts)]
        for sc in got
    ]  # fmt: skip
    return records, path
