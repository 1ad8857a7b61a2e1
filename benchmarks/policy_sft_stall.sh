#!/usr/bin/env bash
# The Reflect policy SFT that ended at 79 % option accuracy on seed 0 of `make reproduce` (docs/experiments.md §1):
# is it the float rounding of the shared-prefix forwards, and would lr 1e-3 have converged? The demo's policy SFT
# settings (benchmarks/_policy_sft.sh), on the data of this reproduction (NEW) and of the previous version's
# (PREV, whose SFT reached 93.8 %), with and without the shared prefix; two runs at a time, one thread each.
#   bash benchmarks/policy_sft_stall.sh [NEW_SEED_DIR] [PREV_SEED_DIR]   -> outputs/bench/policy_sft_stall/*/sft_metrics.json
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/_policy_sft.sh
NEW=${1:-outputs/reproduce/taxi/seed_0}
PREV=${2:-outputs/reproduce_prev/taxi/seed_0}
OUT=outputs/bench/policy_sft_stall
export OMP_NUM_THREADS=1
policy_sft $OUT prev_data_prefix $PREV/models/tiny-llama $PREV/data/taxi/policy_reflect_model &
policy_sft $OUT prev_data_plain $PREV/models/tiny-llama $PREV/data/taxi/policy_reflect_model --shared_prefix_min_tokens 0 &
wait
policy_sft $OUT new_data_plain $NEW/models/tiny-llama $NEW/data/taxi/policy_reflect_model --shared_prefix_min_tokens 0 &
policy_sft $OUT new_data_lr1e-3 $NEW/models/tiny-llama $NEW/data/taxi/policy_reflect_model --learning_rate 1e-3 &
wait
policy_sft $OUT new_data_prefix $NEW/models/tiny-llama $NEW/data/taxi/policy_reflect_model  # the reproduction's own
for run in prev_data_prefix prev_data_plain new_data_plain new_data_lr1e-3 new_data_prefix; do
  .venv/bin/python -c "import json,sys; m=json.load(open('$OUT/$run/sft_metrics.json')); print(f\"$run: option accuracy {100*m['eval_option_accuracy']:.1f} %, train loss {m['train_loss']:.3f}\")"
done
