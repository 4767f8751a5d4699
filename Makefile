SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LAB_DIR ?= $(HOME)/.cache/claimwarden/lab
LAB_ARGS ?=
KUBECONFIG_LAB := $(LAB_DIR)/kubeconfig
PYTEST_ARGS ?=

.PHONY: help venv bins lab lab-down demo run test test-unit test-integration lint

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "claimwarden needs Python >= 3.11; found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

venv: $(VENV)/.installed ## create .venv with claimwarden and its dev tools installed

bins: ## build etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, kwok (cached)
	bins/build.sh

lab: venv bins ## start the local lab (LAB_DIR, LAB_ARGS) in the background
	$(BIN)/claimwarden lab up --dir $(LAB_DIR) $(LAB_ARGS)

lab-down: venv ## stop the local lab and remove its state
	$(BIN)/claimwarden lab down --dir $(LAB_DIR)

demo: lab ## build what is missing, start the lab, show it, and run claimwarden on it (Ctrl-C stops it)
	@eval "$$($(BIN)/claimwarden lab env --dir $(LAB_DIR))" && \
	  kubectl apply -f crds/ && kubectl wait --for=condition=Established --timeout=60s crd --all && \
	  kubectl version && kubectl get nodes -o wide && kubectl get deviceclasses,resourceslices
	@echo "claimwarden runs against the lab now; Ctrl-C stops it, 'make lab-down' stops the lab"
	$(BIN)/claimwarden run --kubeconfig $(KUBECONFIG_LAB) --liveness http://127.0.0.1:8080/healthz \
	  --metrics-address 127.0.0.1

run: venv ## run claimwarden against the current kubeconfig
	$(BIN)/claimwarden run

test: venv bins ## run unit and integration tests (builds the binaries first if needed)
	$(BIN)/pytest $(PYTEST_ARGS) tests

test-unit: venv ## run the unit tests only
	$(BIN)/pytest $(PYTEST_ARGS) tests/unit

test-integration: venv bins ## run the integration tests only (starts a lab)
	$(BIN)/pytest $(PYTEST_ARGS) tests/integration

lint: venv ## ruff and mypy
	$(BIN)/ruff check operator tests
	$(BIN)/mypy
