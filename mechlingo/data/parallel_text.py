"""Parallel text in the layouts public corpora ship it in, mapped to mechlingo's languages.

:func:`read_parallel` tells three folder layouts apart: line-aligned ``<lang>.txt`` files
(:func:`~mechlingo.data.io.read_parallel_dir`; FLORES codes such as ``fra_Latn.txt`` too),
FLORES+ as the hub stores it (``<split>/<lang_Script>.parquet`` with a ``text`` column, the
folder or the split folder itself), and FLORES-200 as released
(``<split>/<lang_Script>.<split>``, possibly under ``flores200_dataset/``). FLORES codes map
to mechlingo's by :data:`SCRIPT_CODES`; files in other languages are skipped (see
:func:`parallel_languages`) unless asked for by their own code in ``langs``. The layouts:
``docs/benchmarks.md`` ("FLORES-200 / FLORES+")."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from mechlingo.core.errors import DataError, InputError
from mechlingo.core.languages import is_lang_code, lang_code, order_langs
from mechlingo.core.untrusted import refuse_special
from mechlingo.data.facts import LANGS
from mechlingo.data.io import read_parallel_dir, read_text

PathLike = str | os.PathLike[str]

#: FLORES-200 / FLORES+ (and KLAR) language codes of mechlingo's twelve languages.
SCRIPT_CODES: dict[str, str] = {
    "eng_Latn": "en",
    "deu_Latn": "de",
    "fra_Latn": "fr",
    "spa_Latn": "es",
    "ita_Latn": "it",
    "por_Latn": "pt",
    "rus_Cyrl": "ru",
    "zho_Hans": "zh",
    "cmn_Hans": "zh",
    "jpn_Jpan": "ja",
    "kor_Hang": "ko",
    "kor_Kore": "ko",
    "arb_Arab": "ar",
    "ara_Arab": "ar",
    "hin_Deva": "hi",
}

#: The parallel-text layouts :func:`read_parallel` reads.
LAYOUTS = ("txt", "parquet", "classic")

#: Splits of FLORES (``dev`` for choosing, ``devtest`` for reporting).
SPLITS = ("dev", "devtest")


def lang_of(code: str) -> str | None:
    """mechlingo's canonical code for a file's language code (``fra_Latn`` -> ``fr``,
    ``swh_Latn`` -> ``sw``, ``fr`` -> ``fr``; any language, see
    :func:`~mechlingo.core.languages.lang_code`), ``None`` when ``code`` is not a language
    code (``README``)."""
    if code in LANGS:
        return code
    if code in SCRIPT_CODES:
        return SCRIPT_CODES[code]
    return lang_code(code) if is_lang_code(code) else None


def _split_dir(folder: Path, split: str, ext: str) -> Path | None:
    """The folder holding the ``*{ext}`` files of ``split`` (``folder/split`` or ``folder``)."""
    for cand in (folder / split, folder / "flores200_dataset" / split, folder):
        if cand.is_dir() and any(cand.glob(f"*{ext}")):
            return cand
    return None


def parallel_layout(path: PathLike, split: str = "devtest") -> tuple[str, Path]:
    """Which layout the folder ``path`` holds, and the folder with the files of ``split``.

    A folder with neither FLORES layout is taken as the ``txt`` layout (whose reader names
    the missing files).

    Raises:
        DataError: not a folder, or FLORES files of the other split only.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise DataError(
            f"{folder} is not a folder of parallel text",
            fix="pass a folder of <lang>.txt files or a FLORES folder (devtest/<lang_Script>.*)",
        )
    if split not in SPLITS:
        raise InputError(f"split must be one of {SPLITS}, got {split!r}")
    found = _split_dir(folder, split, ".parquet")
    if found is not None:
        return "parquet", found
    found = _split_dir(folder, split, f".{split}")
    if found is not None:
        return "classic", found
    other = "devtest" if split == "dev" else "dev"
    if not any(folder.glob("*.txt")) and (
        _split_dir(folder, other, ".parquet") or _split_dir(folder, other, f".{other}")
    ):
        raise DataError(
            f"{folder} holds no parallel text for split {split!r}, only for {other!r}",
            fix=f"pass split {other!r} (--flores-split {other})",
        )
    return "txt", folder  # read_parallel_dir reports what is missing


def _files(layout: str, folder: Path, split: str) -> dict[str, Path]:
    ext = {"parquet": ".parquet", "classic": f".{split}", "txt": ".txt"}[layout]
    return {p.name[: -len(ext)]: p for p in sorted(folder.glob(f"*{ext}")) if p.is_file()}


def parallel_languages(path: PathLike, split: str = "devtest") -> dict[str, str | None]:
    """Every file's language code in the folder, mapped to mechlingo's canonical code
    (``None``: a file name that is no language code, skipped)."""
    layout, folder = parallel_layout(path, split)
    return {code: lang_of(code) for code in _files(layout, folder, split)}


def _read_parquet(path: Path) -> list[str]:
    import pandas as pd

    refuse_special(path, DataError, fix="give a regular parquet file")
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several types for a broken file
        raise DataError(f"{path}: not a readable parquet file ({err})") from None
    if "text" not in frame.columns:
        raise DataError(
            f"{path}: no 'text' column (columns: {list(frame.columns)})",
            fix="FLORES+ parquet files have one sentence per row in 'text'",
        )
    if "id" in frame.columns:
        frame = frame.sort_values("id", kind="stable")
    bad = [i for i, t in enumerate(frame["text"]) if not isinstance(t, str)]
    if bad:
        raise DataError(f"{path}, row {bad[0] + 1}: 'text' is not a string")
    return [" ".join(t.split("\n")) for t in frame["text"]]


def _read_lines(path: Path) -> list[str]:
    lines = read_text(path, "text file").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def _wanted(
    files: dict[str, Path], langs: Iterable[str] | str | None, folder: Path
) -> dict[str, str]:
    """``{mechlingo or requested code: file code}`` for the languages to read."""
    by_lang: dict[str, str] = {}
    for code in files:
        lang = lang_of(code)
        if lang is not None:
            by_lang.setdefault(lang, code)
    if langs is None:
        if not by_lang:
            raise DataError(
                f"{folder}: no file named by a language code (files: {sorted(files)[:8]})",
                fix="name each file by its language: sv.txt, swh_Latn.devtest, ...",
            )
        return {lang: by_lang[lang] for lang in order_langs(list(by_lang))}
    wanted = [langs] if isinstance(langs, str) else list(langs)
    wanted = [lang_code(lg) if is_lang_code(lg) else lg for lg in wanted]
    out: dict[str, str] = {}
    missing = []
    for lang in wanted:
        if lang in by_lang:
            out[lang] = by_lang[lang]
        elif lang in files:  # asked for by the file's own code
            out[lang] = lang
        else:
            missing.append(lang)
    if missing:
        raise DataError(f"{folder}: no file for language(s) {missing} (files: {sorted(files)})")
    return out


def read_parallel(
    path: PathLike, langs: Iterable[str] | str | None = None, split: str = "devtest"
) -> dict[str, list[str]]:
    """Read line-aligned parallel text from a folder in any of :data:`LAYOUTS`.

    Args:
        path: the folder (``<lang>.txt`` files, a FLORES+ parquet folder or a FLORES-200
            folder; see the module docstring).
        langs: language codes to read, in any form :func:`~mechlingo.core.languages.lang_code`
            takes (default: every file named by a language code, the bundled twelve first);
            the result is keyed by canonical codes (``swh_Latn.devtest`` -> ``"sw"``).
        split: ``"devtest"`` (default) or ``"dev"``, for the FLORES layouts.

    Returns:
        ``{lang: [sentence, ...]}``; sentence ``i`` is the same in every language.

    Raises:
        DataError: no readable file, a requested language missing, or files of different
            lengths (naming the counts).
    """
    layout, folder = parallel_layout(path, split)
    if (
        layout == "txt"
        and all(Path(f).stem in LANGS for f in folder.glob("*.txt"))
        and (
            langs is None
            or all(lg in LANGS for lg in ([langs] if isinstance(langs, str) else langs))
        )
    ):
        return read_parallel_dir(folder, langs)
    files = _files(layout, folder, split)
    texts: dict[str, list[str]] = {}
    for lang, code in _wanted(files, langs, folder).items():
        reader = _read_parquet if layout == "parquet" else _read_lines
        texts[lang] = reader(files[code])
    counts = {lang: len(lines) for lang, lines in texts.items()}
    if len(set(counts.values())) > 1:
        raise DataError(f"{folder}: files are not line-aligned, line counts {counts}")
    return texts
