"""``omnistage generate [MODEL] --prompt ... --output out.png``: offline one-shot image (speech, video) generation.

Runs the model's pipeline through ``omnistage.Omni`` (whose progress bar shows
denoising steps). With no MODEL the built-in demo pipeline is used.

``--audio FILE`` on a speech recogniser (Whisper, or an omni model: any pipeline with ``info.transcription``)
prints the transcript instead: the file decoded and cut into the model's windows as
``/v1/audio/transcriptions`` does, ``--prompt`` the previous text, ``--language`` / ``--task`` as there.

A world model's actions (Cosmos3's policy / inverse dynamics) go beside the MP4 as ``<output stem>.actions.json``,
the JSON ``/v1/videos`` answers (``actions``, ``action_domain``, ``action_fps``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from omnistage.params import DiffusionSamplingParams


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate images, speech or video offline (one request, no server)",
        description=__doc__.splitlines()[0].replace("``", ""),
    )
    p.add_argument("model", nargs="?", default=None, help="local model folder (default: the demo pipeline)")
    p.add_argument("--prompt", default=None, help="the prompt (with --audio: the previous text, optional)")
    p.add_argument("--audio", default=None, help="an audio file to transcribe (speech recognisers)")
    p.add_argument("--language", default=None, help="with --audio: the spoken language (ISO 639-1)")
    p.add_argument("--task", default="transcribe", choices=("transcribe", "translate"), help="with --audio")
    p.add_argument("--max-tokens", type=int, default=None, help="with --audio: per window")
    p.add_argument("--negative-prompt", default=None)
    p.add_argument(
        "--image",
        action="append",
        default=None,
        help="input image for img2img / edit (repeat for several, e.g. Qwen-Image-Edit-2509)",
    )
    p.add_argument("--video", default=None, help="input video for video-to-video / inverse dynamics (Cosmos3)")
    p.add_argument("--strength", type=float, default=None, help="img2img strength in (0, 1]")
    p.add_argument("--num-inference-steps", type=int, default=None)
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--guidance-scale", type=float, default=None)
    p.add_argument("--true-cfg-scale", type=float, default=None, help="true CFG (with --negative-prompt)")
    p.add_argument("--num-frames", type=int, default=None, help="video frames (video pipelines)")
    p.add_argument("-n", "--num-outputs", type=int, default=None, help="images per prompt")
    p.add_argument("--duration", type=float, default=None, help="seconds of audio (text-to-audio pipelines)")
    p.add_argument("--extra-body", default=None, help="JSON: sampling fields or model-specific extra_args")
    p.add_argument("--deploy-config", default=None)
    p.add_argument(
        "--output",
        default="output.png",
        help="image path (several images get -1, -2, ... suffixes); speech -> .wav, video -> .mp4 "
        "(and a world model's actions -> .actions.json beside it)",
    )


def build_params(args: argparse.Namespace) -> dict[str, Any]:
    """CLI flags (+ --extra-body) -> a partial DiffusionSamplingParams dict; raises ValueError naming the flag."""
    params: dict[str, Any] = {}
    if args.extra_body:
        try:
            extra = json.loads(args.extra_body)
        except json.JSONDecodeError as e:
            raise ValueError(f"--extra-body: not valid JSON ({e})") from None
        if not isinstance(extra, dict):
            raise ValueError("--extra-body: expected a JSON object")
        fields = set(DiffusionSamplingParams.model_fields) - {"extra_args", "generator"}
        params.update({k: v for k, v in extra.items() if k in fields})
        model_args = {k: v for k, v in extra.items() if k not in fields}
        if model_args:
            params["extra_args"] = model_args
    flags = {
        "negative_prompt": args.negative_prompt,
        "strength": args.strength,
        "num_inference_steps": args.num_inference_steps,
        "height": args.height,
        "width": args.width,
        "seed": args.seed,
        "guidance_scale": args.guidance_scale,
        "true_cfg_scale": args.true_cfg_scale,
        "num_outputs_per_prompt": args.num_outputs,
        "num_frames": args.num_frames,
    }
    params.update({k: v for k, v in flags.items() if v is not None})
    if args.duration is not None:  # the text-to-audio families' own parameter
        params["extra_args"] = {**params.get("extra_args", {}), "duration": args.duration}
    return params


def output_paths(output: str, n: int) -> list[Path]:
    path = Path(output)
    if n == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{i + 1}{path.suffix}") for i in range(n)]


def run(args: argparse.Namespace) -> int:
    from PIL import Image

    from omnistage import Omni
    from omnistage.drawable import prompt_warnings

    if args.audio is not None:
        return transcribe(args)
    if args.prompt is None:
        print("error: --prompt is required (or --audio FILE for a speech recogniser)", file=sys.stderr)
        return 2
    try:
        params = build_params(args)
        prompt: dict[str, Any] = {"prompt": args.prompt}
        media: dict[str, Any] = {}
        if args.image:
            images = [Image.open(path).convert("RGB") for path in args.image]
            media["image"] = images[0] if len(images) == 1 else images
        if args.video:
            media["video"] = _read_video(args.video)
        if media:
            prompt["multi_modal_data"] = media
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with Omni(model=args.model, deploy_config=args.deploy_config) as omni:
        stages = omni.pipeline.stages
        # the flags are diffusion knobs: they go to the (first) diffusion stage, other stages keep defaults
        target = next((s.stage_id for s in stages if s.kind == "diffusion"), stages[-1].stage_id)
        params_list = [params if s.stage_id == target else None for s in stages]
        try:
            (out,) = omni.generate([prompt], params_list)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        name = omni.pipeline.info.served_model_name or Path(omni.engine.model or omni.pipeline.name).name
        info = omni.pipeline.info
    if out.images:  # what the model cannot draw (words, a size), as the server's X-Omnistage-Warning says it
        for warning in prompt_warnings(info, name, args.prompt, out.images[0].size):
            print(f"warning: {warning}", file=sys.stderr)
    if out.error:
        print(f"error: {out.error}", file=sys.stderr)
        return 1
    if not out.images and (out.audio is not None or out.video is not None):  # speech / video pipelines
        return _write_media(out, Path(args.output))
    if not out.images:
        print(f"error: the pipeline returned no image (got {', '.join(out.modalities) or 'nothing'})", file=sys.stderr)
        return 1
    for image, path in zip(out.images, output_paths(args.output, len(out.images))):
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
        print(path)
    if out.text:
        print(out.text)
    return 0


def _write_media(out: Any, path: Path) -> int:
    """A speech pipeline's WAV or a video pipeline's MP4 (with its soundtrack, for a video+audio pipeline such as
    LTX-2); an image suffix on --output is swapped."""
    image_suffix = path.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp")
    path.parent.mkdir(parents=True, exist_ok=True)
    if out.video is not None:
        from omnistage.server.media import encode_mp4

        path = path.with_suffix(".mp4") if image_suffix else path
        path.write_bytes(encode_mp4(out.video, out.fps or 16, out.audio, out.sample_rate))
        if out.actions is not None:  # a world model's actions: beside the video, as /v1/videos answers them
            from omnistage.server.result import action_fields

            print(path)
            path = path.with_suffix(".actions.json")
            path.write_text(json.dumps(action_fields(out.actions, out.action_domain, out.action_fps)))
    else:
        import soundfile

        path = path.with_suffix(".wav") if image_suffix else path
        soundfile.write(str(path), out.audio.T if out.audio.ndim == 2 else out.audio, out.sample_rate)
    print(path)
    return 0


def _read_video(file: str) -> Any:
    """uint8 [T, H, W, 3] frames, decoded by PyAV as the server decodes an uploaded video (its default limits)."""
    from omnistage.server.errors import APIError
    from omnistage.server.media import MediaLimits, video_from_bytes

    try:
        return video_from_bytes(Path(file).read_bytes(), "--video", MediaLimits())
    except APIError as e:
        raise ValueError(e.message) from None


def transcribe(args: argparse.Namespace) -> int:
    """``--audio``: the transcript of the file, its windows joined as the transcription route joins them."""
    from omnistage import AsyncOmni, Omni, Transcription
    from omnistage.media.audio import decode_audio
    from omnistage.server.errors import APIError
    from omnistage.server.recognition import (
        DEFAULT_MAX_AUDIO_S,
        NO_SPACE_LANGUAGES,
        language_of,
        language_probe,
        windows,
    )
    from omnistage.server.transcripts import LanguagePrefix

    # the pipeline and the file are checked before any engine starts (AsyncOmni resolves without starting)
    pipeline = AsyncOmni(model=args.model, deploy_config=args.deploy_config).pipeline
    info = pipeline.info.transcription
    if info is None:
        print(f"error: --audio: pipeline {pipeline.name!r} does not recognise speech", file=sys.stderr)
        return 2
    rate = info.sample_rate
    known = list(info.languages)
    if args.language and args.language.lower() not in known:
        print(f"error: --language: {args.language!r} is not a language this model knows", file=sys.stderr)
        return 2
    # no --language: a model that can tell it (Whisper) detects it, one that names it in its text (Qwen3-ASR)
    # is left to, and one that hears it (Voxtral) gets a prompt naming none, as the transcription route does
    ids = None if args.language else info.language_token_ids
    prefix = None if args.language else info.language_prefix
    unforced = not args.language and bool(prefix or info.unforced_language)
    language = (args.language or info.default_language or (known[0] if known else "en")).lower()
    try:
        samples = decode_audio(Path(args.audio).read_bytes(), "--audio", rate, DEFAULT_MAX_AUDIO_S)
    except OSError as e:
        print(f"error: --audio: {e}", file=sys.stderr)
        return 2
    except APIError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    pieces = windows(samples, rate, float(info.window_s))
    with Omni(model=args.model, deploy_config=args.deploy_config) as omni:
        if ids:
            prompt, probe = language_probe(pieces[0][1], rate, ids)
            out = omni.generate(
                [prompt],
                [probe if s.kind == "llm" else None for s in omni.pipeline.stages],
                output_modalities=["text", "token_ids"],
                use_tqdm=False,
            )[0]
            try:
                language = language_of(out.token_ids or [], ids)
            except APIError as e:
                print(f"error: {e.message}", file=sys.stderr)
                return 1
        prompts = [
            {
                "prompt": args.prompt or "",
                "multi_modal_data": {"audio": (piece, rate)},
                "transcription": Transcription(language=None if unforced else language, task=args.task),
            }
            for _, piece in pieces
        ]
        llm = {"max_tokens": args.max_tokens} if args.max_tokens else {}
        params = [llm if s.knobs == "llm" else None for s in omni.pipeline.stages]
        try:
            outs = omni.generate(prompts, params, output_modalities=["text"], use_tqdm=False)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    failed = next((o.error for o in outs if o.error), None)
    if failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    texts = [LanguagePrefix(**prefix).feed(o.text or "", finished=True) if prefix else o.text or "" for o in outs]
    print(("" if language in NO_SPACE_LANGUAGES else " ").join(texts))
    return 0
