"""The answers of a fact, in one place: how an answer is written after its prompt, which of its
aliases count, how a generation is matched against it, and which tokens are "the model saying it".

* variants -- :func:`answer_separator`, :func:`complete`, :func:`answer_key`,
  :func:`distinct_aliases`;
* matching -- the eval rule (:func:`is_correct`: the first line, after :func:`normalize`, starts
  with the answer or an alias, at a word boundary in languages written with spaces);
  :func:`match_status` on a partial generation, :func:`decided` and :func:`decision_prefix`
  for when its verdict is final;
* what a generation did besides answering -- :func:`shared_form`, :func:`continues_prompt`,
  :func:`echoes_subject`, all of them at once: :func:`generation_flags`;
* token sets -- :func:`answer_tokens` (:class:`AnswerTokens`) and :func:`pack_token_sets`.

The rules in full: ``docs/concepts.md`` (answer token sets) and ``docs/methods/scoring.md``
(the eval rule)."""

from __future__ import annotations

import contextlib
import gc
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from mechlingo.core.languages import needs_word_boundary, writes_spaces
from mechlingo.core.tokens import TokenizationError, token_ids
from mechlingo.core.types import Model

__all__ = [
    "BOUNDARY_FREE_LANGS",
    "AnswerTokens",
    "answer_key",
    "answer_separator",
    "answer_tokens",
    "complete",
    "continues_prompt",
    "decided",
    "decision_prefix",
    "distinct_aliases",
    "echoes_subject",
    "first_line",
    "generation_flags",
    "is_correct",
    "match_status",
    "normalize",
    "pack_token_sets",
    "shared_form",
]


# --------------------------------------------------------------------------------------
# Variants: an answer written after its prompt, and its aliases
# --------------------------------------------------------------------------------------


def answer_separator(lang: str) -> str:
    """The text between a prompt and its answer when both are written out: ``""`` for the
    languages whose script writes no spaces (Chinese, Japanese, Thai, ...:
    :func:`~mechlingo.core.languages.writes_spaces`), ``" "`` otherwise."""
    return " " if writes_spaces(lang) else ""


def complete(prompt: str, answer: str, lang: str) -> str:
    """``prompt`` followed by ``answer`` with the separator of ``lang`` (a full statement)."""
    return f"{prompt}{answer_separator(lang)}{answer}"


#: Arabic short vowels and tatweel, ignored when answers are compared.
# str.translate maps code points (ints): a table keyed by characters would remove nothing.
_ARABIC_MARKS: dict[int, None] = {c: None for c in [*range(0x064B, 0x0653), 0x0640, 0x0670]}


def answer_key(text: str) -> str:
    """A loose comparison form of an answer, used to drop duplicate aliases: NFKC,
    casefolded, punctuation and symbols removed, Arabic vowel marks removed, whitespace
    collapsed. (Scoring generations is :func:`is_correct`.)"""
    text = unicodedata.normalize("NFKC", text).casefold().translate(_ARABIC_MARKS)
    text = "".join(ch for ch in text if unicodedata.category(ch)[0] not in "PS")
    return " ".join(text.split())


def distinct_aliases(answer: str, aliases: Iterable[str]) -> list[str]:
    """``aliases`` without those that normalize (:func:`answer_key`) to nothing, to the
    answer or to an earlier alias, in their order."""
    seen = {answer_key(answer)}
    out = []
    for alias in aliases:
        key = answer_key(alias)
        if key and key not in seen:
            seen.add(key)
            out.append(alias)
    return out


# --------------------------------------------------------------------------------------
# Matching: the eval rule
# --------------------------------------------------------------------------------------


#: The bundled languages matched without a word boundary after the answer (any language:
#: :func:`mechlingo.core.languages.needs_word_boundary`, told from its script).
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
    return _starts_with(generation, answers, needs_word_boundary(lang))


def _starts_with(generation: str, answers: Sequence[str], boundary: bool) -> bool:
    """:func:`is_correct` in a language that needs (``boundary``) or does not need a word
    boundary after the answer."""
    gen = normalize(generation.split("\n")[0] if generation.strip() else generation.strip())
    for ans in answers:
        a = normalize(ans)
        if not a or not gen.startswith(a):
            continue
        if not boundary or len(gen) == len(a):
            return True
        nxt = gen[len(a)]
        if not (nxt.isalnum() or unicodedata.category(nxt).startswith("M")):
            return True
    return False


def match_status(gen: str, answer: str, lang: str | None) -> str:
    """``"match"``, ``"fail"`` or ``"open"`` for a normalised partial generation against one
    normalised answer under the eval rule."""
    if not answer:
        return "fail"
    if gen.startswith(answer):
        if not needs_word_boundary(lang):
            return "match"
        if len(gen) == len(answer):
            return "open"  # the next character decides the word boundary
        nxt = gen[len(answer)]
        ok = not (nxt.isalnum() or unicodedata.category(nxt).startswith("M"))
        return "match" if ok else "fail"
    return "open" if answer.startswith(gen) else "fail"


def decided(
    generation: str, answers: Sequence[str], lang: str | None = None, english: str = ""
) -> bool:
    """Whether the eval rule's verdicts on a *partial* greedy generation are already final:
    it is correct whatever follows, or it can no longer match any answer (nor ``english``,
    the English answer, whose match :class:`~mechlingo.scoring.evaluate.EvalResult` records
    as ``in_english``).

    A line break also decides (the rule reads the first line). Used to stop decoding a row
    early; the verdicts equal those on the full generation (tested)."""
    line = generation.split("\n")[0]
    finished = "\n" in generation and bool(generation.strip())
    text = line.rstrip("\ufffd")  # an incomplete multi-byte character is not text yet
    gen = normalize(text)
    if finished:
        return True
    if not gen or text != line:
        return False
    gold = [match_status(gen, normalize(a), lang) for a in answers]
    if "match" in gold:
        return True
    if "open" in gold:
        return False
    return not english or match_status(gen, normalize(english), "en") != "open"


# --------------------------------------------------------------------------------------
# What a generation did besides answering
# --------------------------------------------------------------------------------------


def shared_form(lang: str, answers: Sequence[str], english: str) -> bool:
    """Whether a non-English answer (``answers``: the answer and its aliases) is written as
    its ``english`` answer (fr ``Tirana``, de ``Berlin``): no translation is needed, so a
    wrong answer cannot be a translation failure (compared after :func:`normalize`)."""
    if lang == "en" or not english:
        return False
    return normalize(english) in {normalize(a) for a in answers}


def _word_char(ch: str) -> bool:
    return ch.isalnum() or unicodedata.category(ch).startswith("M")


def continues_prompt(prompt: str, continuation: str, lang: str) -> bool:
    """Whether the raw greedy ``continuation`` glues onto the prompt's last word: the
    language writes a space before its answers (:func:`answer_separator`), the prompt ends in
    a letter or digit and the continuation starts with one, with no space or punctuation
    between (German ``"... in der Stadt"`` continued as ``"bibliothek"``: the model goes on
    with the word, it does not answer)."""
    return writes_spaces(lang) and _glues(prompt, continuation)


def _glues(prompt: str, continuation: str) -> bool:
    """:func:`continues_prompt` in a language written with spaces."""
    return bool(prompt and continuation) and _word_char(prompt[-1]) and _word_char(continuation[0])


def echoes_subject(generation: str, subject: str, answers: Sequence[str], lang: str) -> bool:
    """Whether the greedy answer starts by repeating the ``subject`` (the eval rule's match,
    :func:`is_correct`, of the subject; Japanese ``"日本の首都は…"`` for the subject 日本),
    unless one of ``answers`` itself starts with the subject (``Mexico City`` for Mexico)."""
    return _echoes(generation, subject, answers, needs_word_boundary(lang))


def _echoes(generation: str, subject: str, answers: Sequence[str], boundary: bool) -> bool:
    """:func:`echoes_subject` in a language that needs (``boundary``) or does not need a word
    boundary after the answer."""
    subj = normalize(subject)
    if not subj or any(normalize(a).startswith(subj) for a in answers):
        return False
    return _starts_with(generation, [subject], boundary)


def decision_prefix(
    generation: str, answers: Sequence[str], lang: str | None = None, english: str = ""
) -> str:
    """The shortest prefix of ``generation`` on which the eval rule's verdict is final
    (:func:`decided`: right whatever follows, or no longer able to match an answer or the
    ``english`` answer); the whole generation when only its end (a line break or the token
    budget) decided it. Early-stopped scoring keeps the first generated tokens that contain
    this prefix."""
    for k in range(1, len(generation) + 1):
        if decided(generation[:k], answers, lang, english):
            return generation[:k]
    return generation


def generation_flags(
    prompt: str,
    subject: str,
    lang: str,
    answers: Sequence[str],
    english: str,
    continuation: str | None,
) -> dict[str, Any]:
    """What a fact's greedy ``continuation`` did besides answering, as record fields (the
    language's rules looked up once): ``shared_form`` (:func:`shared_form`: the answer is
    written as its ``english`` one), ``continues_prompt`` (:func:`continues_prompt`),
    ``echoes_subject`` (:func:`echoes_subject`, on the first line) and ``decided_at``
    (:func:`decision_prefix` of the first line). ``answers``: the answer and its aliases;
    ``continuation`` ``None``: nothing generated (the flags are ``False``, ``decided_at``
    ``None``)."""
    spaced, boundary = writes_spaces(lang), needs_word_boundary(lang)
    shared = shared_form(lang, answers, english)
    if continuation is None:
        return {"shared_form": shared, "continues_prompt": False, "echoes_subject": False,
                "decided_at": None}  # fmt: skip
    line = first_line(continuation)
    return {
        "shared_form": shared,
        "continues_prompt": spaced and _glues(prompt, continuation),
        "echoes_subject": _echoes(line, subject, answers, boundary),
        "decided_at": decision_prefix(line, answers, lang, english),
    }


def first_line(continuation: str) -> str:
    """The first line of a raw ``continuation`` (``""`` for one of whitespace only): what
    the eval rule reads."""
    return continuation.strip().split("\n")[0] if continuation.strip() else ""


# --------------------------------------------------------------------------------------
# Token sets
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
    main_ids = token_ids(model, main)
    other_ids = token_ids(model, other)
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
