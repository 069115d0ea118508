"""Hand-written fixtures in the public benchmarks' file formats, for tests.

Every fact here was written by hand for these tests (country capitals and continents,
plain sentences); none is a row of BMLAMA, KLAR, mLAMA, mParaRel or FLORES. Only the file
layouts follow the benchmarks (see docs/benchmarks.md).

``write_fixture(kind, folder)`` writes one fixture under ``folder`` and returns the path to
pass to :func:`mechlingo.data.load_benchmark` or to ``--facts``. Kinds (:data:`KINDS`):

- ``bmlama``: ``en fr ja ko zh nl .tsv``, five aligned rows and three relations; masks
  mid-sentence (ja, ko), at the start (row 4), text after the mask everywhere; fr has a
  gold answer missing from its candidates (row 1, line 3) and a subject not in the prompt
  (row 2, line 4) and a quoted field; zh has a space before its mask (row 3), CRLF line
  ends and the two-cell ``Candidate\\tAns`` header of the real 17-language zh file; nl is
  outside mechlingo's languages. ``bmlama_bad``: the same plus ``de.tsv`` whose line 3
  has three fields.
- ``klar``: ``klar_source/<lang>/<relation>.json`` for en fr ja ko (and el, unsupported),
  relations ``capital_of`` and ``continent``; fr has an empty subject (capital_of) and a
  template without ``<mask>`` (continent). ``klar_bad``: fr/capital_of.json is invalid
  JSON at line 3.
- ``klar_flat``: ``eng_Latn fra_Latn jpn_Jpan kor_Kore ell_Grek .txt``, three aligned
  lines; fra line 3 has an empty answer. ``klar_flat_bad``: fra line 2 has no colon.
- ``mlama``: ``mlama1.1/<lang>/templates.jsonl`` + ``P36.jsonl`` (capital) and
  ``P30.jsonl`` (continent) for en fr ja (and el); fr has no P30 template.
  ``mlama_bad``: en/P36.jsonl line 2 is invalid JSON.
- ``mpararel``: ``patterns/<lang>/P36.jsonl`` (two paraphrases) + ``tuples/<lang>/P36.jsonl``
  for en, ja and zh-hans.
- ``mlama_rows``: one JSONL file of flat rows (obj_label a list: gold then aliases), as the
  hub exports hold them; one row in ``el``.
- ``flores_parquet``: ``dev/`` and ``devtest/<lang_Script>.parquet`` (column ``text``,
  rows given out of ``id`` order) for eng fra spa cmn (and swh); ``flores_classic``:
  ``flores200_dataset/{dev,devtest}/<lang_Script>.{dev,devtest}`` for eng fra spa zho
  (and swh); ``flores_bad``: a classic folder whose fra file is one line short.
"""

from __future__ import annotations

import json
from pathlib import Path

KINDS = (
    "bmlama",
    "bmlama_bad",
    "klar",
    "klar_bad",
    "klar_flat",
    "klar_flat_bad",
    "mlama",
    "mlama_bad",
    "mpararel",
    "mlama_rows",
    "flores_parquet",
    "flores_classic",
    "flores_bad",
)

# (Prompt, Ans, Candidate Ans, Subject) per language; row i is the same fact everywhere.
BMLAMA_ROWS: dict[str, list[tuple[str, str, str, str]]] = {
    "en": [
        ("The capital of France is <mask>.", "Paris", "Berlin, Paris, Tokyo", "France"),
        ("The capital of Japan is <mask>.", "Tokyo", "Tokyo, Paris, Berlin", "Japan"),
        ("Germany is located in <mask> today.", "Europe", "Asia, Europe", "Germany"),
        ("Japan is located in <mask> today.", "Asia", "Asia, Europe", "Japan"),
        ("<mask> is the capital of Germany.", "Berlin", "Paris, Berlin", "Germany"),
    ],
    "fr": [
        ("La capitale de la France est <mask>.", "Paris", "Berlin, Paris, Tokyo", "France"),
        ("La capitale du Japon est <mask>.", "Tokyo", "Berlin, Paris", "Japon"),
        ("L'Allemagne se trouve en <mask>.", "Europe", "Asie, Europe", "Allemand"),
        ("Le Japon se trouve en <mask>.", "Asie", "Asie, Europe", "Japon"),
        ("<mask> est la capitale de l'Allemagne.", "Berlin", '"Paris, Berlin"', "Allemagne"),
    ],
    "ja": [
        ("フランスの首都は<mask>です。", "パリ", "ベルリン, パリ, 東京", "フランス"),
        ("日本の首都は<mask>です。", "東京", "東京, パリ, ベルリン", "日本"),
        ("ドイツは<mask>にあります。", "ヨーロッパ", "アジア, ヨーロッパ", "ドイツ"),
        ("日本は<mask>にあります。", "アジア", "アジア, ヨーロッパ", "日本"),
        ("<mask>はドイツの首都です。", "ベルリン", "パリ, ベルリン", "ドイツ"),
    ],
    "ko": [
        ("프랑스의 수도는 <mask>입니다.", "파리", "베를린, 파리, 도쿄", "프랑스"),
        ("일본의 수도는 <mask>입니다.", "도쿄", "도쿄, 파리, 베를린", "일본"),
        ("독일은 <mask>에 있습니다.", "유럽", "아시아, 유럽", "독일"),
        ("일본은 <mask>에 있습니다.", "아시아", "아시아, 유럽", "일본"),
        ("<mask>은 독일의 수도입니다.", "베를린", "파리, 베를린", "독일"),
    ],
    "zh": [
        ("法国的首都是<mask>。", "巴黎", "柏林, 巴黎, 东京", "法国"),
        ("日本的首都是<mask>。", "东京", "东京, 巴黎, 柏林", "日本"),
        ("德国位于<mask>。", "欧洲", "亚洲, 欧洲", "德国"),
        ("日本位于 <mask>。", "亚洲", "亚洲, 欧洲", "日本"),
        ("<mask>是德国的首都。", "柏林", "巴黎, 柏林", "德国"),
    ],
    "nl": [
        ("De hoofdstad van Frankrijk is <mask>.", "Parijs", "Berlijn, Parijs, Tokio", "Frankrijk"),
        ("De hoofdstad van Japan is <mask>.", "Tokio", "Tokio, Parijs, Berlijn", "Japan"),
        ("Duitsland ligt in <mask>.", "Europa", "Azië, Europa", "Duitsland"),
        ("Japan ligt in <mask>.", "Azië", "Azië, Europa", "Japan"),
        ("<mask> is de hoofdstad van Duitsland.", "Berlijn", "Parijs, Berlijn", "Duitsland"),
    ],
}


def _bmlama(folder: Path, bad: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for lang, rows in BMLAMA_ROWS.items():
        header = (
            "Prompt\tAns\tCandidate\tAns\tSubject"
            if lang == "zh"
            else ("Prompt\tAns\tCandidate Ans\tSubject")
        )
        end = "\r\n" if lang == "zh" else "\n"
        lines = [header, *("\t".join(r) for r in rows)]
        (folder / f"{lang}.tsv").write_bytes((end.join(lines) + end).encode("utf-8"))
    if bad:
        rows = ["Prompt\tAns\tCandidate Ans\tSubject",
                "Die Hauptstadt von Frankreich ist <mask>.\tParis\tBerlin, Paris\tFrankreich",
                "Die Hauptstadt von Japan ist <mask>.\tTokio\tTokio, Paris"]  # fmt: skip
        (folder / "de.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


# KLAR: {lang: {relation: (templates, [(subject, object, index)])}}
KLAR: dict[str, dict[str, tuple[list[str], list[tuple[str, str, int]]]]] = {
    "en": {
        "capital_of": (
            ["The capital of <subject> is <mask>.", "<subject> has the capital <mask>."],
            [("France", "Paris", 0), ("Japan", "Tokyo", 1), ("Germany", "Berlin", 2)],
        ),
        "continent": (["<subject> is part of the continent of <mask>."],
                      [("Japan", "Asia", 0), ("France", "Europe", 1)]),
    },
    "fr": {
        "capital_of": (["La capitale de <subject> est <mask>."],
                       [("la France", "Paris", 0), ("", "Tokyo", 1), ("l'Allemagne", "Berlin", 2)]),
        "continent": (["<subject> fait partie d'un continent."],
                      [("le Japon", "Asie", 0), ("la France", "Europe", 1)]),
    },
    "ja": {
        "capital_of": (["<subject>の首都は<mask>です。"],
                       [("フランス", "パリ", 0), ("日本", "東京", 1), ("ドイツ", "ベルリン", 2)]),
        "continent": (["<subject>は<mask>大陸にあります。"],
                      [("日本", "アジア", 0), ("フランス", "ヨーロッパ", 1)]),
    },
    "ko": {
        "capital_of": (["<subject>의 수도는 <mask>입니다."],
                       [("프랑스", "파리", 0), ("일본", "도쿄", 1), ("독일", "베를린", 2)]),
        "continent": (["<subject>은 <mask> 대륙에 있습니다."],
                      [("일본", "아시아", 0), ("프랑스", "유럽", 1)]),
    },
    "el": {
        "capital_of": (["Η πρωτεύουσα της <subject> είναι η <mask>."],
                       [("Γαλλίας", "Παρίσι", 0), ("Ιαπωνίας", "Τόκιο", 1), ("Γερμανίας", "Βερολίνο", 2)]),
    },
}  # fmt: skip


def _klar(folder: Path, bad: bool) -> Path:
    root = folder / "klar_source"
    for lang, rels in KLAR.items():
        (root / lang).mkdir(parents=True, exist_ok=True)
        for rel, (templates, samples) in rels.items():
            doc = {
                "name": rel,
                "prompt_templates": templates,
                "samples": [{"subject": s, "object": o, "index": i} for s, o, i in samples],
            }
            text = json.dumps(doc, ensure_ascii=False, indent=1)
            if bad and lang == "fr" and rel == "capital_of":
                lines = text.split("\n")
                lines[2] = lines[2] + " oops"  # line 3: stray text, invalid JSON
                text = "\n".join(lines)
            (root / lang / f"{rel}.json").write_text(text, encoding="utf-8")
    return folder


KLAR_FLAT: dict[str, list[str]] = {
    "eng_Latn": [
        "What is the capital of France? The answer is: Paris",
        "What is the capital of Japan? The answer is: Tokyo",
        "On which continent is Japan? The answer is: Asia",
    ],
    "fra_Latn": [
        "Quelle est la capitale de la France ? La réponse est : Paris",
        "Quelle est la capitale du Japon ? La réponse est : Tokyo",
        "Sur quel continent se trouve le Japon ? La réponse est :",
    ],
    "jpn_Jpan": [
        "フランスの首都はどこですか？答えは： パリ",
        "日本の首都はどこですか？答えは： 東京",
        "日本はどの大陸にありますか？答えは： アジア",
    ],
    "kor_Kore": [
        "프랑스의 수도는 어디입니까? 답은: 파리",
        "일본의 수도는 어디입니까? 답은: 도쿄",
        "일본은 어느 대륙에 있습니까? 답은: 아시아",
    ],
    "ell_Grek": [
        "Ποια είναι η πρωτεύουσα της Γαλλίας; Η απάντηση είναι: Παρίσι",
        "Ποια είναι η πρωτεύουσα της Ιαπωνίας; Η απάντηση είναι: Τόκιο",
        "Σε ποια ήπειρο βρίσκεται η Ιαπωνία; Η απάντηση είναι: Ασία",
    ],
}


def _klar_flat(folder: Path, bad: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for code, lines in KLAR_FLAT.items():
        lines = list(lines)
        if bad and code == "fra_Latn":
            lines[1] = "Quelle est la capitale du Japon ? Tokyo"
        (folder / f"{code}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


# mLAMA: templates and (lineid, subject, object) per language and relation
MLAMA_TEMPLATES = {
    "en": {"P36": "The capital of [X] is [Y] .", "P30": "[X] is located in [Y] ."},
    "fr": {"P36": "La capitale de [X] est [Y] ."},
    "ja": {"P36": "[X]の首都は[Y]です。", "P30": "[X]は[Y]にあります。"},
    "el": {"P36": "Η πρωτεύουσα της [X] είναι [Y] ."},
}
MLAMA_TRIPLES = {
    "en": {"P36": [(0, "France", "Paris"), (1, "Japan", "Tokyo"), (2, "Germany", "Berlin")],
           "P30": [(0, "Japan", "Asia"), (1, "France", "Europe")]},
    "fr": {"P36": [(0, "France", "Paris"), (2, "Allemagne", "Berlin")],
           "P30": [(0, "Japon", "Asie")]},
    "ja": {"P36": [(0, "フランス", "パリ"), (1, "日本", "東京"), (2, "ドイツ", "ベルリン")],
           "P30": [(0, "日本", "アジア"), (1, "フランス", "ヨーロッパ")]},
    "el": {"P36": [(0, "Γαλλίας", "Παρίσι")]},
}  # fmt: skip


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")


def _mlama(folder: Path, bad: bool) -> Path:
    root = folder / "mlama1.1"
    for lang, templates in MLAMA_TEMPLATES.items():
        _jsonl(root / lang / "templates.jsonl",
               [{"relation": r, "template": t, "label": r} for r, t in templates.items()])  # fmt: skip
        for rel, triples in MLAMA_TRIPLES[lang].items():
            rows = [
                {"uuid": f"u{rel}{i}", "lineid": i, "sub_uri": f"Q{i}", "sub_label": s,
                 "obj_uri": f"Q{100 + i}", "obj_label": o}
                for i, s, o in triples
            ]  # fmt: skip
            _jsonl(root / lang / f"{rel}.jsonl", rows)
    if bad:
        path = root / "en" / "P36.jsonl"
        lines = path.read_text(encoding="utf-8").split("\n")
        lines[1] = lines[1][:-1]  # line 2 loses its closing brace
        path.write_text("\n".join(lines), encoding="utf-8")
    return folder


MPARAREL_PATTERNS = {
    "en": ["The capital of [X] is [Y].", "[X]'s capital city is [Y]."],
    "ja": ["[X]の首都は[Y]です。", "[X]の首都は[Y]。"],
    "zh-hans": ["[X]的首都是[Y]。", "[X]首都为[Y]。"],
}
MPARAREL_TUPLES = {
    "en": [(0, "France", "Paris"), (1, "Japan", "Tokyo")],
    "ja": [(0, "フランス", "パリ"), (1, "日本", "東京")],
    "zh-hans": [(0, "法国", "巴黎"), (1, "日本", "东京")],
}


def _mpararel(folder: Path, bad: bool) -> Path:
    for lang, patterns in MPARAREL_PATTERNS.items():
        _jsonl(folder / "patterns" / lang / "P36.jsonl",
               [{"pattern": p, "checked-by-human": True} for p in patterns])  # fmt: skip
        _jsonl(folder / "tuples" / lang / "P36.jsonl",
               [{"sub_uri": f"Q{i}", "obj_uri": f"Q{9 + i}", "sub_label": s, "obj_label": o,
                 "lineid": i} for i, s, o in MPARAREL_TUPLES[lang]])  # fmt: skip
    return folder


MLAMA_ROWS = [
    {"language": "en", "relation": "P36", "template": "The capital of [X] is [Y].",
     "template_id": 0, "sub_label": "France", "obj_label": ["Paris", "City of Light"],
     "lineid": 0},
    {"language": "en", "relation": "P36", "template": "The capital of [X] is [Y].",
     "template_id": 0, "sub_label": "Japan", "obj_label": ["Tokyo"], "lineid": 1},
    {"language": "fr", "relation": "P36", "template": "La capitale de [X] est [Y].",
     "template_id": 0, "sub_label": "France", "obj_label": ["Paris", "Paris"], "lineid": 0},
    {"language": "fr", "relation": "P36", "template": "La capitale de [X] est [Y].",
     "template_id": 0, "sub_label": "Japon", "obj_label": ["Tokyo"], "lineid": 1},
    {"language": "el", "relation": "P36", "template": "Η πρωτεύουσα της [X] είναι [Y].",
     "template_id": 0, "sub_label": "Γαλλίας", "obj_label": ["Παρίσι"], "lineid": 0},
]  # fmt: skip


def _mlama_rows(folder: Path, bad: bool) -> Path:
    path = folder / "rows.jsonl"
    _jsonl(path, MLAMA_ROWS)
    return path


#: Six hand-written sentences per language, line i the same sentence in each.
FLORES_TEXT = {
    "eng_Latn": ["The cat sleeps on the sofa.", "It is raining in the city today.",
                 "My brother reads a book every week.", "The train leaves at eight.",
                 "We cooked soup for our neighbours.", "The museum opens on Sunday."],
    "fra_Latn": ["Le chat dort sur le canapé.", "Il pleut en ville aujourd'hui.",
                 "Mon frère lit un livre chaque semaine.", "Le train part à huit heures.",
                 "Nous avons fait une soupe pour nos voisins.", "Le musée ouvre le dimanche."],
    "spa_Latn": ["El gato duerme en el sofá.", "Hoy llueve en la ciudad.",
                 "Mi hermano lee un libro cada semana.", "El tren sale a las ocho.",
                 "Cocinamos sopa para nuestros vecinos.", "El museo abre el domingo."],
    "zho_Hans": ["猫在沙发上睡觉。", "今天城里下雨。", "我哥哥每周读一本书。",
                 "火车八点出发。", "我们给邻居做了汤。", "博物馆星期天开门。"],
    "swh_Latn": ["Paka analala kwenye sofa.", "Leo mvua inanyesha mjini.",
                 "Kaka yangu anasoma kitabu kila wiki.", "Treni inaondoka saa mbili.",
                 "Tulipika supu kwa majirani.", "Makumbusho hufunguliwa Jumapili."],
}  # fmt: skip


def _flores_parquet(folder: Path, bad: bool) -> Path:
    import pandas as pd

    for split in ("dev", "devtest"):
        (folder / split).mkdir(parents=True, exist_ok=True)
        for code, lines in FLORES_TEXT.items():
            code = "cmn_Hans" if code == "zho_Hans" else code  # FLORES+ names Mandarin so
            lines = lines[:3] if split == "dev" else lines
            ids = list(range(len(lines)))[::-1]  # stored in reverse: the loader sorts by id
            frame = pd.DataFrame({"id": ids, "text": [f"{split}: {s}" for s in lines[::-1]]})
            frame["iso_639_3"], frame["iso_15924"] = code.split("_")
            frame.to_parquet(folder / split / f"{code}.parquet")
    return folder


def _flores_classic(folder: Path, bad: bool) -> Path:
    for split in ("dev", "devtest"):
        sub = folder / "flores200_dataset" / split
        sub.mkdir(parents=True, exist_ok=True)
        for code, lines in FLORES_TEXT.items():
            lines = lines[:3] if split == "dev" else lines
            if bad and code == "fra_Latn":
                lines = lines[:-1]
            text = "".join(f"{split}: {s}\n" for s in lines)
            (sub / f"{code}.{split}").write_text(text, encoding="utf-8")
    return folder


def write_fixture(kind: str, folder: Path | str) -> Path:
    """Write the fixture ``kind`` (one of :data:`KINDS`) under ``folder`` (created) and
    return the path to load (the folder, or the file for ``mlama_rows``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    writers = {
        "bmlama": _bmlama, "klar": _klar, "klar_flat": _klar_flat, "mlama": _mlama,
        "mpararel": _mpararel, "mlama_rows": _mlama_rows, "flores_parquet": _flores_parquet,
        "flores_classic": _flores_classic,
    }  # fmt: skip
    if kind == "flores_bad":
        return _flores_classic(folder, True)
    base = kind.removesuffix("_bad")
    if base not in writers or kind not in KINDS:
        raise ValueError(f"unknown fixture kind {kind!r}; kinds: {KINDS}")
    return writers[base](folder, kind.endswith("_bad"))
