"""Each repair test item's outcomes under a condition: strict and lenient (format-control)
correctness, the gold answer's log-probability share, and the keys that cluster items (the
fact id; the subject shared across relations, which clusters the rows over facts:
:func:`item_clusters`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from mechlingo.core.answers import normalize
from mechlingo.data import Fact
from mechlingo.scoring.share import gold_logshare as _gold_logshare
from mechlingo.scoring.share import gold_share

__all__ = [
    "cluster_note",
    "clustered_by",
    "condition_outcomes",
    "gold_share",
    "item_clusters",
    "item_records",
    "lenient_match",
    "subject_keys",
    "subject_of",
]


def _loose(text: str) -> str:
    """:func:`~mechlingo.core.answers.normalize`, then accents and every character that is
    not a letter or digit removed (``"São Tomé!"`` -> ``"saotome"``)."""
    t = unicodedata.normalize("NFD", normalize(text))
    return "".join(ch for ch in t if ch.isalnum() and not unicodedata.combining(ch))


def lenient_match(generation: str, answers: Sequence[str]) -> bool:
    """The format control: the answer counts when, after :func:`_loose` normalisation, one of
    ``answers`` (the gold and its aliases) occurs anywhere in the first line of
    ``generation``, or that line (at least 3 characters) is the start of one (an answer cut
    by the token budget). A vector that only changes the answer's form (quotes, case,
    accents, a leading article, a cut word) moves the strict accuracy but not this one."""
    lines = generation.strip().split("\n")
    gen = _loose(lines[0] if lines else "")
    for a in answers:
        ans = _loose(a)
        if ans and (ans in gen or (len(gen) >= 3 and ans.startswith(gen))):
            return True
    return False


def condition_outcomes(results: Mapping[str, Any], facts: Sequence[Fact]) -> dict[str, Any]:
    """Per condition and language, in (lang, id) order: ``outcomes`` (0/1 under the card's
    metric), ``share`` (:func:`gold_share`; ``None`` entries under ``generate``) and
    ``lenient`` (:func:`lenient_match`), and ``ids`` (one list for every condition).

    Raises:
        RuntimeError: conditions that scored different items (a bug upstream)."""
    answers = {(f.id, f.lang): f.answers for f in facts}
    out: dict[str, Any] = {"outcomes": {}, "share": {}, "lenient": {}}
    ids: dict[str, list[str]] | None = None
    for c, res in results.items():
        keys: dict[str, list[str]] = {}
        acc: dict[str, list[bool]] = {}
        share: dict[str, list[float | None]] = {}
        loose: dict[str, list[bool]] = {}
        for r in sorted(res.records, key=lambda r: (r["lang"], r["id"])):
            lg = r["lang"]
            keys.setdefault(lg, []).append(r["id"])
            acc.setdefault(lg, []).append(bool(r["correct"]))
            share.setdefault(lg, []).append(gold_share(r))
            golds = answers.get((r["id"], lg), (r.get("answer", ""),))
            loose.setdefault(lg, []).append(lenient_match(str(r.get("generation", "")), golds))
        if ids is not None and keys != ids:
            raise RuntimeError(f"condition {c} scored other test items than orig")
        ids = keys
        out["outcomes"][c], out["share"][c], out["lenient"][c] = acc, share, loose
    out["ids"] = ids or {}
    return out


def subject_keys(facts: Sequence[Fact]) -> dict[str, str]:
    """``{fact id: subject key}`` when facts of several relations share a subject (the unit
    that clusters them: the id's key after the relation, ``capital/IT`` -> ``IT``; where the
    id names no subject (no ``/``, or a row number such as ``P17/0``) the English subject);
    ``{}`` when no subject is shared across relations."""

    def key(f: Fact) -> str:
        k = subject_of(f.id)
        return k if k != f.id else (f.subject_en or f.id)

    rels: dict[str, set[str]] = {}
    for f in facts:
        rels.setdefault(key(f), set()).add(f.relation)
    if not any(len(v) > 1 for v in rels.values()):
        return {}
    return {f.id: key(f) for f in facts}


def subject_of(fact_id: str) -> str:
    """The subject key of a fact id, the rule of :func:`subject_keys`: the part after the
    first ``/`` (``capital/IT`` -> ``IT``); an id without ``/``, or whose key is digits only
    (a benchmark's row number within its relation, ``P17/0``: no subject), is its own key."""
    key = fact_id.split("/", 1)[1] if "/" in fact_id else ""
    return key if key and not key.isdigit() else fact_id


def item_clusters(ids: Sequence[str], subjects: Mapping[str, str] | None = None) -> list[str]:
    """The cluster of each item of a row over facts: its fact's subject, so that the facts of
    several relations on one subject (``capital/IT``, ``language/IT``) are resampled together.

    Args:
        ids: each item's fact id (a fact's languages are items of one fact).
        subjects: the ``{fact id: subject}`` map a stage stored (:func:`subject_keys`; ``{}``:
            no subject shared across relations); ``None`` (a result stored without one): each
            id's :func:`subject_of`.

    Returns:
        The subject of each item; the fact ids themselves (as before subjects) when no two of
        the row's facts share a subject: the same clusters, the same numbers.
    """
    ids = [str(i) for i in ids]
    if subjects is not None and not subjects:
        return ids
    keys = [subjects.get(i, subject_of(i)) if subjects else subject_of(i) for i in ids]
    return ids if len(set(keys)) == len(set(ids)) else keys


def clustered_by(ids: Sequence[str], clusters: Sequence[str]) -> str:
    """How a row over facts is clustered, in words: ``"clustered by fact"``, or
    ``"clustered by subject (20 subjects of 48 facts)"`` when facts share a subject."""
    f, g = len(set(ids)), len(set(clusters))
    return "clustered by fact" if f == g else f"clustered by subject ({g} subjects of {f} facts)"


def cluster_note(ids: Sequence[str], clusters: Sequence[str]) -> str:
    """``"; clustered by subject (...)"`` when the row's facts share subjects, else ``""``."""
    return "" if list(clusters) == list(ids) else f"; {clustered_by(ids, clusters)}"


def item_records(results: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per condition, one record per scored item: ``id`` (the cluster), ``lang``,
    ``correct``, and under ``rank`` ``logshare``, ``share`` (:func:`gold_share`) and
    ``ranking``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for cond, res in results.items():
        rows = []
        for r in sorted(res.records, key=lambda r: (r["lang"], r["id"])):
            item = {"id": r["id"], "lang": r["lang"], "correct": bool(r["correct"])}
            if r.get("ranking") is not None:
                item["ranking"] = list(r["ranking"])
                item["logshare"] = _gold_logshare(r)
                item["share"] = gold_share(r)
            rows.append(item)
        out[cond] = rows
    return out
