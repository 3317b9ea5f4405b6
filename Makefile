# numafleet.tuning: developer and CI entry points.
#
#   make setup demo   create .venv (pinned toolchain) and run the demo job
#   make test         the CI gate: lint, sanity, units, integration, system, vm; fails on any finding
#
# Every target runs from the repository root. Tools come from .venv only.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
.NOTPARALLEL:
MAKEFLAGS += --no-builtin-rules

VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# The stamp's name carries a hash of requirements-dev.txt: a changed pin re-runs pip, nothing else does.
REQ_HASH := $(shell sha256sum requirements-dev.txt | cut -c1-16)
STAMP := $(VENV)/.setup-$(REQ_HASH)
COLLECTION_LINK := .collections/ansible_collections/numafleet/tuning
# Only folders that exist: a fresh clone has no benchmarks/ until something is committed there.
PY_PATHS := $(wildcard plugins tests benchmarks molecule .ci docs)

# Tools see the venv first (ansible-lint warns when its own bin dir is missing from PATH).
export PATH := $(BIN):$(PATH)
export ANSIBLE_NOCOLOR := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: bench gpu-proof mutation help setup demo docs test lint ruff yamllint ansible-lint sanity units security integration system vm vm-up vm-verify vm-login vm-down changelog-lint changelog format clean

help:
	@echo "make setup          create .venv from requirements-dev.txt and the .collections symlink"
	@echo "make demo           materialise .demo/ and run site.yml on the demo fleet (render mode)"
	@echo "make test           lint + sanity + units + security + integration + system + vm (the CI gate)"
	@echo "make lint|sanity|units|security|system|vm|changelog-lint   one layer at a time"
	@echo "make vm             the 2-NUMA-node QEMU guest scenario (molecule numa_vm, about 10 minutes)"
	@echo "make vm-up|vm-verify|vm-login|vm-down   the same step by step, the guest left running"
	@echo "make bench          the benchmarks (facts, planner, 50-500 host fleet; about 60 minutes), results in benchmarks/results/"
	@echo "make integration    ansible-test integration on a copy of the tree"
	@echo "make gpu-proof      on an NVIDIA or AMD GPU host: the GPU proof kit (tests/gpu/README.md), evidence in reports/gpu-proof/"
	@echo "make mutation       mutation testing of the core files (tests/mutation/README.md; not in make test)"
	@echo "make docs           regenerate docs/host_variables.md from the schema of the host variables"
	@echo "make format         ruff format + safe ruff fixes on plugins/ tests/ benchmarks/ .ci/ docs/"
	@echo "make changelog      release notes for galaxy.yml's version from changelogs/fragments"
	@echo "make clean          remove .venv, .collections, .demo and tests/output"

setup: $(STAMP) $(COLLECTION_LINK)

$(STAMP): requirements-dev.txt
	@is311='import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 11))'; \
	if $(VENV)/bin/python -c "$$is311" >/dev/null 2>&1; then exit 0; fi; \
	py=""; \
	for cand in python3.11 python3; do \
	  if "$$cand" -c "$$is311" >/dev/null 2>&1; then py="$$cand"; break; fi; \
	done; \
	if [ -z "$$py" ]; then \
	  echo "setup: Python 3.11 with venv/ensurepip is required (python3.11, or python3 if it is" \
	       "3.11; on Debian 12: apt-get install python3-venv)" >&2; \
	  exit 1; \
	fi; \
	rm -rf $(VENV); \
	echo "setup: creating $(VENV) with $$(command -v "$$py")"; \
	"$$py" -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet -r requirements-dev.txt
	rm -f $(VENV)/.setup-*
	touch $@

# A phony check rather than a file target: make would follow the symlink's loop.
$(COLLECTION_LINK): FORCE
	@if [ -L $@ ] && [ "$$(readlink $@)" = "../../.." ]; then exit 0; fi; \
	if [ -e $@ ] || [ -L $@ ]; then echo "setup: $@ exists and is not a link to ../../.." >&2; exit 1; fi; \
	mkdir -p $(@D) && ln -s ../../.. $@ && echo "setup: linked $@ -> ../../.."

.PHONY: FORCE
FORCE:

# Fresh scratch trees every time (.demo/<host>/{sys,proc,root}), so the first run renders everything.
demo: setup
	$(BIN)/python tests/unit/fixtures/trees.py --demo .demo
	$(BIN)/ansible-playbook -i inventories/demo site.yml

test: lint sanity units security integration system vm

# docs/host_variables.md is generated from plugins/plugin_utils/_host_vars.py (the schema that
# numafleet.tuning.host_vars_check checks against); tests/unit/test_host_vars_doc.py fails while
# the committed file differs from what the script writes.
docs: setup
	$(BIN)/python docs/gen_host_variables.py

lint: ruff yamllint ansible-lint

ruff: setup
	$(BIN)/ruff check $(PY_PATHS)
	$(BIN)/ruff format --check $(PY_PATHS)

yamllint: setup
	$(BIN)/yamllint --strict .

ansible-lint: setup
	$(BIN)/ansible-lint --offline --strict

# ansible-test needs a real .../ansible_collections/numafleet/tuning directory: .ci/ansible-test
# copies the tree (git ls-files -co --exclude-standard) to a temporary one and runs it there with
# --venv --python 3.11. Extra arguments: make sanity ANSIBLE_TEST_ARGS="--test pylint".
sanity: setup
	.ci/ansible-test sanity $(ANSIBLE_TEST_ARGS)

# Layer 3; not part of `make test` (about 40 minutes on 2 cores; run it on an otherwise idle machine).
# Each script exits 1 when a target is missed; all of them run, and make fails at the end if any did.
bench: setup
	rc=0; \
	$(BIN)/python benchmarks/facts.py || rc=1; \
	$(BIN)/python benchmarks/planner.py || rc=1; \
	$(BIN)/python benchmarks/fleet.py || rc=1; \
	$(BIN)/python benchmarks/guard_round.py || rc=1; \
	exit $$rc

# Layer 5, on a real NVIDIA GPU host (not part of `make test`; no venv: it runs under the host's
# python3 with its CUDA stack, PYTHON=... to choose). Reads the GPU and runs user-space CUDA and MPS
# processes only. Without an NVIDIA driver every check is skipped and it exits 0.
GPU_PROOF_OUT ?= reports/gpu-proof
gpu-proof:
	bash tests/gpu/run.sh $(GPU_PROOF_OUT)

# Not part of `make test`: minutes per file. One file at a time, niced; report in reports/mutation/.
# MUTATION_FILES="plugins/module_utils/numa/cpulist.py" MUTATION_ARGS="--sample 100" to narrow it.
MUTATION_FILES ?= $(addprefix plugins/module_utils/numa/,cpulist.py placements.py hugepages.py units.py files.py mps.py)
MUTATION_ARGS ?=
mutation: setup
	rc=0; \
	for file in $(MUTATION_FILES); do \
	  nice -n 15 $(BIN)/python tests/mutation/run.py "$$file" $(MUTATION_ARGS) || rc=1; \
	done; \
	exit $$rc

integration: setup
	.ci/ansible-test integration $(ANSIBLE_TEST_ARGS)

format: setup
	$(BIN)/ruff format $(PY_PATHS)
	$(BIN)/ruff check --fix $(PY_PATHS)

units: setup
	$(BIN)/pytest tests/unit -q

# The security layer: the injection matrix (every user-settable string x a payload corpus, each
# refused before the plan gate or read back exactly; counts in tests/output/security/).
security: setup
	$(BIN)/pytest tests/security -q -p no:cacheprovider

# Real site.yml runs on scratch copies of the demo fleet and tests/bad_inputs/ (about 2-3 minutes).
system: setup
	$(BIN)/pytest tests/system -q -p no:cacheprovider

# Layer 4 on a real kernel: a 2-NUMA-node QEMU guest (tests/vm/README.md). Installs qemu and
# mmdebstrap with apt-get when missing (root or sudo -n), builds or reuses the cached image, boots
# it, runs site.yml twice (second run changed=0), testinfra and playbooks/verify.yml (plus an
# unpinned control that must fail), stops the guest. Times per action: reports/numa_vm/timings.json.
vm: setup
	$(BIN)/python tests/vm/numa_vm.py deps
	$(BIN)/python tests/vm/run_scenario.py test -s numa_vm

# The scenario step by step: boot + site.yml and leave the guest running; the verify stage; a root
# shell in the guest; stop it (by its recorded PID; also after an interrupted run).
vm-up: setup
	$(BIN)/python tests/vm/numa_vm.py deps
	$(BIN)/molecule converge -s numa_vm

vm-verify: setup
	$(BIN)/molecule verify -s numa_vm

vm-login: setup
	$(BIN)/molecule login -s numa_vm

vm-down: setup
	$(BIN)/molecule destroy -s numa_vm

changelog-lint: setup
	$(BIN)/antsibull-changelog lint

# Adds (or refreshes) the release of galaxy.yml's version: fragments plus every plugin whose
# version_added is that version. Run before tagging; commit changelogs/ and CHANGELOG.rst.
changelog: setup
	$(BIN)/antsibull-changelog release --update-existing --reload-plugins --refresh-plugins

clean:
	rm -rf $(VENV) .collections .demo tests/output
