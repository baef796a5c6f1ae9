"""Compare omnistage's XTTS text front end with coqui-tts 0.28.0's ``VoiceBpeTokenizer.preprocess_text`` on
randomly generated strings of numbers, prices, ordinal suffixes, symbols and abbreviations (seeded), in 15
languages. A check to run after changing ``omnistage/models/xtts/text*.py`` or ``zh_numbers.py``; the tests
compare the committed table (``text_goldens.py``).

    PYTHONPATH=. /work/ref-venvs/xtts/bin/python scripts/reference/xtts/compare_text.py [N_PER_LANGUAGE=120]

Exits 1 on any difference (a refusal must be a refusal on both sides).
"""

from __future__ import annotations

import random
import sys

PIECES = {  # language -> what goes between the generated numbers
    "zh": "元 块 角 个 年 月 日 号 % / - 名 人 万 千 的 是 ， 。 _ P B 二 $ £ ° x".split(),
    "en": "$ £ € % st nd th , . / _ & @ # ° mr. dr. a -".split(),
    "de": "€ $ % . , _ und dr. st º".split(),
    "fr": "€ $ % er e ème , _ .".split(),
    "es": "€ $ º er os a , _ .".split(),
    "ru": "€ $ % -й -го , _ .".split(),
    "tr": "€ $ % . inci , _".split(),
    "hu": "€ $ . adik , _".split(),
    "ko": "번째 % $ , _ .".split(),
    "it": "€ ° o i , _ .".split(),
    "pt": "€ $ º os , _ .".split(),
    "pl": "€ $ º st , _ .".split(),
    "nl": "€ $ de ste , _ .".split(),
    "ar": "€ $ % , _ .".split(),
    "cs": "€ $ % , _ .".split(),
}


def number(rnd: random.Random) -> str:
    digits = "".join(rnd.choice("0123456789") for _ in range(rnd.choice([1, 1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 17])))
    if rnd.random() < 0.3:
        digits += rnd.choice(".,") + "".join(rnd.choice("0123456789") for _ in range(rnd.choice([1, 2, 3])))
    return digits


def main(per_language: int) -> int:
    from TTS.tts.layers.xtts.tokenizer import VoiceBpeTokenizer

    from omnistage.errors import InvalidRequestError
    from omnistage.models.xtts.text import clean

    release, rnd, differ, n = VoiceBpeTokenizer(), random.Random(0), 0, 0
    for lang, pieces in PIECES.items():
        for _ in range(per_language * (3 if lang in ("zh", "en") else 1)):
            parts = [number(rnd) if rnd.random() < 0.4 else rnd.choice(pieces) for _ in range(rnd.randint(1, 8))]
            text = "".join(parts).replace("_", " ")
            try:
                want = release.preprocess_text(text.strip().lower(), lang)
            except Exception:  # noqa: BLE001  any raise is the release refusing the text
                want = None
            try:
                got = clean(text, "zh-cn" if lang == "zh" else lang)
            except InvalidRequestError:
                got = None
            n += 1
            if got != want:
                differ += 1
                print(f"{lang} {text!r}\n  omnistage {got!r}\n  release   {want!r}")
    print(f"{differ} of {n} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 120))
