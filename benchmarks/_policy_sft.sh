# Sourced by the policy probe scripts: the demo's policy SFT settings (at lr 3e-3, the Reflect chain's rate before
# the demo moved every policy SFT to 1e-3; pass --learning_rate 1e-3 for today's) and the probes' greedy
# `validation` evaluation (300 episodes per stage, seed 777). Each step is skipped when its output exists.

policy_sft() {  # OUT NAME BASE DATA [more `reflect-trl sft` flags, e.g. --max_steps 2000 --warmup_steps 60; a
  # later flag wins, so `--role reflection` trains a reflection model with the same settings]
  local out=$1 name=$2 base=$3 dataset=$4; shift 4
  [ -f $out/$name/model.safetensors ] && return 0
  .venv/bin/reflect-trl --no-progress sft --model_name_or_path $base --dataset_path $dataset --env_name taxi \
    --role policy --max_steps 400 --per_device_train_batch_size 16 --learning_rate 3e-3 --lr_scheduler_type cosine \
    --warmup_steps 20 --logging_steps 40 --eval_strategy no --max_length 1024 --max_eval_samples 96 \
    --eval_num_policy_samples 96 --eval_num_reflection_samples 24 --reflection_max_new_tokens 48 \
    --output_dir $out/$name --use_cpu true --bf16 false --seed 0 --report_to none --save_strategy no \
    --disable_tqdm true "$@"
}

policy_eval() {  # OUT NAME [REFLECTION [POLICY]] (no reflection: the policy plays alone; POLICY: default OUT/NAME)
  local out=$1 name=$2 reflection=${3:-} policy=${4:-$1/$2}
  [ -f $out/$name/eval/results.md ] && return 0
  .venv/bin/reflect-trl --no-progress eval --policy $policy ${reflection:+--reflection $reflection} --name $name \
    --split validation --seed 777 --episodes_per_stage 300 --decodings greedy --reflection_temperature 0 \
    --reflection_max_new_tokens 48 --output_dir $out/$name/eval
}

policy_relabel() {  # OUTPUT DATA REFLECTION [more `reflect-trl relabel` flags, e.g. --temperature 0.7]: DATA's
  # Reflect policy rows with REFLECTION's own reflections (greedy unless told, targets kept), as the demo's relabel step
  local output=$1 dataset=$2 reflection=$3; shift 3
  [ -d $output ] && return 0
  .venv/bin/reflect-trl --no-progress relabel --dataset $dataset/policy_reflect.jsonl --reflection_model $reflection \
    --output $output --max_new_tokens 48 --seed 0 --replace "$@"
}
