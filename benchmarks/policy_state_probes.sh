#!/usr/bin/env bash
# Can the policy read the DangerousTaxi state without a reflection? (docs/experiments.md §5) From one `make reproduce`
# seed's data: the plain policy (no reflection) SFT'd longer (2000 steps) and at the `small` size (400 steps), each
# evaluated greedy without a reflection; then the Reflect policy SFT'd (400 steps, the recipe's data) from the
# 2000-step plain policy instead of the base model, evaluated with the seed's reflection model. 300 `validation`
# episodes per stage, seed 777.
#   bash benchmarks/policy_state_probes.sh [SEED_DIR]   -> outputs/bench/policy_state/<variant>/eval/results.md
set -euo pipefail
cd "$(dirname "$0")/.."
seed_dir=${1:-outputs/reproduce/taxi/seed_0}
out=outputs/bench/policy_state
mkdir -p $out
data=$seed_dir/data/taxi
reflection=$seed_dir/runs/sft_reflection
small=outputs/bench/policy_sft/small-llama  # built by benchmarks/policy_sft_probes.sh
[ -d $small ] || .venv/bin/reflect-trl build-tiny --output_dir $small --arch llama --preset small --seed 0

source benchmarks/_policy_sft.sh
policy_sft $out tiny_plain_2000_steps $seed_dir/models/tiny-llama $data/policy_plain --max_steps 2000
policy_eval $out tiny_plain_2000_steps
policy_sft $out small_plain $small $data/policy_plain
policy_eval $out small_plain
policy_sft $out tiny_reflect_from_plain $out/tiny_plain_2000_steps $data/policy_reflect_model
policy_eval $out tiny_reflect_from_plain $reflection
for r in $out/*/eval/results.md; do grep greedy "$r"; done
