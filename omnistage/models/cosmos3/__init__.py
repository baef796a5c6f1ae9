"""Cosmos3: one diffusion stage (``Cosmos3OmniPipeline``: a joint text + vision + sound + action MoT transformer, the
Wan VAE, the AVAE sound tokenizer) making images, videos (with sound) and a world model's robot actions."""

from pathlib import Path

from omnistage.info import PipelineInfo
from omnistage.models.cosmos3.adapter import DEFAULT_FPS, Cosmos3Adapter
from omnistage.models.cosmos3.tiny import build
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

PIPELINE = Pipeline(
    name="cosmos3",
    description="Cosmos3 omni: token ids -> Cosmos3OmniTransformer (UniPC per modality) -> Wan VAE [+ AVAE sound]",
    matches=lambda f: f.diffusers_class == "Cosmos3OmniPipeline",
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=Cosmos3Adapter,
            # an image (one frame) or a video, with its sound when the request asks enable_sound and the actions
            # of a policy / inverse-dynamics request
            output="image+video+audio+action",
            can_output="image,video,audio,action,latent",
            final=True,
            # Cosmos3OmniPipeline.__call__'s defaults; num_frames (189) the adapter fills, as it is 1 for an image
            default_params={"num_inference_steps": 35, "guidance_scale": 6.0, "fps": DEFAULT_FPS},
        )
    ],
    # the family's own request parameters (docs/families/cosmos3.md): the soundtrack, and the action tasks
    extra_body_params={
        "enable_sound": bool,
        "task": str,  # policy | forward_dynamics | inverse_dynamics
        "action_domain": str,  # the embodiment (diffusers' table: av, bridge_orig_lerobot, ...)
        "action_chunk_size": int,  # action steps; the video has one frame more
        "actions": list[list[float]],  # forward_dynamics: [steps][the domain's width]
        "resolution_tier": int,  # 256 | 480 | 704 | 720 (the conditioning canvas)
        "view_point": str,  # ego_view | third_person_view | wrist_view | concat_view
    },
    # its input image is a video's first frame (one frame from an image is refused): no image edits; an input
    # video is continued (video-to-video) or read for its actions (inverse_dynamics)
    info=PipelineInfo(image_edits=False, video_input=True),
    deploy_file=DEPLOY,
)
PIPELINES = [PIPELINE]
TINY = {"cosmos3": build}
