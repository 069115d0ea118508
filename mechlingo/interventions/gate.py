"""Language gating, the row side: which language each row of a batch is in, and the hook
that keeps an edit on the rows that pass (the :class:`~mechlingo.interventions.base.Gated`
intervention, after CAST, Lee et al. 2024, is built from these).

* :class:`RowLanguages` -- each row's language, by its *prompt* tokens: a declared
  ``{prompt: language}`` first, else (``identify=True``) the language identified from the text
  by :func:`mechlingo.data.langid.identify_language`, else ``None`` (left untouched unless
  ``unknown="apply"``);
* :func:`gated_hook` -- the wrapped hook's result on the rows that pass, the untouched
  activation on the others (exactly, with padding and under KV-cached decoding).

The gate needs each row's tokens, so it acts inside mechlingo runs, ``intervene(model, iv,
batch=b)`` and ``iv.fwd_hooks_for(model, b)``; a bare ``run_with_hooks`` is refused. Usage and
guarantees: ``docs/methods/repair-vectors.md`` ("Language-gated interventions")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from mechlingo.core.errors import InterventionError
from mechlingo.core.tokens import TokenBatch, current_batch
from mechlingo.core.types import HookFn, Model
from mechlingo.data.langid import identify_language

__all__ = ["UNKNOWN_RULES", "RowLanguages", "gated_hook"]

#: What a row of unknown language gets: left untouched (``"skip"``) or the edit (``"apply"``).
UNKNOWN_RULES = ("skip", "apply")


class RowLanguages:
    """Each row's prompt language in the current batch, remembered per prompt.

    Args:
        model: the model whose tokenizer turns the declared prompts into tokens.
        declared: ``{prompt: language}`` (rule 1 of the module docstring).
        identify: identify an undeclared prompt from its text (rule 2).
        passes: whether a row of a language (``None``: unknown) gets the intervention.
    """

    def __init__(self, model: Model, declared: Mapping[str, str], *, identify: bool,
                 passes: Callable[[str | None], bool]) -> None:  # fmt: skip
        self.model = model
        self.prompts = dict(declared)
        self.identify = identify
        self.passes = passes
        self.seen: dict[tuple[int, ...], str | None] = {}
        self.declared: dict[bool, dict[tuple[int, ...], str]] = {}

    def _declared(self, bos: bool) -> dict[tuple[int, ...], str]:
        if bos not in self.declared:
            self.declared[bos] = {
                tuple(int(i) for i in self.model.to_tokens(p, prepend_bos=bos, truncate=False)[0]):
                lang for p, lang in self.prompts.items()
            }  # fmt: skip
        return self.declared[bos]

    def lang(self, ids: tuple[int, ...], has_bos: bool) -> str | None:
        if ids in self.seen:
            return self.seen[ids]
        lang = self._declared(has_bos).get(ids) if self.prompts else None
        if lang is None and self.identify:
            body = ids[1:] if has_bos else ids
            lang = identify_language(self.model.tokenizer.decode(list(body)))
        self.seen[ids] = lang
        return lang

    def mask(self, batch: TokenBatch) -> list[bool]:
        """Which rows of ``batch`` get the intervention."""
        tokens = batch.tokens.tolist()
        plen = batch.prompt_lengths.tolist()
        return [
            self.passes(self.lang(tuple(row[: int(n)]), batch.has_bos))
            for row, n in zip(tokens, plen, strict=True)
        ]


def gated_hook(fn: HookFn, rows: RowLanguages) -> HookFn:
    """``fn`` on the rows of the current batch that ``rows`` passes; the other rows keep the
    untouched activation."""

    def hook(t: Tensor, hook: Any) -> Tensor | None:
        batch = current_batch()
        if batch is None:
            raise InterventionError(
                "a language-gated intervention needs each row's tokens: apply it through "
                "mechlingo (evaluate_facts, greedy_generate, collect), `with "
                "mechlingo.intervene(model, iv, batch=b)`, or `iv.fwd_hooks_for(model, b)` "
                "with b = mechlingo.core.tokens.encode(model, prompts)"
            )
        if batch.batch_size != t.shape[0]:
            raise InterventionError(
                f"the activation has {t.shape[0]} rows but the current batch {batch.batch_size}"
            )
        keep = rows.mask(batch)
        if not any(keep):
            return t
        if all(keep):
            return fn(t, hook)
        work = t.clone()
        out = fn(work, hook)
        new = work if out is None else out
        m = torch.tensor(keep, device=t.device).reshape(-1, *([1] * (t.ndim - 1)))
        return torch.where(m, new, t)

    return hook
