"""Greedy generation and the accuracy rule every intervention is measured against.

**The eval rule.** The model continues the prompt greedily for ``max_new_tokens`` tokens; the
continuation is cut at its first line break; it is *correct* when, after normalisation, it
starts with the answer or one of its aliases. Normalisation: Unicode NFKC, case-folding,
leading whitespace and punctuation (quotes, colons, dashes, brackets) removed, runs of
whitespace collapsed to one space. In languages written with spaces the match must end at a
word boundary ("Rom" does not match "Romania"); in Chinese, Japanese and Korean, where
particles attach to the word, it need not.

Generation recomputes the whole prefix at each step instead of using a key-value cache:
with TransformerLens 4.3 on transformers 5 the bridge's cached decoding gives different
tokens from uncached decoding (its ``past_key_values`` no longer reaches the model), so the
cache is not trusted here. To keep this cheap, prompts of similar lengths share right-padded
batches and only each row's last position is unembedded.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from mechlingo.runs import FwdHooks, next_token_logits
from mechlingo.tokens import TokenBatch, encode, sorted_batches

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from mechlingo.data import Fact

BOUNDARY_FREE_LANGS = frozenset({"zh", "ja", "ko"})
_LEADING_JUNK = re.compile(r"^[\s\"'`“”‘’«»„‚「」『』（）()\[\]{}:：;；,，.。、\-–—*_#]+")
_WS = re.compile(r"\s+")


def normalize(text: str) -> str:
    """The eval rule's normalisation (see the module docstring)."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _LEADING_JUNK.sub("", text)
    return _WS.sub(" ", text).strip()


def is_correct(generation: str, answers: Sequence[str], lang: str | None = None) -> bool:
    """Whether ``generation`` (the continuation) starts with one of ``answers``."""
    gen = normalize(generation.split("\n")[0] if generation.strip() else generation.strip())
    for ans in answers:
        a = normalize(ans)
        if not a or not gen.startswith(a):
            continue
        if lang in BOUNDARY_FREE_LANGS or len(gen) == len(a):
            return True
        nxt = gen[len(a)]
        if not (nxt.isalnum() or unicodedata.category(nxt).startswith("M")):
            return True
    return False


def _hooks_of(model: Any, intervention: Any, fwd_hooks: FwdHooks) -> list:
    hooks = list(fwd_hooks)
    if intervention is not None:
        hooks = list(intervention.fwd_hooks(model)) + hooks
    return hooks


def greedy_generate(
    model: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 8,
    batch_size: int = 16,
    intervention: Any = None,
    fwd_hooks: FwdHooks = (),
    stop_at_newline: bool = True,
    progress: bool = False,
) -> list[str]:
    """Greedy continuations of ``prompts`` (the generated text only).

    Prompts of different lengths share right-padded batches (sorted by length): at each step
    every row's next token is read at its own last real token and written into its first pad
    slot, and causal attention with the attention mask keeps the padding invisible, so the
    result equals generating each prompt alone (tested). The whole prefix is recomputed at each
    step (see the module docstring on the KV cache).

    Args:
        intervention: anything with ``fwd_hooks(model)`` (a mechlingo intervention); applied at
            every step. Its ``"last"`` positions mean the prompt's last token, ``"generated"``
            the tokens generated so far.
        fwd_hooks: extra plain TransformerLens hooks, applied at every step.
        stop_at_newline: stop a row once it has produced a line break after some text.

    Returns:
        One string per prompt, in input order.
    """
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts to generate from")
    hooks = _hooks_of(model, intervention, fwd_hooks)
    batch = encode(model, prompts)
    eos = getattr(model.tokenizer, "eos_token_id", None)
    outputs: list[list[int]] = [[] for _ in prompts]
    with torch.no_grad():
        for rows in tqdm(
            sorted_batches(batch.lengths, batch_size), desc="generating", disable=not progress
        ):
            sub = batch.select(rows)
            tokens, lengths, plen = sub.tokens, sub.lengths.clone(), sub.prompt_lengths
            done = [False] * len(rows)
            ar = torch.arange(len(rows), device=tokens.device)
            for _ in range(max_new_tokens):
                cur = TokenBatch(tokens, lengths, sub.pad_id, sub.has_bos, plen)
                nxt = next_token_logits(model, cur, extra_hooks=hooks).argmax(-1)
                nxt = nxt.to(tokens.device)
                if int(lengths.max()) >= tokens.shape[1]:
                    tokens = torch.cat([tokens, torch.full_like(tokens[:, :1], sub.pad_id)], 1)
                tokens = tokens.clone()
                tokens[ar, lengths] = nxt
                lengths = lengths + 1
                for j, (r, tid) in enumerate(zip(rows, nxt.tolist(), strict=True)):
                    if done[j]:
                        continue
                    if eos is not None and tid == eos:
                        done[j] = True
                        continue
                    outputs[r].append(tid)
                    if stop_at_newline:
                        text = model.tokenizer.decode(outputs[r])
                        done[j] = "\n" in text and bool(text.strip())
                if all(done):
                    break
    return [model.tokenizer.decode(o) for o in outputs]


@dataclass
class EvalResult:
    """Greedy-generation accuracy over facts.

    ``records`` holds one dict per fact: ``id``, ``relation``, ``lang``, ``prompt``,
    ``answer``, ``generation`` (first line of the continuation), ``correct``, and
    ``in_english`` (for non-English prompts: the model gave the English answer instead of the
    target-language one).
    """

    records: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def accuracy(self) -> dict[str, float]:
        """Fraction correct per language (``{lang: x}``)."""
        out: dict[str, list[bool]] = {}
        for r in self.records:
            out.setdefault(r["lang"], []).append(bool(r["correct"]))
        return {lg: sum(v) / len(v) for lg, v in sorted(out.items())}

    def english_rate(self) -> dict[str, float]:
        """Fraction of answers given in English instead of the prompt's language."""
        out: dict[str, list[bool]] = {}
        for r in self.records:
            out.setdefault(r["lang"], []).append(bool(r["in_english"]))
        return {lg: sum(v) / len(v) for lg, v in sorted(out.items())}

    def to_dataframe(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.records)

    def fig_accuracy(self, title: str = "Greedy accuracy per language") -> go.Figure:
        from mechlingo.plots import accuracy_bars

        return accuracy_bars({"accuracy": self.accuracy()}, title)

    def _repr_html_(self) -> str:
        acc = self.accuracy()
        cells = "".join(f"<tr><td>{lg}</td><td>{x:.2f}</td></tr>" for lg, x in acc.items())
        return f"<b>EvalResult</b> ({len(self.records)} facts)<table>{cells}</table>"


def evaluate_facts(
    model: Any,
    facts: Sequence[Fact],
    *,
    prompts: Sequence[str] | None = None,
    max_new_tokens: int = 8,
    batch_size: int = 16,
    intervention: Any = None,
    fwd_hooks: FwdHooks = (),
    progress: bool = False,
) -> EvalResult:
    """Score the model on facts with the eval rule.

    Args:
        prompts: prompts to use instead of each fact's zero-shot ``prompt`` (e.g. few-shot
            prompts); the answers are still the facts' answers.
    """
    facts = list(facts)
    if not facts:
        raise ValueError("no facts selected for evaluation")
    texts = list(prompts) if prompts is not None else [f.prompt for f in facts]
    if len(texts) != len(facts):
        raise ValueError(f"{len(texts)} prompts for {len(facts)} facts")
    gens = greedy_generate(
        model,
        texts,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        intervention=intervention,
        fwd_hooks=fwd_hooks,
        progress=progress,
    )
    records = []
    for f, text, gen in zip(facts, texts, gens, strict=True):
        first_line = gen.strip().split("\n")[0] if gen.strip() else ""
        answers = [f.answer, *f.aliases]
        correct = is_correct(gen, answers, f.lang)
        in_en = (
            f.lang != "en"
            and not correct
            and bool(f.answer_en)
            and normalize(f.answer_en) != normalize(f.answer)
            and is_correct(gen, [f.answer_en], "en")
        )
        records.append(
            {
                "id": f.id,
                "relation": f.relation,
                "lang": f.lang,
                "prompt": text,
                "answer": f.answer,
                "generation": first_line,
                "correct": correct,
                "in_english": in_en,
            }
        )
    return EvalResult(records, {"max_new_tokens": max_new_tokens})
