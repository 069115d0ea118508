"""The bundled natural parallel text (an NTREX-128 subset) and document-aware line splits.

``mechlingo/data/ntrex/`` holds the first 1005 lines (63 whole news documents) of the NTREX-128
references in the twelve languages of :data:`~mechlingo.data.LANGS`, under CC BY-SA 4.0 (its
``README.md`` and ``LICENSE.md`` give the attribution and the licence). Line ``i`` of every
language is the same sentence; ``DOCUMENT_IDS.tsv`` names each line's document.

Sentences of one document share topic, names and vocabulary, so they are not independent:
:func:`split_by_documents` cuts the lines into consecutive parts (e.g. expert finding,
k choice, evaluation) that never share a document, and the card's alignment rows resample
whole documents (:func:`document_clusters`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

from mechlingo.core.errors import InputError
from mechlingo.data.facts import check_langs
from mechlingo.data.io import read_text

__all__ = [
    "DOCUMENT_FILE",
    "bundled_documents",
    "bundled_parallel",
    "document_clusters",
    "read_documents",
    "split_by_documents",
]

#: The name of the per-line document-id file beside the ``<lang>.txt`` files.
DOCUMENT_FILE = "DOCUMENT_IDS.tsv"


def _folder() -> Path:
    return Path(str(resources.files("mechlingo.data").joinpath("ntrex")))


def _lines(path: Path, what: str) -> list[str]:
    lines = read_text(path, what).split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def bundled_parallel(langs: Iterable[str] | str | None = None) -> dict[str, list[str]]:
    """The bundled NTREX-128 lines, ``{lang: [sentence, ...]}`` line-aligned (1005 lines each).

    Args:
        langs: languages (``None``: all twelve of :data:`~mechlingo.data.LANGS`).
    """
    folder = _folder()
    return {lg: _lines(folder / f"{lg}.txt", "bundled parallel text") for lg in check_langs(langs)}


def bundled_documents() -> list[str]:
    """The document id of every bundled parallel line (``bbc.381790``, ...), in line order."""
    return _lines(_folder() / DOCUMENT_FILE, "bundled document ids")


def read_documents(folder: str | Path, n_lines: int) -> list[str] | None:
    """The document ids of a parallel folder's lines from its ``DOCUMENT_IDS.tsv`` (one id per
    line, the first column), or ``None`` when the folder has no such file.

    Raises:
        InputError: the file's line count differs from the text's.
    """
    path = Path(folder) / DOCUMENT_FILE
    if not path.is_file():
        return None
    ids = [line.split("\t")[0].strip() for line in _lines(path, "document ids")]
    if len(ids) != n_lines:
        raise InputError(
            f"{path} has {len(ids)} lines, the parallel text {n_lines}",
            fix=f"give one document id per text line in {DOCUMENT_FILE}, or remove it",
        )
    return ids


def split_by_documents(
    docs: Sequence[str], sizes: Sequence[int], per_doc: Sequence[int | None] | None = None
) -> list[list[int]]:
    """Line indices of consecutive parts, one per size, that never share a document: part
    ``p`` takes whole documents in order, starting at the first document no earlier part
    touched, and from each at most ``per_doc[p]`` lines (its first ones; ``None``: all), until
    it has ``sizes[p]`` lines or the documents run out. Lines of a document cut short are used
    by no later part. A cap per document gives an evaluation part more independent documents.

    Args:
        docs: the document id of every line (runs of one id are one document).
        sizes: the wanted number of lines of each part, in order.
        per_doc: the cap of lines per document of each part (default: no cap).

    Raises:
        InputError: a part would be empty (the text is too short for the sizes).
    """
    starts = [i for i in range(len(docs)) if i == 0 or docs[i] != docs[i - 1]]
    spans = list(zip(starts, [*starts[1:], len(docs)], strict=True))
    caps = list(per_doc) if per_doc is not None else [None] * len(sizes)
    out: list[list[int]] = []
    d = 0
    for p, size in enumerate(sizes):
        part: list[int] = []
        while d < len(spans) and len(part) < size:
            a, b = spans[d]
            take = b - a if caps[p] is None else min(b - a, int(caps[p]))  # type: ignore[arg-type]
            part.extend(range(a, a + min(take, size - len(part))))
            d += 1
        if not part:
            raise InputError(
                f"the parallel text has {len(docs)} lines in {len(spans)} documents: too few "
                f"for parts of {list(sizes)} lines that share no document (part {p} is empty)",
                fix="pass more lines with --parallel, or a smaller budget",
            )
        out.append(part)
    return out


def document_clusters(docs: Sequence[str]) -> list[int]:
    """Each line's document as a small integer (0 for the first document seen, ...), for
    clustered intervals."""
    index: dict[str, int] = {}
    return [index.setdefault(d, len(index)) for d in docs]
