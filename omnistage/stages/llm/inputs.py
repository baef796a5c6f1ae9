"""Prompt dicts (a source stage's prompt or an edge processor's output) to
token ids, the way vLLM's ``LLM.generate`` / chat endpoint would tokenize them."""

from __future__ import annotations

from typing import Any

# Keys an llm stage understands; anything else in an edge's output is a wiring bug.
INPUT_KEYS = {"prompt", "prompt_token_ids", "messages", "negative_prompt", "additional_information", "modalities"}


def _message_text(i: int, m: Any) -> dict[str, str]:
    if not isinstance(m, dict) or "role" not in m:
        raise ValueError(f"messages[{i}]: expected an object with 'role' and 'content'")
    content = m.get("content", "")
    if isinstance(content, list):  # OpenAI content parts: keep the text parts
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text":
                raise ValueError(f"messages[{i}].content: only text parts are supported by this stage, got {p!r}")
            parts.append(str(p.get("text", "")))
        content = "".join(parts)
    if not isinstance(content, str):
        raise ValueError(f"messages[{i}].content: expected a string, got {type(content).__name__}")
    return {"role": str(m["role"]), "content": content}


def prompt_token_ids(inputs: dict[str, Any], tokenizer: Any) -> tuple[list[int], str | None]:
    """Returns (token ids, prompt text if there was one)."""
    unknown = sorted(set(inputs) - INPUT_KEYS)
    if unknown:
        raise ValueError(f"prompt: unsupported key(s) for an llm stage: {', '.join(unknown)}")
    if inputs.get("prompt_token_ids") is not None:
        ids = inputs["prompt_token_ids"]
        if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("prompt_token_ids: expected a list of integers")
        return list(ids), inputs.get("prompt")
    if inputs.get("messages") is not None:
        messages = inputs["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages: expected a non-empty list")
        msgs = [_message_text(i, m) for i, m in enumerate(messages)]
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("messages: this model's tokenizer has no chat template; send 'prompt' instead")
        opts = (inputs.get("additional_information") or {}).get("chat_template_kwargs") or {}
        cont = bool(opts.get("continue_final_message", False))
        add_gen = bool(opts.get("add_generation_prompt", not cont))
        try:
            text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_gen,
                                                 continue_final_message=cont)
        except Exception as e:  # template errors are the caller's messages' fault
            raise ValueError(f"messages: the chat template failed: {e}") from None
        # The template already placed the special tokens (as vLLM's chat endpoint does).
        return tokenizer.encode(text, add_special_tokens=False), text
    prompt = inputs.get("prompt")
    if not isinstance(prompt, str):
        raise ValueError("prompt: needs 'prompt' (string), 'prompt_token_ids' or 'messages'")
    return tokenizer.encode(prompt), prompt
