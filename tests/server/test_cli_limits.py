"""`omnistage serve` reliability flags map onto ServeOptions, with the documented defaults."""

from __future__ import annotations

import argparse

from omnistage.cli import serve, serve_config
from omnistage.server import ServeOptions


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_defaults_are_the_documented_ones():
    o = serve_config.serve_options(parse())
    assert (o.max_image_pixels, o.max_num_frames, o.max_inference_steps, o.max_tokens) == (4096 * 4096, 512, 200, None)
    assert (o.max_media_bytes, o.max_download_bytes, o.media_fetch_timeout_s) == (20 << 20, 20 << 20, 10.0)
    assert o.allowed_media_domains is None and o.request_timeout_s is None
    assert o.media_limits().allowed_media_domains is None


def test_flags_reach_the_options_and_the_limits():
    o = serve_config.serve_options(
        parse(
            "--max-image-pixels",
            "4096",
            "--max-num-frames",
            "9",
            "--max-inference-steps",
            "8",
            "--max-tokens",
            "64",
            "--request-timeout",
            "2.5",
            "--max-download-mb",
            "0.5",
            "--media-fetch-timeout",
            "3",
            "--allowed-media-domains",
            "Example.com",
            "cdn.test",
        )
    )
    assert isinstance(o, ServeOptions)
    limits = o.request_limits()
    assert (limits.max_image_pixels, limits.max_num_frames, limits.max_inference_steps, limits.max_tokens) == (
        4096,
        9,
        8,
        64,
    )
    media = o.media_limits()
    assert media.allowed_media_domains == frozenset({"example.com", "cdn.test"})  # host names compare lower-case
    assert (media.max_download_bytes, media.fetch_timeout_s, media.max_image_pixels, media.max_video_frames) == (
        1 << 19,
        3.0,
        4096,
        9,
    )
    assert o.request_timeout_s == 2.5


def test_duplex_flags_map_onto_serve_options():
    default = serve_config.serve_options(parse())
    assert (default.duplex_resume_grace_s, default.duplex_frame_budget_ms) == (30.0, 80.0)
    o = serve_config.serve_options(parse("--duplex-resume-grace", "2.5", "--duplex-frame-budget-ms", "40"))
    assert (o.duplex_resume_grace_s, o.duplex_frame_budget_ms) == (2.5, 40.0)
