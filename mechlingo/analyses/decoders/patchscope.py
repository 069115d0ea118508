"""Patchscopes (Ghandeharioun et al. 2024): decode a residual state by letting the model
itself say what it holds.

The state after ``l`` blocks of a prompt's last token is written before block ``l`` of an
identity-style target prompt (``"cat -> cat; 1135 -> 1135; hello -> hello; ?"``, in the
prompt's own language: :data:`TARGET_PROMPTS`) at its placeholder ``?``, and the model's
next-token distribution there (and optionally a greedy continuation) is read. Entry points:
:class:`Patchscope` (``decoder="patchscope"`` of the lens; one target row per entry and
prompt, batched) and :func:`patch_hooks`. ``docs/methods/logit-lens.md`` compares it with the
logit and tuned lenses, with its cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.activations.runs import collect, final_resid_name
from mechlingo.analyses.decoders.entries import lens_hook_names
from mechlingo.analyses.decoders.registry import DecoderOption, register_decoder
from mechlingo.core.errors import InputError
from mechlingo.core.tokens import TokenBatch, encode, pad_rows
from mechlingo.core.types import HookFn, Model
from mechlingo.kernels.readout import greedy_next

__all__ = ["MAX_NEW_TOKENS", "PATCHSCOPE", "PATCHSCOPE_BATCH_SIZE", "TARGET", "TARGET_PROMPTS",
           "Patchscope", "patch_hooks"]  # fmt: skip

#: The patchscope's registered decoder name.
PATCHSCOPE = "patchscope"
#: Greedy continuation tokens per entry by default (0: its first token only).
MAX_NEW_TOKENS = 0
#: Target rows per forward pass by default, above the shared batch of fact prompts: each row is
#: one short target prompt patched at one entry (``lens --help``).
PATCHSCOPE_BATCH_SIZE = 64
#: The target language by default (``None``: each prompt's own).
TARGET: str | None = None
#: One patchscope prompt (every entry decoded) in the card's cost unit, items scored under
#: ``rank`` (measured on the embedded model).
CARD_COST = 7.6

#: Identity-style target prompts per language: word -> same word, a number, a greeting, and
#: the placeholder ``?`` whose position receives the patched state.
TARGET_PROMPTS: dict[str, str] = {
    "en": "cat -> cat; 1135 -> 1135; hello -> hello; ?",
    "de": "Katze -> Katze; 1135 -> 1135; hallo -> hallo; ?",
    "fr": "chat -> chat; 1135 -> 1135; bonjour -> bonjour; ?",
    "es": "gato -> gato; 1135 -> 1135; hola -> hola; ?",
    "it": "gatto -> gatto; 1135 -> 1135; ciao -> ciao; ?",
    "pt": "gato -> gato; 1135 -> 1135; olá -> olá; ?",
    "ru": "кошка -> кошка; 1135 -> 1135; привет -> привет; ?",
    "zh": "猫 -> 猫; 1135 -> 1135; 你好 -> 你好; ?",
    "ja": "猫 -> 猫; 1135 -> 1135; こんにちは -> こんにちは; ?",
    "ko": "고양이 -> 고양이; 1135 -> 1135; 안녕 -> 안녕; ?",
    "ar": "قطة -> قطة; 1135 -> 1135; مرحبا -> مرحبا; ?",
    "hi": "बिल्ली -> बिल्ली; 1135 -> 1135; नमस्ते -> नमस्ते; ?",
}


def patch_hooks(
    model: Model,
    entries: Sequence[int],
    row_entry: Int[Tensor, " row"],
    positions: Int[Tensor, " row"],
    states: Float[Tensor, "row d_model"],
) -> list[tuple[str, HookFn]]:
    """Forward hooks that write ``states[r]`` into row ``r`` of a target batch at position
    ``positions[r]``, at the hook of lens entry ``entries[row_entry[r]]`` (entry ``l < n``:
    ``blocks.l.hook_resid_pre``; entry ``n``: the last block's ``hook_resid_post``)."""
    names = lens_hook_names(model, list(entries))
    fwd_hooks = []
    for k, name in enumerate(names):
        rows = torch.nonzero(row_entry == k).flatten()
        if not rows.numel():
            continue

        def hook(t: Tensor, hook: Any, rows: Tensor = rows) -> Tensor:
            r = rows.to(t.device)
            t[r, positions[rows].to(t.device)] = states[rows].to(t.device, t.dtype)
            return t

        fwd_hooks.append((name, hook))
    return fwd_hooks


@dataclass
class Patchscope:
    """The patchscope decoder.

    Attributes:
        targets: target prompt per language (default :data:`TARGET_PROMPTS`); ``target``
            overrides it for every prompt.
        target: one target language (or a literal prompt ending in the placeholder) for
            every source prompt; ``None``: each prompt's own language (English where a
            language has no target prompt).
        batch_size: target rows per forward pass.
        max_new_tokens: greedy continuation length recorded by :func:`lens_facts`
            (0: none).
    """

    targets: Mapping[str, str] = field(default_factory=lambda: dict(TARGET_PROMPTS))
    target: str | None = TARGET
    batch_size: int = PATCHSCOPE_BATCH_SIZE
    max_new_tokens: int = MAX_NEW_TOKENS
    name: str = PATCHSCOPE

    def check(self, model: Model) -> None:
        """Raise :class:`~mechlingo.core.errors.InputError` when ``model`` cannot run the
        target prompts (no tokenizer) or has no lens entries (a ``SiteError``)."""
        lens_hook_names(model, [0])
        if getattr(model, "tokenizer", None) is None:
            raise InputError("the patchscope needs a model with a tokenizer for its target prompts",
                             fix="load the model with mechlingo.load_model")  # fmt: skip

    def target_prompt(self, lang: str) -> str:
        """The target prompt for a source prompt in ``lang``."""
        key = self.target if self.target is not None else lang
        if key in self.targets:
            return self.targets[key]
        if self.target is not None:
            return self.target  # a literal prompt
        return self.targets.get("en", TARGET_PROMPTS["en"])

    def _rows(self, model: Model, langs: Sequence[str], n_entries: int) -> TokenBatch:
        """One target row per (entry, prompt), entry-major (row = entry * b + prompt)."""
        order = list(dict.fromkeys(langs))
        enc = encode(model, [self.target_prompt(lg) for lg in order])
        one = {lg: enc.tokens[i, : int(enc.lengths[i])] for i, lg in enumerate(order)}
        rows = [one[lg] for _ in range(n_entries) for lg in langs]
        return pad_rows(rows, pad_id=enc.pad_id, has_bos=enc.has_bos)

    def decode(
        self,
        model: Model,
        entries: Sequence[int],
        acts: Float[Tensor, "entry prompt d_model"],
        langs: Sequence[str],
    ) -> Float[Tensor, "entry prompt d_model"]:
        """The target prompts' final residual stream at the placeholder, each patched with
        one source state: ``out[e, i]`` decodes ``acts[e, i]``. Read it through the final
        norm and unembedding (:func:`mechlingo.kernels.readout.read_logits`) for the
        patchscope's next-token distribution."""
        n_e, b, d = acts.shape
        if n_e != len(entries) or b != len(langs):
            raise InputError(f"acts {tuple(acts.shape)} do not match {len(entries)} entries "
                             f"x {len(langs)} prompts")  # fmt: skip
        batch = self._rows(model, langs, n_e)
        row_entry = torch.arange(n_e).repeat_interleave(b)
        states = acts.reshape(n_e * b, d)
        out = torch.empty(n_e * b, d)
        for r0 in range(0, n_e * b, self.batch_size):
            rows = list(range(r0, min(n_e * b, r0 + self.batch_size)))
            sub = batch.select(rows)
            pos = sub.last_index
            fwd_hooks = patch_hooks(model, entries, row_entry[rows], pos, states[rows])
            name = final_resid_name(model)
            out[rows] = collect(model, sub, [name], fwd_hooks=fwd_hooks)[name].cpu()
        return out.reshape(n_e, b, d).to(acts.device)

    def generate(
        self,
        model: Model,
        entries: Sequence[int],
        acts: Float[Tensor, "entry prompt d_model"],
        langs: Sequence[str],
        max_new_tokens: int | None = None,
    ) -> list[list[str]]:
        """Greedy continuations of the patched target prompts, ``[entry][prompt]`` strings of
        ``max_new_tokens`` tokens (the patch stays at the placeholder; every step reruns the
        prefix, which is short)."""
        k = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        n_e, b, d = acts.shape
        batch = self._rows(model, langs, n_e)
        row_entry = torch.arange(n_e).repeat_interleave(b)
        states = acts.reshape(n_e * b, d)
        new = torch.empty(n_e * b, max(0, k), dtype=torch.long)
        name = final_resid_name(model)
        for r0 in range(0, n_e * b, self.batch_size):
            rows = list(range(r0, min(n_e * b, r0 + self.batch_size)))
            sub = batch.select(rows)
            place = sub.last_index.clone()
            fwd_hooks = patch_hooks(model, entries, row_entry[rows], place, states[rows])
            for j in range(k):
                resid = collect(model, sub, [name], fwd_hooks=fwd_hooks)[name]
                nxt = greedy_next(model, resid).cpu()
                new[rows, j] = nxt
                sub = _appended(sub, nxt)
        texts = model.tokenizer.batch_decode(new.tolist())
        return [[texts[e * b + i] for i in range(b)] for e in range(n_e)]


def _appended(batch: TokenBatch, nxt: Int[Tensor, " row"]) -> TokenBatch:
    """Each row with one more token after its last real one."""
    rows = [torch.cat([batch.tokens[i, : int(n)], nxt[i : i + 1].to(batch.tokens.device)])
            for i, n in enumerate(batch.lengths.tolist())]  # fmt: skip
    return pad_rows(rows, pad_id=batch.pad_id, has_bos=batch.has_bos)


def _patchscope(model: Model, *, target: str | None = TARGET,
                max_new_tokens: int = MAX_NEW_TOKENS, **opts: Any) -> Patchscope:  # fmt: skip
    return Patchscope(target=target, max_new_tokens=max_new_tokens)


register_decoder(
    PATCHSCOPE, _patchscope, generates=True, layer_passes=1,
    card_cost=CARD_COST, help="patched into an identity target prompt",
    options=[
        DecoderOption("--patchscope-target", "target", str, TARGET,
                      "language of the identity target prompt for every prompt",
                      why_default="each prompt's own language"),
        DecoderOption("--patchscope-tokens", "max_new_tokens", int, MAX_NEW_TOKENS,
                      "greedy tokens the patchscope generates per layer", why_default="its "
                      "first token only, no generation", minimum=0),
    ],
)  # fmt: skip
