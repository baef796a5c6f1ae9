"""Higgs Audio v2's LM, step by step, as transformers' ``HiggsAudioV2ForConditionalGeneration.generate``
does it (read there: ``generation_higgs_audio_v2.py`` ``_sample`` and
``HiggsAudioV2DelayPatternLogitsProcessor``), over the transformers modules:

- **prompt**: the chat template's text, each audio placeholder expanded as ``HiggsAudioV2Processor`` does
  (``<|AUDIO_OUT|>`` per delayed frame, the last N-1 as the delay token); audio positions take the sum of
  the frame's codebook embeddings and the dual-FFN layers' audio path.
- **each step**: one frame of N codes from the audio head (N codebooks x (codes + stream BOS/EOS)) under the
  delay pattern: codebook k is forced to stream BOS for the first k+1 steps; once some codebook ends
  (stream EOS), codebook k is forced to EOS k steps later; a frame of all EOS ends the speech. Optional
  repetition-aware sampling (RAS) redraws a code repeated too often in the last frames. The next input is
  the frame's summed embeddings (audio path only).

The emitted frames are the un-delayed ones (``HiggsAudioV2Processor.revert_delay_pattern``): frame j takes
codebook k from generated row j + k, so frame j leaves as soon as row j + N - 1 exists, clipped to the
codec's codes as the processor clips them before decoding.

Batching: the LM runs all requests' rows as one right-padded batch (``stages.ar.kv``), the joining requests'
prompts too; the delay pattern's masks and greedy draws run over the batch, a sampled draw per row with the
request's own generator, in transformers' order (the warped draw, then RAS's redraws).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from omnistage.stages.ar.kv import RequestKV, StepCache
from omnistage.stages.ar.params import TokenSampling


@dataclass
class HiggsRow:
    """One request's state (touched only by the step thread while a step runs)."""

    kv: RequestKV
    sampling: TokenSampling
    generator: torch.Generator | None
    ras_win_len: int = 0
    ras_win_max_num_repeat: int = 0
    logits: torch.Tensor | None = None  # [N, C] float32: the audio head's output for the next frame
    bos_delay: torch.Tensor | None = None  # [N] the delay pattern processor's counters
    eos_delay: torch.Tensor | None = None
    last_text: int = -1  # the text id of the last position (audio, delay or the prompt's last token)
    history: list[torch.Tensor] = field(default_factory=list)  # recent frames (prompt audio first), RAS's window
    delayed: list[torch.Tensor] = field(default_factory=list)  # generated rows after the BOS row, last N kept
    rows: int = 0  # steps taken


class HiggsModel:
    def __init__(self, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import AutoTokenizer, HiggsAudioV2ForConditionalGeneration

        folder = Path(folder)
        # sdpa: the engine passes boolean 4-D masks (padded batches of per-request caches)
        self.model = HiggsAudioV2ForConditionalGeneration.from_pretrained(
            str(folder), dtype=dtype, attn_implementation="sdpa"
        )
        self.model = self.model.to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        template = folder / "chat_template.jinja"
        self.chat_template = template.read_text() if template.is_file() else self.tokenizer.chat_template
        self.device, self.dtype = device, dtype
        cfg = self.model.config
        self.num_codebooks = cfg.num_codebooks
        self.codebook_size = cfg.codebook_size  # codes + stream BOS + stream EOS
        self.stream_bos, self.stream_eos = cfg.audio_stream_bos_id, cfg.audio_stream_eos_id
        self.audio_token = cfg.audio_token_id
        self.delay_token = cfg.audio_delay_token_id
        self.audio_bos_token = cfg.audio_bos_token_id
        self.num_layers = cfg.num_hidden_layers
        self.max_positions = cfg.max_position_embeddings
        self.audio_token_text = self.tokenizer.convert_ids_to_tokens(self.audio_token)
        self.delay_token_text = self.tokenizer.convert_ids_to_tokens(self.delay_token)
        from omnistage.models.shared.higgs_tokenizer.encoder import HiggsAudioEncoder

        self.encoder = HiggsAudioEncoder(folder / "audio_tokenizer", device, dtype)  # reference clips -> codes

    # ------------------------------------------------------------------ prompt

    def delayed_clip(self, codes: torch.Tensor) -> torch.Tensor:
        """A clip's codes [N, T] -> the frames the prompt carries [T + N + 1, N]: stream BOS, the codes,
        stream EOS, in the delay pattern (``HiggsAudioV2Processor.build_delay_pattern``)."""
        n, t = codes.shape
        full = torch.cat([codes.new_full((n, 1), self.stream_bos), codes, codes.new_full((n, 1), self.stream_eos)], 1)
        out = full.new_empty(n, t + 2 + n - 1)
        for k in range(n):
            out[k, :k] = self.stream_bos
            out[k, k : k + t + 2] = full[k]
            out[k, k + t + 2 :] = self.stream_eos
        return out.T

    def prompt(self, messages: list[dict], clips: list[torch.Tensor]) -> tuple[list[int], torch.Tensor | None]:
        """Token ids and the prompt's audio frames [F, N] (None without clips) of a conversation whose audio
        items are ``clips`` (codes [N, T] each, in the order they appear)."""
        text = self.tokenizer.apply_chat_template(
            messages, chat_template=self.chat_template, tokenize=False, add_generation_prompt=True
        )
        frames = [self.delayed_clip(c) for c in clips]
        sizes = iter(f.shape[0] for f in frames)
        n = self.num_codebooks

        def expand(_: re.Match) -> str:
            count = next(sizes)
            return self.audio_token_text * (count - (n - 1)) + self.delay_token_text * (n - 1)

        if text.count(self.audio_token_text) != len(frames):
            raise ValueError(f"the chat template placed {text.count(self.audio_token_text)} clips, not {len(frames)}")
        text = re.sub(re.escape(self.audio_token_text), expand, text)
        ids = self.tokenizer(text)["input_ids"]
        return ids, torch.cat(frames) if frames else None

    # ------------------------------------------------------------------ steps

    def _forward(self, rows: list[HiggsRow], lengths: list[int], **inputs) -> None:
        """One LM forward (row i continues its own cache with ``lengths[i]`` new positions); each row's
        next audio logits."""
        cache = StepCache([r.kv for r in rows], lengths)
        t = torch.arange(cache.new_tokens, device=self.device)
        out = self.model.model(
            position_ids=torch.stack([s + t for s in cache.starts]),
            attention_mask=cache.mask(self.device),
            past_key_values=cache,
            use_cache=True,
            **inputs,
        )
        cache.commit()
        last = out.last_hidden_state[torch.arange(len(rows)), torch.tensor(lengths) - 1]
        logits = self.model.audio_lm_head(last).float().view(len(rows), self.num_codebooks, self.codebook_size)
        for i, row in enumerate(rows):
            row.logits = logits[i]

    @torch.no_grad()
    def prefill(self, rows: list[HiggsRow], prompts: list[tuple[list[int], torch.Tensor | None]]) -> None:
        """The prompts' forward, one right-padded batch: row i's prompt is ``prompts[i]`` (token ids, the
        prompt's audio frames [F, N] or None)."""
        n = self.num_codebooks
        lengths = [len(ids) for ids, _ in prompts]
        # padding (a row's own first id: text, never an audio placeholder) is neither cached nor attended
        ids = torch.tensor([p + p[:1] * (max(lengths) - len(p)) for p, _ in prompts])
        inputs: dict = {"input_ids": ids.to(self.device)}
        clips = [a for _, a in prompts]
        if any(a is not None for a in clips):  # audio frames right-padded; the mask marks each row's own
            width = max(a.shape[0] for a in clips if a is not None)
            audio = torch.zeros(len(rows), width, n, dtype=torch.long)
            mask = torch.zeros(len(rows), width, dtype=torch.bool)
            for i, a in enumerate(clips):
                if a is not None:
                    audio[i, : a.shape[0]], mask[i, : a.shape[0]] = a, True
            inputs["audio_input_ids"], inputs["audio_input_ids_mask"] = audio.to(self.device), mask.to(self.device)
        self._forward(rows, lengths, **inputs)
        pattern = torch.arange(1, n + 1)
        for row, (p, a) in zip(rows, prompts):
            if a is not None and row.ras_win_len:
                row.history = list(a[-row.ras_win_len :])
            # the delay pattern processor's counters, from the prompt's last N ids as it reads them
            tail = torch.tensor(p[-n:])
            at = (tail == self.audio_bos_token).nonzero()
            row.bos_delay = pattern - (n - int(at[0])) if len(at) else torch.zeros(n, dtype=torch.long)
            at = (tail == self.delay_token).nonzero()
            row.eos_delay = pattern - (n - int(at[0])) if len(at) else pattern.clone()
            row.last_text = p[-1]

    def choose(self, rows: list[HiggsRow]) -> tuple[torch.Tensor, list[bool]]:
        """Each row's next delayed frame (the delay pattern's masks, the request's sampling, RAS) as [B, N], and
        whether it is all stream EOS (the speech ended); records the text id the step appends. The masks and
        greedy draws run as one batch (row by row they are the same numbers); a sampling row draws alone from
        its own generator."""
        scores = torch.stack([r.logits for r in rows])  # [B, N, C]
        bos = torch.stack([r.bos_delay for r in rows])
        eos = torch.stack([r.eos_delay for r in rows])
        eos -= torch.tensor([r.last_text == self.delay_token for r in rows]).unsqueeze(1).long()
        codes = torch.arange(self.codebook_size)
        forced = bos >= 0
        scores[forced[..., None] & (codes != self.stream_bos)] = float("-inf")
        scores[(eos <= 0)[..., None] & (codes != self.stream_eos)] = float("-inf")
        bos -= forced.long()
        greedy = scores.argmax(-1)
        frames: list[torch.Tensor] = []
        for i, row in enumerate(rows):
            row.bos_delay, row.eos_delay = bos[i], eos[i]
            frame = greedy[i] if row.sampling.temperature == 0 else _sample(scores[i], row.sampling, row.generator)
            if row.ras_win_len and row.ras_win_max_num_repeat and row.history:
                window = torch.stack(row.history[-row.ras_win_len :])
                repeated = (window == frame) & (window != self.stream_bos) & (window != self.stream_eos)
                redraw = repeated.sum(0) >= row.ras_win_max_num_repeat
                if redraw.any():
                    probs = row.logits[redraw].softmax(-1)
                    frame = frame.clone()
                    frame[redraw] = torch.multinomial(probs, 1, replacement=True, generator=row.generator).view(-1)
            if row.ras_win_len:
                row.history = [*row.history[-(row.ras_win_len - 1) :], frame] if row.ras_win_len > 1 else [frame]
            row.rows += 1
            frames.append(frame)
        stacked = torch.stack(frames)
        eos_codes = stacked == self.stream_eos
        for row, ends in zip(rows, eos_codes.any(-1).tolist()):
            row.last_text = self.delay_token if ends or row.last_text == self.delay_token else self.audio_token
        return stacked, eos_codes.all(-1).tolist()

    def undelayed(self, row: HiggsRow, frame: torch.Tensor) -> torch.Tensor | None:
        """Record a generated row; the codec frame [N] it completes (None while it completes none)."""
        if row.rows == 1:  # the all-BOS row opens the stream: no codes
            return None
        row.delayed = [*row.delayed[-(self.num_codebooks - 1) :], frame]
        if len(row.delayed) < self.num_codebooks:
            return None
        out = torch.stack(row.delayed).diagonal()  # codebook k from the k-th of the last N rows
        return out.clamp(0, self.stream_bos - 1)  # as the processor clips before decoding

    @torch.no_grad()
    def advance(self, rows: list[HiggsRow], frames: torch.Tensor) -> None:
        """Feed each row's frame [B, N] (the audio path) and compute its next logits."""
        self._forward(rows, [1] * len(rows), audio_input_ids=frames.unsqueeze(1).to(self.device))


def _sample(scores: torch.Tensor, s: TokenSampling, generator: torch.Generator | None) -> torch.Tensor:
    """One code per codebook from ``scores`` [N, C], transformers' warpers per codebook row."""
    if s.temperature == 0:
        return scores.argmax(-1)
    scores = scores / s.temperature
    if 0 < s.top_k < scores.shape[-1]:
        kth = torch.topk(scores, s.top_k).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if s.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False)
        drop = ordered.softmax(-1).cumsum(-1) <= (1 - s.top_p)
        drop[..., -1] = False
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(scores.softmax(-1), 1, generator=generator).view(-1)
