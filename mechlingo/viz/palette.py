"""One colour per concept, the same in every figure.

A reader who has learned that "recall failure" is red in one figure, or that French is red in
the latent-language curves, should find the same colour for it in the next figure. So no figure
picks colours by the position of a series in its own legend; each asks this module for the
colour of *what* the series is: :func:`class_color`, :func:`language_color`,
:func:`decoder_color` (:func:`register_decoder_color` for a new decoder),
:func:`condition_color`, :func:`track_color`, :func:`site_color`, :func:`verdict_color`, or
:func:`series_color` when a series may be any of them. A name no map lists gets a colour
derived from the name (:data:`SPARE`), never from its position. A heatmap takes the colour
scale of the quantity it draws: :data:`PROBABILITY`, :data:`SCORE`, :data:`OVERLAP` or
:data:`RANK` (sequential), :data:`SIGNED_EFFECT` or :data:`CHANGE` (diverging, white at zero);
no figure names a colour scale of its own. ``docs/architecture.md``
("Results and figures") says which lookup serves which figure.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

__all__ = [
    "CLASS",
    "CHANGE",
    "CONDITION",
    "DECODER",
    "DECODER_FALLBACK",
    "EFFECT",
    "LANGUAGE",
    "OVERLAP",
    "PROBABILITY",
    "RANK",
    "SCORE",
    "SEQUENCE",
    "SIGNED_EFFECT",
    "SITE",
    "SPARE",
    "TRACK",
    "VERDICT",
    "class_color",
    "condition_color",
    "decoder_color",
    "effect_color",
    "language_color",
    "register_decoder_color",
    "series_color",
    "site_color",
    "track_color",
    "verdict_color",
]

#: The trace's classes, in the order they are drawn (the order of
#: :data:`mechlingo.analyses.recall.trace.CLASSES`): green is right, red is the failure the
#: recall pipeline is about, orange the one after it.
CLASS: Mapping[str, str] = {
    "correct": "#2ca02c",
    "wrong_language": "#9467bd",
    "translation_failure": "#ff7f0e",
    "recall_failure": "#d62728",
    "shared_form": "#17becf",
    "other": "#7f7f7f",
}

#: A colour per language code; English keeps blue everywhere.
LANGUAGE: Mapping[str, str] = {
    "en": "#1f77b4",
    "fr": "#d62728",
    "de": "#2ca02c",
    "es": "#ff7f0e",
    "ja": "#9467bd",
    "zh": "#8c564b",
    "ru": "#e377c2",
    "it": "#bcbd22",
    "pt": "#17becf",
    "ko": "#393b79",
    "ar": "#637939",
    "hi": "#8c6d31",
    "nl": "#843c39",
    "pl": "#7b4173",
    "tr": "#3182bd",
    "sv": "#e6550d",
    "fi": "#31a354",
    "vi": "#756bb1",
    "id": "#636363",
    "uk": "#ad494a",
    "cs": "#a55194",
    "el": "#6baed6",
    "he": "#fd8d3c",
    "th": "#74c476",
}

#: The decoders, by their canonical name (see :func:`decoder_color` for the spellings); the
#: decoder registry adds each decoder it registers (:func:`register_decoder_color`).
DECODER: dict[str, str] = {
    "logit": "#1f77b4",
    "tuned": "#d62728",
    "patchscope": "#2ca02c",
}

#: The colours a registered decoder without one of its own takes, the first unused first.
DECODER_FALLBACK = ("#9467bd #ff7f0e #8c564b #17becf #e377c2 #bcbd22 #393b79 #637939").split()

#: Conditions of an evaluation and arms of a comparison. The baselines (``orig``, the plain
#: ``accuracy`` of one evaluation, ``zero_shot``, ``pre``) are dark grey; a random control is
#: olive whatever it controls for.
CONDITION: Mapping[str, str] = {
    "orig": "#555555",
    "accuracy": "#555555",
    "zero_shot": "#555555",
    "pre": "#555555",
    "task": "#1f77b4",
    "diff": "#ff7f0e",
    "both": "#9467bd",
    "k_shot": "#1f77b4",
    "experts": "#d62728",
    "post": "#d62728",
    "random": "#bcbd22",
    "control": "#bcbd22",
}

#: Lens tracks that are no language: the answer in the prompt's own language, and the
#: measures a decoder figure draws beside the answers.
TRACK: Mapping[str, str] = {
    "answer": "#222222",
    "entropy": "#8c564b",
    "energy": "#e377c2",
}

#: The sites of a patching figure: colours no class, language, answer track or condition
#: uses (a test says so), so a circuit's attention node is never read as a recall failure.
SITE: Mapping[str, str] = {
    "attn_out": "#008b8b",
    "mlp_out": "#b8860b",
    "head": "#2f6f4f",
    "resid_pre": "#a0a0a0",
    "resid_mid": "#6b4423",
    "resid_post": "#708090",
}

#: Lines of an intervention's effect that are no condition: the attention-knockout curve.
EFFECT: Mapping[str, str] = {
    "knockout": "#000080",
}

#: The verdict of a claim in the claims report (the card's verdict words; the same colours
#: as the verdict column of the card's table).
VERDICT: Mapping[str, str] = {
    "holds": "#22aa77",
    "does_not_hold": "#cc3333",
    "inconclusive": "#aa7700",
    "not_testable_here": "#888888",
    "error": "#dd8800",
}

#: Colours for series that are only an order (entry 0, 1, 2, ...), no concept.
SEQUENCE = (
    "#1f77b4 #d62728 #2ca02c #ff7f0e #9467bd #8c564b #e377c2 #7f7f7f #bcbd22 #17becf "
    "#393b79 #637939"
).split()

#: The sequential colour scale of each quantity a heatmap draws, one per concept and the same
#: in every figure (a reader who learned "dark blue: likely" in the lens reads the token grid
#: the same way): a probability (0 to 1), a score where higher is better (an accuracy, a
#: retrieval rate, a faithfulness), the overlap of two sets (a shared fraction, a Jaccard
#: index) and a rank (reversed: bright is near the top, as a high score).
PROBABILITY = "Blues"
SCORE = "Viridis"
OVERLAP = "Purples"
RANK = "Viridis_r"

#: The diverging colour scale of each signed quantity a heatmap draws, white at zero (the
#: figure sets the middle, ``zmid=0`` or ``cmid=0``): a signed effect, where up is what the
#: intervention aims for (a patch restoring the clean readout, a steering vector's gain in
#: accuracy, the clamp's change in retrieval): blue up, red down; and the change of a side
#: effect, whose good direction depends on the measure (accuracy down and perplexity up both
#: harm): red up, blue down.
SIGNED_EFFECT = "RdBu"
CHANGE = "RdBu_r"

#: Where a name none of the maps lists takes its colour from (by a CRC of the name).
SPARE = (
    "#5254a3 #8ca252 #bd9e39 #ad494a #a55194 #6b6ecf #b5cf6b #e7ba52 #d6616b #ce6dbd "
    "#9c9ede #cedb9c"
).split()


def _spare(name: str) -> str:
    return SPARE[zlib.crc32(name.encode()) % len(SPARE)]


def class_color(name: str) -> str:
    """The colour of a trace class (``"recall_failure"`` or ``"recall failure"``)."""
    return CLASS.get(name.replace(" ", "_")) or _spare(name)


def language_color(code: str) -> str:
    """The colour of a language code (case-insensitive; a region tag is ignored:
    ``"pt-BR"`` is Portuguese)."""
    base = code.lower().replace("_", "-").split("-")[0]
    return LANGUAGE.get(base) or _spare(base)


def _decoder_key(name: str) -> str:
    words = name.lower().replace("_", " ").replace("-", " ").split()
    if words[-1:] == ["lens"] and len(words) > 1:
        words = words[:-1]
    return " ".join(words)


def decoder_color(name: str) -> str:
    """The colour of a decoder: ``"logit"``, ``"logit_lens"``, ``"logit lens"`` and
    ``"Logit lens"`` are one decoder; so are ``"tuned"``/``"tuned_lens"``."""
    key = _decoder_key(name)
    return DECODER.get(key) or _spare(key)


def register_decoder_color(name: str, color: str | None = None) -> str:
    """Give decoder ``name`` a colour and return it: ``color`` when given, the one it has,
    else the first of :data:`DECODER_FALLBACK` no decoder uses (cycling when all are used,
    by the number of decoders): the same registrations give the same colours."""
    key = _decoder_key(name)
    if color is None:
        if key in DECODER:
            return DECODER[key]
        used = set(DECODER.values())
        free = [c for c in DECODER_FALLBACK if c not in used]
        color = free[0] if free else DECODER_FALLBACK[len(DECODER) % len(DECODER_FALLBACK)]
    DECODER[key] = color
    return color


def condition_color(name: str) -> str:
    """The colour of a condition or arm; ``"random_3"`` or ``"random task"`` (a random
    control, however numbered) is ``"random"``; ``"2-shot"`` is ``"k_shot"``."""
    key = name.lower().replace("-", "_").replace(" ", "_")
    if key in CONDITION:
        return CONDITION[key]
    if key.startswith("random"):
        return CONDITION["random"]
    if key.endswith("_shot") and key[:-5].isdigit():
        return CONDITION["zero_shot" if key[:-5] == "0" else "k_shot"]
    return _spare(key)


def track_color(track: str) -> str:
    """The colour of a lens track: ``"answer"`` (the prompt-language answer), a language code
    (the answer in that language), ``"entropy"`` or ``"energy"``."""
    return TRACK.get(track) or language_color(track)


def site_color(site: str) -> str:
    """The colour of a patching site (``"mlp_out"``, ``"attn_out"``, ...)."""
    return SITE.get(site) or _spare(site)


def effect_color(name: str) -> str:
    """The colour of an effect line (``"knockout"``)."""
    return EFFECT.get(name) or _spare(name)


def verdict_color(verdict: str) -> str:
    """The colour of a claim's verdict (``"holds"``, ``"does not hold"``, ...)."""
    key = verdict.lower().replace(" ", "_").replace("-", "_")
    return VERDICT.get(key) or _spare(key)


def series_color(name: str) -> str:
    """The colour of a series that may be a class, a condition, a decoder or a language: the
    first of those maps that knows the name decides (their names do not overlap; a test says
    so), else a colour from the name."""
    key = name.replace(" ", "_")
    if key in CLASS:
        return CLASS[key]
    cond = name.lower().replace("-", "_").replace(" ", "_")
    if cond in CONDITION or cond.startswith("random") or cond.endswith("_shot"):
        return condition_color(name)
    if _decoder_key(name) in DECODER:
        return decoder_color(name)
    return language_color(name) if name.lower().split("-")[0] in LANGUAGE else _spare(name)
