"""The card's multiplicity adjustments: a family of rows adjusted together, Holm's step-down
(family-wise error) or Benjamini-Hochberg (false discovery rate), and each row's multiplier ``k``
that puts its interval at level ``alpha / k`` (:meth:`mechlingo.card.clustered_tests.Test.at_level`).
``docs/replicate.md`` ("The verdict rules") says which claims form a family.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["adjust", "benjamini_hochberg", "holm"]


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the input order (``None`` stays ``None`` and
    does not count in the family): the i-th smallest of m becomes ``max_{j<=i} min(1, (m - j
    + 1) p_(j))``, as ``statsmodels``' ``multipletests(method="holm")`` (the tests check)."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])  # type: ignore[arg-type,return-value]
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (len(idx) - rank) * float(pvalues[i])))  # type: ignore[arg-type]
        out[i] = running
    return out


def benjamini_hochberg(pvalues: Sequence[float | None]) -> list[float | None]:
    """Benjamini-Hochberg adjusted p-values (false discovery rate), in the input order: the
    i-th smallest of m becomes ``min_{j>=i} min(1, m p_(j) / j)``; ``None`` stays ``None``
    (as ``statsmodels``' ``multipletests(method="fdr_bh")``; the tests check)."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])  # type: ignore[arg-type,return-value]
    out: list[float | None] = [None] * len(pvalues)
    running = 1.0
    for rank in range(len(idx) - 1, -1, -1):
        i = idx[rank]
        running = min(running, len(idx) * float(pvalues[i]) / (rank + 1))  # type: ignore[arg-type]
        out[i] = running
    return out


def adjust(pvalues: Sequence[float | None], method: str) -> list[tuple[float | None, float]]:
    """``(adjusted p, multiplier)`` per p of one family (``method``: ``"holm"`` or ``"bh"``).
    The multiplier ``k`` puts the row at level ``alpha / k``: the adjusted p over the raw
    one, or where the adjustment is capped at 1 the procedure's own step (Holm: the number of
    p-values not smaller; BH: m over the rank). ``None`` p: ``(None, m)``, Bonferroni's."""
    adj = holm(pvalues) if method == "holm" else benjamini_hochberg(pvalues)
    ps = [p for p in pvalues if p is not None]
    m = max(1, len(ps))
    out: list[tuple[float | None, float]] = []
    for p, a in zip(pvalues, adj, strict=True):
        if p is None or a is None:
            out.append((None, float(m)))
            continue
        rank = sum(q < p for q in ps)  # 0-based rank, ties share the lowest
        step = float(m - rank) if method == "holm" else m / (rank + 1)
        out.append((a, a / p if (a < 1 and p > 0) else max(step, 1.0)))
    return out
