"""``glm_image``: GLM-Image as two stages (diffusers ``GlmImagePipeline`` folders).

Stage 0 (llm, ``token_ids``): the autoregressive model draws the image as VQ
token ids. Stage 1 (diffusion, ``image``): GlmImageTransformer2DModel + VAE,
conditioned on those ids through ``edges.ar_tokens_to_prior``. The target
size reaches stage 0 through the request (the prompt's ``image_size``,
(height, width), or stage 0's params), see ``edges.requested_size``.
"""

from pathlib import Path

from omnistage.models.glm_image.adapter import GlmImageAdapter
from omnistage.models.glm_image.edges import ar_tokens_to_prior, size_for_ar_stage
from omnistage.models.glm_image.tiny import build
from omnistage.pipeline import Edge, Pipeline, StageSpec, lazy

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment


PIPELINE = Pipeline(
    name="glm_image",
    description="GLM-Image: AR model draws image tokens (vLLM) -> DiT + VAE decode them",
    matches=lambda f: f.diffusers_class == "GlmImagePipeline",
    stages=[
        StageSpec(
            0,
            kind="llm",
            name="ar",
            output="token_ids",
            can_output="token_ids",
            engine=lazy("omnistage.models.glm_image.ar_engine:GlmImageAREngine"),
            model_subfolder="vision_language_encoder",
            default_params={"temperature": 0.0},
        ),
        StageSpec(
            1,
            kind="diffusion",
            name="dit",
            adapter=GlmImageAdapter,
            output="image",
            can_output="image,latent",
            final=True,
            default_params={"num_inference_steps": 50, "guidance_scale": 1.5},
            inputs=[Edge(0, process=ar_tokens_to_prior)],
        ),
    ],
    shape_request=size_for_ar_stage,
    deploy_file=DEPLOY,
)

PIPELINES = [PIPELINE]
TINY = {"glm_image": build}

__all__ = ["GlmImageAdapter", "PIPELINE", "PIPELINES", "TINY", "ar_tokens_to_prior"]
