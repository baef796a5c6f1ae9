"""VoxCPM2's prompt, as the release's ``_generate_with_prompt_cache`` builds it: per position a text token
and a latent patch [P, D], with a text mask and an audio mask saying which of the two is the input there.

- plain: the text's tokens, then ``audio_start``;
- a cloned voice from a clip alone (the release's reference mode): ``ref_start``, one position per patch of
  the clip (right-padded to whole patches), ``ref_end``, then the text as above;
- a clip and its transcript (continuation): the transcript and text as one string, ``audio_start``, then one
  position per patch of the clip (left-padded), so the speech goes on from the clip. The last three of those
  patches are the decoder's left context (decoded in front of the speech, never emitted).

Text is tokenised by the checkpoint's Llama tokenizer with multi-character Chinese tokens split into single
characters, as the release does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

AUDIO_START, REF_START, REF_END = 101, 103, 104
CONTEXT_PATCHES = 3  # the release's streaming_prefix_len (4) - 1


@dataclass
class Built:
    tokens: torch.Tensor  # [L] int64
    feats: torch.Tensor  # [L, P, D]
    text_mask: torch.Tensor  # [L]
    audio_mask: torch.Tensor  # [L]
    context: torch.Tensor | None  # latent frames decoded before the speech [D, frames], or None
    target_tokens: int  # tokens of the text to speak (the release caps the steps at 6 per token + 10)


class Prompt:
    def __init__(self, folder: Path, vae, patch: int):
        from transformers import LlamaTokenizerFast

        self.tok = LlamaTokenizerFast.from_pretrained(str(folder))
        self.multichar = {t for t in self.tok.get_vocab() if len(t) >= 2 and all("\u4e00" <= c <= "\u9fff" for c in t)}
        self.vae, self.patch = vae, patch

    def ids(self, text: str) -> list[int]:
        out: list[str] = []
        for token in self.tok.tokenize(text):
            clean = token.replace("\u2581", "")
            out.extend(list(clean) if clean in self.multichar else [token])
        return self.tok.convert_tokens_to_ids(out)

    @torch.no_grad()
    def encode_clip(self, audio: np.ndarray, pad_left: bool) -> torch.Tensor:
        """mono float32 at the VAE's input rate -> patches [T, P, D]."""
        x = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))[None]
        step = self.patch * self.vae.chunk_size
        if x.shape[1] % step:
            n = step - x.shape[1] % step
            x = torch.nn.functional.pad(x, (n, 0) if pad_left else (0, n))
        feat = self.vae.encode(x.to(next(self.vae.parameters()).device)).cpu()
        return feat.view(self.vae.latent_dim, -1, self.patch).permute(1, 2, 0)

    def build(self, text: str, clip: np.ndarray | None, clip_text: str | None) -> Built:
        d = self.vae.latent_dim
        target = len(self.ids(text))
        if clip is not None and clip_text is not None:  # continuation
            ids = self.ids(clip_text + text) + [AUDIO_START]
            audio = self.encode_clip(clip, pad_left=True)
            n, a = len(ids), audio.shape[0]
            ctx = audio[-min(CONTEXT_PATCHES, a) :]
            return Built(
                torch.tensor(ids + [0] * a),
                torch.cat([torch.zeros(n, self.patch, d), audio]),
                torch.tensor([1] * n + [0] * a),
                torch.tensor([0] * n + [1] * a),
                ctx.reshape(-1, d).T.contiguous(),
                target,
            )
        ids = self.ids(text) + [AUDIO_START]
        n = len(ids)
        tokens, feats = torch.tensor(ids), torch.zeros(n, self.patch, d)
        tmask, amask = torch.ones(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
        if clip is not None:  # reference: [ref_start, clip patches, ref_end] in front
            audio = self.encode_clip(clip, pad_left=False)
            a, z = audio.shape[0], torch.zeros(1, self.patch, d)
            tokens = torch.cat([torch.tensor([REF_START] + [0] * a + [REF_END]), tokens])
            feats = torch.cat([z, audio, z, feats])
            tmask = torch.cat([torch.tensor([1] + [0] * a + [1]), tmask])
            amask = torch.cat([torch.tensor([0] + [1] * a + [0]), amask])
        return Built(tokens, feats, tmask, amask, None, target)
