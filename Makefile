# fabricscope — `make run` starts the demo stack, `make test` runs the test suite.
# Both set everything up from a fresh machine first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup system-deps bpf wheel image rules dashboards run test bench clean

setup: system-deps $(STAMP) bpf

# BPF objects are built once here (clang + vmlinux.h from the running kernel's BTF)
# and loaded at run time through libbpf; nodes need neither clang nor headers.
bpf: system-deps
	@if [ -f exporter/bpf/Makefile ]; then $(MAKE) -s -C exporter/bpf; fi

# The wheel a node installs (dist/): built after the BPF objects, so it carries them. pip
# builds it in an isolated environment: the development venv is not needed for it.
wheel: bpf
	$(PYTHON) -m pip wheel -q --no-deps -w dist .

# The OCI images (exporter/sidecar, Prometheus, Alertmanager) from a debootstrap'ed Debian
# base, no registry needed; as root (docs/deploy.md).
image: system-deps
	python3 deploy/image/build.py

# Render the mixin (jsonnet) to rules/*.yaml and check rules and Alertmanager config.
rules: $(STAMP)
	@if [ -f rules/Makefile ]; then $(MAKE) -s -C rules PYTHON=$(abspath $(PY)); fi

# Regenerate the committed Grafana JSON (dashboards/json/) from the grafanalib source.
dashboards: $(STAMP)
	$(PY) -m fabricscope.dashboards.build

system-deps:
	@./deploy/install-system-deps.sh

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,sidecar,chaos,dashboards]'
	touch $@

run: setup
	$(VENV)/bin/fabricscope stack

# Test files run in parallel (--dist loadfile: a file's tests, and the real servers its
# module fixtures start, stay in one worker), one worker per core: several tests time
# real processes (uprobe arrival lag, alert delivery) and need the CPU they ask for.
# At most 4: each worker starts its own Prometheus/PostgreSQL/sidecar processes.
# TEST_JOBS=0 runs serially.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ "$$n" -gt 4 ] && n=4; echo $$n)
# Tests marked `timing` measure how late a process is (uprobe arrival lag, a stopped rank's
# culprit, alert delivery and inhibition): they run after the parallel pass, alone, so no
# other test's CPU shows up in what they measure.
test: setup
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not timing" tests
	$(PY) -m pytest -q -m timing tests

bench: setup
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build dist *.egg-info
