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
            return {k: v for k, v in inputs.items() if k != "multi_modal_data"}  # caller built the conversation
        prompt = inputs.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidRequestError("prompt", "prompt_expand needs a non-empty text prompt")
        info = inputs.get("additional_information") or {}
        system = info.get("system_prompt", self.system_prompt)
        if not isinstance(system, str):
            raise InvalidRequestError("additional_information.system_prompt", "expected a string")
        if getattr(self.tokenizer, "chat_template", None) is None:  # a base LM: plain text framing
            return {"prompt": f"{system}\n\nPrompt: {prompt}\nDescription:"}
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}]}

    def prepare(self, req: StageRequest):
        return super().prepare(replace(req, inputs=self.expansion_inputs(req.inputs)))
