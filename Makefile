# `make run` and `make test` do all the set-up: they create or refresh .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UNAME := $(shell uname -s)

.PHONY: run test eval lint format bench screenshot blas xcb clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

# Linux only: mlx[cpu] bundles a reference BLAS; kvcore loads OpenBLAS first when it is there.
blas:
ifeq ($(UNAME),Linux)
	@if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libopenblas.so.0'; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "Installing libopenblas0 (optimized BLAS for mlx on Linux)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas0 >/dev/null; \
	  else \
	    echo "Optimized BLAS missing: run 'sudo apt-get install libopenblas0' (tests still run, slower)."; \
	  fi; \
	fi
endif

# Linux only: Qt's xcb platform (a real or xvfb-run display) aborts without these runtime libraries.
XCB_PACKAGES := libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0 \
  libxcb-randr0 libxcb-shape0 libxcb-xfixes0 libxcb-xkb1 libxkbcommon-x11-0 libegl1 libgl1 libfontconfig1 libdbus-1-3 xvfb xauth
xcb:
ifeq ($(UNAME),Linux)
	@if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libxcb-cursor.so.0'; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "Installing Qt's xcb runtime libraries"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(XCB_PACKAGES) >/dev/null; \
	  else \
	    echo "Qt's xcb libraries missing: run 'sudo apt-get install $(XCB_PACKAGES)'"; \
	  fi; \
	fi
endif

run: $(STAMP) xcb
ifeq ($(UNAME),Linux)
	@if [ -z "$$DISPLAY" ] && [ -z "$$WAYLAND_DISPLAY" ] && [ -z "$$QT_QPA_PLATFORM" ]; then \
	  echo "No display found. Run it under a virtual screen: xvfb-run -a make run"; exit 1; fi
endif
	$(BIN)/kvlens

test: $(STAMP) blas
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n auto

# The long demo-model evaluations in full (minutes); `make test` keeps a fixed subset of each.
eval: $(STAMP) blas
	$(BIN)/python -m pytest -q -n auto -m eval

bench: $(STAMP) blas
	$(BIN)/python -m benchmarks.run_all

screenshot: $(STAMP) xcb
	$(BIN)/python scripts/screenshot.py

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
