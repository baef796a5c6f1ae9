"""Prompts and settings shared by the chat parity tests (reference and engines alike)."""

ENGINE = dict(max_model_len=512, max_num_seqs=8, dtype="float32", enforce_eager=True)
PROMPTS = ["hello world", "a photo of a red cat", "the quick brown fox", "describe a landscape with"]
GREEDY = dict(temperature=0.0, max_tokens=24)
SEEDED = dict(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=24)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello, how are you?"}]
