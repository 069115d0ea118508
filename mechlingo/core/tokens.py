"""Tokens: padding- and BOS-safe batches, positions, answer token sets and chat prompts.

* :class:`TokenBatch` and :func:`encode` -- right-padded batches (every prompt starts at
  position 0; a row's last real token is at ``lengths[i] - 1``, never read ``-1`` of a padded
  batch); :func:`batch_context` sets the current batch that interventions read;
* :func:`position_mask` -- the position rules (``"last"``, ``"all"``, ``"generated"``, ...);
* :func:`answer_tokens` -- an answer's token set (primary token, spacing variant, prefixes)
  and ``n_tokens``; an answer that tokenizes to nothing is an error;
* :func:`use_chat`, :class:`ChatPrompt`, :func:`chat_prefix_length` -- chat mode: the stem
  is the user's turn and opens the assistant's turn, so answers, last positions and stem
  tokens are those of the plain prompt (``"off"`` in the Python API, ``"auto"`` on the
  command line).

The rules in full: ``docs/concepts.md`` (positions, answer token sets, chat models)."""

from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from mechlingo.core.errors import InputError, MechlingoError
from mechlingo.core.languages import writes_spaces
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


# --------------------------------------------------------------------------------------
# Answer token sets
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnswerTokens:
    """The tokens that count as "the model is saying this word" at the next position.

    Attributes:
        word: the answer word.
        primary: id of the first token of the answer as it continues the prompt.
        ids: the whole set (primary, the other spacing variant, and prefix tokens).
        n_tokens: how many tokens the continuation form of the answer takes.
    """

    word: str
    primary: int
    ids: tuple[int, ...]
    n_tokens: int


#: The modules of the tokenizer classes whose ``decode`` of one sequence is the Rust
#: backend's ``decode`` followed by the optional clean-up (transformers 5, and 4's fast
#: tokenizers): for these, :func:`_decode_each` asks the backend for the whole vocabulary at
#: once (``decode_batch``, faster than ``batch_decode``'s sequence-by-sequence calls:
#: docs/benchmarks.md).
_BACKEND_DECODE_MODULES = (
    "transformers.tokenization_utils_tokenizers",
    "transformers.tokenization_utils_fast",
)


def _backend_decodes(tokenizer: Any) -> bool:
    """Whether ``tokenizer.batch_decode`` of single ids is its backend's ``decode_batch``:
    a fast tokenizer without clean-up whose decoding methods are transformers' own."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if not getattr(tokenizer, "is_fast", False) or not hasattr(backend, "decode_batch"):
        return False
    if getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return False
    for name in ("_decode", "decode", "batch_decode"):
        owner = next((c for c in type(tokenizer).__mro__ if name in c.__dict__), None)
        base = owner is not None and owner.__module__.startswith("transformers.tokenization_utils")
        if not base or (name == "_decode" and owner.__module__ not in _BACKEND_DECODE_MODULES):
            return False
    return True


def _decode_each(tokenizer: Any, n: int) -> list[str]:
    """Each of the ids ``0 .. n-1`` decoded alone: ``tokenizer.batch_decode([[0], [1], ...])``,
    through the backend's batch decode where that is the same (:func:`_backend_decodes`;
    checked on the first, middle and last ids)."""
    ids = [[i] for i in range(n)]
    if n and _backend_decodes(tokenizer):
        texts: list[str] = tokenizer._tokenizer.decode_batch(ids, skip_special_tokens=False)
        probe = sorted({0, n - 1, n // 2})
        if tokenizer.batch_decode([ids[i] for i in probe]) == [texts[i] for i in probe]:
            return texts
    return list(tokenizer.batch_decode(ids))


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block (restored after, as it was). Building
    the vocabulary index makes a few hundred thousand small lists, and each full collection
    they trigger would walk every object of the process (a loaded model holds about a
    million): most of the build's time, for objects that form no cycles."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _VocabIndex:
    """Decoded vocabulary: text with one leading space stripped -> token ids."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.by_text: dict[str, list[int]] = {}
        with _gc_paused():
            texts = _decode_each(tokenizer, vocab_size)
            for i, text in enumerate(texts):
                key = text[1:] if text.startswith(" ") else text
                if key and "\ufffd" not in key:
                    self.by_text.setdefault(key, []).append(i)


_VOCAB_INDEX: dict[int, tuple[Any, _VocabIndex]] = {}


def _vocab_index(model: Model) -> _VocabIndex:
    tok = model.tokenizer
    key = id(tok)
    hit = _VOCAB_INDEX.get(key)
    if hit is not None and hit[0] is tok:
        return hit[1]
    index = _VocabIndex(tok, int(model.cfg.d_vocab))
    _VOCAB_INDEX[key] = (tok, index)
    return index


def _ids(model: Model, text: str) -> list[int]:
    """The token ids of ``text`` alone (no BOS); none for an empty text."""
    if not text:
        return []
    return [int(i) for i in model.to_tokens(text, prepend_bos=False, truncate=False)[0].tolist()]


def answer_tokens(
    model: Model, word: str, *, lang: str | None = None, prefixes: bool = True
) -> AnswerTokens:
    """The answer token set of ``word`` (see the module docstring for the rule).

    Args:
        word: the answer as written (no leading space).
        lang: language of the text the answer continues; languages whose script writes no
            spaces (Chinese, Japanese, Thai, ...) continue without a space, every other
            language with one.
        prefixes: also add vocabulary tokens that are prefixes of the word.

    Raises:
        TokenizationError: the answer is empty or tokenizes to nothing.
    """
    word = word.strip()
    if not word:
        raise TokenizationError("an empty answer has no tokens")
    spaced = " " + word
    main, other = (spaced, word) if writes_spaces(lang) else (word, spaced)
    main_ids = _ids(model, main)
    other_ids = _ids(model, other)
    if not main_ids:
        raise TokenizationError(f"answer {word!r} tokenizes to nothing")
    n_tokens = len(main_ids)
    # A tokenizer without a leading-space marker may write the space as a token of its own;
    # " " would then be every answer's primary token: track the word's first token instead.
    main_ids = _drop_leading_space_tokens(model, main_ids)
    other_ids = _drop_leading_space_tokens(model, other_ids)
    if not main_ids:
        raise TokenizationError(f"answer {word!r} tokenizes to whitespace only")
    ids = [main_ids[0]]
    if other_ids and other_ids[0] not in ids:
        other_text = model.tokenizer.decode([other_ids[0]]).strip()
        if other_text and word.startswith(other_text):
            ids.append(other_ids[0])
    if prefixes:
        index = _vocab_index(model)
        shortest = min(3, len(word)) if writes_spaces(lang) else 1
        for k in range(shortest, len(word) + 1):
            for i in index.by_text.get(word[:k], ()):
                if i not in ids:
                    ids.append(i)
    return AnswerTokens(word, main_ids[0], tuple(ids), n_tokens)


def _drop_leading_space_tokens(model: Model, ids: list[int]) -> list[int]:
    """``ids`` without the leading tokens that decode to whitespace only."""
    k = 0
    while k < len(ids) and not model.tokenizer.decode([ids[k]]).strip():
        k += 1
    return ids[k:]


def pack_token_sets(
    sets: Sequence[Sequence[AnswerTokens]], device: torch.device | str | None = None
) -> tuple[Int[Tensor, "row track member"], Int[Tensor, "row track"]]:
    """Pack per-row lists of answer sets into a padded id tensor (``-1`` = no token) and the
    primary ids, the form :func:`mechlingo.kernels.readout.read_logits` takes."""
    n_rows = len(sets)
    n_track = len(sets[0]) if n_rows else 0
    width = max((len(a.ids) for row in sets for a in row), default=1)
    ids = torch.full((n_rows, n_track, width), -1, dtype=torch.long)
    primary = torch.zeros((n_rows, n_track), dtype=torch.long)
    for r, row in enumerate(sets):
        if len(row) != n_track:
            raise TokenizationError("every row needs the same number of answer sets")
        for s, a in enumerate(row):
            ids[r, s, : len(a.ids)] = torch.tensor(a.ids)
            primary[r, s] = a.primary
    if device is not None:
        ids, primary = ids.to(device), primary.to(device)
    return ids, primary


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
