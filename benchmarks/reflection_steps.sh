#!/usr/bin/env bash
# How long to SFT the reflection model (docs/experiments.md §2, third round): from one `make reproduce` seed's data and
# base model, SFT the tiny reflection model with the demo's settings for each of REFLECTION_STEPS (default 1500),
# relabel the seed's Reflect policy data with its reflections, SFT the tiny policy on them for each of POLICY_STEPS
# (default "400 200"), evaluate every pair greedy on 300 `validation` episodes per stage (seed 777), then the recipe's
# RL from every policy, RL seeds SEEDS (default "0 1"), through benchmarks/advantage_estimators.py (paired differences
# to the SFT start on its own held-out tasks, seed 4242).
#   bash benchmarks/reflection_steps.sh [SEED_DIR]
#   -> outputs/bench/refl_steps/policy_r<R>_p<P>/eval/results.md, outputs/bench/refl_steps/rl_r<R>_p<P>/results.md
# The reflection SFT's held-out metrics (how often a reflection names the oracle's action) are in
# reflection_<R>/sft_metrics.json, the relabelled data's share in the relabel output. About 5 min per reflection
# model, 1-2 min per policy, 12 min per RL pair (two runs at a time) here. Each step is skipped when its output exists.
set -euo pipefail
cd "$(dirname "$0")/.."
seed_dir=${1:-outputs/reproduce/taxi/seed_0}
out=outputs/bench/refl_steps
mkdir -p $out
data=$seed_dir/data/taxi
base=$seed_dir/models/tiny-llama

source benchmarks/_policy_sft.sh
for r in ${REFLECTION_STEPS:-1500}; do
  reflection=$out/reflection_$r
  policy_sft $out reflection_$r $base $data/reflection --role reflection --max_steps $r --warmup_steps $((r / 20)) \
    --logging_steps $((r / 10)) --eval_num_reflection_samples 96
  policy_relabel $out/policy_reflect_model_$r $data $reflection
  for p in ${POLICY_STEPS:-400 200}; do
    policy_sft $out policy_r${r}_p$p $base $out/policy_reflect_model_$r --max_steps $p
    policy_eval $out policy_r${r}_p$p $reflection
    [ -f $out/rl_r${r}_p$p/results.md ] || .venv/bin/python benchmarks/advantage_estimators.py \
      --policy $out/policy_r${r}_p$p --reflection $reflection --estimators gigpo --seeds ${SEEDS:-0 1} \
      --output_dir $out/rl_r${r}_p$p
  done
done
for f in $out/*/eval/results.md; do grep greedy "$f"; done
for f in $out/rl_*/results.md; do echo "$f"; grep -A3 "^| run" "$f"; done
