#!/usr/bin/env bash
# The policy SFT learning rate of each chain (docs/experiments.md §2, fourth round): from one `make reproduce` seed
# whose policies were SFT'd at 3e-3 (the recipe before `sft_run_learning_rates`), SFT the Reflect policy (with
# negatives), the w/o-negatives policy and the plain policy at RATE (default 1e-3) with the demo's settings otherwise
# (benchmarks/_policy_sft.sh: 400 steps, batch 16, cosine, the seed as SFT seed), then evaluate each next to the
# seed's own policy of the same chain, greedy, 300 `validation` episodes per stage (seed 777).
#   bash benchmarks/policy_sft_rates.sh SEED_DIR SEED [RATE]
#   -> outputs/bench/policy_sft_rates/seed_<SEED>/eval_{reflect,plain}/results.md
# About 2 min per policy SFT and 3 min of evaluation per seed here. Each step is skipped when its output exists.
set -euo pipefail
cd "$(dirname "$0")/.."
seed_dir=$1 seed=$2 rate=${3:-1e-3}
out=outputs/bench/policy_sft_rates/seed_$seed
runs=$seed_dir/runs data=$seed_dir/data/taxi base=$seed_dir/models/tiny-llama
mkdir -p $out

source benchmarks/_policy_sft.sh
policy_sft $out reflect_$rate $base $data/policy_reflect_model --learning_rate $rate --seed $seed
policy_sft $out positive_$rate $base $data/policy_reflect_positive_model --learning_rate $rate --seed $seed
policy_sft $out plain_$rate $base $data/policy_plain --learning_rate $rate --seed $seed
common=(--split validation --seed 777 --episodes_per_stage 300 --decodings greedy)
[ -f $out/eval_reflect/results.md ] || .venv/bin/reflect-trl --no-progress eval \
  --policy $runs/sft_policy --reflection $runs/sft_reflection --name reflect_seed_run \
  --policy $out/reflect_$rate --reflection $runs/sft_reflection --name reflect_$rate \
  --policy $runs/sft_policy_positive --reflection $runs/sft_reflection_positive --name positive_seed_run \
  --policy $out/positive_$rate --reflection $runs/sft_reflection_positive --name positive_$rate \
  "${common[@]}" --reflection_temperature 0 --reflection_max_new_tokens 48 --output_dir $out/eval_reflect
[ -f $out/eval_plain/results.md ] || .venv/bin/reflect-trl --no-progress eval \
  --policy $runs/sft_plain --name plain_seed_run --policy $out/plain_$rate --name plain_$rate \
  "${common[@]}" --output_dir $out/eval_plain
grep -h greedy $out/eval_reflect/results.md $out/eval_plain/results.md
