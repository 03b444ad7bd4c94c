# gpufleet.upgrade — developer and CI entry points. `make lab` runs the main job, `make test`
# runs every test layer. Both create everything they need on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# A Python that actually runs: python3.12 (a pyenv shim can exist and fail), then pyenv's 3.12,
# then python3. Override with `make PYTHON=/path/to/python3.x`.
PYTHON ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 python3; do \
	  "$$p" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1 && { echo "$$p"; break; }; done)

# Modules run on GPU nodes with Python >= 3.9: sanity also compiles them there when one runs.
PY39 ?= $(shell for p in python3.9 $$HOME/.pyenv/versions/3.9*/bin/python3.9 /usr/bin/python3.9; do \
	  "$$p" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 9) else 1)' >/dev/null 2>&1 && { echo "$$p"; break; }; done)

VENV        ?= .venv
VPY         := $(VENV)/bin/python
COLL_ROOT   := $(VENV)/collections
COLL_LINK   := $(COLL_ROOT)/ansible_collections/gpufleet/upgrade
STAMP       := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/$(COLL_ROOT)
export ANSIBLE_PYTHON_INTERPRETER := $(CURDIR)/$(VPY)
export PYTHONDONTWRITEBYTECODE := 1

PYTEST      := $(VPY) -m pytest
# pytest-xdist workers of `make test`, `make units` and `make integration`: each worker starts its own
# control plane (the session fixture) and every lab test its own, so the workers share nothing but the
# caches (built atomically). 3 on the 2-core build machine: two lab tests side by side left 22 % of the
# CPU idle (their bounded waits: observation windows, metric windows, reboots, Jobs), which a third worker
# fills; PYTEST_WORKERS=2 or 0 (one test at a time, in one process) where that is too much. --dist loadgroup:
# a test module is one unit of work (its fixtures built once), but the lab modules are spread test by test and
# go first (tests/conftest.py, SPREAD), so no worker finishes alone on a long test.
PYTEST_WORKERS ?= 3
PYTEST_N    := $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25)
SANITY_TREE := tests/output/sanity/ansible_collections/gpufleet/upgrade

.PHONY: help venv collection controlplane cluster test units integration sanity molecule lint lab clean system-deps device-bundle

help:
	@echo "make lab    - run the main job (the lab rollout of kernel, RKE2 and driver on a real control plane; FAULT=none for no fault, FAULT_KIND=xid|temperature|kernel, CHANGE=driver)"
	@echo "make test   - run every test layer (units, integration, molecule, ansible-test sanity, ansible-lint)"
	@echo "make cluster - run the test control plane in the foreground (kubeconfig: \$$CLUSTER_KUBECONFIG)"
	@echo "make units | integration | molecule | sanity | lint | controlplane | clean"

$(STAMP): requirements.txt requirements-test.txt
	@test -n "$(PYTHON)" || { echo "no Python >= 3.11 found; set PYTHON=" >&2; exit 1; }
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-test.txt
	@touch $@

venv: $(STAMP)

# The repository root is the collection root: link it where Ansible looks for collections.
collection: $(STAMP)
	@mkdir -p $(dir $(COLL_LINK))
	@ln -sfn $(CURDIR) $(COLL_LINK)
	@$(VPY) tests/tools/seed_get_pip.py

# Debian packages the tests run for real (Prometheus for metric_gate, Chromium for the evidence
# report). Installed when missing and running as root with apt-get (one `apt-get update`);
# otherwise a loud warning, and the tests that need them skip saying why. Append, don't replace.
SYSTEM_DEPS += prometheus chromium
# grub-editenv for the kernel_boot integration tests and tests/tools/grubsim.py.
SYSTEM_DEPS += grub-common
# rpm (rpmbuild), dnf, createrepo_c and dnf's versionlock plugin for the RHEL-family kernel tests
# (tests/tools/rpmrepo.py, tests/integration/test_kernel_dnf.py).
SYSTEM_DEPS += rpm dnf createrepo-c dnf-plugins-core
system-deps:
	@missing=""; for p in $(sort $(SYSTEM_DEPS)); do \
	  dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "system-deps: installing$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $$missing \
	  || echo "WARNING: system-deps: could not install$$missing; the tests that need them will SKIP" >&2; \
	else \
	  echo "WARNING: system-deps: missing$$missing and not root with apt-get; the tests that need them will SKIP" >&2; \
	fi

# The test control plane (tests/cluster): etcd, kube-apiserver, kube-controller-manager, kube-scheduler
# and KWOK built from their Go modules (tests/cluster/go/go.mod + go.sum), and NVIDIA's GPU Operator
# (tests/cluster/gpu-operator), into ~/.cache/gpufleet
# (GPUFLEET_CACHE), once per machine: prints progress and how long the build took; reused after.
controlplane: collection
	@$(VPY) tests/cluster/build.py --gpu-operator >/dev/null

# The control plane in the foreground (Ctrl-C stops it); CLUSTER_FLEET=file.yml seeds it.
CLUSTER_KUBECONFIG ?= .cluster/kubeconfig
cluster: controlplane
	PYTHONPATH=$(CURDIR)/tests $(VPY) -m cluster --kubeconfig $(CLUSTER_KUBECONFIG) \
	  $(if $(CLUSTER_FLEET),--fleet $(CLUSTER_FLEET))

units: collection system-deps
	$(PYTEST) $(PYTEST_N) tests/unit

integration: collection system-deps controlplane
	$(PYTEST) $(PYTEST_N) tests/integration

# ansible-test wants to run inside ansible_collections/<ns>/<name>: copy the files git would
# ship (tracked and untracked-not-ignored) there and run sanity offline.
sanity: collection
	@rm -rf $(SANITY_TREE) && mkdir -p $(SANITY_TREE)
	@git ls-files -co --exclude-standard -z | xargs -0 -I{} sh -c 'test -e "{}" && echo "{}"' \
	  | tar -cf - -T - | tar -xf - -C $(SANITY_TREE)
	@cd $(SANITY_TREE) && git init -q && git add -A
	cd $(SANITY_TREE) && $(CURDIR)/$(VENV)/bin/ansible-test sanity --local --color no \
	  --python $$($(CURDIR)/$(VPY) -c 'import sys;print("%d.%d"%sys.version_info[:2])') $(SANITY_ARGS)
	@if [ -n "$(PY39)" ]; then cd $(SANITY_TREE) && $(CURDIR)/$(VENV)/bin/ansible-test sanity --local --color no \
	  --test compile --python 3.9 --python-interpreter $$(command -v $(PY39) || echo $(PY39)); \
	else echo "note: no Python 3.9 here; node-side code compiled on the controller Python only"; fi

# Molecule scenarios of the node_upgrade and rollback roles (extensions/molecule/<scenario>/; default
# driver, localhost, against a real control plane (tests/cluster, started by prepare, stopped by destroy)
# and per-node install roots). Molecule's state (its
# ANSIBLE_HOME) and the scenarios' fleets stay under tests/output/molecule, never in ~/. The
# collection is found only through ANSIBLE_COLLECTIONS_PATH (the venv's link to this work tree; the
# scenarios set prerun: false so molecule copies nothing), and a stale copy under ~/.ansible that
# could shadow the work tree is removed. Every scenario runs; the target fails if any failed.
MOLECULE_SCENARIOS ?= node_upgrade rollback
MOLECULE_HOME      := $(CURDIR)/tests/output/molecule/ansible-home
molecule: collection controlplane
	@for stale in $(HOME)/.ansible/collections/ansible_collections/gpufleet/upgrade \
	  $(MOLECULE_HOME)/collections/ansible_collections/gpufleet/upgrade; do \
	  if [ -e "$$stale" ] || [ -L "$$stale" ]; then echo "molecule: removing $$stale (it could shadow the work tree)"; rm -rf "$$stale"; fi; \
	done
	@failed=""; for s in $(MOLECULE_SCENARIOS); do \
	  t0=$$(date +%s); \
	  if ANSIBLE_HOME=$(MOLECULE_HOME) molecule test -s $$s; then r=passed; else r=FAILED; failed="$$failed $$s"; fi; \
	  echo "molecule: scenario $$s $$r in $$(( $$(date +%s) - t0 )) s"; \
	done; \
	if [ -n "$$failed" ]; then echo "molecule: FAILED:$$failed" >&2; exit 1; fi

# ansible-lint (profile production, offline: it installs nothing) over the playbooks, roles, molecule
# scenarios and YAML files, with .ansible-lint and .yamllint. It finds this collection through the venv's
# link and awx.awx (playbooks/awx_setup.yml) where the tests get it: tests/tools/awx_collection.py,
# cached under .venv (the first run downloads it from PyPI, as the AWX tests do).
lint: collection
	@awx=$$($(VPY) tests/tools/awx_collection.py) && \
	  ANSIBLE_COLLECTIONS_PATH=$(CURDIR)/$(COLL_ROOT):$$awx $(VENV)/bin/ansible-lint --offline --nocolor $(LINT_ARGS)

# Each test's wall and CPU, and each lab phase's, go to $(TIMINGS) (tests/tools/suite_timings.py), whose
# breakdown `make test` prints after pytest (docs/development.md, "Where the time goes"). The three layers after
# pytest share nothing (molecule's state is under tests/output/molecule, sanity's under tests/output/sanity, lint
# only reads the tree): they run side by side, each one's output printed whole when it ends, every one even where
# another failed (-k).
TIMINGS ?= tests/output/timings
test: collection system-deps controlplane
	@rm -rf $(TIMINGS)
	GPUFLEET_TIMINGS=$(CURDIR)/$(TIMINGS) $(PYTEST) $(PYTEST_N) tests/unit tests/integration
	@$(VPY) tests/tools/suite_timings.py $(TIMINGS) --top 15
	$(MAKE) --no-print-directory -k -j3 --output-sync=target molecule sanity lint

# The one-command lab (docs/lab.md): plan → canary → approval → upgrade_check → rollout on a 40-node
# pool of a real control plane (built first by controlplane, started and stopped by the lab) of the
# seed's change (kernel 6.8.0-134 → 135, RKE2 v1.35.3 → v1.36.1 through the SUC, driver 580.126.20 →
# 580.130.00; CHANGE=driver: the driver alone), with an injected Xid 79 (FAULT=none: the whole rollout
# completes; FAULT=<node>; FAULT_KIND=xid|temperature|kernel: kernel = the target kernel does not boot).
# FLEET=production: the fleet shaped like a real one and run from the built collection installed read-only, with the
# dynamic inventory, K8S_AUTH_* credentials and no evidence repository (docs/lab.md, "A production-shaped fleet").
FLEET ?= lab
FAULT ?= auto
FAULT_KIND ?= xid
CHANGE ?= seed
# NVIDIA's real GPU Operator runs the lab's operands and the target moves it too: auto (the default) where it can
# run in a chroot of its own (as root, or without root where unprivileged user namespaces are allowed: unshare -r),
# 1 always (fails where it cannot), 0 never (plain DaemonSets).
GPU_OPERATOR ?= auto
OPERATOR_CAN_RUN = $(shell [ "$$(id -u)" = 0 ] && echo y || { unshare --user --map-root-user -- chroot / true >/dev/null 2>&1 && echo y; })
LAB_GPU_OPERATOR = $(if $(filter 1,$(GPU_OPERATOR)),--gpu-operator,$(if $(filter auto,$(GPU_OPERATOR)),$(if $(OPERATOR_CAN_RUN),--gpu-operator)))
# operator (with the real GPU Operator and CHANGE=driver): the operator's driver container is the driver.
INSTALL_METHOD ?= apt
# DRIVER_POOLS=1 (with INSTALL_METHOD=operator): the driver rendered per node pool from an NVIDIADriver object.
DRIVER_POOLS ?= 0
lab: collection controlplane
	$(VPY) tests/tools/lab.py --fault $(FAULT) --fault-kind $(FAULT_KIND) --change $(if $(filter production,$(FLEET)),production,$(CHANGE)) --install-method $(INSTALL_METHOD) $(if $(filter production,$(FLEET)),,$(LAB_GPU_OPERATOR)) $(if $(filter 1,$(DRIVER_POOLS)),--driver-pools) --fleet $(FLEET)

# Real-GPU fixtures (issue 4): the GPU machine has no network, so the nvidia-ml-py wheel travels in
# .device/; there run `python3 tests/tools/device_capture.py --out DIR` (read only).
device-bundle: collection
	$(VPY) -m pip download --quiet --no-deps --only-binary=:all: -d .device \
	  "nvidia-ml-py==$$($(VPY) -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))')"

clean:
	rm -rf $(VENV) tests/output .lab .device .cluster
