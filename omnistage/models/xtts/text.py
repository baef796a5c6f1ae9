"""XTTS v2's text front end, as the release's (coqui-tts 0.28.0) ``Xtts.inference`` and ``VoiceBpeTokenizer``
prepare a sentence: stripped and lower-cased; then, for every language but Japanese, quotes dropped, numbers,
currencies and ordinals spelt out (num2words, per language; Chinese by ``zh_numbers``), abbreviations and the
symbols ``& @ % # $ £ °`` read as words (``text_tables``) and whitespace collapsed; Chinese then romanised to
numbered-tone pinyin (pypinyin) and Korean to Latin letters (ko-speech-tools' ``hangul_romanize``); Japanese is only
romanised (cutlet, Hepburn). ``[lang]`` + that text, each space as ``[SPACE]``, through the checkpoint's
``vocab.json`` (a ``tokenizers`` BPE).

Text the release cannot spell (num2words has no ordinals in Czech nor numbers in Hindi; a number too long to
name) is a 400 naming ``input``: the release raises on it.
"""

from __future__ import annotations

import contextlib
import re
from functools import cache

from num2words import num2words

from omnistage.errors import InvalidRequestError
from omnistage.models.xtts import zh_numbers
from omnistage.models.xtts.text_tables import ABBREVIATIONS, CURRENCY_AND, ORDINAL, SYMBOLS

CLEANED = {"ar", "cs", "de", "en", "es", "fr", "hi", "hu", "it", "nl", "pl", "pt", "ru", "tr", "zh", "ko"}
_COMMA_THOUSANDS = re.compile(r"\b\d{1,3}(,\d{3})*(\.\d+)?\b")  # 1,000.5 (English, Russian)
_DOT_THOUSANDS = re.compile(r"\b\d{1,3}(.\d{3})*(\,\d+)?\b")  # 1.000,5; the release's unescaped dot kept
# In the release's order: pounds, dollars, euros; "$1,5" or "1,5$". The release's amount-before-symbol pattern
# ([0-9.,]*[0-9]+\$) backtracks cubically over a long run of digits; this one matches the same text (the whole
# run before the symbol, when it ends in a digit) in linear time per start.
_CURRENCIES = tuple(
    (code, re.compile(rf"{re.escape(sign)}[0-9.,]*[0-9]+|[0-9.,]++(?<=[0-9]){re.escape(sign)}"))
    for code, sign in (("GBP", "£"), ("USD", "$"), ("EUR", "€"))
)
_DECIMAL = re.compile(r"([0-9]++[.,][0-9]+)")  # the release's [0-9]+, taken whole (a [.,] follows)
_NUMBER = re.compile(r"[0-9]+")
_ABBREVIATIONS = {
    lang: [
        (re.compile(rf"\b{re.escape(short)}" + ("\\b" if lang == "ru" else "\\."), re.IGNORECASE), word)
        for short, word in pairs
    ]
    for lang, pairs in ABBREVIATIONS.items()
}


def _currency(match: re.Match, lang: str, currency: str) -> str:
    amount = float(re.sub(r"[^\d.]", "", match.group(0).replace(",", ".")))
    words = num2words(amount, to="currency", currency=currency, lang=lang)
    if amount.is_integer():  # no cents: drop num2words' "zero cents"
        cut = words.rfind(CURRENCY_AND.get(lang, ", "))
        words = words if cut == -1 else words[:cut]
    return words


def spell_numbers(text: str, lang: str) -> str:
    """``text`` (lower case) with its numbers, prices and ordinals in words of ``lang``."""
    if lang == "zh":
        return zh_numbers.normalize(text)
    if lang in ("en", "ru"):
        text = _COMMA_THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
    else:
        text = _DOT_THOUSANDS.sub(lambda m: m.group(0).replace(".", ""), text)
    with contextlib.suppress(Exception):  # the release leaves a price num2words cannot name as it was
        for currency, pattern in _CURRENCIES:
            text = pattern.sub(lambda m, c=currency: _currency(m, lang, c), text)
    if lang != "tr":
        text = _DECIMAL.sub(lambda m: num2words(float(m.group(1).replace(",", ".")), lang=lang), text)
    text = ORDINAL[lang].sub(lambda m: num2words(int(m.group(1)), ordinal=True, lang=lang), text)
    return _NUMBER.sub(lambda m: num2words(int(m.group(0)), lang=lang), text)


def _words(text: str, lang: str) -> str:
    """The release's ``multilingual_cleaners``."""
    text = text.replace('"', "")
    if lang == "tr":
        text = text.replace("İ", "i").replace("Ö", "ö").replace("Ü", "ü")
    text = spell_numbers(text.lower(), lang)
    for pattern, word in _ABBREVIATIONS.get(lang, ()):
        text = pattern.sub(word, text)
    for symbol, word in SYMBOLS[lang]:
        text = text.replace(symbol, f" {word} ").replace("  ", " ")
    return re.sub(r"\s+", " ", text.strip()).strip()


@cache
def _katsu():
    import cutlet  # loads a MeCab dictionary: only for Japanese

    return cutlet.Cutlet()


def _romanised(text: str, lang: str) -> str:
    if lang == "zh":
        import pypinyin

        syllables = pypinyin.pinyin(text, style=pypinyin.Style.TONE3, heteronym=False, neutral_tone_with_five=True)
        return "".join(s[0] for s in syllables)
    if lang == "ko":
        from ko_speech_tools import hangul_romanize

        return hangul_romanize(text)
    return text


def clean(text: str, language: str) -> str:
    """The text the release tokenizes for ``text`` in ``language`` (a release language code)."""
    lang = language.split("-")[0]
    text = text.strip().lower()
    if lang == "ja":
        return _katsu().romaji(text).lower()
    if lang not in CLEANED:
        raise InvalidRequestError("language", f"{language!r} has no text front end in XTTS v2")
    try:
        return _romanised(_words(text, lang), lang)
    except Exception as e:  # num2words raising on a number (too long, no such form) is the release refusing it
        raise InvalidRequestError("input", f"XTTS cannot spell this text out in {language!r}: {e!r}") from e


def token_ids(tokenizer, text: str, language: str) -> list[int]:
    """``tokenizer`` (``tokenizers.Tokenizer`` of ``vocab.json``) ids of ``text`` in ``language``."""
    tag = "zh-cn" if language.split("-")[0] == "zh" else language.split("-")[0]
    return tokenizer.encode(f"[{tag}]{clean(text, language)}".replace(" ", "[SPACE]")).ids
