"""Generate the bundled factual-recall data of mechlingo from CLDR names (via Babel).

Writes ``mechlingo/data/facts.jsonl`` (one record per fact and language) and
``mechlingo/data/templates.json`` (the template chosen per relation and language, with the
zero-shot accuracy measured for every candidate). Run from the repository root::

    python scripts/generate_data.py            # into mechlingo/data/
    python scripts/generate_data.py --out DIR  # somewhere else

The output depends only on this file and the CLDR data of the installed Babel (recorded in
templates.json), so running it twice gives identical bytes.

Sources, all inside Babel (nothing is typed in by hand except where said):

- country, language, script, currency and continent names: ``Locale(lang).territories``,
  ``.languages``, ``.scripts``, ``.currencies``;
- city names: the time-zone exemplar cities of CLDR (``Locale(lang).time_zones[zone]['city']``;
  for the Latin-script languages a missing entry falls back to the time-zone id, which is
  CLDR's own inheritance rule, e.g. ``Europe/Oslo`` -> "Oslo"); for ru/zh/ja/ko/ar/hi only
  explicit CLDR names are used;
- which country a city is in: ``get_global('zone_territories')``;
- capitals: CLDR has none, so :data:`CAPITAL_ZONES` is a hand list country -> time zone whose
  exemplar city is the capital (only capitals that name a time zone can appear);
- official languages: ``get_global('territory_languages')`` (official/de facto official);
- currencies: ``babel.numbers.get_territory_currencies`` at a fixed date;
- continents: Babel has no territory containment, so the continent is read from the
  region prefix of the country's time zones (Europe/, Africa/, Asia/, America/, Australia/),
  with hand rules for the Americas split and ocean-prefixed zones (see :func:`continent_of`);
- scripts: the likely script of a language (``get_global('likely_subtags')``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import babel
from babel import Locale
from babel.core import get_global
from babel.numbers import get_currency_name, get_territory_currencies

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mechlingo.data.facts import LANGS, RELATIONS, Fact, make_fact  # noqa: E402
from mechlingo.data.io import write_jsonl  # noqa: E402

#: Languages whose missing CLDR city names fall back to the time-zone id (Latin script).
LATIN_LANGS = frozenset({"en", "de", "fr", "es", "it", "pt"})

#: The 193 UN member states (ISO 3166-1 alpha-2): the countries of the country relations.
UN_MEMBERS: tuple[str, ...] = tuple(
    """
    AF AL DZ AD AO AG AR AM AU AT AZ BS BH BD BB BY BE BZ BJ BT BO BA BW BR BN BG BF BI CV
    KH CM CA CF TD CL CN CO KM CG CD CR CI HR CU CY CZ DK DJ DM DO EC EG SV GQ ER EE SZ ET
    FJ FI FR GA GM GE DE GH GR GD GT GN GW GY HT HN HU IS IN ID IR IQ IE IL IT JM JP JO KZ
    KE KI KP KR KW KG LA LV LB LS LR LY LI LT LU MG MW MY MV ML MT MH MR MU MX FM MD MC MN
    ME MA MZ MM NA NR NP NL NZ NI NE NG MK NO OM PK PW PA PG PY PE PH PL PT QA RO RU RW KN
    LC VC WS SM ST SA SN RS SC SL SG SK SI SB SO ZA SS ES LK SD SR SE CH SY TJ TZ TH TL TG
    TO TT TN TR TM TV UG UA AE GB US UY UZ VU VE VN YE ZM ZW
    """.split()
)

#: Hand list: country -> the CLDR time zone whose exemplar city is its capital. Countries
#: whose capital names no time zone (e.g. US, CN, IN, BR, AU, CA, TR) are absent, and so are
#: city-states where capital and country share a name (e.g. SG, MC, KW, LU).
CAPITAL_ZONES: dict[str, str] = {
    # Europe
    "AD": "Europe/Andorra",
    "AL": "Europe/Tirane",
    "AT": "Europe/Vienna",
    "BA": "Europe/Sarajevo",
    "BE": "Europe/Brussels",
    "BG": "Europe/Sofia",
    "BY": "Europe/Minsk",
    "CY": "Asia/Nicosia",
    "CZ": "Europe/Prague",
    "DE": "Europe/Berlin",
    "DK": "Europe/Copenhagen",
    "EE": "Europe/Tallinn",
    "ES": "Europe/Madrid",
    "FI": "Europe/Helsinki",
    "FR": "Europe/Paris",
    "GB": "Europe/London",
    "GR": "Europe/Athens",
    "HR": "Europe/Zagreb",
    "HU": "Europe/Budapest",
    "IE": "Europe/Dublin",
    "IS": "Atlantic/Reykjavik",
    "IT": "Europe/Rome",
    "LI": "Europe/Vaduz",
    "LT": "Europe/Vilnius",
    "LV": "Europe/Riga",
    "MD": "Europe/Chisinau",
    "ME": "Europe/Podgorica",
    "MK": "Europe/Skopje",
    "NL": "Europe/Amsterdam",
    "NO": "Europe/Oslo",
    "PL": "Europe/Warsaw",
    "PT": "Europe/Lisbon",
    "RO": "Europe/Bucharest",
    "RS": "Europe/Belgrade",
    "RU": "Europe/Moscow",
    "SE": "Europe/Stockholm",
    "SI": "Europe/Ljubljana",
    "SK": "Europe/Bratislava",
    "UA": "Europe/Kyiv",
    # Asia
    "AF": "Asia/Kabul",
    "AM": "Asia/Yerevan",
    "AZ": "Asia/Baku",
    "BD": "Asia/Dhaka",
    "BT": "Asia/Thimphu",
    "GE": "Asia/Tbilisi",
    "ID": "Asia/Jakarta",
    "IQ": "Asia/Baghdad",
    "IR": "Asia/Tehran",
    "JO": "Asia/Amman",
    "JP": "Asia/Tokyo",
    "KG": "Asia/Bishkek",
    "KH": "Asia/Phnom_Penh",
    "KP": "Asia/Pyongyang",
    "KR": "Asia/Seoul",
    "LA": "Asia/Vientiane",
    "LB": "Asia/Beirut",
    "MN": "Asia/Ulaanbaatar",
    "MY": "Asia/Kuala_Lumpur",
    "NP": "Asia/Kathmandu",
    "OM": "Asia/Muscat",
    "PH": "Asia/Manila",
    "SA": "Asia/Riyadh",
    "SY": "Asia/Damascus",
    "TH": "Asia/Bangkok",
    "TJ": "Asia/Dushanbe",
    "TL": "Asia/Dili",
    "TM": "Asia/Ashgabat",
    "UZ": "Asia/Tashkent",
    # Africa
    "AO": "Africa/Luanda",
    "BF": "Africa/Ouagadougou",
    "BJ": "Africa/Porto-Novo",
    "BW": "Africa/Gaborone",
    "CD": "Africa/Kinshasa",
    "CF": "Africa/Bangui",
    "CG": "Africa/Brazzaville",
    "DZ": "Africa/Algiers",
    "EG": "Africa/Cairo",
    "ER": "Africa/Asmara",
    "ET": "Africa/Addis_Ababa",
    "GA": "Africa/Libreville",
    "GH": "Africa/Accra",
    "GM": "Africa/Banjul",
    "GN": "Africa/Conakry",
    "GQ": "Africa/Malabo",
    "GW": "Africa/Bissau",
    "KE": "Africa/Nairobi",
    "LR": "Africa/Monrovia",
    "LS": "Africa/Maseru",
    "LY": "Africa/Tripoli",
    "MG": "Indian/Antananarivo",
    "ML": "Africa/Bamako",
    "MR": "Africa/Nouakchott",
    "MZ": "Africa/Maputo",
    "NA": "Africa/Windhoek",
    "NE": "Africa/Niamey",
    "RW": "Africa/Kigali",
    "SD": "Africa/Khartoum",
    "SL": "Africa/Freetown",
    "SN": "Africa/Dakar",
    "SO": "Africa/Mogadishu",
    "SS": "Africa/Juba",
    "ST": "Africa/Sao_Tome",
    "SZ": "Africa/Mbabane",
    "TD": "Africa/Ndjamena",
    "TG": "Africa/Lome",
    "TN": "Africa/Tunis",
    "UG": "Africa/Kampala",
    "ZM": "Africa/Lusaka",
    "ZW": "Africa/Harare",
    # Americas
    "AR": "America/Argentina/Buenos_Aires",
    "BS": "America/Nassau",
    "CL": "America/Santiago",
    "CO": "America/Bogota",
    "CU": "America/Havana",
    "DO": "America/Santo_Domingo",
    "HN": "America/Tegucigalpa",
    "HT": "America/Port-au-Prince",
    "MX": "America/Mexico_City",
    "NI": "America/Managua",
    "PE": "America/Lima",
    "PY": "America/Asuncion",
    "SR": "America/Paramaribo",
    "TT": "America/Port_of_Spain",
    "UY": "America/Montevideo",
    "VE": "America/Caracas",
    # Oceania
    "KI": "Pacific/Tarawa",
    "MH": "Pacific/Majuro",
    "PG": "Pacific/Port_Moresby",
    "TV": "Pacific/Funafuti",
    "WS": "Pacific/Apia",
}

#: Time zones outside the five continental prefixes that name a real city.
OCEAN_CITY_ZONES = frozenset(
    {
        "Atlantic/Reykjavik",
        "Indian/Antananarivo",
        "Pacific/Apia",
        "Pacific/Auckland",
        "Pacific/Honolulu",
        "Pacific/Port_Moresby",
    }
)

#: CLDR region codes of the continents used by the continent relation.
CONTINENTS = {"Africa": "002", "Asia": "142", "Europe": "150", "Oceania": "009"}
NORTH_AMERICA, SOUTH_AMERICA = "003", "005"

#: Hand rules for the continent relation.
SOUTH_AMERICAN = frozenset("AR BO BR CL CO EC GY PE PY SR UY VE".split())
#: Countries whose zones are only ocean-prefixed (Atlantic/, Indian/), by UN geoscheme.
OCEAN_COUNTRY_CONTINENT = {
    "CV": "Africa",
    "KM": "Africa",
    "MG": "Africa",
    "MU": "Africa",
    "SC": "Africa",
    "IS": "Europe",
    "MV": "Asia",
}
#: Transcontinental countries, left out of the continent relation (no single answer).
TRANSCONTINENTAL = frozenset("AM AZ CY EG GE KZ RU TR".split())

#: Language codes replaced by a more common code for the same language ("Norwegian").
PREFERRED_LANGUAGE = {"nb": "no"}
#: Scripts whose CLDR names are not names of a writing system (Hans -> "Simplified").
SKIPPED_SCRIPTS = frozenset({"Hans", "Hant", "Jpan", "Kore"})
#: Currency head nouns come last in these languages ("Japanese yen"), first in the others
#: with spaces ("yen japonais"); zh/ja names have no spaces and get no head-word alias.
HEAD_LAST_LANGS = frozenset({"en", "de", "ru", "ko", "hi"})
HEAD_FIRST_LANGS = frozenset({"fr", "es", "it", "pt", "ar"})
#: Date at which the official currencies are read (keeps the output reproducible).
CURRENCY_DATE = datetime.date(2025, 1, 1)

# ---------------------------------------------------------------------------------------
# Templates: candidates per relation and language; ``{s}`` is the subject. The answer is the
# continuation (after a space, or directly for zh/ja). The generator uses the candidate with
# the best measured accuracy in MEASURED (first candidate when unmeasured).
# ---------------------------------------------------------------------------------------

CANDIDATES: dict[str, dict[str, tuple[str, ...]]] = {
    "capital": {
        "en": (
            "The capital of {s} is the city of",
            "Country: {s}\nCapital:",
            "Q: What is the capital of {s}?\nA:",
        ),
        "de": (
            "Die Hauptstadt von {s} ist die Stadt",
            "Land: {s}\nHauptstadt:",
            "Frage: Was ist die Hauptstadt von {s}?\nAntwort:",
        ),
        "fr": (
            "La capitale de la nation {s} est la ville de",
            "Pays : {s}\nCapitale :",
            "Question : Quelle est la capitale de la nation {s} ?\nRéponse :",
        ),
        "es": (
            "La capital de {s} es la ciudad de",
            "País: {s}\nCapital:",
            "Pregunta: ¿Cuál es la capital de {s}?\nRespuesta:",
        ),
        "it": (
            "La capitale della nazione {s} è la città di",
            "Paese: {s}\nCapitale:",
            "Domanda: Qual è la capitale della nazione {s}?\nRisposta:",
        ),
        "pt": (
            "A capital da nação {s} é a cidade de",
            "País: {s}\nCapital:",
            "Pergunta: Qual é a capital do país {s}?\nResposta:",
        ),
        "ru": (
            "Столица страны {s} — город",
            "Страна: {s}\nСтолица:",
            "Вопрос: Какой город является столицей страны {s}?\nОтвет:",
            "Столица страны {s} — это",
        ),
        "zh": (
            "{s}的首都是",
            "国家：{s}\n首都：",
            "问：{s}的首都是哪座城市？\n答：",
        ),
        "ja": (
            "{s}の首都は",
            "国：{s}\n首都：",
            "質問：{s}の首都はどこですか？\n答え：",
        ),
        "ko": (
            "{s}의 수도는",
            "국가: {s}\n수도:",
            "질문: {s}의 수도는 어디입니까?\n답:",
        ),
        "ar": (
            "عاصمة {s} هي مدينة",
            "الدولة: {s}\nالعاصمة:",
            "سؤال: ما هي عاصمة {s}؟\nجواب:",
        ),
        "hi": (
            "{s} की राजधानी",
            "देश: {s}\nराजधानी:",
            "प्रश्न: {s} की राजधानी क्या है?\nउत्तर:",
        ),
    },
    "language": {
        "en": (
            "The official language of {s} is",
            "Country: {s}\nOfficial language:",
            "Q: What is the official language of {s}?\nA:",
        ),
        "de": (
            "Die Amtssprache von {s} ist",
            "Land: {s}\nAmtssprache:",
            "Frage: Was ist die Amtssprache von {s}?\nAntwort:",
        ),
        "fr": (
            "Pays : {s}\nLangue officielle :",
            "La langue officielle de la nation {s} est :",
            "Question : Quelle est la langue officielle de la nation {s} ?\nRéponse :",
        ),
        "es": (
            "El idioma oficial de {s} es el",
            "País: {s}\nIdioma oficial:",
            "Pregunta: ¿Cuál es el idioma oficial de {s}?\nRespuesta:",
        ),
        "it": (
            "Paese: {s}\nLingua ufficiale:",
            "La lingua ufficiale della nazione {s} è:",
            "Domanda: Qual è la lingua ufficiale della nazione {s}?\nRisposta:",
        ),
        "pt": (
            "O idioma oficial do país {s} é o",
            "País: {s}\nIdioma oficial:",
            "Pergunta: Qual é o idioma oficial do país {s}?\nResposta:",
        ),
        "ru": (
            "Официальный язык страны {s} —",
            "Страна: {s}\nОфициальный язык:",
            "Вопрос: Какой официальный язык страны {s}?\nОтвет:",
            "Официальный язык страны {s} — это",
        ),
        "zh": (
            "{s}的官方语言是",
            "国家：{s}\n官方语言：",
            "问：{s}的官方语言是什么？\n答：",
        ),
        "ja": (
            "{s}の公用語は",
            "国：{s}\n公用語：",
            "質問：{s}の公用語は何ですか？\n答え：",
        ),
        "ko": (
            "{s}의 공용어는",
            "국가: {s}\n공용어:",
            "질문: {s}의 공용어는 무엇입니까?\n답:",
        ),
        "ar": (
            "اللغة الرسمية في {s} هي اللغة",
            "الدولة: {s}\nاللغة الرسمية:",
            "سؤال: ما هي اللغة الرسمية في {s}؟\nجواب:",
        ),
        "hi": (
            "{s} की आधिकारिक भाषा",
            "देश: {s}\nआधिकारिक भाषा:",
            "प्रश्न: {s} की आधिकारिक भाषा क्या है?\nउत्तर:",
        ),
    },
    "currency": {
        "en": (
            "The currency of {s} is the",
            "Country: {s}\nCurrency:",
            "Q: What is the currency of {s}?\nA:",
        ),
        "de": (
            "Die offizielle Währung von {s} heißt",
            "Land: {s}\nWährung:",
            "Frage: Was ist die Währung von {s}?\nAntwort:",
        ),
        "fr": (
            "La monnaie de la nation {s} s'appelle",
            "Pays : {s}\nMonnaie :",
            "Question : Quelle est la monnaie de la nation {s} ?\nRéponse :",
        ),
        "es": (
            "La moneda de {s} se llama",
            "País: {s}\nMoneda:",
            "Pregunta: ¿Cuál es la moneda de {s}?\nRespuesta:",
        ),
        "it": (
            "La valuta della nazione {s} si chiama",
            "Paese: {s}\nValuta:",
            "Domanda: Qual è la valuta della nazione {s}?\nRisposta:",
        ),
        "pt": (
            "A moeda do país {s} se chama",
            "País: {s}\nMoeda:",
            "Pergunta: Qual é a moeda do país {s}?\nResposta:",
        ),
        "ru": (
            "Валюта страны {s} называется",
            "Страна: {s}\nВалюта:",
            "Вопрос: Какая валюта в стране {s}?\nОтвет:",
            "Валюта страны {s} — это",
        ),
        "zh": (
            "{s}的货币是",
            "国家：{s}\n货币：",
            "问：{s}的货币是什么？\n答：",
        ),
        "ja": (
            "{s}の通貨は",
            "国：{s}\n通貨：",
            "質問：{s}の通貨は何ですか？\n答え：",
        ),
        "ko": (
            "{s}의 통화는",
            "국가: {s}\n통화:",
            "질문: {s}의 통화는 무엇입니까?\n답:",
        ),
        "ar": (
            "عملة {s} هي",
            "الدولة: {s}\nالعملة:",
            "سؤال: ما هي عملة {s}؟\nجواب:",
        ),
        "hi": (
            "{s} की मुद्रा",
            "देश: {s}\nमुद्रा:",
            "प्रश्न: {s} की मुद्रा क्या है?\nउत्तर:",
        ),
    },
    "continent": {
        "en": (
            "{s} is a country in the continent of",
            "Country: {s}\nContinent:",
            "Q: On which continent is {s}?\nA:",
        ),
        "de": (
            "Das Land {s} liegt auf dem Kontinent",
            "Land: {s}\nKontinent:",
            "Frage: Auf welchem Kontinent liegt das Land {s}?\nAntwort:",
            "Das Land {s} liegt in",
        ),
        "fr": (
            "La nation {s} est située en",
            "Pays : {s}\nContinent :",
            "Question : Sur quel continent se trouve la nation {s} ?\nRéponse :",
        ),
        "es": (
            "{s} es un país situado en",
            "País: {s}\nContinente:",
            "Pregunta: ¿En qué continente está {s}?\nRespuesta:",
            "{s} es un país de",
        ),
        "it": (
            "La nazione {s} si trova in",
            "Paese: {s}\nContinente:",
            "Domanda: In quale continente si trova la nazione {s}?\nRisposta:",
        ),
        "pt": (
            "O país {s} fica na",
            "País: {s}\nContinente:",
            "Pergunta: Em que continente fica o país {s}?\nResposta:",
        ),
        "ru": (
            "Часть света, в которой находится страна {s}, —",
            "Страна: {s}\nКонтинент:",
            "Вопрос: На каком континенте находится страна {s}?\nОтвет:",
            "Часть света, в которой находится страна {s}, — это",
        ),
        "zh": (
            "{s}位于",
            "国家：{s}\n大洲：",
            "问：{s}位于哪个大洲？\n答：",
        ),
        "ja": (
            "{s}がある大陸は",
            "国：{s}\n大陸：",
            "質問：{s}はどの大陸にありますか？\n答え：",
        ),
        "ko": (
            "{s} 국가가 속한 대륙은",
            "국가: {s}\n대륙:",
            "질문: {s} 국가는 어느 대륙에 있습니까?\n답:",
        ),
        "ar": (
            "تقع {s} في قارة",
            "الدولة: {s}\nالقارة:",
            "سؤال: في أي قارة تقع {s}؟\nجواب:",
        ),
        "hi": (
            "{s} देश का महाद्वीप",
            "देश: {s}\nमहाद्वीप:",
            "प्रश्न: {s} किस महाद्वीप में है?\nउत्तर:",
        ),
    },
    "city_country": {
        "en": (
            "{s} is a city in the country of",
            "City: {s}\nCountry:",
            "Q: In which country is the city of {s}?\nA:",
        ),
        "de": (
            "Die Stadt {s} liegt im Land",
            "Stadt: {s}\nLand:",
            "Frage: In welchem Land liegt die Stadt {s}?\nAntwort:",
            "Die Stadt {s} liegt in",
        ),
        "fr": (
            "La ville de {s} est située dans le pays nommé",
            "Ville : {s}\nPays :",
            "Question : Dans quel pays se trouve la ville de {s} ?\nRéponse :",
        ),
        "es": (
            "La ciudad de {s} se encuentra en",
            "Ciudad: {s}\nPaís:",
            "Pregunta: ¿En qué país está la ciudad de {s}?\nRespuesta:",
        ),
        "it": (
            "La città di {s} appartiene alla nazione",
            "Città: {s}\nPaese:",
            "Domanda: In quale paese si trova la città di {s}?\nRisposta:",
        ),
        "pt": (
            "A cidade de {s} fica no país",
            "Cidade: {s}\nPaís:",
            "Pergunta: Em que país fica a cidade de {s}?\nResposta:",
        ),
        "ru": (
            "Город {s} находится в стране",
            "Город: {s}\nСтрана:",
            "Вопрос: В какой стране находится город {s}?\nОтвет:",
            "Страна, в которой находится город {s}, — это",
        ),
        "zh": (
            "{s}是一座城市，位于",
            "城市：{s}\n国家：",
            "问：{s}这座城市位于哪个国家？\n答：",
        ),
        "ja": (
            "{s}という都市がある国は",
            "都市：{s}\n国：",
            "質問：{s}という都市はどの国にありますか？\n答え：",
        ),
        "ko": (
            "{s} 도시가 있는 나라는",
            "도시: {s}\n나라:",
            "질문: {s} 도시는 어느 나라에 있습니까?\n답:",
        ),
        "ar": (
            "تقع مدينة {s} في دولة",
            "المدينة: {s}\nالدولة:",
            "سؤال: في أي دولة تقع مدينة {s}؟\nجواب:",
        ),
        "hi": (
            "{s} शहर का देश",
            "शहर: {s}\nदेश:",
            "प्रश्न: {s} शहर किस देश में है?\nउत्तर:",
        ),
    },
    "script": {
        "en": (
            "The {s} language is written in the",
            "Language: {s}\nScript:",
            "Q: Which script is the {s} language written in?\nA:",
            "The {s} language uses the",
        ),
        "de": (
            "Die Schrift der Sprache {s} heißt",
            "Sprache: {s}\nSchrift:",
            "Frage: In welcher Schrift wird die Sprache {s} geschrieben?\nAntwort:",
        ),
        "fr": (
            "L'alphabet de la langue « {s} » est l'alphabet",
            "Langue : {s}\nÉcriture :",
            "Question : Quelle écriture utilise la langue « {s} » ?\nRéponse :",
        ),
        "es": (
            "El idioma {s} se escribe con el alfabeto",
            "Idioma: {s}\nEscritura:",
            "Pregunta: ¿Con qué alfabeto se escribe el idioma {s}?\nRespuesta:",
        ),
        "it": (
            "La lingua «{s}» si scrive con l'alfabeto",
            "Lingua: {s}\nScrittura:",
            "Domanda: Con quale alfabeto si scrive la lingua «{s}»?\nRisposta:",
        ),
        "pt": (
            "O idioma {s} é escrito com o alfabeto",
            "Idioma: {s}\nEscrita:",
            "Pergunta: Com que alfabeto se escreve o idioma {s}?\nResposta:",
        ),
        "ru": (
            "Письменность языка «{s}» —",
            "Язык: {s}\nПисьменность:",
            "Вопрос: Какая письменность используется в языке «{s}»?\nОтвет:",
            "Письменность языка «{s}» — это",
        ),
        "zh": (
            "{s}使用的文字是",
            "语言：{s}\n文字：",
            "问：{s}使用哪种文字？\n答：",
        ),
        "ja": (
            "{s}で使われる文字は",
            "言語：{s}\n文字：",
            "質問：{s}はどの文字で書かれますか？\n答え：",
        ),
        "ko": (
            "{s}의 문자는",
            "언어: {s}\n문자:",
            "질문: {s}는 어떤 문자로 씁니까?\n답:",
        ),
        "ar": (
            "نظام الكتابة المستخدم في {s} هو",
            "اللغة: {s}\nنظام الكتابة:",
            "سؤال: ما هو نظام الكتابة المستخدم في {s}؟\nجواب:",
        ),
        "hi": (
            "{s} भाषा की लिपि",
            "भाषा: {s}\nलिपि:",
            "प्रश्न: {s} भाषा किस लिपि में लिखी जाती है?\nउत्तर:",
        ),
    },
}

#: Number of facts per template in the measurement below.
MEASURED_N = 40
#: Zero-shot accuracy of each candidate on google/gemma-3-270m (dequantized Q4_K_M GGUF,
#: float32, greedy, up to 8 new tokens, scored by mechlingo.core.answers.is_correct against the
#: answer and aliases) on MEASURED_N facts per relation sampled with seed 0, from
#: ``python scripts/measure_templates.py --threads 1`` (2025, Babel 2.19 / CLDR 49 names).
#: relation -> lang -> template -> accuracy.
MEASURED: dict[str, dict[str, dict[str, float]]] = {
    "capital": {
        "en": {
            "The capital of {s} is the city of": 0.825,
            "Country: {s}\nCapital:": 0.875,
            "Q: What is the capital of {s}?\nA:": 0.025,
        },
        "de": {
            "Die Hauptstadt von {s} ist die Stadt": 0.35,
            "Land: {s}\nHauptstadt:": 0.45,
            "Frage: Was ist die Hauptstadt von {s}?\nAntwort:": 0.1,
        },
        "fr": {
            "La capitale de la nation {s} est la ville de": 0.475,
            "Pays : {s}\nCapitale :": 0.475,
            "Question : Quelle est la capitale de la nation {s} ?\nRéponse :": 0.325,
        },
        "es": {
            "La capital de {s} es la ciudad de": 0.1,
            "País: {s}\nCapital:": 0.425,
            "Pregunta: ¿Cuál es la capital de {s}?\nRespuesta:": 0.025,
        },
        "it": {
            "La capitale della nazione {s} è la città di": 0.5,
            "Paese: {s}\nCapitale:": 0.35,
            "Domanda: Qual è la capitale della nazione {s}?\nRisposta:": 0.2,
        },
        "pt": {
            "A capital da nação {s} é a cidade de": 0.175,
            "País: {s}\nCapital:": 0.425,
            "Pergunta: Qual é a capital do país {s}?\nResposta:": 0.05,
        },
        "ru": {
            "Столица страны {s} — город": 0.0,
            "Страна: {s}\nСтолица:": 0.125,
            "Вопрос: Какой город является столицей страны {s}?\nОтвет:": 0.1,
            "Столица страны {s} — это": 0.0,
        },
        "zh": {
            "{s}的首都是": 0.0,
            "国家：{s}\n首都：": 0.175,
            "问：{s}的首都是哪座城市？\n答：": 0.05,
        },
        "ja": {
            "{s}の首都は": 0.0,
            "国：{s}\n首都：": 0.05,
            "質問：{s}の首都はどこですか？\n答え：": 0.075,
        },
        "ko": {
            "{s}의 수도는": 0.0,
            "국가: {s}\n수도:": 0.05,
            "질문: {s}의 수도는 어디입니까?\n답:": 0.05,
        },
        "ar": {
            "عاصمة {s} هي مدينة": 0.05,
            "الدولة: {s}\nالعاصمة:": 0.1,
            "سؤال: ما هي عاصمة {s}؟\nجواب:": 0.05,
        },
        "hi": {
            "{s} की राजधानी": 0.025,
            "देश: {s}\nराजधानी:": 0.025,
            "प्रश्न: {s} की राजधानी क्या है?\nउत्तर:": 0.025,
        },
    },
    "language": {
        "en": {
            "The official language of {s} is": 0.875,
            "Country: {s}\nOfficial language:": 0.8,
            "Q: What is the official language of {s}?\nA:": 0.7,
        },
        "de": {
            "Die Amtssprache von {s} ist": 0.275,
            "Land: {s}\nAmtssprache:": 0.15,
            "Frage: Was ist die Amtssprache von {s}?\nAntwort:": 0.05,
        },
        "fr": {
            "Pays : {s}\nLangue officielle :": 0.5,
            "La langue officielle de la nation {s} est :": 0.0,
            "Question : Quelle est la langue officielle de la nation {s} ?\nRéponse :": 0.025,
        },
        "es": {
            "El idioma oficial de {s} es el": 0.375,
            "País: {s}\nIdioma oficial:": 0.2,
            "Pregunta: ¿Cuál es el idioma oficial de {s}?\nRespuesta:": 0.025,
        },
        "it": {
            "Paese: {s}\nLingua ufficiale:": 0.35,
            "La lingua ufficiale della nazione {s} è:": 0.0,
            "Domanda: Qual è la lingua ufficiale della nazione {s}?\nRisposta:": 0.0,
        },
        "pt": {
            "O idioma oficial do país {s} é o": 0.225,
            "País: {s}\nIdioma oficial:": 0.225,
            "Pergunta: Qual é o idioma oficial do país {s}?\nResposta:": 0.0,
        },
        "ru": {
            "Официальный язык страны {s} —": 0.025,
            "Страна: {s}\nОфициальный язык:": 0.375,
            "Вопрос: Какой официальный язык страны {s}?\nОтвет:": 0.1,
            "Официальный язык страны {s} — это": 0.1,
        },
        "zh": {
            "{s}的官方语言是": 0.5,
            "国家：{s}\n官方语言：": 0.275,
            "问：{s}的官方语言是什么？\n答：": 0.0,
        },
        "ja": {
            "{s}の公用語は": 0.425,
            "国：{s}\n公用語：": 0.55,
            "質問：{s}の公用語は何ですか？\n答え：": 0.3,
        },
        "ko": {
            "{s}의 공용어는": 0.075,
            "국가: {s}\n공용어:": 0.075,
            "질문: {s}의 공용어는 무엇입니까?\n답:": 0.05,
        },
        "ar": {
            "اللغة الرسمية في {s} هي اللغة": 0.125,
            "الدولة: {s}\nاللغة الرسمية:": 0.275,
            "سؤال: ما هي اللغة الرسمية في {s}؟\nجواب:": 0.0,
        },
        "hi": {
            "{s} की आधिकारिक भाषा": 0.0,
            "देश: {s}\nआधिकारिक भाषा:": 0.075,
            "प्रश्न: {s} की आधिकारिक भाषा क्या है?\nउत्तर:": 0.0,
        },
    },
    "currency": {
        "en": {
            "The currency of {s} is the": 0.325,
            "Country: {s}\nCurrency:": 0.4,
            "Q: What is the currency of {s}?\nA:": 0.0,
        },
        "de": {
            "Die offizielle Währung von {s} heißt": 0.025,
            "Land: {s}\nWährung:": 0.05,
            "Frage: Was ist die Währung von {s}?\nAntwort:": 0.0,
        },
        "fr": {
            "La monnaie de la nation {s} s'appelle": 0.0,
            "Pays : {s}\nMonnaie :": 0.075,
            "Question : Quelle est la monnaie de la nation {s} ?\nRéponse :": 0.0,
        },
        "es": {
            "La moneda de {s} se llama": 0.0,
            "País: {s}\nMoneda:": 0.0,
            "Pregunta: ¿Cuál es la moneda de {s}?\nRespuesta:": 0.0,
        },
        "it": {
            "La valuta della nazione {s} si chiama": 0.0,
            "Paese: {s}\nValuta:": 0.125,
            "Domanda: Qual è la valuta della nazione {s}?\nRisposta:": 0.0,
        },
        "pt": {
            "A moeda do país {s} se chama": 0.0,
            "País: {s}\nMoeda:": 0.05,
            "Pergunta: Qual é a moeda do país {s}?\nResposta:": 0.0,
        },
        "ru": {
            "Валюта страны {s} называется": 0.0,
            "Страна: {s}\nВалюта:": 0.075,
            "Вопрос: Какая валюта в стране {s}?\nОтвет:": 0.0,
            "Валюта страны {s} — это": 0.0,
        },
        "zh": {
            "{s}的货币是": 0.025,
            "国家：{s}\n货币：": 0.05,
            "问：{s}的货币是什么？\n答：": 0.0,
        },
        "ja": {
            "{s}の通貨は": 0.0,
            "国：{s}\n通貨：": 0.075,
            "質問：{s}の通貨は何ですか？\n答え：": 0.05,
        },
        "ko": {
            "{s}의 통화는": 0.0,
            "국가: {s}\n통화:": 0.0,
            "질문: {s}의 통화는 무엇입니까?\n답:": 0.0,
        },
        "ar": {
            "عملة {s} هي": 0.0,
            "الدولة: {s}\nالعملة:": 0.0,
            "سؤال: ما هي عملة {s}؟\nجواب:": 0.0,
        },
        "hi": {
            "{s} की मुद्रा": 0.0,
            "देश: {s}\nमुद्रा:": 0.0,
            "प्रश्न: {s} की मुद्रा क्या है?\nउत्तर:": 0.0,
        },
    },
    "continent": {
        "en": {
            "{s} is a country in the continent of": 0.7,
            "Country: {s}\nContinent:": 0.8,
            "Q: On which continent is {s}?\nA:": 0.0,
        },
        "de": {
            "Das Land {s} liegt auf dem Kontinent": 0.0,
            "Land: {s}\nKontinent:": 0.225,
            "Frage: Auf welchem Kontinent liegt das Land {s}?\nAntwort:": 0.0,
            "Das Land {s} liegt in": 0.0,
        },
        "fr": {
            "La nation {s} est située en": 0.325,
            "Pays : {s}\nContinent :": 0.35,
            "Question : Sur quel continent se trouve la nation {s} ?\nRéponse :": 0.0,
        },
        "es": {
            "{s} es un país situado en": 0.0,
            "País: {s}\nContinente:": 0.5,
            "Pregunta: ¿En qué continente está {s}?\nRespuesta:": 0.0,
            "{s} es un país de": 0.0,
        },
        "it": {
            "La nazione {s} si trova in": 0.0,
            "Paese: {s}\nContinente:": 0.5,
            "Domanda: In quale continente si trova la nazione {s}?\nRisposta:": 0.0,
        },
        "pt": {
            "O país {s} fica na": 0.0,
            "País: {s}\nContinente:": 0.45,
            "Pergunta: Em que continente fica o país {s}?\nResposta:": 0.0,
        },
        "ru": {
            "Часть света, в которой находится страна {s}, —": 0.0,
            "Страна: {s}\nКонтинент:": 0.125,
            "Вопрос: На каком континенте находится страна {s}?\nОтвет:": 0.0,
            "Часть света, в которой находится страна {s}, — это": 0.0,
        },
        "zh": {
            "{s}位于": 0.2,
            "国家：{s}\n大洲：": 0.075,
            "问：{s}位于哪个大洲？\n答：": 0.0,
        },
        "ja": {
            "{s}がある大陸は": 0.05,
            "国：{s}\n大陸：": 0.0,
            "質問：{s}はどの大陸にありますか？\n答え：": 0.0,
        },
        "ko": {
            "{s} 국가가 속한 대륙은": 0.0,
            "국가: {s}\n대륙:": 0.225,
            "질문: {s} 국가는 어느 대륙에 있습니까?\n답:": 0.0,
        },
        "ar": {
            "تقع {s} في قارة": 0.575,
            "الدولة: {s}\nالقارة:": 0.375,
            "سؤال: في أي قارة تقع {s}؟\nجواب:": 0.0,
        },
        "hi": {
            "{s} देश का महाद्वीप": 0.0,
            "देश: {s}\nमहाद्वीप:": 0.25,
            "प्रश्न: {s} किस महाद्वीप में है?\nउत्तर:": 0.0,
        },
    },
    "city_country": {
        "en": {
            "{s} is a city in the country of": 0.425,
            "City: {s}\nCountry:": 0.75,
            "Q: In which country is the city of {s}?\nA:": 0.05,
        },
        "de": {
            "Die Stadt {s} liegt im Land": 0.0,
            "Stadt: {s}\nLand:": 0.2,
            "Frage: In welchem Land liegt die Stadt {s}?\nAntwort:": 0.0,
            "Die Stadt {s} liegt in": 0.025,
        },
        "fr": {
            "La ville de {s} est située dans le pays nommé": 0.25,
            "Ville : {s}\nPays :": 0.475,
            "Question : Dans quel pays se trouve la ville de {s} ?\nRéponse :": 0.025,
        },
        "es": {
            "La ciudad de {s} se encuentra en": 0.0,
            "Ciudad: {s}\nPaís:": 0.5,
            "Pregunta: ¿En qué país está la ciudad de {s}?\nRespuesta:": 0.0,
        },
        "it": {
            "La città di {s} appartiene alla nazione": 0.05,
            "Città: {s}\nPaese:": 0.375,
            "Domanda: In quale paese si trova la città di {s}?\nRisposta:": 0.0,
        },
        "pt": {
            "A cidade de {s} fica no país": 0.0,
            "Cidade: {s}\nPaís:": 0.35,
            "Pergunta: Em que país fica a cidade de {s}?\nResposta:": 0.0,
        },
        "ru": {
            "Город {s} находится в стране": 0.0,
            "Город: {s}\nСтрана:": 0.125,
            "Вопрос: В какой стране находится город {s}?\nОтвет:": 0.0,
            "Страна, в которой находится город {s}, — это": 0.025,
        },
        "zh": {
            "{s}是一座城市，位于": 0.05,
            "城市：{s}\n国家：": 0.05,
            "问：{s}这座城市位于哪个国家？\n答：": 0.0,
        },
        "ja": {
            "{s}という都市がある国は": 0.0,
            "都市：{s}\n国：": 0.0,
            "質問：{s}という都市はどの国にありますか？\n答え：": 0.0,
        },
        "ko": {
            "{s} 도시가 있는 나라는": 0.0,
            "도시: {s}\n나라:": 0.075,
            "질문: {s} 도시는 어느 나라에 있습니까?\n답:": 0.0,
        },
        "ar": {
            "تقع مدينة {s} في دولة": 0.075,
            "المدينة: {s}\nالدولة:": 0.15,
            "سؤال: في أي دولة تقع مدينة {s}؟\nجواب:": 0.025,
        },
        "hi": {
            "{s} शहर का देश": 0.0,
            "शहर: {s}\nदेश:": 0.0,
            "प्रश्न: {s} शहर किस देश में है?\nउत्तर:": 0.0,
        },
    },
    "script": {
        "en": {
            "The {s} language is written in the": 0.15,
            "Language: {s}\nScript:": 0.025,
            "Q: Which script is the {s} language written in?\nA:": 0.0,
            "The {s} language uses the": 0.0,
        },
        "de": {
            "Die Schrift der Sprache {s} heißt": 0.0,
            "Sprache: {s}\nSchrift:": 0.0,
            "Frage: In welcher Schrift wird die Sprache {s} geschrieben?\nAntwort:": 0.025,
        },
        "fr": {
            "L'alphabet de la langue « {s} » est l'alphabet": 0.0,
            "Langue : {s}\nÉcriture :": 0.1,
            "Question : Quelle écriture utilise la langue « {s} » ?\nRéponse :": 0.0,
        },
        "es": {
            "El idioma {s} se escribe con el alfabeto": 0.475,
            "Idioma: {s}\nEscritura:": 0.025,
            "Pregunta: ¿Con qué alfabeto se escribe el idioma {s}?\nRespuesta:": 0.05,
        },
        "it": {
            "La lingua «{s}» si scrive con l'alfabeto": 0.0,
            "Lingua: {s}\nScrittura:": 0.1,
            "Domanda: Con quale alfabeto si scrive la lingua «{s}»?\nRisposta:": 0.0,
        },
        "pt": {
            "O idioma {s} é escrito com o alfabeto": 0.05,
            "Idioma: {s}\nEscrita:": 0.0,
            "Pergunta: Com que alfabeto se escreve o idioma {s}?\nResposta:": 0.025,
        },
        "ru": {
            "Письменность языка «{s}» —": 0.0,
            "Язык: {s}\nПисьменность:": 0.0,
            "Вопрос: Какая письменность используется в языке «{s}»?\nОтвет:": 0.0,
            "Письменность языка «{s}» — это": 0.0,
        },
        "zh": {
            "{s}使用的文字是": 0.0,
            "语言：{s}\n文字：": 0.0,
            "问：{s}使用哪种文字？\n答：": 0.0,
        },
        "ja": {
            "{s}で使われる文字は": 0.0,
            "言語：{s}\n文字：": 0.0,
            "質問：{s}はどの文字で書かれますか？\n答え：": 0.0,
        },
        "ko": {
            "{s}의 문자는": 0.0,
            "언어: {s}\n문자:": 0.0,
            "질문: {s}는 어떤 문자로 씁니까?\n답:": 0.0,
        },
        "ar": {
            "نظام الكتابة المستخدم في {s} هو": 0.0,
            "اللغة: {s}\nنظام الكتابة:": 0.025,
            "سؤال: ما هو نظام الكتابة المستخدم في {s}؟\nجواب:": 0.0,
        },
        "hi": {
            "{s} भाषा की लिपि": 0.0,
            "भाषा: {s}\nलिपि:": 0.0,
            "प्रश्न: {s} भाषा किस लिपि में लिखी जाती है?\nउत्तर:": 0.125,
        },
    },
}


def chosen_template(relation: str, lang: str) -> str:
    """The candidate with the best measured accuracy (ties and unmeasured: the first)."""
    candidates = CANDIDATES[relation][lang]
    scores = MEASURED.get(relation, {}).get(lang, {})
    return max(candidates, key=lambda t: (scores.get(t, -1.0), -candidates.index(t)))


# ---------------------------------------------------------------------------------------
# CLDR names
# ---------------------------------------------------------------------------------------


@dataclass
class Row:
    """One fact across languages: the subject and answer names per language."""

    key: str
    subjects: dict[str, str]
    answers: dict[str, str]
    aliases: dict[str, list[str]] = field(default_factory=dict)


class Names:
    """CLDR display names for the twelve languages."""

    def __init__(self) -> None:
        self.locales = {lang: Locale.parse(lang) for lang in LANGS}

    def territory(self, code: str, lang: str) -> str | None:
        return self.locales[lang].territories.get(code)

    def language(self, code: str, lang: str) -> str | None:
        return self.locales[lang].languages.get(code)

    def script(self, code: str, lang: str) -> str | None:
        return self.locales[lang].scripts.get(code)

    def currency(self, code: str, lang: str) -> str | None:
        return self.locales[lang].currencies.get(code)

    def city(self, zone: str, lang: str) -> str | None:
        entry = self.locales[lang].time_zones.get(zone)
        if entry is not None and "city" in entry:
            return entry["city"]
        if lang in LATIN_LANGS:
            return zone.rsplit("/", 1)[-1].replace("_", " ")
        return None

    def all_langs(self, getter: str, code: str) -> dict[str, str] | None:
        """Names of ``code`` in every language, or None if one language lacks it."""
        method = getattr(self, getter)
        names = {lang: method(code, lang) for lang in LANGS}
        if any(not name for name in names.values()):
            return None
        return names


def name_variants(name: str, lang: str) -> list[str]:
    """Other ways of writing a CLDR name that count as the same answer: the parts of
    ``"Myanmar (Burma)"``, the part before ``" - "`` in ``"Congo - Kinshasa"``, and in English
    ``"and"`` for ``"&"``."""
    variants: list[str] = []
    match = re.fullmatch(r"(.+?)\s*[(（](.+)[)）]", name)
    if match:
        variants += [match.group(1).strip(), match.group(2).strip()]
    if " - " in name:
        variants.append(name.split(" - ")[0].strip())
    if lang == "en" and "&" in name:
        variants.append(name.replace("&", "and"))
    return [v for v in variants if v and v != name]


def _key(text: str) -> str:
    return re.sub(r"\W+", " ", text.casefold()).strip()


# ---------------------------------------------------------------------------------------
# Relations
# ---------------------------------------------------------------------------------------


def capital_rows(names: Names) -> list[Row]:
    """Country -> capital city, for the countries of :data:`CAPITAL_ZONES`."""
    zone_territories = get_global("zone_territories")
    rows = []
    for code, zone in sorted(CAPITAL_ZONES.items()):
        if zone_territories.get(zone) != code:
            raise ValueError(f"time zone {zone} is not in {code} according to CLDR")
        subjects = names.all_langs("territory", code)
        answers = names.all_langs("city", zone)
        if not subjects or not answers:
            continue
        if any(_key(subjects[lang]) == _key(answers[lang]) for lang in LANGS):
            continue  # e.g. Andorra: CLDR's exemplar city is "Andorra", not Andorra la Vella
        aliases = {lang: name_variants(answers[lang], lang) for lang in LANGS}
        rows.append(Row(code, subjects, answers, aliases))
    return rows


def official_languages(code: str) -> list[str]:
    """Official and de facto official languages of a country, most spoken first."""
    info = get_global("territory_languages").get(code, {})
    ranked = sorted(
        (
            (-float(data.get("population_percent") or 0.0), lang)
            for lang, data in info.items()
            if data.get("official_status") in ("official", "de_facto_official")
        )
    )
    out: list[str] = []
    for _, lang in ranked:
        lang = PREFERRED_LANGUAGE.get(lang, lang)
        if lang not in out:
            out.append(lang)
    return out


def language_rows(names: Names) -> list[Row]:
    """Country -> its most spoken official language (other official languages are aliases)."""
    rows = []
    for code in sorted(UN_MEMBERS):
        subjects = names.all_langs("territory", code)
        named = [
            (lang, names.all_langs("language", lang))
            for lang in official_languages(code)
            if names.all_langs("language", lang)
        ]
        if not subjects or not named:
            continue
        answers = named[0][1]
        assert answers is not None
        aliases = {lang: [other[lang] for _, other in named[1:] if other] for lang in LANGS}
        rows.append(Row(code, subjects, answers, aliases))
    return rows


def _currency_names(code: str, lang: str, names: Names) -> list[str]:
    base = names.currency(code, lang) or ""
    forms = [get_currency_name(code, count=n, locale=lang) for n in (1, 2, 5, 1.5)]
    return [f for f in dict.fromkeys([base, *forms]) if f]


def currency_rows(names: Names) -> list[Row]:
    """Country -> its official currency (CLDR display name; plural forms, the ISO code, other
    tender currencies and a distinctive head word such as "yen" are aliases)."""
    per_country: dict[str, list[str]] = {}
    for code in sorted(UN_MEMBERS):
        currencies = get_territory_currencies(code, start_date=CURRENCY_DATE)
        if currencies:
            per_country[code] = list(currencies)
    used = sorted({c for cs in per_country.values() for c in cs})
    head_counts: dict[str, dict[str, int]] = {lang: {} for lang in LANGS}
    heads: dict[tuple[str, str], str] = {}
    for cur in used:
        for lang in LANGS:
            name = names.currency(cur, lang) or ""
            words = name.split()
            if len(words) < 2:
                continue
            head = words[-1] if lang in HEAD_LAST_LANGS else words[0]
            if lang not in HEAD_FIRST_LANGS | HEAD_LAST_LANGS:
                continue
            heads[(cur, lang)] = head
            head_counts[lang][_key(head)] = head_counts[lang].get(_key(head), 0) + 1
    rows = []
    for code, currencies in per_country.items():
        subjects = names.all_langs("territory", code)
        answers = names.all_langs("currency", currencies[0])
        if not subjects or not answers:
            continue
        aliases: dict[str, list[str]] = {}
        for lang in LANGS:
            found = _currency_names(currencies[0], lang, names)
            head = heads.get((currencies[0], lang))
            if head and head_counts[lang][_key(head)] == 1:
                found.append(head)
            found.append(currencies[0])  # the ISO 4217 code ("EUR"), valid in every language
            for other in currencies[1:]:
                found += [*_currency_names(other, lang, names), other]
            aliases[lang] = found
        rows.append(Row(code, subjects, answers, aliases))
    return rows


def continent_of(code: str) -> str | None:
    """CLDR region code of a country's continent from its time-zone prefixes, or None for
    transcontinental countries. America/ splits into North (with Central America and the
    Caribbean, as CLDR's 003) and South America; Australia/ and Pacific/ are Oceania."""
    if code in TRANSCONTINENTAL:
        return None
    prefixes = {zone.split("/")[0] for zone in get_global("territory_zones").get(code, ())}
    if code in OCEAN_COUNTRY_CONTINENT:
        return CONTINENTS[OCEAN_COUNTRY_CONTINENT[code]]
    if "America" in prefixes:
        return SOUTH_AMERICA if code in SOUTH_AMERICAN else NORTH_AMERICA
    if prefixes & {"Australia", "Pacific"}:
        return CONTINENTS["Oceania"]
    land = prefixes & {"Africa", "Asia", "Europe"}
    if len(land) == 1:
        return CONTINENTS[land.pop()]
    if code == "ES":  # Europe/Madrid with Africa/Ceuta (a Spanish city in Africa)
        return CONTINENTS["Europe"]
    raise ValueError(f"no continent rule for {code} (time-zone regions {sorted(prefixes)})")


def continent_rows(names: Names) -> list[Row]:
    """Country -> continent (Africa, Asia, Europe, North America, South America, Oceania)."""
    rows = []
    for code in sorted(UN_MEMBERS):
        region = continent_of(code)
        if region is None:
            continue
        subjects = names.all_langs("territory", code)
        answers = names.all_langs("territory", region)
        if subjects and answers:
            rows.append(Row(code, subjects, answers))
    return rows


def city_rows(names: Names) -> list[Row]:
    """City (a CLDR time-zone exemplar city) -> the country it is in. Only zones of UN
    members, with a one-level id (``Europe/Rome``, not ``America/Indiana/Knox``; the
    ``America/Argentina/`` cities are kept), on a
    continent or in :data:`OCEAN_CITY_ZONES`, and whose city is not named like its country."""
    members = set(UN_MEMBERS)
    rows = []
    for zone, code in sorted(get_global("zone_territories").items()):
        region = zone.split("/")[0]
        if code not in members:
            continue
        if zone.count("/") != 1 and not zone.startswith("America/Argentina/"):
            continue
        continental = region in ("Africa", "America", "Asia", "Australia", "Europe")
        if not continental and zone not in OCEAN_CITY_ZONES:
            continue
        subjects = names.all_langs("city", zone)
        answers = names.all_langs("territory", code)
        if not subjects or not answers:
            continue
        if any(_key(subjects[lang]) == _key(answers[lang]) for lang in LANGS):
            continue
        aliases = {lang: name_variants(answers[lang], lang) for lang in LANGS}
        rows.append(Row(zone, subjects, answers, aliases))
    return rows


def script_rows(names: Names) -> list[Row]:
    """Language -> its (likely) script, for the official languages of UN members."""
    likely = get_global("likely_subtags")
    langs = sorted({lang for code in UN_MEMBERS for lang in official_languages(code)})
    rows = []
    for code in langs:
        parts = likely.get(code, "").split("_")
        if len(parts) < 2 or parts[1] in SKIPPED_SCRIPTS:
            continue
        subjects = names.all_langs("language", code)
        answers = names.all_langs("script", parts[1])
        if subjects and answers:
            rows.append(Row(code, subjects, answers))
    return rows


ROW_BUILDERS = {
    "capital": capital_rows,
    "language": language_rows,
    "currency": currency_rows,
    "continent": continent_rows,
    "city_country": city_rows,
    "script": script_rows,
}


def collect_rows(names: Names | None = None) -> dict[str, list[Row]]:
    """All rows of all relations, sorted by key."""
    names = names or Names()
    return {rel: sorted(ROW_BUILDERS[rel](names), key=lambda r: r.key) for rel in RELATIONS}


def build_facts(
    rows: dict[str, list[Row]],
    templates: dict[tuple[str, str], str] | None = None,
    langs: Iterable[str] = LANGS,
) -> list[Fact]:
    """Fill the templates: one Fact per row and language, sorted by relation, id, language.

    ``templates`` maps (relation, lang) to a template; missing pairs use
    :func:`chosen_template`.
    """
    templates = templates or {}
    facts = []
    for relation in RELATIONS:
        for row in rows.get(relation, []):
            for lang in langs:
                template = templates.get((relation, lang)) or chosen_template(relation, lang)
                facts.append(
                    make_fact(
                        id=f"{relation}/{row.key}",
                        relation=relation,
                        lang=lang,
                        template=template,
                        subject=row.subjects[lang],
                        answer=row.answers[lang],
                        answer_en=row.answers["en"],
                        aliases=row.aliases.get(lang, ()),
                        subject_en=row.subjects["en"],
                    )
                )
    return facts


def template_table() -> dict[str, object]:
    """The content of templates.json: chosen templates, measured accuracies, provenance."""
    table: dict[str, dict[str, object]] = {}
    for relation in RELATIONS:
        table[relation] = {}
        for lang in LANGS:
            scores = MEASURED.get(relation, {}).get(lang, {})
            template = chosen_template(relation, lang)
            table[relation][lang] = {
                "template": template,
                "accuracy": scores.get(template),
                "n": MEASURED_N if scores else 0,
                "candidates": {t: scores.get(t) for t in CANDIDATES[relation][lang]},
            }
    return {
        "source": {
            "babel": babel.__version__,
            "cldr": str(get_global("cldr").get("version", "")),
            "model": "google/gemma-3-270m",
        },
        "templates": table,
    }


def generate(out_dir: Path) -> list[Fact]:
    """Write facts.jsonl and templates.json into ``out_dir``; return the facts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    facts = build_facts(collect_rows())
    write_jsonl(facts, out_dir / "facts.jsonl")
    text = json.dumps(template_table(), ensure_ascii=False, indent=1, sort_keys=False)
    (out_dir / "templates.json").write_text(text + "\n", encoding="utf-8")
    return facts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "mechlingo" / "data")
    args = parser.parse_args(argv)
    facts = generate(args.out)
    counts: dict[str, int] = {}
    for fact in facts:
        if fact.lang == "en":
            counts[fact.relation] = counts.get(fact.relation, 0) + 1
    print(f"wrote {len(facts)} records to {args.out}: facts per relation {counts}")


if __name__ == "__main__":
    main()
