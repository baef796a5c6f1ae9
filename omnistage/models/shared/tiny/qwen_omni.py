"""What the two Qwen-Omni tiny fixtures (Qwen3-Omni, Qwen2.5-Omni) share: the ChatML template cut to media
placeholders, the tokenizer trained on one small corpus, and the processor files as the releases lay them out.
Each family passes its own token names, processor class and image statistics."""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS = [
    "<|im_start|>system\nyou are a helpful assistant.<|im_end|>\n",
    "<|im_start|>user\nhello, who are you?<|im_end|>\n<|im_start|>assistant\ni am a voice assistant.<|im_end|>\n",
    "the quick brown fox jumps over the lazy dog",
    "describe the picture and the sound: a red cat sits on a blue chair in the sun",
    "user assistant system user assistant system",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]

# ChatML's and the audio placeholders, first in Qwen3-Omni's and Qwen3-ASR's special tokens (in this order: the ids)
QWEN3_AUDIO_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
]
QWEN3_AUDIO = {"downsample_hidden_size": 8, "conv_chunksize": 500}  # Qwen3's audio encoder (AuT) beyond Whisper's


@dataclass(frozen=True)
class MediaTokens:
    """A release's media token names: the placeholders the processor expands and the bos / eos around them."""

    image: str
    audio: str
    video: str
    vision_bos: str
    vision_eos: str
    audio_bos: str
    audio_eos: str

    def named(self) -> dict[str, str]:
        """The tokenizer attributes the processor reads (``image_token``, ``audio_bos_token``, ...)."""
        return {
            "image_token": self.image,
            "audio_token": self.audio,
            "video_token": self.video,
            "vision_bos_token": self.vision_bos,
            "vision_eos_token": self.vision_eos,
            "audio_bos_token": self.audio_bos,
            "audio_eos_token": self.audio_eos,
        }

    def chat_template(self) -> str:
        """The release's template, cut to what a tiny model needs: ChatML turns and the media placeholders the
        processor expands; no default system prompt."""
        image = f"{self.vision_bos}{self.image}{self.vision_eos}"
        audio = f"{self.audio_bos}{self.audio}{self.audio_eos}"
        video = f"{self.vision_bos}{self.video}{self.vision_eos}"
        return (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
            "{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for c in m['content'] %}"
            f"{{% if c['type'] == 'image' or 'image' in c or 'image_url' in c %}}{image}"
            f"{{% elif c['type'] == 'audio' or 'audio' in c or 'audio_url' in c %}}{audio}"
            f"{{% elif c['type'] == 'video' or 'video' in c %}}{video}"
            "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
            "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        )


def audio_encoder(mel: int, width: int, out: int, window: int, init: float, **extra) -> dict:
    """The Whisper-style audio encoder of the Qwen-Omni thinkers and Qwen3-ASR (one layer of two heads), ``width``
    wide, projecting to ``out``; ``extra``: the release's own fields (Qwen3's chunked convolution, ...)."""
    fixed = {"encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "max_source_positions": 1500}
    return dict(
        num_mel_bins=mel, d_model=width, output_dim=out, n_window=window, initializer_range=init, **fixed, **extra
    )


def train_tokenizer(special_tokens: Sequence[str], template: str, vocab_size: int = 400):
    """A Qwen2 BPE tokenizer whose role names (``system``/``user``/``assistant``) are single tokens, as in the
    releases: the talker finds the user turns by the token after ``<|im_start|>``."""
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(
        CORPUS * 40, vocab_size=vocab_size, new_special_tokens=list(special_tokens)
    )
    for role in ("system", "user", "assistant"):
        ids = tok.encode(role, add_special_tokens=False)
        if len(ids) != 1:
            raise RuntimeError(f"tiny tokenizer: role {role!r} is not one token ({ids})")
    tok.chat_template = template
    tok.eos_token = "<|im_end|>"  # as the release's tokenizer: the turn ends the reply
    tok.pad_token = "<|endoftext|>"
    return tok


def save_tokenizer(outdir: Path, tok, named_tokens: Mapping[str, str]) -> None:
    from transformers import AutoTokenizer

    tok.save_pretrained(outdir)
    # the processor reads these names off the tokenizer (image_token, audio_bos_token, ...), as in the release
    AutoTokenizer.from_pretrained(str(outdir), extra_special_tokens=dict(named_tokens)).save_pretrained(outdir)


def processor_files(
    outdir: Path,
    template: str,
    processor_class: str,
    vision: Mapping[str, Any],
    audio: Mapping[str, Any],
    video_only: Mapping[str, Any] | None = None,
) -> None:
    """``preprocessor_config.json`` (the Whisper feature extractor + the Qwen2-VL image processor), the video
    processor's file and ``chat_template.json``. ``vision``: patch, merge and pixel bounds and image statistics,
    shared by images and video; ``audio``: the feature extractor's fields beyond the common ones."""
    preprocessor = {
        "processor_class": processor_class,
        "feature_extractor_type": "WhisperFeatureExtractor",
        **audio,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
        "dither": 0.0,
        "image_processor_type": "Qwen2VLImageProcessor",
        **vision,
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
    }
    video = {
        "video_processor_type": "Qwen2VLVideoProcessor",
        "processor_class": processor_class,
        **{k: v for k, v in vision.items() if k not in ("image_mean", "image_std")},
        **(video_only or {}),
        "image_mean": vision["image_mean"],
        "image_std": vision["image_std"],
    }
    (outdir / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    (outdir / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    (outdir / "chat_template.json").write_text(json.dumps({"chat_template": template}, indent=2) + "\n")
