"""Built-in model families. Each family module registers its pipeline on import.

Adding a family: create ``models/<family>/`` and add its name here.
"""

import importlib
import importlib.util
import logging

_FAMILIES = ["sd3", "sd", "chat", "prompt_expand", "glm_image", "demo", "wan", "codec_tts"]

for _name in _FAMILIES:
    if importlib.util.find_spec(f"omnistage.models.{_name}") is None:
        continue
    try:
        importlib.import_module(f"omnistage.models.{_name}")
    except ImportError as e:  # an optional dependency of one family must not hide the others
        logging.getLogger(__name__).warning("model family %s unavailable: %s", _name, e)
