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

.PHONY: help deps apt venv sim sim-up sim-down test lint

help:
	@echo "make sim       bring up the simulated ring and run site.yml against it"
	@echo "make sim-down  remove the simulated ring (namespaces, daemons, mounts)"
	@echo "make test      lint and run every test (sim tests bring the ring up and down)"

deps: apt venv

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
	$(BIN)/ansible-playbook playbooks/sim.yml

sim: sim-up
	$(BIN)/ansible-playbook site.yml

sim-down: deps
	$(BIN)/ansible-playbook playbooks/sim-down.yml

lint: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/ansible-lint --profile production

test: deps lint
	$(BIN)/pytest tests
