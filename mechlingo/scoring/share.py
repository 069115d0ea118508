"""The gold answer's share among a fact's candidates under candidate ranking: the continuous
outcome that the claims card judges where a metric ranks candidates (``rank``), read from a
scored record's candidate scores (:func:`mechlingo.scoring.rank.rank_record`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["gold_logshare", "gold_share"]


def gold_logshare(rec: Mapping[str, Any]) -> float | None:
    """``log p(gold)`` among the candidates: the log-softmax of the candidates' mean token
    log-probabilities (``-scores``), summed over the gold candidates."""
    scores = rec.get("scores")
    if not scores:
        return None
    x = -np.asarray(scores, dtype=float)
    gold = str(rec.get("answer", "")).strip()
    idx = {i for i, c in enumerate(rec.get("candidates") or []) if c.strip() == gold}
    if rec.get("gold_rank") and rec.get("ranking"):  # the best gold (an alias counts too)
        idx.add(int(rec["ranking"][int(rec["gold_rank"]) - 1]))
    idx = sorted(idx)
    if not idx:
        return None
    top = x.max()
    norm = top + math.log(float(np.exp(x - top).sum()))
    g = x[idx].max() + math.log(float(np.exp(x[idx] - x[idx].max()).sum()))
    return float(g - norm)


def gold_share(rec: Mapping[str, Any]) -> float | None:
    """The repair rows' continuous outcome: the gold answer's probability share among the
    candidates, ``p(gold) / sum_c p(c)`` with ``p(c) = exp(mean token log-probability of
    c)`` (the numbers candidate ranking ranks by; aliases among the candidates add to the
    gold): 1 when the model puts all its candidate mass on the gold, 1/candidates when it
    cannot tell them apart. ``None`` for a record without candidate scores (``generate``)."""
    lg = gold_logshare(rec)
    return None if lg is None else float(math.exp(lg))
