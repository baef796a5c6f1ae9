"""Write the text front end's goldens: coqui-tts 0.28.0's own ``VoiceBpeTokenizer`` on a table of sentences
per language (numbers, prices, ordinals, abbreviations, symbols, Chinese/Japanese/Korean script).

    python text_goldens.py TINY_DIR GOLDEN_DIR      (in the reference venv: setup.sh runs it)

For each sentence, as ``Xtts.inference`` prepares it (stripped, lower-cased, then ``encode``): the text
``preprocess_text`` makes and the ids ``encode`` gives with the tiny folder's ``vocab.json``; or, where the
release raises, the exception's type. Writes GOLDEN_DIR/text_frontend.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SENTENCES = {  # language (the release's code) -> what users type
    "en": [
        "It costs $5.50 on 3/4, 20% off.",
        "Mr. Smith paid £1,200 for the 2nd car & 3 bikes at 10:30.",
        "Dr. Jones lives at 221B Baker St. in 1999, it was -5° outside.",
        'She said "Hi" to 1,000,000 people @ #42, then 12.5 more, and €20.15 was left.',
        "The 21st of July; 100$ or 7€ each.",
        "A number too long to name: 1" + "0" * 400 + ".",
    ],
    "es": [
        "Cuesta $5.50 el 3/4, con 20% de descuento.",
        "La Dra. García llegó el 1º de mayo con 1.500 euros.",
        "Eso le costará 20,15€ señor, 3er piso.",
    ],
    "fr": [
        "Ça coûte 5,50€ le 1er mai, 20% de remise.",
        "Mme. Dupont a 1.250 livres & 3 chats.",
        "Il y avait 12,5 degrés, 2e étage.",
    ],
    "de": [
        "Es kostet 5,50€ am 3. Mai, 20% Rabatt.",
        "Frau Dr. Müller hat 1.000 Bücher & 2 Katzen.",
        "Das macht $20 Herr, Fr. Weber.",
    ],
    "pt": [
        "Custa R$ 5,50 no dia 1º, 20% de desconto.",
        "O Sr. Silva tem 1.200 livros & 3 gatos.",
        "Isso custará 20,15€ senhor.",
    ],
    "it": ["Costa 5,50€ il 3° giorno, 20% di sconto.", "Il Sig. Rossi ha 1.500 libri & 2 gatti."],
    "pl": ["To kosztuje 5,50€, 20% taniej, 3 dni.", "Dr. Nowak ma 1.000 książek."],
    "tr": ["Bu 5,50€, %20 indirim, 3. gün.", "İstanbul'da 1.000 kişi var, Dr. Öz geldi.", "12,5 saniye içinde."],
    "ru": ["Это стоит $5.50, скидка 20%, 3 дня.", "Д-р Смирнов купил 1,000 книг.", "Это будет 20.15€ сэр."],
    "nl": ["Het kost 5,50€, 20% korting, 3 dagen.", "Dhr. Jansen heeft 1.000 boeken & 2 katten."],
    "cs": ["Stojí to 5,50€, sleva 20%, 3 dny.", "Dr. Novák má 1.000 knih.", "Je to 1. den."],
    "ar": ["يكلف 5,50 دولار، خصم 20%، 3 أيام.", "كان هناك 50 جنديًا."],
    "zh-cn": [
        "这个东西价格是5.50元，打八折，有20%的折扣。",
        "2023年5月1日我们有50名士兵，电话13812345678。",
        "他在1999年出生，P2P网络，3/4的人，温度是36.6°。",
        "我有2000本书和12个苹果，价格是$100和£5。",
        "他花了3.5万元，还剩12块5角；0.5%的人打010-12345678，做B2B业务，第15天来了10个人。",
    ],
    "hu": ["Ez 5,50€, 20% kedvezmény, 3 nap.", "Dr. Szabó 1.000 könyvet vett, az 1. helyen.", "1" + "0" * 80],
    "ko": ["이것은 5.50달러, 20% 할인, 3 번째 날입니다.", "안녕하세요, 저는 1000 명을 만났어요."],
    "ja": ["今日は良い天気ですね。", "これは5.50ドルで、20%オフです。", "東京に3日間いました!"],
    "hi": ["यह 5.50 डॉलर है, 20% छूट।", "नमस्ते, आप कैसे हैं?"],
}


def main(tiny: Path, out: Path) -> None:
    from TTS.tts.layers.xtts.tokenizer import VoiceBpeTokenizer

    tokenizer = VoiceBpeTokenizer(vocab_file=str(tiny / "vocab.json"))
    rows = []
    for language, sentences in SENTENCES.items():
        lang = language.split("-")[0]
        for text in sentences:
            sent = text.strip().lower()  # what Xtts.inference hands encode
            row = {"language": language, "text": text}
            try:
                row |= {"cleaned": tokenizer.preprocess_text(sent, lang), "ids": tokenizer.encode(sent, language)}
            except Exception as e:  # noqa: BLE001  the release refusing this text is the golden
                row["refused"] = type(e).__name__
            rows.append(row)
            print(row)
    (out / "text_frontend.json").write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
