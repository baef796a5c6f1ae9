"""The synchronous Omni API over a real (tiny, torch-module) pipeline."""

import pytest
import torch

from omnistage import InvalidRequestError, Omni
from omnistage.testing import pipelines as tp

from .test_orchestrator import reference_chain


def test_omni_list_in_list_out_and_context_manager():
    with Omni(pipeline=tp.chain()) as omni:
        assert len(omni.default_sampling_params_list) == 3
        outs = omni.generate(["a", "bb", "ccc"], use_tqdm=False)
        assert [o.finished for o in outs] == [True] * 3
        for p, o in zip(["a", "bb", "ccc"], outs):
            torch.testing.assert_close(o.latents, reference_chain(p), rtol=0, atol=1e-5)
        one = omni.generate("a", use_tqdm=False)
        assert len(one) == 1 and torch.equal(one[0].latents, omni.generate(["a"], use_tqdm=False)[0].latents)
        with pytest.raises(InvalidRequestError, match="prompt"):
            omni.generate([{"bogus": 1}])


def test_omni_merges_final_stages_and_reports_failures():
    with Omni(pipeline=tp.fan_out()) as omni:
        out, bad = omni.generate(["hello", "boom"], use_tqdm=False)
        assert out.text is not None and out.latents is not None
        assert set(out.metrics) == {0, 1, 2}
        assert bad.error and "boom" in bad.error
        only_text = omni.generate("hello", output_modalities=["text"], use_tqdm=False)[0]
        assert only_text.text == out.text and only_text.latents is None
