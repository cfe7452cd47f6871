# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both bootstrap .venv (pinned CPU torch) and the Debian packages they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Development pins torch to the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0

.PHONY: venv sysdeps s3rver demo test lint typecheck unit bench clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e ".[all,dev]" "$(TORCH_PIN)"
	touch $(STAMP)

venv: $(STAMP)

# fio is the anchor of the storage probe and the flush benchmark.
sysdeps:
	@command -v fio >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq fio >/dev/null; }

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

lint: venv
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy

unit: venv sysdeps s3rver
	$(BIN)/python -m pytest --durations=15 $(PYTEST_ARGS)

test: lint unit

bench: venv sysdeps
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) ckptio-demo .pytest_cache .mypy_cache .ruff_cache node_modules
