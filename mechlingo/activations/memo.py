"""Unpatched prefix passes kept across scoring calls that score the same prompts again.

The shared-prefix scorer (:func:`mechlingo.scoring.evaluate.generate_conditions`) runs each
batch's unedited positions once per call (:func:`mechlingo.activations.prefix.record_head`)
and decodes every condition from there. A caller that scores the *same* prompts in several
calls, under other interventions each time, repeats that pass: the transfer matrix scores
each column's test facts once per row (13 rows by relation, 12 by language). Inside
:func:`reusing_prefixes` the scorer looks the batch up in a :class:`PrefixMemo` first. A
record depends only on the model and the batch's tokens (no hook runs during it), so a hit is
the record the pass would compute; the outcomes are the same (tested).

The memo holds keys and values of every layer for every cached batch, on the model's device,
up to ``max_bytes`` (oldest dropped first); use it only around calls that repeat prompts.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from mechlingo.activations.prefix import PrefixRecord, record_head
from mechlingo.core.tokens import TokenBatch
from mechlingo.core.types import Model

__all__ = ["PrefixMemo", "current_memo", "reusing_prefixes"]


def _nbytes(rec: PrefixRecord) -> int:
    return sum(t.numel() * t.element_size() for t in (*rec.keys, *rec.values, rec.final))


class PrefixMemo:
    """Prefix records by model and batch content, at most ``max_bytes`` of them.

    Attributes:
        hits, misses: lookups that found a record / ran the pass.
        nbytes: bytes of keys, values and final states held now.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = int(max_bytes)
        self.hits = 0
        self.misses = 0
        self.nbytes = 0
        self._records: OrderedDict[tuple, PrefixRecord] = OrderedDict()

    @staticmethod
    def _key(model: Model, batch: TokenBatch, d: int) -> tuple:
        t, n = batch.tokens.detach().cpu(), batch.lengths.detach().cpu()
        # the unembedding's storage and version guard against a reloaded or edited model
        # (edits to other weights inside the block are not seen: keep the block to one run)
        w = model.W_U
        return (id(model), w.data_ptr(), w._version, d, batch.pad_id, batch.has_bos,
                tuple(t.shape), t.numpy().tobytes(), n.numpy().tobytes())  # fmt: skip

    def record(self, model: Model, batch: TokenBatch, d: int) -> PrefixRecord:
        """:func:`~mechlingo.activations.prefix.record_head` of ``batch`` at ``d``, from
        the memo when the same model already ran the same batch."""
        key = self._key(model, batch, d)
        hit = self._records.get(key)
        if hit is not None:
            self.hits += 1
            self._records.move_to_end(key)
            return hit
        self.misses += 1
        rec = record_head(model, batch, d)
        size = _nbytes(rec)
        if size <= self.max_bytes:
            self._records[key] = rec
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, old = self._records.popitem(last=False)
                self.nbytes -= _nbytes(old)
        return rec

    def stats(self) -> dict[str, Any]:
        """Hits, misses, records and bytes held (for logs and tests)."""
        return {"hits": self.hits, "misses": self.misses, "records": len(self._records),
                "bytes": self.nbytes}  # fmt: skip


_CURRENT: ContextVar[PrefixMemo | None] = ContextVar("mechlingo_prefix_memo", default=None)


def current_memo() -> PrefixMemo | None:
    """The memo of the innermost :func:`reusing_prefixes` block, if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def reusing_prefixes(memo: PrefixMemo) -> Iterator[PrefixMemo]:
    """Inside the block, shared-prefix scoring takes its unpatched prefix passes from
    ``memo`` (and adds the ones it runs)."""
    token = _CURRENT.set(memo)
    try:
        yield memo
    finally:
        _CURRENT.reset(token)
