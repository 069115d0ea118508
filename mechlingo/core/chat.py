"""Prompts for chat (instruction-tuned) models: the tokenizer's chat template around every
prompt mechlingo tokenizes.

mechlingo's prompts are completion stems ("La capitale de l'Italie est") whose continuation
is the answer. A chat model is asked the same way in its own format: the stem is the user's
turn, and the assistant's turn is *opened with the stem itself* and left open (the template's
``continue_final_message``), so that

* the answer still continues the stem, token for token as without the template (the answer
  token sets, the eval rule and the benchmarks' scoring are unchanged);
* the prompt's last real token is still the stem's last token: interventions at ``"last"``,
  the lens readout and the repair vectors' build positions land where they do for a base
  model;
* the stem's tokens are exactly its tokens without the template (the template part and the
  stem are tokenized separately and joined), so subject spans only shift by the template's
  length (:func:`chat_prefix_length`).

Few-shot prompts and translation prompts carry their solved demonstrations
(:class:`ChatPrompt`, made by :func:`mechlingo.data.prompts.few_shot_prompt` and
``translation_prompt``); in chat form each demonstration is a user turn (its stem) and a
closed assistant turn (the stem and its answer), then the query as above.

The mode is set per model (:func:`use_chat`, ``--chat`` on the command line):

* ``"off"``: plain prompts (the default for the Python API);
* ``"on"``: wrap every prompt; refused for a tokenizer without a chat template;
* ``"auto"`` (the command line's default): on when the tokenizer has a chat template *and*
  the model's name says it is chat-tuned (``-it``, ``instruct``, ``chat``, ``sft``, ``dpo``,
  ``rlhf``), since many base models ship a template they were never trained on (the
  embedded gemma-3-270m has none, so nothing changes for it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

import torch
from jaxtyping import Int
from torch import Tensor

from mechlingo.core.errors import InputError
from mechlingo.core.types import Model

__all__ = [
    "CHAT_MODES",
    "ChatPrompt",
    "chat_enabled",
    "chat_messages",
    "chat_prefix_length",
    "chat_token_ids",
    "chat_tokens",
    "has_chat_template",
    "looks_chat_tuned",
    "use_chat",
]

ChatMode = Literal["auto", "on", "off"]
CHAT_MODES: tuple[str, ...] = ("auto", "on", "off")

_ATTR = "_mechlingo_chat"
_TUNED = re.compile(r"(?:^|[-_./ ])(?:it|instruct|chat|sft|dpo|rlhf)(?:$|[-_./ \d])", re.I)


class ChatPrompt(str):
    """A prompt string that also knows its parts: the query stem and the solved
    demonstrations before it, as ``(stem, stem_with_answer)`` pairs. It is the plain prompt
    wherever a string is used; :func:`chat_messages` uses the parts."""

    query: str
    demos: tuple[tuple[str, str], ...]

    def __new__(
        cls, text: str, *, query: str | None = None, demos: Sequence[tuple[str, str]] = ()
    ) -> ChatPrompt:
        obj = super().__new__(cls, text)
        obj.query = text if query is None else query
        obj.demos = tuple((str(a), str(b)) for a, b in demos)
        return obj


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def looks_chat_tuned(name: str) -> bool:
    """Whether a model name says the model is chat/instruction-tuned (``gemma-3-1b-it``,
    ``Qwen2.5-0.5B-Instruct``, ``...-chat``, ``...-sft``)."""
    return bool(_TUNED.search(name or ""))


def use_chat(model: Model, mode: str = "auto") -> bool:
    """Set whether the prompts mechlingo tokenizes for ``model`` are wrapped in its chat
    template (``"auto"``, ``"on"`` or ``"off"``; see the module docstring). Returns whether
    they now are; the setting stays on the model object until changed.

    Raises:
        InputError: an unknown mode, or ``"on"`` for a tokenizer without a chat template.
    """
    if mode not in CHAT_MODES:
        raise InputError(
            f"unknown chat mode {mode!r}", where="--chat", fix=f"use one of {list(CHAT_MODES)}"
        )
    tok = getattr(model, "tokenizer", None)
    template = has_chat_template(tok)
    if mode == "on" and not template:
        raise InputError(
            "chat mode 'on' needs a tokenizer with a chat template, and this model's has none",
            where="--chat",
            fix="use --chat off (or auto) for a base model, or load the chat model's tokenizer",
        )
    name = str(getattr(model.cfg, "model_name", "") or getattr(tok, "name_or_path", "") or "")
    on = mode == "on" or (mode == "auto" and template and looks_chat_tuned(name))
    setattr(model, _ATTR, bool(on))
    return bool(on)


def chat_enabled(model: Model) -> bool:
    """Whether ``model``'s prompts are wrapped in its chat template (:func:`use_chat`)."""
    return bool(getattr(model, _ATTR, False))


def chat_messages(prompt: str) -> list[dict[str, str]]:
    """The conversation a prompt becomes: per demonstration a user turn (its stem) and an
    assistant turn (stem and answer), then the query as the user's turn and as the start of
    the assistant's (left open)."""
    query = getattr(prompt, "query", str(prompt))
    messages: list[dict[str, str]] = []
    for stem, solved in getattr(prompt, "demos", ()):
        messages += [{"role": "user", "content": stem}, {"role": "assistant", "content": solved}]
    messages += [{"role": "user", "content": query}, {"role": "assistant", "content": query}]
    return messages


def _template_head(model: Model, prompt: str) -> tuple[str, str]:
    """The rendered template up to the open assistant turn's content, and that content."""
    tok = model.tokenizer
    messages = chat_messages(prompt)
    query = messages[-1]["content"]
    text = tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    cut = text.rfind(query.strip())
    if cut < 0 or text[cut:].strip() != query.strip():
        raise InputError(
            "the chat template does not end with the open assistant turn it was given",
            fix="use --chat off for this model",
        )
    return text[:cut], query


def _ids(model: Model, text: str) -> list[int]:
    if not text:
        return []
    return [int(i) for i in model.to_tokens(text, prepend_bos=False, truncate=False)[0]]


def chat_token_ids(model: Model, prompt: str, *, bos: bool) -> list[int]:
    """The token ids of ``prompt`` in chat form: the template part, then the query's own
    tokens (tokenized alone, so they equal its plain tokens). The template's BOS (rendered
    as text by most templates) is the sequence's first token when ``bos``, and is dropped
    otherwise."""
    head, query = _template_head(model, prompt)
    bos_id = getattr(model.tokenizer, "bos_token_id", None)
    head_ids = _ids(model, head)
    if head_ids and bos_id is not None and head_ids[0] == bos_id:
        head_ids = head_ids[1:]
    start = [int(bos_id)] if bos and bos_id is not None else []
    return start + head_ids + _ids(model, query)


def chat_tokens(model: Model, prompt: str, *, bos: bool) -> Int[Tensor, " pos"]:
    """:func:`chat_token_ids` as a tensor on the device ``model.to_tokens`` uses."""
    ids = chat_token_ids(model, prompt, bos=bos)
    device = model.to_tokens("a", prepend_bos=False, truncate=False).device
    return torch.tensor(ids, dtype=torch.long, device=device)


def chat_prefix_length(model: Model, prompt: str) -> int:
    """How many tokens the chat template puts before the query's first token (after BOS);
    0 when chat mode is off for ``model``. A position ``i`` of the plain prompt (BOS
    counted) is ``i + chat_prefix_length(model, prompt)`` in chat form."""
    if not chat_enabled(model):
        return 0
    head, _ = _template_head(model, prompt)
    ids = _ids(model, head)
    bos_id = getattr(model.tokenizer, "bos_token_id", None)
    return len(ids) - (1 if ids and bos_id is not None and ids[0] == bos_id else 0)
