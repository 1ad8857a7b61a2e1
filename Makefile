# reflect-trl — every target uses the virtual environment $(VENV) created by `make install`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build on CPU machines. On a GPU machine the
# same pin installs PyPI's CUDA build of torch 2.13; set TORCH_SPEC to choose another build.
TORCH_SPEC ?= torch==2.13.0
ENV ?= taxi
# CPU recipes for the tiny local models by default; real-model recipes: RECIPES=recipes/$(ENV)
RECIPES ?= recipes/$(ENV)/cpu
ACCELERATE_CONFIG ?= recipes/accelerate_configs/cpu.yaml
LAUNCH := $(VENV)/bin/accelerate launch --config_file $(ACCELERATE_CONFIG) -m reflect_trl.cli
ROLE ?= policy
# `make demo` writes outputs/demo (DangerousTaxi) or outputs/demo_<env> for ENV=auto_explore, textworld, ...
DEMO_DIR ?= outputs/demo$(if $(filter-out taxi,$(ENV)),_$(ENV))
ARGS ?=
PYTEST_ARGS ?=

.PHONY: help install install-extras test test-slow test-all lint format tiny data sft sft-all rl eval plot demo bench clean

help:
	@echo "make install          create $(VENV) (CPU torch pinned) and install reflect-trl[dev]"
	@echo "make test             default test suite (no slow tests)"
	@echo "make demo             the whole method end to end on tiny models -> outputs/demo/ (ENV=auto_explore -> outputs/demo_auto_explore/)"
	@echo "make tiny             build the tiny offline models under models/"
	@echo "make data ENV=taxi    SFT datasets with negative examples -> data/<env>/"
	@echo "make sft ROLE=policy|reflection|plain ENV=taxi    SFT warm-up (recipe $(RECIPES)/sft_<role>.yaml)"
	@echo "make rl ENV=taxi      online RL (recipe $(RECIPES)/rl.yaml; ACCELERATE_CONFIG=... for DDP/ZeRO/FSDP)"
	@echo "make eval / plot / bench / lint"

$(PY):
	python3 -m venv $(VENV)

install: $(PY)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH_SPEC)
	$(PIP) install -e ".[dev]"

install-extras: $(PY)
	$(PIP) install -e ".[dev,textworld,alfworld,serve]"

test:
	$(VENV)/bin/pytest -m "not slow" $(PYTEST_ARGS)

test-slow:
	$(VENV)/bin/pytest -m "slow" $(PYTEST_ARGS)

test-all:
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint:
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

format:
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

tiny:
	$(PY) -m reflect_trl.cli build-tiny --output_dir models/tiny-llama-$(ENV) --arch llama --preset tiny --envs $(ENV)

data:
	$(PY) -m reflect_trl.cli data --config $(RECIPES)/data.yaml $(ARGS)

sft:
	$(LAUNCH) sft --config $(RECIPES)/sft_$(ROLE).yaml $(ARGS)

sft-all:
	$(MAKE) sft ROLE=reflection
	$(MAKE) sft ROLE=policy
	$(MAKE) sft ROLE=plain

rl:
	$(LAUNCH) rl --config $(RECIPES)/rl.yaml $(ARGS)

eval:
	$(PY) -m reflect_trl.cli eval --config $(RECIPES)/eval.yaml $(ARGS)

plot:
	$(PY) -m reflect_trl.cli plot $(ARGS)

demo:
	$(PY) -m reflect_trl.cli demo --env_name $(ENV) --output_dir $(DEMO_DIR) $(ARGS)

bench:
	$(PY) benchmarks/rollout_throughput.py $(ARGS)

clean:
	rm -rf outputs wandb .pytest_cache .ruff_cache
