"""Tiny Sesame CSM folder (``CsmForConditionalGeneration``): backbone, depth decoder, Mimi codec,
and the processor (tokenizer + Mimi's feature extractor + CSM's chat template).

    python -m omnistage.testing.tiny csm DIR

The real transformers classes with random (seeded) float32 weights and a locally trained
byte-level BPE tokenizer holding the release's special tokens (``<|begin_of_text|>``,
``<|end_of_text|>``, ``<|AUDIO|>``, ``<|audio_eos|>``). Structure follows the release where it
matters to the pipeline: Mimi at 24 kHz, 12.5 frames/s (1920 samples per frame, the strides
``CsmProcessor`` assumes when it counts a clip's frames), the chat template of the release
(``[speaker]text`` turns, each earlier turn followed by its audio), a generation config that
samples both the backbone and the depth decoder. Smaller where it costs nothing structural:
8 codebooks of 64 codes (the release: 32 of 2051), 2-layer backbone and depth decoder, head
size 32 (the release uses 64).
"""

from __future__ import annotations

import string
from pathlib import Path

from omnistage.models.shared.tiny import mimi
from omnistage.models.shared.tiny.sizes import decoder

NUM_CODEBOOKS = 8
CODEBOOK_SIZE = 64
HEAD_DIM = 32
HIDDEN = 2 * HEAD_DIM
SAMPLE_RATE = 24000
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>"]

# The release's chat template, condensed: turns are "<bos>[speaker]text<eos>", every turn but the last
# carries exactly one audio (its frames follow as <|AUDIO|><|audio_eos|>, expanded by the processor).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if not message['role'] is string or not message['role'].isdigit() %}"
    "{{- raise_exception(\"The role must be an integer or a stringified integer (e.g. '0') designating the speaker id\") }}"
    "{%- endif %}"
    "{%- set types = message['content'] | map(attribute='type') | list %}"
    "{%- if loop.last %}"
    "{%- if 'text' not in types %}{{- raise_exception(\"The last message must include one item of type 'text'\") }}"
    "{%- elif (types | select('equalto', 'text') | list | length > 1) or (types | select('equalto', 'audio') | list | length > 1) %}"
    "{{- raise_exception(\"At most two items are allowed in the last message: one 'text' and one 'audio'\") }}{%- endif %}"
    "{%- elif types | select('equalto', 'text') | list | length != 1 or types | select('equalto', 'audio') | list | length != 1 %}"
    "{{- raise_exception(\"Each message (except the last) must contain exactly one 'text' and one 'audio' item\") }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{{- bos_token }}{{- '[' + message['role'] + ']' }}{{- message['content'][0]['text'] }}{{- eos_token }}"
    "{%- if message['content'] | length > 1 %}{{- '<|AUDIO|><|audio_eos|>' }}{%- endif %}"
    "{%- endfor %}"
)
_CORPUS = [
    "[0]hello world, this is a tiny conversational speech model speaking.",
    "[1]the quick brown fox jumps over the lazy dog",
    "[0]good morning, how are you today? i am fine, thank you.",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]


def build_processor(outdir: Path):
    from transformers import CsmProcessor, EncodecFeatureExtractor, Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(_CORPUS * 20, vocab_size=300, new_special_tokens=SPECIAL)
    tok.bos_token, tok.eos_token, tok.pad_token = "<|begin_of_text|>", "<|end_of_text|>", "<|end_of_text|>"
    fe = EncodecFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE, padding_value=0.0)
    processor = CsmProcessor(feature_extractor=fe, tokenizer=tok, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(outdir)
    return processor


def build(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from transformers import CsmConfig, CsmForConditionalGeneration, GenerationConfig

    outdir = Path(outdir)
    processor = build_processor(outdir)
    tok = processor.tokenizer
    codec = mimi.config(SAMPLE_RATE, [8, 6, 5, 4], CODEBOOK_SIZE, NUM_CODEBOOKS, frame_rate=12.5)
    depth = dict(
        decoder(CODEBOOK_SIZE, HIDDEN, head_dim=HEAD_DIM, max_positions=NUM_CODEBOOKS + 1),
        num_codebooks=NUM_CODEBOOKS,
        backbone_hidden_size=HIDDEN,
        initializer_range=0.3,
    )
    config = CsmConfig(
        **decoder(CODEBOOK_SIZE, HIDDEN, head_dim=HEAD_DIM, max_positions=2048),
        num_codebooks=NUM_CODEBOOKS,
        text_vocab_size=len(tok),
        initializer_range=0.3,  # peaked logits: greedy is no tie
        pad_token_id=tok.convert_tokens_to_ids("<|AUDIO|>"),
        codebook_pad_token_id=CODEBOOK_SIZE - 1,
        codebook_eos_token_id=0,
        bos_token_id=tok.bos_token_id,
        audio_token_id=tok.convert_tokens_to_ids("<|AUDIO|>"),
        audio_eos_token_id=tok.convert_tokens_to_ids("<|audio_eos|>"),
        depth_decoder_config=depth,
        codec_config=codec.to_dict(),
        architectures=["CsmForConditionalGeneration"],
    )
    torch.manual_seed(seed)
    model = CsmForConditionalGeneration(config).to(torch.float32).eval()
    mimi.spread_codebooks(model.codec_model)
    with torch.no_grad():  # random weights peak near 5; keep the waveform inside [-1, 1] (16-bit PCM clips)
        last = model.codec_model.decoder.layers[-1].conv
        last.weight.mul_(0.1)
        last.bias.mul_(0.1)
    # The release samples both models (temperature 0.9, top-k 50); the depth decoder's settings travel
    # as depth_decoder_* keys of the model's generation config.
    model.generation_config = GenerationConfig(do_sample=True, temperature=0.9, top_k=50, max_new_tokens=125)
    model.depth_decoder.generation_config = GenerationConfig(do_sample=True, temperature=0.9, top_k=50)
    model.save_pretrained(outdir)
