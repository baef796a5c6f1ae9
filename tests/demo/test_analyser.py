"""The accuracy judge must itself be right: on the training renderer's exact pictures it
must recover every colour and position, and it must reject pictures with no shape."""

import numpy as np

from tests.demo.analyser import PALETTE, analyse


def test_palette_matches_training_colours(shapes):
    assert PALETTE == shapes.COLOURS


def test_analyser_recovers_rendered_scenes(shapes):
    rng = np.random.default_rng(123)
    for _ in range(150):
        scene = shapes.random_scene(rng)
        got = analyse(shapes.render(scene))
        assert (got["colour"], got["position"]) == (scene.colour, scene.position), scene


def test_analyser_rejects_empty_and_wrong_pictures(shapes):
    flat = np.full((64, 64, 3), 128, np.uint8)
    assert analyse(flat)["colour"] is None
    scene = shapes.Scene("red", "circle", "left", "large", "black", 0, 0, 12, (0, 0, 0))
    got = analyse(shapes.render(scene))
    assert got["colour"] == "red" and got["position"] == "left"
    flipped = analyse(shapes.render(scene)[:, ::-1])
    assert flipped["position"] == "right"
