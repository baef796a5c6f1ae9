"""vLLM-backed llm stages. This package is the only place that imports vllm."""
