#!/usr/bin/env bash
# A `small` reflection model at its own learning rate (docs/experiments.md §5): from one `make reproduce` seed's data,
# SFT the `small` preset (128 hidden, 4 layers) as the reflection model with the demo's settings (1200 steps) but
# lr 3e-4 (SFT_ARGS adds flags), relabel the seed's Reflect policy data with its reflections, SFT the tiny policy on it
# with the demo's settings, and evaluate that pair greedy on 300 `validation` episodes per stage (seed 777) -- next to
# the seed's own pair (tiny reflection model, the recipe's `sft_policy`), evaluated the same way.
#   bash benchmarks/small_reflection.sh [SEED_DIR]   -> outputs/bench/small_reflection/*/eval/results.md
# The reflection SFT's held-out metrics (how often a reflection names the oracle's action, stop rate) are in
# outputs/bench/small_reflection/small_reflection_lr3e-4/sft_metrics.json. Each step is skipped when its output exists.
set -euo pipefail
cd "$(dirname "$0")/.."
seed_dir=${1:-outputs/reproduce/taxi/seed_0}
out=outputs/bench/small_reflection
mkdir -p $out
data=$seed_dir/data/taxi
small=outputs/bench/policy_sft/small-llama  # the same base model as benchmarks/policy_sft_probes.sh
[ -d $small ] || .venv/bin/reflect-trl build-tiny --output_dir $small --arch llama --preset small --seed 0
reflection=$out/small_reflection_lr3e-4

source benchmarks/_policy_sft.sh
policy_sft $out small_reflection_lr3e-4 $small $data/reflection --role reflection --max_steps 1200 \
  --warmup_steps 60 --logging_steps 120 --learning_rate 3e-4 --eval_num_reflection_samples 96 ${SFT_ARGS:-}
policy_relabel $out/data_small_reflection $data $reflection

policy_sft $out tiny_policy $seed_dir/models/tiny-llama $out/data_small_reflection
policy_eval $out tiny_policy $reflection
policy_eval $out recipe_pair $seed_dir/runs/sft_reflection $seed_dir/runs/sft_policy
for r in $out/*/eval/results.md; do grep greedy "$r"; done
