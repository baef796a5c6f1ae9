"""A robot policy over OpenPI's policy WebSocket, driven by the published ``openpi-client`` package itself.

``WebsocketClientPolicy.infer`` against ``omnistage serve`` of the tiny Cosmos3 folder returns the action chunk that
offline ``Omni`` makes for the same observation and settings (exactly: the same engine code, the same seed);
several clients at once each get their own; a malformed observation is the client's server error naming the key,
and the same connection then answers the next observation; the API key is enforced.

``openpi-client`` is installed by ``make install`` without its dependencies (it pins numpy < 2 for its own
stack; its client modules need only msgpack, numpy and websockets, which the project has).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from omnistage import AsyncOmni, Omni

pytestmark = pytest.mark.slow

SETTINGS = {"action_domain": "av", "action_chunk_size": 4, "resolution_tier": 256, "num_inference_steps": 3}
KEY = "robot-key"


def frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (32, 48, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def folder(tiny_model):
    return str(tiny_model("cosmos3"))


@pytest.fixture(scope="module")
def url(folder, server_factory):
    srv = server_factory(AsyncOmni(folder), api_key=KEY)
    query = "&".join(f"{k}={v}" for k, v in SETTINGS.items())
    return srv.url.replace("http://", "ws://") + "/v1/realtime/robot/openpi?" + query


@pytest.fixture(scope="module")
def offline(folder):
    with Omni(model=folder) as omni:

        def actions(prompt: str, image: np.ndarray, seed: int) -> np.ndarray:
            from PIL import Image

            task = {"task": "policy", **{k: v for k, v in SETTINGS.items() if k != "num_inference_steps"}}
            params = [{"num_inference_steps": SETTINGS["num_inference_steps"], "seed": seed, "extra_args": task}]
            inputs = {"prompt": prompt, "multi_modal_data": {"image": [Image.fromarray(image)]}}
            [out] = omni.generate(inputs, params, use_tqdm=False)
            assert out.error is None, out.error
            return out.actions.numpy()

        yield actions


def client(url: str, key: str | None = KEY):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    return WebsocketClientPolicy(host=url, api_key=key)


def test_infer_returns_the_actions_offline_omni_makes(url, offline):
    policy = client(url)
    meta = policy.get_server_metadata()
    assert meta["protocol"] == "openpi" and "observation/image" in meta["observation_keys"]
    got = policy.infer({"prompt": "pick up the cup", "observation/image": frame(1), "seed": np.int64(5)})
    want = offline("pick up the cup", frame(1), 5)
    assert got["actions"].dtype == np.float32 and got["actions"].shape == want.shape == (4, 9)  # av: 9 wide
    assert np.array_equal(got["actions"], want)
    assert got["action_domain"] == "av" and got["action_fps"] > 0


def test_clients_at_once_each_get_their_own(url, offline):
    cases = [("pick up the cup", 2, 11), ("open the drawer", 3, 12), ("wave", 4, 13)]
    got: dict[int, np.ndarray] = {}

    def one(i: int) -> None:
        prompt, image, seed = cases[i]
        got[i] = client(url).infer({"prompt": prompt, "image": frame(image), "seed": seed})["actions"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)  # a deadline that stops a hang, not a timing
    assert sorted(got) == [0, 1, 2]
    for i, (prompt, image, seed) in enumerate(cases):
        assert np.array_equal(got[i], offline(prompt, frame(image), seed)), prompt


@pytest.mark.parametrize(
    "observation, key",
    [
        ({"observation/image": frame(1)}, "prompt"),
        ({"prompt": "pick"}, "observation/image"),
        ({"prompt": "pick", "observation/image": frame(1).astype(np.float32)}, "observation/image"),
        ({"prompt": "pick", "image": frame(1)[:, :, :2]}, "image"),
        ({"prompt": "pick", "image": frame(1), "action_domain": "mars"}, "action_domain"),
        ({"prompt": "pick", "image": frame(1), "num_inference_steps": 0}, "num_inference_steps"),
    ],
)
def test_a_malformed_observation_names_the_key_and_the_connection_goes_on(url, observation, key):
    policy = client(url)
    with pytest.raises(RuntimeError, match="Error in inference server") as err:
        policy.infer(observation)
    assert str(err.value).splitlines()[1].startswith(key), str(err.value)
    again = policy.infer({"prompt": "pick", "image": frame(1), "seed": 1})  # the same socket still serves
    assert again["actions"].shape == (4, 9)


@pytest.mark.parametrize("key", [None, "wrong"])
def test_the_api_key_is_enforced(url, key):
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as err:
        client(url, key)
    assert err.value.response.status_code == 403
