# fastfeed: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# A plain torch requirement would pull a multi-GB CUDA build here: take the CPU wheel first
# (README.md, "Install": on a CPU machine, `pip install torch==2.13.0` before fastfeed).
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=
# Benchmarks run in their own venv (never used by `make test`): torchvision only imports with the
# CUDA build torch==2.14.1 (~5.5 GB, from local disk), and ffcv compiles against Debian's libraries.
BENCH_VENV  ?= .venv-bench
BENCH_PY    := $(BENCH_VENV)/bin/python
BENCH_PIP   := $(BENCH_PY) -m pip --disable-pip-version-check -q
BENCH_TORCH ?= torch==2.14.1 torchvision==0.29.1
BENCH_APT   := libturbojpeg0-dev libopencv-dev pkg-config
BENCH_ARGS  ?=

.PHONY: demo test docs bench bench-env install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# fastfeed/_jpegroi.c, fastfeed/_resize.c: optional C extensions, built by the editable install (pyproject)
$(VENV)/.installed: pyproject.toml fastfeed/_jpegroi.c fastfeed/_resize.c | $(PY)
	$(PIP) install $(TORCH)
	$(PIP) install -e '.[dev,s3,turbo]'
	touch $@

# mkdocs, mkdocstrings-python (the docs extra) and import-linter (dev) for `make docs` / `make test`
$(VENV)/.installed-docs: $(VENV)/.installed
	$(PIP) install -e '.[dev,docs,s3,turbo]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-docs
	$(PIP) install -e '.[dev,docs,s3,turbo,ray,dali]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m tools.demo --root demo-data

# The suite, then the docstrings' examples (doctests), the import layering (pyproject's
# [tool.importlinter]) and the site with --strict (a broken link or a stale API name fails).
test: $(VENV)/.installed-test
	$(PY) -m pytest -q $(PYTEST_ARGS)
	$(PY) -m pytest -q -p no:cacheprovider --doctest-modules fastfeed
	$(BIN)/lint-imports --no-cache
	$(BIN)/mkdocs build --strict

# The site (mkdocs.yml, docs/) into build/site (never -q: it hides the warnings --strict counts); `$(BIN)/mkdocs serve` to browse it while editing.
docs: $(VENV)/.installed-docs
	$(BIN)/mkdocs build --strict

$(BENCH_PY):
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PIP) install --upgrade pip

# apt-get runs only when one of the Debian packages ffcv builds against is missing.
$(BENCH_VENV)/.installed: pyproject.toml benchmarks/requirements-bench.txt fastfeed/_jpegroi.c fastfeed/_resize.c | $(BENCH_PY)
	@missing="$$(for p in $(BENCH_APT); do dpkg -s $$p >/dev/null 2>&1 || printf '%s ' $$p; done)"; \
	if [ -n "$$missing" ]; then \
	  echo "apt-get install -y $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	$(BENCH_PIP) install $(BENCH_TORCH)
	$(BENCH_PIP) install -e '.[s3,turbo,ray]' -r benchmarks/requirements-bench.txt
	touch $@

bench-env: $(BENCH_VENV)/.installed

bench: $(BENCH_VENV)/.installed
	$(BENCH_PY) benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) demo-data bench-data build *.egg-info
