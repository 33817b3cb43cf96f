# Each target installs what it needs into .venv on a fresh machine.
# Where an NVIDIA driver answers, torch==2.14.1, the newest tested release (PyPI's CUDA build);
# elsewhere torch==2.13.0, the CPU build. Both ends of pyproject.toml's tested range run in CI
# (.ci/run); TORCH_SPEC overrides the choice, and pip refuses a torch outside that range.

VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HAS_NVIDIA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH_SPEC ?= $(if $(HAS_NVIDIA),torch==2.14.1,torch==2.13.0)
# bitsandbytes (8-bit AdamW, QLoRA) ships wheels for Linux (CUDA and CPU backends); elsewhere
# `pip install 'vramkit[bnb]'` by hand where your platform has a wheel.
EXTRAS ?= dev,nlp,tensorboard,mlflow,onnx$(if $(filter Linux,$(shell uname -s)),$(comma)bnb)
comma := ,
ARGS ?=

.PHONY: install train test test-wheel test-fast bench lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
# One resolve of TORCH_SPEC with the package: a torch outside pyproject.toml's range is refused.
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" -e ".[$(EXTRAS)]"  # dev brings Polygon3 ("official")
# pip compiles no bytecode for an editable install, and where PYTHONDONTWRITEBYTECODE is set no run
# writes it either: every run would compile ours again (0.15-0.20 s of CPU for the 99 a plan imports).
	$(PY) -m compileall -q vramkit scripts
	touch $(STAMP)

train: install  ## train the default job on the detected hardware (ARGS="+hw=t4 ..." to pass overrides)
	$(PY) train.py $(ARGS)

# --dist worksteal: an idle worker takes tests queued for the busy one, so the suite does not end
# with one core waiting while the other runs the end-to-end tests collected last (tests/e2e).
test: install  ## the whole test suite but the wheel's (end-to-end runs included; under 8 minutes on 2 cores)
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not wheel"

test-wheel: install  ## build the wheel, install it apart from the checkout, run every documented command
	$(PY) -m pytest -q -p no:xdist -m wheel tests/test_installed_package.py

test-fast: install  ## the suite without the end-to-end runs
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not slow"

bench: install  ## speed benchmarks; JSON results in benchmarks/results/ (about 26 minutes on 2 cores, docs/benchmarks.md)
	$(PY) -m benchmarks.run_all

lint: install  ## ruff, formatting, and the import contracts (core imports no task; no cycles)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
