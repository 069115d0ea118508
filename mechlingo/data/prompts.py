"""Prompt builders: zero-shot, few-shot, translation, and parallel sentences.

Every builder returns a completion stem without trailing whitespace whose intended
continuation is ``fact.answer`` (for Chinese and Japanese the answer follows without a
space, for the other languages after one space, see :func:`answer_separator`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence

from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError
from mechlingo.core.languages import lang_name, native_name
from mechlingo.core.tokens import ChatPrompt
from mechlingo.data.facts import LANG_NAMES, Fact, check_langs
from mechlingo.data.io import load_facts

#: Translation-prompt labels: each language's name in that language (English stays
#: "English"). The default labels of :func:`translation_prompt`, see its docstring.
NATIVE_LANG_NAMES: dict[str, str] = {
    "en": "English",
    "de": "Deutsch",
    "fr": "Français",
    "es": "Español",
    "it": "Italiano",
    "pt": "Português",
    "ru": "Русский",
    "zh": "中文",
    "ja": "日本語",
    "ko": "한국어",
    "ar": "العربية",
    "hi": "हिन्दी",
}


def zero_shot_prompt(fact: Fact) -> str:
    """The fact's own completion stem (``fact.prompt``); its continuation is the answer."""
    return fact.prompt


def _pick(candidates: Sequence[Fact], k: int, seed: int, key: str) -> list[Fact]:
    rng = random.Random(f"{seed}|{key}")
    return rng.sample(list(candidates), k)


def _demo_pool(pool: Iterable[Fact], keep: Callable[[Fact], bool], k: int, what: str) -> list[Fact]:
    """The facts of ``pool`` that ``keep`` accepts, the first of each id, sorted by id; an
    :class:`InputError` when fewer than ``k`` (``what`` says which facts were sought)."""
    by_id: dict[str, Fact] = {}
    for other in pool:
        if keep(other):
            by_id.setdefault(other.id, other)
    out = [by_id[i] for i in sorted(by_id)]
    if len(out) < k:
        raise InputError(f"the pool has {len(out)} {what}; {k} demonstrations were asked for")
    return out


def few_shot_prompt(
    fact: Fact, pool: Iterable[Fact], k: int = 3, seed: int = SEED, sep: str = "\n"
) -> str:
    """``k`` solved demonstrations, then the query: an in-context recall prompt.

    Demonstrations are facts of ``pool`` with the query's relation and language and a
    different fact id, each written as prompt + answer; they are drawn at random with a
    generator seeded by ``seed`` and the query's id (so the same call gives the same prompt,
    and different queries get different demonstrations). Parts are joined by ``sep``.

    Raises:
        InputError: (a ``ValueError``) if ``pool`` has fewer than ``k`` such facts.
    """
    if k < 0:
        raise InputError(f"k must be >= 0, got {k}")
    candidates = _demo_pool(
        pool,
        lambda o: o.relation == fact.relation and o.lang == fact.lang and o.id != fact.id,
        k,
        f"facts of relation {fact.relation!r} in language {fact.lang!r} other than {fact.id!r}",
    )
    demos = _pick(candidates, k, seed, fact.id)
    text = sep.join([d.sentence for d in demos] + [fact.prompt])
    return ChatPrompt(text, query=fact.prompt, demos=[(d.prompt, d.sentence) for d in demos])


def language_label(lang: str, labels: str = "native") -> str:
    """A language's label in translation prompts: its own name (``labels="native"``:
    :data:`NATIVE_LANG_NAMES` for the bundled twelve, else CLDR's name of the language in
    itself, ``sv`` -> ``"Svenska"``; its English name where CLDR has none) or its English
    name (``labels="en"``: ``"Swedish"``)."""
    if labels == "en":
        return LANG_NAMES.get(lang) or lang_name(lang)
    if labels == "native":
        return NATIVE_LANG_NAMES.get(lang) or native_name(lang) or lang_name(lang)
    raise InputError(f"labels must be 'en' or 'native', got {labels!r}")


_label = language_label


def _source_word(fact: Fact, src: str, pool: Sequence[Fact] | None) -> str:
    if src == fact.lang:
        return fact.answer
    if src == "en" and fact.answer_en:
        return fact.answer_en
    facts = pool if pool is not None else load_facts(langs=[src], relations=[fact.relation])
    for other in facts:
        if other.id == fact.id and other.lang == src:
            return other.answer
    raise InputError(f"no answer in {src!r} for fact {fact.id!r} (pass a pool that has it)")


def translation_prompt(
    fact: Fact,
    src: str = "en",
    k: int = 0,
    pool: Iterable[Fact] | None = None,
    seed: int = SEED,
    labels: str = "native",
) -> str:
    """An explicit word-translation prompt whose continuation is ``fact.answer``.

    ``"English: Kabul\nFrançais:"`` for a French fact: the answer in ``src`` after the
    source label, then the label of ``fact.lang``. Labels are each language's own name
    (:func:`language_label`: :data:`NATIVE_LANG_NAMES`, or CLDR's for other languages) by
    default: on the embedded model they beat English labels
    ("French:") in every language, most at k=0 (docs/data.md has the table);
    ``labels="en"`` gives ``"English: Kabul\nFrench:"``. With ``k > 0``, ``k``
    demonstrations from ``pool`` come first: other facts of the same language (any relation)
    whose answer differs from the query's, each as a source/target pair; words that change in
    translation ("Vienna" -> "Vienne") are preferred when the pool has k of them. The source
    word of a non-English ``src`` comes from the fact with the same id in ``pool`` (or the
    bundled data).

    Raises:
        InputError: (a ``ValueError``) for an unknown language, a missing source word, or too
            few demonstrations in ``pool``.
    """
    check_langs([src, fact.lang])
    pool_list = list(pool) if pool is not None else None
    tgt_label = _label(fact.lang, labels)
    src_label = _label(src, labels)

    def pair(item: Fact, with_answer: bool) -> str:
        source = _source_word(item, src, pool_list)
        line = f"{src_label}: {source}\n{tgt_label}:"
        return f"{line} {item.answer}" if with_answer else line

    parts: list[str] = []
    demos: list[tuple[str, str]] = []  # (stem, solved) pairs, for chat models
    if k > 0:
        if pool_list is None:
            raise InputError("translation_prompt with k > 0 needs a pool of demonstrations")
        answer_key = fact.answer.casefold()
        candidates = _demo_pool(
            pool_list,
            lambda o: o.lang == fact.lang and o.id != fact.id and o.answer.casefold() != answer_key,
            k,
            f"facts in {fact.lang!r} with another answer than {fact.id!r}",
        )
        translated = [
            d
            for d in candidates
            if _source_word(d, src, pool_list).casefold() != d.answer.casefold()
        ]
        if len(translated) >= k:
            candidates = translated  # words that change in translation teach the task best
        shown = _pick(candidates, k, seed, fact.id)
        parts = [pair(d, True) for d in shown]
        demos = [(pair(d, False), pair(d, True)) for d in shown]
    parts.append(pair(fact, False))
    return ChatPrompt("\n".join(parts), query=parts[-1], demos=demos)


def parallel_sentences(
    langs: Iterable[str] | str | None,
    relations: Iterable[str] | str | None = None,
    limit: int | None = None,
) -> dict[str, list[str]]:
    """Full statements (prompt + answer) from the bundled facts, aligned across languages.

    Line ``i`` is the same fact in every language, so the result is parallel text for
    sentence-embedding and retrieval work. Newlines inside key-value prompts
    (``"Country: Italy\\nCapital: Rome"``) are replaced by a space, so that every sentence is
    one line.

    Args:
        langs: languages of the bundled data (``None``: all twelve); the bundled facts exist
            in :data:`~mechlingo.data.LANGS` only (for another language read your own
            parallel text, :func:`~mechlingo.data.read_parallel`).
        relations: relations to draw from (default all).
        limit: at most this many facts per relation (same ids in every language).
    """
    lang_sel = check_langs(langs)
    facts = load_facts(langs=lang_sel, relations=relations, limit=limit)
    by_key = {(f.id, f.lang): f for f in facts}
    ids = list(dict.fromkeys(f.id for f in facts))
    ids = [i for i in ids if all((i, lang) in by_key for lang in lang_sel)]
    return {
        lang: [" ".join(by_key[(i, lang)].sentence.split("\n")) for i in ids] for lang in lang_sel
    }
