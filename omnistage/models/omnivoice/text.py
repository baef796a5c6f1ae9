"""What OmniVoice reads from a request's text fields: the language as the id its prompt takes, the voice
design instructions in its vocabulary, and how many frames the speech should last when the request does not
say (a weight per character by script, scaled by a reference pace).
"""

from __future__ import annotations

import bisect
import re
import unicodedata

from omnistage.errors import InvalidRequestError

_HAN = re.compile(r"[\u4e00-\u9fff]")

# -- language -----------------------------------------------------------------------------------------------


def language_id(value: str | None) -> str | None:
    """``en`` / ``English`` -> ``en`` (ISO 639-1 where there is one, else 639-3: ``yue``); None: any."""
    if value is None or not value.strip() or value.strip().lower() == "none":
        return None
    v = value.strip()
    if re.fullmatch(r"[a-z]{2,3}", v):
        return v  # an id, as the model's prompt takes it
    import pycountry

    lang = pycountry.languages.get(name=v)
    if lang is None:
        raise InvalidRequestError("language", f"{value!r} is not a language id (en, zh, yue, ...) or English name")
    return getattr(lang, "alpha_2", None) or lang.alpha_3


# -- voice design ---------------------------------------------------------------------------------------------

# The release's voice design vocabulary: each category takes one item; English and Chinese items of a
# category are the same attribute (the prompt uses the text's language).
_PAIRED = [
    {"male": "男", "female": "女"},
    {"child": "儿童", "teenager": "少年", "young adult": "青年", "middle-aged": "中年", "elderly": "老年"},
    {
        "very low pitch": "极低音调",
        "low pitch": "低音调",
        "moderate pitch": "中音调",
        "high pitch": "高音调",
        "very high pitch": "极高音调",
    },
    {"whisper": "耳语"},
]
_ACCENTS = {
    f"{a} accent"
    for a in ("american", "british", "australian", "chinese", "canadian", "indian", "korean", "portuguese")
} | {"russian accent", "japanese accent"}
_DIALECTS = {
    f"{d}话" for d in ("河南", "陕西", "四川", "贵州", "云南", "桂林", "济南", "石家庄", "甘肃", "宁夏", "青岛", "东北")
}
_TO_ZH = {en: zh for cat in _PAIRED for en, zh in cat.items()}
_TO_EN = {zh: en for en, zh in _TO_ZH.items()}
_CATEGORIES = [set(c) | set(c.values()) for c in _PAIRED] + [_ACCENTS, _DIALECTS]
_VALID = set(_TO_ZH) | set(_TO_EN) | _ACCENTS | _DIALECTS


def voice_design(instructions: str | None, text: str) -> str | None:
    """Comma-separated items (``female, low pitch`` / ``女，低音调``) -> the prompt's normalised string, in
    Chinese when the text is Chinese or a dialect is asked for, else in English; a 400 naming
    ``instructions`` for an item outside the vocabulary or two of one category."""
    if instructions is None or not instructions.strip():
        return None
    items = [x.strip().lower() for x in re.split(r"\s*[,，]\s*", instructions.strip()) if x.strip()]
    unknown = [x for x in items if x not in _VALID]
    if unknown:
        raise InvalidRequestError(
            "instructions",
            f"{', '.join(map(repr, unknown))} not in OmniVoice's voice design vocabulary "
            f"({', '.join(sorted(i for i in _VALID if not _HAN.search(i)))}; or the Chinese items)",
        )
    dialect, accent = any(x in _DIALECTS for x in items), any(x in _ACCENTS for x in items)
    if dialect and accent:
        raise InvalidRequestError("instructions", "a Chinese dialect and an English accent cannot be mixed")
    zh = dialect or (not accent and bool(_HAN.search(text)))
    items = [(_TO_ZH if zh else _TO_EN).get(x, x) for x in items]
    for cat in _CATEGORIES:
        hits = [x for x in items if x in cat]
        if len(hits) > 1:
            raise InvalidRequestError("instructions", f"at most one of a kind: {' vs '.join(hits)}")
    return ("，" if any(_HAN.search(x) for x in items) else ", ").join(items)


# -- length ---------------------------------------------------------------------------------------------------

# Speaking time of a character relative to a Latin letter, by Unicode block (last code point of each run).
_BLOCKS = [
    (0x02AF, 1.0),  # Latin
    (0x058F, 1.0),  # Greek, Cyrillic, Armenian
    (0x08FF, 1.5),  # Hebrew, Arabic, Syriac
    (0x0DFF, 1.8),  # Indic scripts
    (0x0EFF, 1.5),  # Thai, Lao
    (0x0FFF, 1.8),  # Tibetan
    (0x109F, 1.8),  # Myanmar
    (0x10FF, 1.0),  # Georgian
    (0x11FF, 2.5),  # Hangul Jamo
    (0x139F, 3.0),  # Ethiopic
    (0x177F, 1.0),
    (0x17FF, 1.8),  # Khmer
    (0x18FF, 1.0),  # Mongolian, Canadian syllabics
    (0x1C7F, 1.8),  # Limbu .. Ol Chiki (Southeast Asian and Indic)
    (0x1CBF, 1.0),  # Cyrillic Extended-C, Georgian Extended
    (0x1CFF, 1.8),  # Sundanese Supplement, Vedic
    (0x1EFF, 1.0),  # phonetic extensions, Latin Extended Additional
    (0x30FF, 2.2),  # (Greek Extended .. CJK punctuation, as the release counts them) Hiragana, Katakana
    (0x312F, 3.0),  # Bopomofo
    (0x318F, 2.5),  # Hangul Compatibility Jamo
    (0x9FFF, 3.0),  # CJK
    (0xA4CF, 3.0),  # Yi
    (0xA7FF, 1.0),  # Lisu, Vai, Cyrillic Extended-B, Bamum, Latin Extended-D
    (0xA82F, 1.8),  # Syloti Nagri
    (0xA87F, 1.0),  # Phags-pa
    (0xA95F, 1.8),  # Saurashtra .. Rejang
    (0xA97F, 2.5),  # Hangul Jamo Extended-A
    (0xAAFF, 1.8),  # Javanese .. Meetei Mayek Extensions
    (0xAB2F, 3.0),  # Ethiopic Extended-A
    (0xABBF, 1.0),  # Latin Extended-E, Cherokee Supplement
    (0xABFF, 1.8),  # Meetei Mayek
    (0xD7AF, 2.5),  # Hangul Syllables
    (0xFAFF, 3.0),  # CJK Compatibility
    (0xFDFF, 1.5),  # Arabic Presentation Forms-A
    (0xFE6F, 1.0),
    (0xFEFF, 1.5),  # Arabic Presentation Forms-B
    (0xFFEF, 1.0),  # fullwidth Latin
]
_ENDS = [e for e, _ in _BLOCKS]


def char_weight(c: str) -> float:
    code = ord(c)
    if c.isascii() and c.isalpha():
        return 1.0
    if code == 32:
        return 0.2
    if code == 0x0640:  # Arabic tatweel: silent
        return 0.0
    cat = unicodedata.category(c)
    if cat[0] == "M":  # marks modify a letter: silent
        return 0.0
    if cat[0] in "PS":
        return 0.5
    if cat[0] == "Z":
        return 0.2
    if cat[0] == "N":
        return 3.5
    i = bisect.bisect_left(_ENDS, code)
    if i < len(_BLOCKS):
        return _BLOCKS[i][1]
    return 3.0 if code > 0x20000 else 1.0  # CJK extensions


def text_weight(text: str) -> float:
    return sum(char_weight(c) for c in text)


# pace when no reference clip gives one: this text in this many frames
PACE_TEXT, PACE_FRAMES = "Nice to meet you.", 25
SHORT_FRAMES, SHORT_BOOST = 50, 3.0  # estimates under 2 s are stretched on a cube-root curve


def estimate_frames(text: str, speed: float = 1.0, ref_text: str | None = None, ref_frames: int | None = None) -> int:
    """Frames for ``text``: its weight at the reference clip's pace (else the built-in one), short estimates
    stretched, divided by ``speed``."""
    if not ref_text or not ref_frames:
        ref_text, ref_frames = PACE_TEXT, PACE_FRAMES
    ref_weight = text_weight(ref_text)
    if ref_weight == 0:
        return 1
    est = text_weight(text) / (ref_weight / ref_frames)  # (this order of operations: the reference's rounding)
    if est < SHORT_FRAMES:
        est = SHORT_FRAMES * (est / SHORT_FRAMES) ** (1.0 / SHORT_BOOST)
    if speed > 0 and speed != 1.0:
        est = est / speed
    return max(1, int(est))
