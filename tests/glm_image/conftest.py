import os

# One engine-core process per vLLM engine, no extra worker process: starts in half the time.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
