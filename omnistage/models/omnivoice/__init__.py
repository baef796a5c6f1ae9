"""``omnivoice``: k2-fsa's OmniVoice — a masked-diffusion language model over 8 codebooks of the Higgs Audio
v2 tokenizer, which fills the whole utterance's codes in a fixed number of unmasking steps (no frame-by-frame
generation), then decodes them to 24 kHz speech.

Declares no pipeline yet: the step-batched code generator (``model.py``) is here and equal to the reference
package; the decoder stage, the text-length-to-duration estimate and the reference clip's encoder are what
serving still needs (docs/families/omnivoice.md).
"""

PIPELINES: list = []
TINY: dict = {}
