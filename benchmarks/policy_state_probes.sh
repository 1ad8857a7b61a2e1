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

sft() {  # NAME BASE DATA STEPS: the demo's policy SFT settings
  [ -f $out/$1/model.safetensors ] && return 0
  .venv/bin/reflect-trl --no-progress sft --model_name_or_path $2 --dataset_path $3 --env_name taxi --role policy \
    --max_steps $4 --per_device_train_batch_size 16 --learning_rate 3e-3 --lr_scheduler_type cosine \
    --warmup_steps 20 --logging_steps 100 --eval_strategy no --max_length 1024 --max_eval_samples 96 \
    --eval_num_policy_samples 96 --eval_num_reflection_samples 24 --reflection_max_new_tokens 48 \
    --output_dir $out/$1 --use_cpu true --bf16 false --seed 0 --report_to none --save_strategy no --disable_tqdm true
}
evaluate() {  # NAME [REFLECTION]
  [ -f $out/$1/eval/results.md ] && return 0
  .venv/bin/reflect-trl --no-progress eval --policy $out/$1 ${2:+--reflection $2} --name $1 --split validation \
    --seed 777 --episodes_per_stage 300 --decodings greedy --reflection_max_new_tokens 48 --output_dir $out/$1/eval
}
sft tiny_plain_2000_steps $seed_dir/models/tiny-llama $data/policy_plain 2000 && evaluate tiny_plain_2000_steps
sft small_plain $small $data/policy_plain 400 && evaluate small_plain
sft tiny_reflect_from_plain $out/tiny_plain_2000_steps $data/policy_reflect_model 400
evaluate tiny_reflect_from_plain $reflection
for r in $out/*/eval/results.md; do grep greedy "$r"; done
