"""Higgs Audio's voice cloning parts against the reference (goldens: transformers' ``HiggsAudioV2TokenizerModel``
and ``HiggsAudioV2Processor``, see conftest): the resampling to the semantic model's rate, the clip's codes, the
prompt (token ids and delayed audio frames) of a cloning conversation."""

from __future__ import annotations

import numpy as np
import torch

from omnistage.models.higgs_audio.engine import request_messages
from omnistage.models.higgs_audio.model import HiggsModel
from omnistage.models.shared.higgs_tokenizer.encoder import HiggsAudioEncoder, resample
from omnistage.speech import SpeechInput
from tests.models.higgs_audio.conftest import golden

torch.set_num_threads(1)


def test_resampling_equals_torchaudios():
    ref = golden("clone")
    got = resample(torch.from_numpy(ref["clip"]), 24000, 16000)
    assert torch.equal(got, torch.from_numpy(ref["clip_16k"]))  # the same filter, computed the same way


def test_clip_codes_equal_the_reference_encode(higgs_dir):
    ref = golden("clone")
    codes = HiggsAudioEncoder(higgs_dir / "audio_tokenizer").encode(ref["clip"])
    assert torch.equal(codes, torch.from_numpy(ref["clip_codes"]))


def test_cloning_prompt_equals_the_processors(higgs_dir):
    ref = golden("clone")
    messages, clips = request_messages(
        str(ref["text"]), SpeechInput(ref_audio=(ref["clip"], 24000), ref_text=str(ref["ref_text"])), 24000
    )
    assert len(clips) == 1 and np.array_equal(clips[0], ref["clip"])  # already at the codec's rate: untouched
    model = HiggsModel(higgs_dir)
    ids, audio = model.prompt(messages, [model.encoder.encode(clips[0])])
    assert ids == ref["prompt_ids"].tolist()
    assert torch.equal(audio, torch.from_numpy(ref["prompt_audio"]))
