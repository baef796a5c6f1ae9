"""The built-in demo: a tiny SD3-style text-to-image model trained on coloured shapes.

Its weights ship in ``weights/`` (written by ``demo/train_shapes.py``), so
``omnistage serve`` / ``omnistage generate`` with no model work offline in seconds.
The folder is a plain diffusers StableDiffusion3Pipeline (without T5), served by the sd3 family's adapter.
"""

from pathlib import Path

from omnistage.info import PipelineInfo
from omnistage.models.demo.adapter import DemoAdapter
from omnistage.models.demo.vocabulary import EXAMPLE_PROMPTS, FILLER_WORDS, VOCABULARY
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

WEIGHTS = Path(__file__).resolve().parent / "weights"

# The model was trained with exactly 16 zero "T5" tokens after its CLIP tokens (it has no T5
# encoder); MMDiT has no text mask, so another count would shift its attention.
DEFAULT_PARAMS = {
    "height": 64,
    "width": 64,
    "num_inference_steps": 20,
    "guidance_scale": 3.0,
    "max_sequence_length": 16,
}

PIPELINE = Pipeline(
    name="demo",
    description="built-in demo: 64x64 coloured shapes (SD3-style MMDiT trained by demo/train_shapes.py); "
    "it draws " + "; ".join(f"{kind}: {', '.join(words)}" for kind, words in VOCABULARY.items()),
    # The weights folder names this pipeline in its omnistage.json; no other folder matches.
    matches=None,
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=DemoAdapter,
            output="image",
            can_output="image,latent",
            final=True,
            default_params=dict(DEFAULT_PARAMS),
        )
    ],
    # vocabulary / filler_words: every word it was trained on (the server warns about others, and about a
    # background named with a shape colour);
    # example_prompts: the playground offers them
    info=PipelineInfo(
        default_model=str(WEIGHTS),
        served_model_name="omnistage-demo",
        vocabulary=VOCABULARY,
        filler_words=FILLER_WORDS,
        example_prompts=EXAMPLE_PROMPTS,
        # trained on 64x64 pictures only: at 128x128 and up (or 32x32) it draws shapeless colour, so other sizes
        # earn a warning (the playground still offers them: the model card lists what the weights allow)
        trained_sizes=(f"{DEFAULT_PARAMS['width']}x{DEFAULT_PARAMS['height']}",),
    ),
    deploy_file=DEPLOY,
)
PIPELINES = [PIPELINE]
TINY: dict = {}  # the demo ships trained weights instead

__all__ = ["PIPELINE", "PIPELINES", "TINY", "WEIGHTS", "DEFAULT_PARAMS"]
