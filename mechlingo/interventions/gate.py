"""Language-gated interventions: apply one only to prompts in some languages.

After CAST (Lee et al. 2024, "Programming Refusal with Conditional Activation Steering"),
where a steering vector is applied only when a condition on the input holds. Here the
condition is the prompt's language: a repair vector meant for non-English queries
(:mod:`mechlingo.analyses.recall.steering`) can be gated to leave English queries untouched::

    gated = Gated(task + diff, langs={"en"}, exclude=True)   # every language but English
    gated = (task + diff).only_for({"fr", "de"})             # French and German only

**Per row.** The gate decides row by row of the running batch. Each hook of the wrapped
intervention computes its result on the whole batch, and the gate keeps it on the rows whose
language passes and the untouched activation on the others, so in a mixed batch the English
rows are exactly what they are without the intervention and the other rows exactly what the
ungated intervention gives them (tested, with padding and under KV-cached decoding, where the
prompt pass and every decoding step see the same rows).

**Which language a row is in**, by its *prompt* (the tokens before generation began):

1. ``declared``: a ``{prompt text: language}`` mapping (e.g. ``{f.prompt: f.lang for f in
   facts}``, :meth:`Gated.for_facts`); a row whose prompt tokens equal a declared prompt's
   tokens gets that language;
2. otherwise, with ``identify=True`` (the default), the prompt text is identified by
   :func:`mechlingo.data.langid.identify_language` (script first, then function words);
3. a row with no language (``None``) is left untouched unless ``unknown="apply"``.

The gate needs each row's tokens, so it acts inside mechlingo runs (``evaluate_facts``,
``greedy_generate``, ``collect``), in ``intervene(model, iv, batch=b)`` and through
``iv.fwd_hooks_for(model, b)``; a plain ``run_with_hooks`` with ``fwd_hooks(model)`` and no
batch is refused with an error that says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from mechlingo.core.errors import InterventionError
from mechlingo.core.tokens import TokenBatch, current_batch
from mechlingo.core.types import HookFn, Model
from mechlingo.data.facts import Fact
from mechlingo.data.langid import identify_language
from mechlingo.interventions.base import Intervention, register_kind, restore_any

__all__ = ["Gated"]

UNKNOWN_RULES = ("skip", "apply")


@register_kind
class Gated(Intervention):
    """``inner`` applied only to the rows whose prompt language is in ``langs`` (or, with
    ``exclude``, not in it).

    Args:
        inner: any intervention (a steering vector, a clamp, an ablation, a composition).
        langs: language codes.
        exclude: apply to every language *but* ``langs`` (``Gated(iv, {"en"},
            exclude=True)`` = non-English only).
        declared: ``{prompt: language}``; these prompts get the declared language.
        identify: identify undeclared prompts from their text (default); ``False`` leaves
            them unknown.
        unknown: what a row of unknown language gets: ``"skip"`` (untouched, default) or
            ``"apply"``.
        meta: saved metadata (see :class:`Intervention`).
    """

    kind = "Gated"

    def __init__(
        self,
        inner: Intervention,
        langs: Iterable[str],
        *,
        exclude: bool = False,
        declared: Mapping[str, str] | None = None,
        identify: bool = True,
        unknown: str = "skip",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(inner, Intervention):
            raise InterventionError(f"Gated wraps an intervention, got a {type(inner).__name__}")
        if isinstance(langs, str):
            langs = [langs]
        self.langs = frozenset(str(x) for x in langs)
        if not self.langs:
            raise InterventionError("Gated needs at least one language code")
        if unknown not in UNKNOWN_RULES:
            raise InterventionError(f"unknown must be one of {UNKNOWN_RULES}, got {unknown!r}")
        self.inner = inner
        self.exclude = bool(exclude)
        self.declared = {str(k): str(v) for k, v in (declared or {}).items()}
        self.identify = bool(identify)
        self.unknown = unknown
        self.meta = dict(meta or {})

    @classmethod
    def for_facts(cls, inner: Intervention, langs: Iterable[str], facts: Sequence[Fact],
                  prompts: Sequence[str] | None = None, **kw: Any) -> Gated:  # fmt: skip
        """A gate whose languages are declared by ``facts`` (each fact's ``lang`` for its
        ``prompt``, or for the matching entry of ``prompts``, e.g. few-shot prompts)."""
        texts = list(prompts) if prompts is not None else [f.prompt for f in facts]
        if len(texts) != len(facts):
            raise InterventionError(f"{len(texts)} prompts for {len(facts)} facts")
        return cls(
            inner, langs, declared={p: f.lang for p, f in zip(texts, facts, strict=True)}, **kw
        )

    def passes(self, lang: str | None) -> bool:
        """Whether a row of language ``lang`` (``None``: unknown) gets the intervention."""
        if lang is None:
            return self.unknown == "apply"
        return (lang not in self.langs) if self.exclude else (lang in self.langs)

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        rows = _RowLanguages(self, model)
        return [(name, _gated(fn, rows)) for name, fn in self.inner.fwd_hooks(model)]

    def _tensors(self) -> dict[str, Tensor]:
        return {f"inner.{k}": v for k, v in self.inner._tensors().items()}

    def _config(self) -> dict[str, Any]:
        return {
            "langs": sorted(self.langs),
            "exclude": self.exclude,
            "declared": self.declared,
            "identify": self.identify,
            "unknown": self.unknown,
            "inner": {"kind": self.inner.kind, "config": self.inner._config(),
                      "meta": self.inner.meta},
        }  # fmt: skip

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> Gated:
        spec = config["inner"]
        sub = {k[len("inner.") :]: v for k, v in tensors.items() if k.startswith("inner.")}
        inner = restore_any(spec["kind"], sub, spec["config"])
        inner.meta = dict(spec.get("meta") or {})
        return cls(inner, config["langs"], exclude=config["exclude"],
                   declared=config.get("declared"), identify=config["identify"],
                   unknown=config["unknown"])  # fmt: skip

    def _fields(self) -> dict[str, str]:
        which = ("all but " if self.exclude else "") + ",".join(sorted(self.langs))
        return {"langs": which, "inner": repr(self.inner), "unknown": self.unknown}


class _RowLanguages:
    """Each row's prompt language in the current batch, remembered per prompt."""

    def __init__(self, gate: Gated, model: Model) -> None:
        self.gate = gate
        self.model = model
        self.seen: dict[tuple[int, ...], str | None] = {}
        self.declared: dict[bool, dict[tuple[int, ...], str]] = {}

    def _declared(self, bos: bool) -> dict[tuple[int, ...], str]:
        if bos not in self.declared:
            self.declared[bos] = {
                tuple(int(i) for i in self.model.to_tokens(p, prepend_bos=bos, truncate=False)[0]):
                lang for p, lang in self.gate.declared.items()
            }  # fmt: skip
        return self.declared[bos]

    def lang(self, ids: tuple[int, ...], has_bos: bool) -> str | None:
        if ids in self.seen:
            return self.seen[ids]
        lang = self._declared(has_bos).get(ids) if self.gate.declared else None
        if lang is None and self.gate.identify:
            body = ids[1:] if has_bos else ids
            lang = identify_language(self.model.tokenizer.decode(list(body)))
        self.seen[ids] = lang
        return lang

    def mask(self, batch: TokenBatch) -> list[bool]:
        """Which rows of ``batch`` get the intervention."""
        tokens = batch.tokens.tolist()
        plen = batch.prompt_lengths.tolist()
        return [
            self.gate.passes(self.lang(tuple(row[: int(n)]), batch.has_bos))
            for row, n in zip(tokens, plen, strict=True)
        ]


def _gated(fn: HookFn, rows: _RowLanguages) -> HookFn:
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
