# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both bootstrap .venv (pinned CPU torch) and the Debian packages they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Development pins torch to the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0

.PHONY: venv sysdeps labdeps lab s3rver demo test lint typecheck unit interop bench clean

# uv installs in well under a minute what pip takes ~90 s for on 2 cores (a fresh clone's `make test` pays it every
# time). It reads none of pip's configuration, so it is handed the find-links pip is configured with (where a machine
# keeps its CPU torch wheel). --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set (as on the CI
# machines), nothing else ever writes the .pyc files, and every interpreter the suite starts would compile torch
# from source (the suite took twice as long). Where uv cannot be had or fails, pip installs as before.
FIND_LINKS := $(strip $(PIP_FIND_LINKS) $(shell $(PY) -m pip config get global.find-links 2>/dev/null))

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	{ $(BIN)/pip install -q uv && $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python \
	    $(foreach d,$(sort $(FIND_LINKS)),--find-links $(d)) -e ".[all,dev]" "$(TORCH_PIN)"; } || \
	{ $(BIN)/pip install -q --upgrade pip && $(BIN)/pip install -q "$(TORCH_PIN)" && \
	  $(BIN)/pip install -q -e ".[all,dev]" "$(TORCH_PIN)"; }
	touch $(STAMP)

venv: $(STAMP)

# fio is the anchor of the storage probe and the flush benchmark.
sysdeps:
	@command -v fio >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq fio >/dev/null; }

# The cluster lab (ckptio.testing.cluster, tests/lab) runs MooseFS and GlusterFS from Debian's packages, by hand:
# policy-rc.d (put in place for the install when the machine has none) keeps their postinst scripts from starting
# daemons. Idempotent. The lab needs root: elsewhere, or where apt-get fails, its tests skip and say why.
LAB_PACKAGES := moosefs-master moosefs-chunkserver moosefs-client glusterfs-server glusterfs-client fuse3
labdeps:
	@if command -v mfsmaster >/dev/null 2>&1 && command -v mfschunkserver >/dev/null 2>&1 && \
	    command -v mfsmount >/dev/null 2>&1 && command -v glusterd >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "labdeps: needs root and apt-get; the cluster lab tests will skip"; \
	else \
	  if [ ! -e /usr/sbin/policy-rc.d ]; then \
	    trap 'rm -f /usr/sbin/policy-rc.d' EXIT; printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; \
	    chmod 755 /usr/sbin/policy-rc.d; fi; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      $(LAB_PACKAGES) >/dev/null; } || echo "labdeps: apt-get failed; the cluster lab tests will skip"; \
	fi

# The main job at cluster shape in the lab (issue 19): needs root; installs what the lab needs, then prints the
# table (bench/bench_lab.py: the demo's runs, the fabric, the planner's matrix and the RATIOS line).
lab: venv labdeps
	$(BIN)/python bench/bench_lab.py $(ARGS)

# s3rver (npm, pinned by package.json + package-lock.json) is the test session's second S3 implementation: one
# that ignores conditional writes (tests/conftest.py starts it). Without Node.js the tests that need it skip.
S3RVER_STAMP := node_modules/.s3rver-installed
$(S3RVER_STAMP): package.json package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --no-audit --no-fund --ignore-scripts --silent && touch $(S3RVER_STAMP); \
	else echo "npm not found: tests that need s3rver will skip"; fi

s3rver: $(S3RVER_STAMP)

demo: venv sysdeps
	$(BIN)/ckptio demo $(ARGS)

RUFF := $(BIN)/ruff check src tests bench examples
lint: venv
	$(RUFF)
	$(BIN)/mypy

# The suite runs on TEST_WORKERS pytest-xdist workers: most tests wait on processes they started (writers, ranks,
# servers), not on a core. Tests that share an expensive fixture stay on one worker (tests/conftest.py). 3 on a
# 2-core machine: with 4, a writer at its nice 10 beside four busy workers once took over 120 s to commit a first
# save. TEST_WORKERS=0 runs the suite in this process, as before.
TEST_WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS)
unit: venv sysdeps s3rver labdeps
	$(PYTEST)

# ruff first (a second); mypy (~40 s of one core) beside pytest rather than before it, its report printed after
# pytest's; either failing fails the target.
test: venv sysdeps s3rver labdeps
	$(RUFF)
	@report=$$(mktemp); $(BIN)/mypy >$$report 2>&1 & typing=$$!; \
	$(PYTEST); rc=$$?; \
	wait $$typing || rc=1; echo "$(BIN)/mypy"; cat $$report; rm -f $$report; exit $$rc

# ckptio and plain DCP in both directions at 1-3 gloo ranks (tests/interop); part of `unit` too.
interop: venv
	$(BIN)/python -m pytest tests/interop -m interop $(PYTEST_ARGS)

bench: venv sysdeps
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) ckptio-demo .pytest_cache .mypy_cache .ruff_cache node_modules
