#!/usr/bin/env bash
# What RL changes in the Reflect policy of every `make reproduce` seed: Reflect SFT (before RL) vs Reflect-RL on the
# `validation` split, greedy and policy-sampled decoding (reflections greedy in both), 300 episodes per stage.
#   bash benchmarks/sampled_vs_greedy.sh [REPRODUCE_DIR] [SEEDS...]   -> outputs/analysis/sampled_eval/seed_<s>/
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-outputs/reproduce/taxi}
shift || true
seeds=${*:-0 1 2}
for s in $seeds; do
  runs=$dir/seed_$s/runs
  config=$(mktemp --suffix .yaml)
  cat > "$config" <<YAML
configurations:
  - {name: Reflect SFT (before RL), policy: $runs/sft_policy, reflection: $runs/sft_reflection}
  - {name: Reflect-RL, policy: $runs/rl_reflect, reflection: $runs/sft_reflection}
split: validation
decodings: [greedy, sampled]
reflection_temperature: 0.0
episodes_per_stage: 300
seed: 777
reflection_max_new_tokens: 48
device: cpu
output_dir: outputs/analysis/sampled_eval/seed_$s
YAML
  .venv/bin/reflect-trl --no-progress eval --config "$config"
  rm -f "$config"
done
