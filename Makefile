# reflect-trl — every target uses the virtual environment $(VENV) created by `make install`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch first, at a pinned version. The pin fixes the version, not the build: pip takes the build its index offers
# (PyPI's Linux wheels are CUDA builds, multi-GB). TORCH_INDEX picks the index of torch alone, e.g. the CPU build:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Set TORCH_SPEC to choose another version (TORCH_SPEC=torch keeps an installed torch).
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
ENV ?= taxi
# CPU recipes for the tiny local models by default; real-model recipes: RECIPES=recipes/$(ENV)
RECIPES ?= recipes/$(ENV)/cpu
ACCELERATE_CONFIG ?= recipes/accelerate_configs/cpu.yaml
# Threads per process on a CPU: the cores over the processes of ACCELERATE_CONFIG (given to accelerate, which
# otherwise picks a value itself and prints a notice about it).
CPU_THREADS ?= $(shell p=$$(awk '/^num_processes:/{print $$2}' $(ACCELERATE_CONFIG) 2>/dev/null); \
	n=$$(( $$(nproc 2>/dev/null || echo 1) / $${p:-1} )); echo $$(( n > 0 ? n : 1 )))
LAUNCH = $(VENV)/bin/accelerate launch --config_file $(ACCELERATE_CONFIG) --num_cpu_threads_per_process $(CPU_THREADS) -m reflect_trl.cli
# Where the recipes of $(RECIPES) write (recipes/taxi/cpu -> outputs/taxi/cpu)
OUTPUTS ?= outputs/$(patsubst recipes/%,%,$(RECIPES))
ROLE ?= policy
# `make demo` writes outputs/demo (DangerousTaxi) or outputs/demo_<env> for ENV=auto_explore, textworld, ...
DEMO_DIR ?= outputs/demo$(if $(filter-out taxi,$(ENV)),_$(ENV))
ARGS ?=
PYTEST_ARGS ?=

.PHONY: help install install-extras test test-slow test-all lint format tiny data sft sft-all relabel rl rl-plain eval plot demo reproduce bench clean

help:
	@echo "make install          create $(VENV), torch 2.13 first, then reflect-trl[dev] (CPU build: TORCH_INDEX=https://download.pytorch.org/whl/cpu)"
	@echo "make test             default test suite (no slow tests)"
	@echo "make demo             the whole method end to end on tiny models -> outputs/demo/ (ENV=auto_explore -> outputs/demo_auto_explore/)"
	@echo "make reproduce        the demo for SEEDS (default 0 1 2): pooled table + paired comparisons -> outputs/reproduce/<env>/"
	@echo "make tiny             build the tiny offline models under models/"
	@echo "make data ENV=taxi    SFT datasets with negative examples -> data/<env>/"
	@echo "make sft ROLE=policy|reflection|plain ENV=taxi    SFT warm-up (recipe $(RECIPES)/sft_<role>.yaml)"
	@echo "make rl ENV=taxi      online RL (recipe $(RECIPES)/rl.yaml; ACCELERATE_CONFIG=... for DDP/ZeRO/FSDP)"
	@echo "make rl-plain         the no-reflection baseline (same recipe from sft_plain, no reflection model)"
	@echo "make eval / plot / bench / lint"

$(PY):
	python3 -m venv $(VENV)

install: $(PY)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH_SPEC) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
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
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples

format:
	$(VENV)/bin/ruff format src tests benchmarks examples
	$(VENV)/bin/ruff check --fix src tests benchmarks examples

tiny:
	$(PY) -m reflect_trl.cli build-tiny --output_dir models/tiny-llama-$(ENV) --arch llama --preset tiny --envs $(ENV)

data:
	$(PY) -m reflect_trl.cli data --config $(RECIPES)/data.yaml $(ARGS)

sft:
	$(LAUNCH) sft --config $(RECIPES)/sft_$(ROLE).yaml $(ARGS)

sft-all:
	$(MAKE) sft ROLE=reflection
	$(MAKE) relabel
	$(MAKE) sft ROLE=policy
	$(MAKE) sft ROLE=plain

# the policy's SFT data with the SFT'd reflection model's own reflections (targets unchanged): what it will read in RL
relabel:
	$(PY) -m reflect_trl.cli relabel --dataset data/$(ENV)/policy_reflect.jsonl \
		--reflection_model $(OUTPUTS)/sft_reflection --output data/$(ENV)/policy_reflect_model --replace $(ARGS)

rl:
	$(LAUNCH) rl --config $(RECIPES)/rl.yaml $(ARGS)

# the no-reflection baseline: the same RL recipe from the plain SFT policy (make sft ROLE=plain), no reflection model
rl-plain:
	$(LAUNCH) rl --config $(RECIPES)/rl.yaml --model_name_or_path $(OUTPUTS)/sft_plain \
		--reflection_model_name_or_path none --output_dir $(OUTPUTS)/rl_plain $(ARGS)

eval:
	$(PY) -m reflect_trl.cli eval --config $(RECIPES)/eval.yaml $(ARGS)

plot:
	$(PY) -m reflect_trl.cli plot $(ARGS)

demo:
	$(PY) -m reflect_trl.cli demo --env_name $(ENV) --output_dir $(DEMO_DIR) $(ARGS)

# the demo for SEEDS, pooled evaluation and paired comparisons -> outputs/reproduce/$(ENV)/
SEEDS ?= 0 1 2
reproduce:
	$(PY) -m reflect_trl.cli reproduce --env_name $(ENV) --seeds $(SEEDS) $(ARGS)

bench:
	$(PY) benchmarks/rollout_throughput.py $(ARGS)

clean:
	rm -rf outputs wandb .pytest_cache .ruff_cache
