#!/bin/bash
# Megatron-DeepSpeed's examples_deepspeed/rebase/ds_pretrain_gpt_125M_flashattn.sh, shrunk: the
# sizes (model, batches, token and sample budgets, warm-up and decay tokens, parallel sizes, GPUs,
# intervals) made small, the paths given by the caller, the ds_ssh pointer fix-up for several nodes
# left out, `deepspeed --num_gpus=N pretrain_gpt.py` replaced by `troupe launch --nproc-per-node N
# -- train`. The flags and the DeepSpeed JSON template (ds_config_gpt_TEMPLATE.json beside it, the
# generated examples_deepspeed/rebase/ds_config_gbs256_mbs8_log1_zero1.json with its placeholders,
# filled by sed as the script does) are as Megatron-DeepSpeed wrote them, fp16 included.
dir=${SCRIPT_DIR:-`pwd`}
seq_len=32

## GPT-3 Small 125M
model_size=0.125
num_layers=2
hidden_size=48
num_attn_heads=4
global_batch_size=8
lr=6.0e-4
min_lr=1.0e-6
init_std=0.02
###############################################################################
### Training duration configs
train_tokens_in_billion=300
train_tokens=$((10 * 8 * ${seq_len}))
train_samples=$(( 300 * 2 / 3 ))
exit_duration=30000000
###############################################################################
### lr configs
lr_warmup_tokens_in_million=3000
lr_warmup_tokens=$((2 * 8 * ${seq_len}))
lr_decay_tokens_in_billion=${train_tokens_in_billion}
lr_decay_tokens=${train_tokens}
lr_decay_style="cosine"
###############################################################################
### Parallelism configs
mp_size=2
pp_size=2
no_pp="false"
zero_stage=1
num_gpus=4
num_gpus_pernode=4
num_node=1
dp_size=$(( ${num_gpus} / ${pp_size} / ${mp_size} ))
batch_size=2
###############################################################################
### Misc configs
log_interval=5
eval_iters=2
eval_interval=5
num_save=500
estimated_train_iter=$((${train_tokens} / ${seq_len} / ${global_batch_size}))
save_interval=5
activation_checkpoint="true"
log_optimizer_state="true"
###############################################################################
### Output and data configs
current_time=$(date "+%Y.%m.%d_%H.%M.%S")
host="${HOSTNAME}"
seed=1234
num_workers=0

VOCAB_PATH=${VOCAB_PATH}
MERGE_PATH=${MERGE_PATH}
DATA_BLEND=${DATA_BLEND}

prescale_grad="true"
jobname="gpt_${model_size}B_tok${train_tokens_in_billion}B"
jobname="${jobname}_lr${lr}_min${min_lr}_w${lr_warmup_tokens_in_million}M_d${lr_decay_tokens_in_billion}B_${lr_decay_style}"
jobname="${jobname}_gbs${global_batch_size}_mbs${batch_size}_g${num_gpus}"
if [[ $zero_stage -gt 0 ]]; then
    jobname="${jobname}_z${zero_stage}"
    prescale_grad="false"
fi
if [[ $mp_size -gt 1 ]]; then
    jobname="${jobname}_mp${mp_size}"
fi
if [ "${no_pp}" = "false" ]; then
    jobname="${jobname}_pp${pp_size}"
fi
jobname="${jobname}_seed${seed}_rebase"

output_home="output"
log_path="${output_home}/log/"
checkpoint_path="${output_home}/checkpoint/${jobname}"
tensorboard_dir="${output_home}/tensorboard/"
tensorboard_path="${tensorboard_dir}${jobname}_${host}_${current_time}"
mkdir -p ${log_path}
mkdir -p ${checkpoint_path}
mkdir -p ${tensorboard_path}
###############################################################################
data_options=" \
         --vocab-file ${VOCAB_PATH} \
         --merge-file ${MERGE_PATH} \
         --data-path ${DATA_BLEND} \
         --data-impl mmap"

megatron_options=" \
    --no-gradient-accumulation-fusion \
    --override-opt_param-scheduler \
    --adam-beta1 0.9 \
    --adam-beta2 0.95 \
    --tensor-model-parallel-size ${mp_size} \
    --init-method-std ${init_std} \
    --lr-decay-tokens ${lr_decay_tokens} \
    --lr-warmup-tokens ${lr_warmup_tokens} \
    --micro-batch-size ${batch_size} \
    --exit-duration-in-mins ${exit_duration} \
    --global-batch-size ${global_batch_size} \
    --num-layers ${num_layers} \
    --hidden-size ${hidden_size} \
    --num-attention-heads ${num_attn_heads} \
    --seq-length ${seq_len} \
    --max-position-embeddings ${seq_len} \
    --train-tokens ${train_tokens} \
    --train-samples ${train_samples} \
    --lr ${lr} \
    --min-lr ${min_lr} \
    --lr-decay-style ${lr_decay_style} \
    --split 949,50,1 \
    --log-interval ${log_interval} \
    --eval-interval ${eval_interval} \
    --eval-iters ${eval_iters} \
    --save-interval ${save_interval} \
    --weight-decay 0.1 \
    --clip-grad 1.0 \
    --hysteresis 2 \
    --num-workers ${num_workers} \
    --fp16 \
    --seed ${seed} \
    --load ${checkpoint_path} \
    --save ${checkpoint_path} \
    --no-async-tensor-model-parallel-allreduce \
    --use-flash-attn \
    --tensorboard-queue-size 1 \
    --log-timers-to-tensorboard \
    --log-batch-size-to-tensorboard \
    --log-validation-ppl-to-tensorboard \
    --tensorboard-dir ${tensorboard_path}"

if [ "${activation_checkpoint}" = "true" ]; then
megatron_options="${megatron_options} \
    --checkpoint-activations"
fi

if [ "${log_optimizer_state}" = "true" ]; then
megatron_options="${megatron_options} \
    --log-optimizer-states-to-tensorboard"
fi

config_json="ds_config_gbs${global_batch_size}_mbs${batch_size}_log${log_interval}_zero${zero_stage}.json"
template_json="${dir}/ds_config_gpt_TEMPLATE.json"
sed "s/GBSIZE/${global_batch_size}/" ${template_json} \
    | sed "s/MBSIZE/${batch_size}/" \
    | sed "s/LOG_INTERVAL/${log_interval}/" \
    | sed "s/ZERO_STAGE/${zero_stage}/" \
    | sed "s/PRESCALE_GRAD/${prescale_grad}/" \
      > ${config_json}

deepspeed_options=" \
    --deepspeed \
    --deepspeed_config ${config_json} \
    --zero-stage ${zero_stage} \
    --pipeline-model-parallel-size ${pp_size}"

if [[ "${no_pp}" = "true" ]]; then
deepspeed_options="${deepspeed_options} \
    --no-pipeline-parallel"
fi

if [ "${activation_checkpoint}" = "true" ]; then
deepspeed_options="${deepspeed_options} \
    --deepspeed-activation-checkpointing"
fi

${TROUPE:-troupe} launch --nproc-per-node ${num_gpus} -- train ${megatron_options} ${data_options} ${deepspeed_options} "$@" |& tee ${log_path}/${jobname}_${host}_${current_time}.log
exit ${PIPESTATUS[0]}
