#!/usr/bin/env bash
# The `small` policy preset at its own learning rates (docs/experiments.md §5): from one `make reproduce` seed's data
# and reflection model, SFT the `small` policy (128 hidden, 4 layers) with the demo's settings but lr 3e-4 on the
# plain data (no reflection) and on the relabelled Reflect data, evaluate both greedy on 300 `validation` episodes per
# stage (seed 777), then the recipe's RL from the Reflect one at RL_LRS (default 1e-4 3e-4), RL SEEDS (default 0 1), through
# benchmarks/advantage_estimators.py (paired differences to the SFT start on its own held-out tasks, seed 4242).
#   bash benchmarks/small_policy_rl.sh [SEED_DIR] [-- more `reflect-trl rl` flags for every RL run]
#   -> outputs/bench/small_policy/<variant>/eval/results.md, outputs/bench/small_policy/rl_lr<lr>/results.md
# Each step is skipped when its output exists. One RL run of the `small` policy takes about 18 min here (4x tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
seed_dir=outputs/reproduce/taxi/seed_0
if [ $# -gt 0 ] && [ "$1" != "--" ]; then seed_dir=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
out=outputs/bench/small_policy
mkdir -p $out
data=$seed_dir/data/taxi
reflection=$seed_dir/runs/sft_reflection
small=outputs/bench/policy_sft/small-llama  # the same base model as benchmarks/policy_sft_probes.sh
[ -d $small ] || .venv/bin/reflect-trl build-tiny --output_dir $small --arch llama --preset small --seed 0

source benchmarks/_policy_sft.sh
policy_sft $out small_plain_lr3e-4 $small $data/policy_plain --learning_rate 3e-4
policy_eval $out small_plain_lr3e-4
policy_sft $out small_reflect_lr3e-4 $small $data/policy_reflect_model --learning_rate 3e-4
policy_eval $out small_reflect_lr3e-4 $reflection
for r in $out/*/eval/results.md; do grep greedy "$r"; done

for lr in ${RL_LRS:-1e-4 3e-4}; do
  [ -f $out/rl_lr$lr${RL_TAG:-}/results.md ] && continue
  .venv/bin/python benchmarks/advantage_estimators.py --policy $out/small_reflect_lr3e-4 --reflection $reflection \
    --estimators gigpo --seeds ${SEEDS:-0 1} --output_dir $out/rl_lr$lr${RL_TAG:-} -- --learning_rate $lr "$@"
done
