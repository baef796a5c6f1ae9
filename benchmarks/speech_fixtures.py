"""The speech benchmarks' tiny fixtures, and what their pipelines declare about them (voices, cloning, how LM steps
become audio frames): a benchmark sets its requests from these declarations, not from the family's name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def declared(folder: str | Path) -> Any:
    """The pipeline serving ``folder``, completed from the folder (its ``info`` has the folder's voices)."""
    import omnistage.models  # noqa: F401 (registers the families)
    from omnistage.pipeline import resolve_pipeline

    return resolve_pipeline(folder).for_model(folder)


def tiny_folder(name: str, root: Path, *, clones: bool) -> Path:
    """The tiny fixture ``name``: built by its builder, or, for a family whose tiny checkpoints the authors' package
    makes (committed under tests/models/<name>/tiny/), the committed checkpoint that only clones (``clones``) or
    the one that speaks preset voices."""
    from omnistage.testing.tiny import build, builders

    if name in builders():
        return build(name, root / name)
    for folder in sorted((REPO / "tests" / "models" / name / "tiny").iterdir()):
        speech = declared(folder).info.speaks
        if (speech.supports_voice_cloning and not speech.voices) if clones else bool(speech.voices):
            return folder
    raise SystemExit(
        f"{name}: no tiny builder, and no committed tiny checkpoint that {'clones' if clones else 'speaks'}"
    )


def stage0_uses_vllm(pipeline: Any) -> bool:
    """Whether the pipeline's first stage runs on vLLM (takes vLLM engine arguments such as max_model_len)."""
    return pipeline.stages[0].kind == "llm"
