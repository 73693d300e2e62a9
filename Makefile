# geosharp — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch 2.13.0 lies on disk on the project's machines; installing it first keeps the
# project's normal torch range (pyproject) from pulling a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast docs derive bench bench-quick clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PIP) install --quiet $(TORCH_PIN) || $(PIP) install --quiet "torch>=2.2"
	$(PIP) install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/geosharp demo

# one test process per core (at most 4), each test file on one process (its module fixtures built once)
XDIST := -n auto --maxprocesses=4 --dist loadfile

test: $(STAMP)
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q $(XDIST) tests --nbmake notebooks

test-fast: $(STAMP)
	$(PY) -m pytest -q -x $(XDIST) tests -m "not slow"

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

derive: $(STAMP)
	$(VENV)/bin/geosharp derive

bench: $(STAMP)
	$(PY) benchmarks/run.py

bench-quick: $(STAMP)
	$(PY) benchmarks/run.py --quick

clean:
	rm -rf $(VENV) build *.egg-info
