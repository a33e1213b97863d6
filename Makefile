# Two commands for a new user: `make demo` and `make test`.  Both create .venv when it is missing
# and (re)install the project only when pyproject.toml is newer than the install stamp.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mcpc-installed
OUT    ?= out
# The bundled example compiled by `make demo` (written by `mcpc examples build`).
DEMO_MODEL ?= $(OUT)/mlp.onnx

.PHONY: demo test test-all lint venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/mcpc examples build $(OUT)
	@if $(BIN)/mcpc sim --help >/dev/null 2>&1; then \
		set -x; \
		$(BIN)/mcp-compile -o $(OUT)/demo.mcpb $(DEMO_MODEL) && \
		$(BIN)/mcpc sim run $(OUT)/demo.mcpb --random-inputs --seed 0; \
	else \
		echo "(the simulator is not part of this build yet: compiling to IR text)"; set -x; \
		$(BIN)/mcp-compile --emit ir -o $(OUT)/demo.mcpir $(DEMO_MODEL); \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/pytest -m "not slow"

test-all: lint
	$(BIN)/pytest

clean:
	rm -rf $(OUT) build .pytest_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
