"""The prompt-expansion stage: the generic vLLM stage with the user's prompt
wrapped in the family's system prompt (through the model's chat template)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageRequest
from omnistage.stages.llm.engine import LLMStageEngine


class PromptExpanderEngine(LLMStageEngine):
    def __init__(self, ctx: StageContext, system_prompt: str):
        super().__init__(ctx)
        self.system_prompt = system_prompt

    def expansion_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        if "messages" in inputs or "prompt_token_ids" in inputs:
            # the caller built the conversation (its own system message, if any)
            return {k: v for k, v in inputs.items() if k not in ("multi_modal_data", "system_prompt")}
        prompt = inputs.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidRequestError("prompt", "prompt_expand needs a non-empty text prompt")
        system = inputs.get("system_prompt")  # a string: checked at admission
        system = self.system_prompt if system is None else system
        if getattr(self.tokenizer, "chat_template", None) is None:  # a base LM: plain text framing
            return {"prompt": f"{system}\n\nPrompt: {prompt}\nDescription:"}
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}]}

    def prepare(self, req: StageRequest):
        return super().prepare(replace(req, inputs=self.expansion_inputs(req.inputs)))
