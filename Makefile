# fastfeed: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# A plain torch requirement would pull a multi-GB CUDA build here: take the CPU wheel first.
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test bench install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install $(TORCH)
	$(PIP) install -e '.[dev,s3,turbo]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -e '.[dev,s3,turbo,ray,dali]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m fastfeed.demo --root demo-data

test: $(VENV)/.installed-test
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) demo-data bench-data build *.egg-info
