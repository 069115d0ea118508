"""Tokens: padding- and BOS-safe batches, positions and chat prompts.

* :class:`TokenBatch` and :func:`encode` -- right-padded batches (every prompt starts at
  position 0; a row's last real token is at ``lengths[i] - 1``, never read ``-1`` of a padded
  batch); :func:`batch_context` sets the current batch that interventions read;
* :func:`position_mask` -- the position rules (``"last"``, ``"all"``, ``"generated"``, ...);
* :func:`token_ids` -- a text's ids alone (no BOS); an answer's token set is
  :func:`mechlingo.core.answers.answer_tokens`;
* :func:`use_chat`, :class:`ChatPrompt`, :func:`chat_prefix_length` -- chat mode: the stem
  is the user's turn and opens the assistant's turn, so answers, last positions and stem
  tokens are those of the plain prompt (``"off"`` in the Python API, ``"auto"`` on the
  command line).

The rules in full: ``docs/concepts.md`` (positions, answer token sets, chat models)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from mechlingo.core.errors import InputError, MechlingoError
from mechlingo.core.types import Model

#: The bundled languages whose answers follow without a space (any language:
#: :func:`mechlingo.core.languages.writes_spaces`, told from its script).
SPACELESS_LANGS = frozenset({"zh", "ja"})


class TokenizationError(MechlingoError, ValueError):
    """A prompt or answer cannot be tokenized in a way the analysis can use."""


@dataclass
class TokenBatch:
    """Right-padded token ids with each row's real length.

    Attributes:
        tokens: ``[batch, pos]`` ids; positions ``>= lengths[i]`` hold ``pad_id``.
        lengths: number of real tokens per row (BOS included when ``has_bos``).
        prompt_lengths: length of each row's prompt. Equal to ``lengths`` except during
            generation, where tokens after the prompt are generated ones.
        pad_id: id used for padding.
        has_bos: whether position 0 of every row is a BOS token.
    """

    tokens: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]
    pad_id: int
    has_bos: bool
    prompt_lengths: Int[Tensor, " batch"] = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.prompt_lengths is None:
            self.prompt_lengths = self.lengths.clone()

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def last_index(self) -> Int[Tensor, " batch"]:
        """Index of each row's last real token."""
        return self.lengths - 1

    @property
    def prompt_last_index(self) -> Int[Tensor, " batch"]:
        """Index of each row's last prompt token (differs from ``last_index`` in generation)."""
        return self.prompt_lengths - 1

    @property
    def mask(self) -> Bool[Tensor, "batch pos"]:
        """True at real tokens (BOS included), False at padding."""
        pos = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return pos.unsqueeze(0) < self.lengths.to(self.tokens.device).unsqueeze(1)

    def real_token_mask(self, include_bos: bool = False) -> Bool[Tensor, "batch pos"]:
        """Real tokens, without the BOS position unless ``include_bos``."""
        m = self.mask
        if self.has_bos and not include_bos:
            m = m.clone()
            m[:, 0] = False
        return m

    def attention_mask(self) -> Int[Tensor, "batch pos"]:
        return self.mask.long()

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(
            self.tokens.to(device),
            self.lengths.to(device),
            self.pad_id,
            self.has_bos,
            self.prompt_lengths.to(device),
        )

    def select(self, rows: Sequence[int] | Tensor) -> TokenBatch:
        """A sub-batch of the given rows, trimmed to its longest row."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.tokens.device)
        lengths = self.lengths[idx]
        width = int(lengths.max())
        return TokenBatch(
            self.tokens[idx, :width], lengths, self.pad_id, self.has_bos, self.prompt_lengths[idx]
        )


def _pad_id(model: Model) -> int:
    tok = getattr(model, "tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    if pad is None:
        pad = getattr(tok, "eos_token_id", None)
    return int(pad) if pad is not None else 0


def prepends_bos(model: Model) -> bool:
    """Whether the model's ``to_tokens`` adds a BOS token by default."""
    return bool(getattr(model.cfg, "default_prepend_bos", True))


def encode(model: Model, prompts: Sequence[str], *, prepend_bos: bool | None = None) -> TokenBatch:
    """Tokenize prompts one by one (as ``model.to_tokens`` would each alone) and right-pad.

    Raises:
        TokenizationError: an empty list, or a prompt with no tokens.
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    if len(prompts) == 0:
        raise TokenizationError("no prompts to encode")
    bos = prepends_bos(model) if prepend_bos is None else bool(prepend_bos)
    rows = []
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise TokenizationError(f"prompt {i} is a {type(p).__name__}, not a string")
        ids = (
            chat_tokens(model, p, bos=bos)  # the chat template around it (below)
            if chat_enabled(model)
            else model.to_tokens(p, prepend_bos=bos, truncate=False)[0]
        )
        if ids.numel() == 0 or (bos and ids.numel() == 1 and p == ""):
            raise TokenizationError(f"prompt {i} ({p!r}) has no tokens")
        rows.append(ids)
    return pad_rows(rows, pad_id=_pad_id(model), has_bos=bos)


def pad_rows(rows: Sequence[Tensor], *, pad_id: int, has_bos: bool) -> TokenBatch:
    """Right-pad 1-D id tensors into a :class:`TokenBatch`."""
    lengths = torch.tensor([int(r.numel()) for r in rows], dtype=torch.long)
    width = int(lengths.max())
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long, device=rows[0].device)
    for i, r in enumerate(rows):
        tokens[i, : r.numel()] = r
    return TokenBatch(tokens, lengths.to(tokens.device), pad_id, has_bos)


def sorted_batches(lengths: Tensor | Sequence[int], batch_size: int) -> list[list[int]]:
    """Row indices in batches of similar length (sorted), to keep padding small."""
    lengths = [int(x) for x in lengths]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return [order[k : k + batch_size] for k in range(0, len(order), batch_size)]


# --------------------------------------------------------------------------------------
# The batch of the run in progress, for hooks that need per-row positions
# --------------------------------------------------------------------------------------

_CURRENT_BATCH: ContextVar[TokenBatch | None] = ContextVar("mechlingo_batch", default=None)
_CURRENT_COLUMNS: ContextVar[Tensor | None] = ContextVar("mechlingo_columns", default=None)


@contextlib.contextmanager
def batch_context(batch: TokenBatch, columns: Tensor | None = None) -> Iterator[TokenBatch]:
    """Make ``batch`` the current batch while a mechlingo run is in progress, so that
    interventions can find each row's last real token.

    Args:
        batch: the whole sequence of every row (prompt and, during generation, the tokens
            generated so far), right-padded.
        columns: ``[batch, t]`` positions in ``batch`` of the ``t`` columns the running
            forward pass computes, or ``None`` when it computes all of them. A KV-cached
            decoding step computes one new token per row: its column is that token's position,
            so position rules (``"last"``, ``"generated"``, integers, callables) still refer
            to the whole sequence.
    """
    token = _CURRENT_BATCH.set(batch)
    col_token = _CURRENT_COLUMNS.set(columns)
    try:
        yield batch
    finally:
        _CURRENT_COLUMNS.reset(col_token)
        _CURRENT_BATCH.reset(token)


def current_batch() -> TokenBatch | None:
    """The batch set by :func:`batch_context`, or ``None`` outside mechlingo runs."""
    return _CURRENT_BATCH.get()


def current_columns() -> Tensor | None:
    """The ``[batch, t]`` positions of the running pass's columns in :func:`current_batch`
    (set during KV-cached decoding steps), or ``None`` when the pass computes every
    position. A plain TransformerLens hook that indexes positions can use it to stay correct
    under cached generation."""
    return _CURRENT_COLUMNS.get()


PositionSpec = str | int | Sequence[int] | Callable[[TokenBatch], Tensor]


def position_mask(
    positions: PositionSpec,
    batch: TokenBatch | None,
    shape: tuple[int, int],
    device: torch.device | str | None = None,
    columns: Tensor | None = None,
) -> Bool[Tensor, "batch pos"]:
    """Where a positions rule applies in a ``[batch, pos]`` activation.

    Rules: ``"last"`` (each row's last *prompt* token), ``"all"`` (every real token except
    BOS), ``"all_with_bos"``, ``"generated"`` (tokens after the prompt, during generation),
    ``"last+generated"``, an int or list of ints (non-negative: absolute positions; negative:
    counted back from each row's last prompt token, so ``-1`` is that token), or a callable
    ``f(batch) -> bool mask [batch, pos] or index tensor [batch]``.

    Without a batch (a plain ``run_with_hooks`` on an unpadded tensor) every row is taken to be
    fully real, with a BOS at position 0.

    With ``columns`` (``[batch, t]``, a KV-cached decoding step), the rule is evaluated on the
    whole sequence held in ``batch`` and read at those positions, so the result is the same
    as in a pass that recomputes every position.
    """
    if columns is not None and batch is not None:
        b, t = shape
        if tuple(columns.shape) != (b, t) or batch.tokens.shape[0] != b:
            raise TokenizationError(
                f"activation of shape {(b, t)} does not match the decoding step's columns "
                f"{tuple(columns.shape)} and batch of {batch.tokens.shape[0]} rows"
            )
        width = batch.tokens.shape[1]
        full = position_mask(positions, batch, (b, width), device=device)
        cols = columns.to(full.device).long()
        inside = (cols >= 0) & (cols < width)
        return full.gather(1, cols.clamp(0, width - 1)) & inside
    b, t = shape
    if batch is None or batch.tokens.shape[0] != b or batch.tokens.shape[1] != t:
        if batch is not None and batch.tokens.shape[0] == b and batch.tokens.shape[1] < t:
            raise TokenizationError(
                f"activation has {t} positions but the current batch has {batch.tokens.shape[1]}"
            )
        lengths = torch.full((b,), t, dtype=torch.long)
        batch = TokenBatch(torch.zeros(b, t, dtype=torch.long), lengths, 0, True)
    dev = device if device is not None else batch.tokens.device
    pos = torch.arange(t, device=dev).unsqueeze(0)
    lengths = batch.lengths.to(dev).unsqueeze(1)
    plen = batch.prompt_lengths.to(dev).unsqueeze(1)
    real = pos < lengths
    if callable(positions) and not isinstance(positions, str):
        out = positions(batch)
        out = torch.as_tensor(out, device=dev)
        if out.dtype == torch.bool:
            if tuple(out.shape) != (b, t):
                raise TokenizationError(
                    f"a positions callable returned a mask of shape {tuple(out.shape)}, "
                    f"expected {(b, t)}"
                )
            return out & real
        out = out.long().reshape(b, -1)
        mask = torch.zeros(b, t, dtype=torch.bool, device=dev)
        return mask.scatter(1, out.clamp(0, t - 1), True) & real
    if isinstance(positions, str):
        if positions == "last":
            return pos == plen - 1
        if positions == "all":
            first = 1 if batch.has_bos else 0
            return real & (pos >= first)
        if positions == "all_with_bos":
            return real
        if positions == "generated":
            return real & (pos >= plen)
        if positions == "last+generated":
            return real & (pos >= plen - 1)
        raise TokenizationError(
            f"unknown positions rule {positions!r}; use 'last', 'all', 'all_with_bos', "
            "'generated', 'last+generated', integer positions or a callable"
        )
    idx = [positions] if isinstance(positions, int) else list(positions)
    if not idx:
        raise TokenizationError("an empty list of positions")
    mask = torch.zeros(b, t, dtype=torch.bool, device=dev)
    for p in idx:
        p = int(p)
        target = (plen + p) if p < 0 else torch.full_like(plen, p)
        if bool(((target < 0) | (target >= plen)).any()):
            raise TokenizationError(
                f"position {p} is outside some prompt (prompt lengths "
                f"{batch.prompt_lengths.tolist()}); negative positions count back from each "
                "prompt's last token"
            )
        mask |= pos == target
    return mask


def token_ids(model: Model, text: str) -> list[int]:
    """The token ids of ``text`` alone (no BOS); none for an empty text."""
    if not text:
        return []
    return [int(i) for i in model.to_tokens(text, prepend_bos=False, truncate=False)[0].tolist()]


# --------------------------------------------------------------------------------------
# Chat templates (see the module docstring)
# --------------------------------------------------------------------------------------

CHAT_MODES: tuple[str, ...] = ("auto", "on", "off")

_ATTR = "_mechlingo_chat"
_CHAT_MODEL_NAME = re.compile(
    r"(?:^|[-_./ ])(?:it|instruct|chat|sft|dpo|rlhf)(?:$|[-_./ \d])", re.I
)


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


def looks_chat_model(name: str) -> bool:
    """Whether a model name says it is a chat (instruction-following) model
    (``gemma-3-1b-it``, ``Qwen2.5-0.5B-Instruct``, ``...-chat``, ``...-sft``)."""
    return bool(_CHAT_MODEL_NAME.search(name or ""))


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
    on = mode == "on" or (mode == "auto" and template and looks_chat_model(name))
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


def chat_token_ids(model: Model, prompt: str, *, bos: bool) -> list[int]:
    """The token ids of ``prompt`` in chat form: the template part, then the query's own
    tokens (tokenized alone, so they equal its plain tokens). The template's BOS (rendered
    as text by most templates) is the sequence's first token when ``bos``, and is dropped
    otherwise."""
    head, query = _template_head(model, prompt)
    bos_id = getattr(model.tokenizer, "bos_token_id", None)
    head_ids = token_ids(model, head)
    if head_ids and bos_id is not None and head_ids[0] == bos_id:
        head_ids = head_ids[1:]
    start = [int(bos_id)] if bos and bos_id is not None else []
    return start + head_ids + token_ids(model, query)


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
    ids = token_ids(model, head)
    bos_id = getattr(model.tokenizer, "bos_token_id", None)
    return len(ids) - (1 if ids and bos_id is not None and ids[0] == bos_id else 0)
