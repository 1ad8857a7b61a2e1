#!/usr/bin/env bash
# SmolLM2-135M-Instruct zero-shot (no SFT) on DangerousTaxi `test` (docs/performance.md, "Zero-shot"):
#   (a) as the reflection player of a tiny SFT'd policy, (b) as the policy, with the tiny SFT'd reflection player or
#   none, beside the oracle, random and the tiny SFT'd pair; `reflection_follower` (takes the move a reflection
#   names) reads each reflection player's plans alone. Greedy decoding, EPISODES episodes per stage.
# Needs `make real-model` and `make tiny`. The tiny pair: the CPU recipes, the policy's data with the oracle's
# reflections (no relabel), the reflection SFT cut to REFLECTION_STEPS steps.
#   bash benchmarks/real_model_zero_shot.sh            # -> outputs/zero_shot/eval/results.md
set -euo pipefail
OUT=${OUT:-outputs/zero_shot}
EPISODES=${EPISODES:-20}
REFLECTION_STEPS=${REFLECTION_STEPS:-600}
REAL=${REAL:-models/smollm2-135m-instruct}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
R=".venv/bin/python -m reflect_trl.cli --no-progress"
[ -d "$OUT/data/taxi/reflection" ] || $R data --config recipes/taxi/cpu/data.yaml --output_dir "$OUT/data" > "$OUT/data.log" 2>&1
[ -f "$OUT/sft_reflection/model.safetensors" ] || \
  $R sft --config recipes/taxi/cpu/sft_reflection.yaml --dataset_path "$OUT/data/taxi/reflection" \
    --output_dir "$OUT/sft_reflection" --report_to none --eval_strategy no --max_steps "$REFLECTION_STEPS" \
    > "$OUT/sft_reflection.log" 2>&1
[ -f "$OUT/sft_policy/model.safetensors" ] || \
  $R sft --config recipes/taxi/cpu/sft_policy.yaml --dataset_path "$OUT/data/taxi/policy_reflect" \
    --output_dir "$OUT/sft_policy" --report_to none --eval_strategy no > "$OUT/sft_policy.log" 2>&1
time $R eval --env_name taxi --split test --decodings greedy --episodes_per_stage "$EPISODES" \
  --batch_size "$EPISODES" --reflection_max_new_tokens 48 --device cpu --output_dir "$OUT/eval" \
  --policy oracle --name oracle \
  --policy random --name random \
  --policy "$OUT/sft_policy" --reflection "$OUT/sft_reflection" --name "tiny SFT policy + tiny SFT reflection" \
  --policy reflection_follower --reflection "$OUT/sft_reflection" --name "follow the tiny SFT reflection" \
  --policy "$OUT/sft_policy" --reflection "$REAL" --name "(a) tiny SFT policy + SmolLM2 zero-shot reflection" \
  --policy reflection_follower --reflection "$REAL" --name "(a) follow the SmolLM2 zero-shot reflection" \
  --policy "$REAL" --reflection "$OUT/sft_reflection" --name "(b) SmolLM2 zero-shot policy + tiny SFT reflection" \
  --policy "$REAL" --name "(b) SmolLM2 zero-shot policy, no reflection"
