#!/usr/bin/env bash
# Policy SFT variants from one `make reproduce` seed's data and reflection model (docs/experiments.md §5), each
# evaluated greedy on 300 `validation` episodes per stage (seed 777) with that seed's SFT'd reflection model:
#   tiny  / relabelled data (the recipe)        tiny  / + crash-reflection rows   tiny / 1200 steps
#   tiny  / reflections sampled at T 0.7, 1.0   small / relabelled data           small / + crash-reflection rows
#   bash benchmarks/policy_sft_probes.sh [SEED_DIR]   -> outputs/bench/policy_sft/<variant>/eval/results.md
set -euo pipefail
cd "$(dirname "$0")/.."
seed_dir=${1:-outputs/reproduce/taxi/seed_0}
out=outputs/bench/policy_sft
mkdir -p $out
data=$seed_dir/data/taxi
reflection=$seed_dir/runs/sft_reflection
py=.venv/bin/python
source benchmarks/_policy_sft.sh
for t in 0.7 1.0; do
  policy_relabel $out/data_T$t $data $reflection --temperature $t
done
[ -d $out/data_crash ] || $py benchmarks/crash_reflection_rows.py --dataset $data/policy_reflect_model \
  --reflection $reflection --output $out/data_crash --samples 4 --temperature 1.0
[ -d $out/small-llama ] || .venv/bin/reflect-trl build-tiny --output_dir $out/small-llama --arch llama --preset small --seed 0

sft_eval() {  # NAME BASE DATA [more sft flags]: SFT, then the evaluation with the seed's reflection model
  local name=$1; policy_sft $out "$@" && policy_eval $out $name $reflection
}
tiny=$seed_dir/models/tiny-llama
sft_eval tiny_relabelled $tiny $data/policy_reflect_model
sft_eval tiny_crash_rows $tiny $out/data_crash
sft_eval tiny_1200_steps $tiny $data/policy_reflect_model --max_steps 1200 --warmup_steps 60
sft_eval tiny_sampled_T0.7 $tiny $out/data_T0.7
sft_eval tiny_sampled_T1.0 $tiny $out/data_T1.0
sft_eval small_relabelled $out/small-llama $data/policy_reflect_model
sft_eval small_crash_rows $out/small-llama $out/data_crash
for r in $out/*/eval/results.md; do grep greedy "$r"; done
