SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LAB_DIR ?= $(HOME)/.cache/claimwarden/lab
LAB_ARGS ?=
DEMO_ARGS ?=
PYTEST_ARGS ?=
BENCH_ARGS ?=
K8S_VERSION ?= 1.34.4
MATRIX_VERSIONS := 1.35.4 1.36.3 1.37.2
# The lifecycle and health core, run on every version by test-matrix (and on 1.37 by test). Files that start
# labs of the versions they are about (test_podgroups, test_extended_resources, test_health_tolerations) are not here.
CORE_TESTS := tests/integration/test_lab_cli.py tests/integration/test_claims_lifecycle.py \
	tests/integration/test_claims_real_paths.py tests/integration/test_claims_walkthrough.py \
	tests/integration/test_claims_sharing_limit.py tests/integration/test_health_eviction.py \
	tests/integration/test_health_quarantine.py tests/integration/test_health_quarantine_records.py \
	tests/integration/test_health_real_paths.py tests/integration/test_relist.py \
	tests/integration/test_signals_taints.py tests/integration/test_signals_podstatus.py \
	tests/integration/test_signals_alertmanager.py

KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo $(HOME)/.cache/claimwarden/bin/v1.34.4/kubectl)
# The one version source; `make release VERSION=x.y.z` stamps another into a copy of the tree.
SOURCE_VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' operator/claimwarden/__init__.py)
IMAGE_REPOSITORY ?= claimwarden
IMAGE ?= $(IMAGE_REPOSITORY):$(SOURCE_VERSION)
HELM ?= $(HOME)/.cache/claimwarden/bin/helm-v3.22.0/helm
DIST ?= dist/v$(VERSION)

.PHONY: help venv bins bins-matrix prometheus alertmanager faketime lab lab-down demo run test test-matrix test-unit test-integration lint manifests \
	install uninstall deploy undeploy image podman lock release chart-package syft deploy-overlay image-arm64 bench bench-smoke bench-signals chaos soak bench-explain \
	helm chart-docs cli-docs crd-docs test-chart

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml lab/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "claimwarden needs Python >= 3.11; found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e ./lab
	@touch $@

venv: $(VENV)/.installed ## create .venv with claimwarden and its dev tools installed

bins: ## build etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, kwok, kube-state-metrics, kubelet (cached; K8S_VERSION=1.37.2 builds another control plane)
	K8S_VERSION=$(K8S_VERSION) bins/build.sh
	K8S_VERSION=1.34.4 bins/build-kube-state-metrics.sh
	K8S_VERSION=1.34.4 bins/build-kubelet.sh

bins-matrix: bins ## also build the control planes of 1.35, 1.36 and 1.37 (about 9 min each, cold)
	for v in $(MATRIX_VERSIONS); do K8S_VERSION=$$v bins/build.sh || exit 1; done

helm: ## build helm v3.22.0 from the Go module proxy into ~/.cache/claimwarden/bin/helm-v3.22.0 (the chart tests; about 4 min cold)
	bins/build-helm.sh

prometheus: ## install Debian's prometheus package (prometheus, promtool) for the metrics tests
	bins/install-prometheus.sh

alertmanager: ## install Debian's prometheus-alertmanager (Alertmanager, amtool) for the Alertmanager webhook tests
	bins/install-prometheus.sh alertmanager

faketime: ## install Debian's faketime (libfaketime) for the chaos suite's clock-rate skew scenario
	bins/install-faketime.sh

lab: venv bins ## start the local lab (LAB_DIR, LAB_ARGS) in the background
	$(BIN)/claimwarden lab up --dir $(LAB_DIR) $(LAB_ARGS)

lab-down: venv ## stop the local lab and remove its state
	$(BIN)/claimwarden lab down --dir $(LAB_DIR)

demo: venv bins ## build what is missing, start the lab and claimwarden, play the walkthrough and a broken GPU, keep claimwarden running (Ctrl-C stops it; DEMO_ARGS=--pause, --models H100,A100,L4)
	$(BIN)/claimwarden lab demo --dir $(LAB_DIR) $(DEMO_ARGS)

run: venv ## run claimwarden against the current kubeconfig
	$(BIN)/claimwarden run

test: venv bins-matrix helm prometheus alertmanager podman faketime syft ## all tests on 1.34.4 (and 1.35-1.37 where a test is about them), then the core on 1.37.2 (builds what is missing)
	$(BIN)/pytest $(PYTEST_ARGS) -m "not matrix_only" tests
	CLAIMWARDEN_KUBERNETES=1.37 $(BIN)/pytest $(PYTEST_ARGS) -m "not matrix_only" $(CORE_TESTS)

test-unit: venv ## run the unit tests only
	$(BIN)/pytest $(PYTEST_ARGS) tests/unit

test-chart: venv bins helm ## the chart's checks without a lab: helm lint, values, drift against manifests/ (seconds)
	$(BIN)/pytest $(PYTEST_ARGS) tests/chart

test-integration: venv bins helm prometheus alertmanager podman syft ## run the integration tests only (starts a lab)
	$(BIN)/pytest $(PYTEST_ARGS) tests/integration

test-matrix: venv bins-matrix helm prometheus alertmanager podman syft ## the full suite on 1.37.2, the core on 1.35.4 and 1.36.3 (make test: everything on 1.34.4)
	CLAIMWARDEN_KUBERNETES=1.37 $(BIN)/pytest $(PYTEST_ARGS) tests/integration tests/chaos
	for v in 1.35 1.36; do CLAIMWARDEN_KUBERNETES=$$v $(BIN)/pytest $(PYTEST_ARGS) $(CORE_TESTS) || exit 1; done

chaos: venv bins prometheus faketime ## the chaos suite at full scale (1,000 pods, 20 SIGKILLs, ...); `make test` runs it reduced, soak slice included
	CHAOS_SCALE=full $(BIN)/pytest $(PYTEST_ARGS) -p no:cacheprovider --deselect tests/chaos/test_soak.py tests/chaos

soak: venv bins ## the soak: churn 20 pods/s, a mark and a clear a minute, a leader kill every 10 min, for SOAK_MINUTES (60); figures in soak-figures.json
	SOAK_MINUTES=$(or $(SOAK_MINUTES),60) SOAK_FIGURES=$(or $(SOAK_FIGURES),soak-figures.json) \
		$(BIN)/pytest $(PYTEST_ARGS) -p no:cacheprovider -s tests/chaos/test_soak.py

bench: venv bins ## issue 19's table: claimwarden against kube-controller-manager side by side (PODS=1000 NODES=125; PODS=5000 NODES=500; BENCH_ARGS=--qps 1000,20 or --baseline /path/to/checkout)
	$(BIN)/python bench/suite.py --pods $(or $(PODS),1000) --nodes $(or $(NODES),125) $(BENCH_ARGS)

bench-smoke: venv bins ## every section of make bench at small scale (200 pods, 30 nodes), to exercise the bench code
	$(BIN)/python bench/suite.py --pods 200 --nodes 30 $(BENCH_ARGS)

bench-signals: venv bins ## issue 21's targets: one signal at a time per source to its record and to the first eviction (SIGNALS=30), then 1,024 devices' taints at once with PODS=1000 running pods under an Enforce rule (the breaker)
	$(BIN)/python bench/signals_latency.py --signals $(or $(SIGNALS),30)
	$(BIN)/python bench/signals_burst.py --nodes 8 --pods $(or $(PODS),1000)

bench-explain: venv ## time 'explain' per claim on a synthetic 500-node x 8-GPU snapshot (no lab needed)
	$(BIN)/python bench/explain_speed.py --nodes $(or $(NODES),500) --devices $(or $(DEVICES),8)

lint: venv ## ruff and mypy
	$(BIN)/ruff check operator lab tests bench release
	$(BIN)/mypy

cli-docs: venv ## write docs/reference/cli.md from the argparse parsers of claimwarden and kubectl claimwarden
	$(BIN)/python -m claimwarden_lab.clidocs

crd-docs: venv ## write docs/reference/crds.md from the OpenAPI schemas in crds/
	$(BIN)/python -m claimwarden_lab.crddocs

chart-docs: venv ## write the values reference of charts/claimwarden/README.md from the comments of its values.yaml
	$(BIN)/python -m claimwarden_lab.chartdocs

# manifests/base names the image `claimwarden` without a tag; a clone's manifests and deploy pin it to IMAGE
# (the source version) through this overlay, a release pins it by digest (release/build.py).
deploy-overlay:
	@for base in base monitoring; do mkdir -p dist/deploy-$$base && printf '%s\n' \
		'apiVersion: kustomize.config.k8s.io/v1beta1' 'kind: Kustomization' "resources: [../../manifests/$$base]" \
		'images: [{name: claimwarden, newName: "$(IMAGE_REPOSITORY)", newTag: "$(SOURCE_VERSION)"}]' \
		> dist/deploy-$$base/kustomization.yaml; done

manifests: deploy-overlay ## render manifests/base (image IMAGE_REPOSITORY:<source version>) and manifests/monitoring into dist/
	$(KUBECTL) kustomize dist/deploy-base > dist/claimwarden.yaml
	$(KUBECTL) kustomize dist/deploy-monitoring > dist/claimwarden-monitoring.yaml
	@echo "wrote dist/claimwarden.yaml and dist/claimwarden-monitoring.yaml"

install: ## install the CRDs into the current cluster
	$(KUBECTL) apply -k crds/

uninstall: ## remove the CRDs (and with them every UnhealthyDevice record)
	$(KUBECTL) delete -k crds/

deploy: deploy-overlay ## install claimwarden (CRDs, namespace, RBAC, Deployment, Service; image IMAGE_REPOSITORY:<source version>) into the current cluster
	$(KUBECTL) apply -k dist/deploy-base

undeploy: ## remove what deploy installed
	$(KUBECTL) delete -k manifests/base

image: ## build the image and write dist/claimwarden-<version>.oci.tar (docker if it runs, else podman from Debian with a local mmdebstrap base; BASE=python:3.11-slim with a registry)
	IMAGE=$(IMAGE) image/build.sh

image-arm64: ## the arm64 image through qemu user emulation (podman; installs qemu-user-static and arch-test from Debian): dist/claimwarden-<version>-linux-arm64.oci.tar; slow, not in make test
	ARCH=arm64 image/build.sh

podman: ## install podman, runc, mmdebstrap and containerd from Debian (make image, the image and real-node tests)
	image/install-podman.sh

release: venv ## every artifact of release VERSION=x.y.z into dist/vx.y.z (image archive, bundles pinned by digest, chart, SBOM, SHA256SUMS); IMAGE_REPOSITORY=registry.example/claimwarden, ALLOW_DIRTY=1
	@[[ -n "$(VERSION)" ]] || { echo "make release VERSION=x.y.z (semver; the source says $(SOURCE_VERSION))" >&2; exit 2; }
	$(BIN)/python -m release.build --version "$(VERSION)" --dist "$(DIST)" --repository "$(IMAGE_REPOSITORY)" \
		--kubectl "$(KUBECTL)" $(if $(ALLOW_DIRTY),--allow-dirty)

chart-package: ## the release's hook: helm package charts/claimwarden into DIST at VERSION (chart and app version), if the chart exists
	@if [[ -d charts/claimwarden ]]; then \
		{ [[ -x "$(HELM)" ]] || bins/build-helm.sh; } && mkdir -p "$(DIST)" && \
		$(HELM) package charts/claimwarden --version "$(VERSION)" --app-version "$(VERSION)" --destination "$(DIST)"; \
	else echo "chart-package: no charts/claimwarden; nothing to package"; fi

syft: ## build syft (the release's SBOM generator) from the Go module proxy into ~/.cache/claimwarden/bin
	bins/build-syft.sh

lock: ## regenerate requirements.lock (pinned runtime dependencies with hashes) from pyproject.toml
	image/lock.sh
