#!/bin/bash
# deepspeedai/Megatron-DeepSpeed 4efb479d5317ce9b86096b9d8e3e8030b0b5263b examples/sc21/CONFIG.sh
# Shrunk for troupe's CI (tests/cli/megatron_real_scripts.sh): sizes, paths and the launcher changed, nothing else. Paths from the caller; the run 3 iterations of 32-token sequences.


# SLURM options.
export SLURM_PARTITION=p
export SLURM_ACCOUNT=a


# Source code.
export MEGATRON_CODE_DIR=${PWD}


# This variable is used to mount the relevant part of the filesystem
# inside the docker container. Note that the `MEGATRON_CODE_DIR` and the
# launch directory already get mounted; this variable should be used to
# mount the directories that contain the data and tokenizer files.
export DOCKER_MOUNT_DIR=${PWD}


# Data and tokenizer files.
MEGATRON_DATA=${DATA_PATH}
BPE_VOCAB_FILE=${VOCAB}
BPE_MERGE_FILE=${MERGES}


# Megatron input parameters.
# `MEGATRON_EXTRA_PARAMS` can be used to provide any extra parameters
# that are not listed here. 
export MEGATRON_PARAMS=" ${MEGATRON_EXTRA_PARAMS} \
	--tensor-model-parallel-size ${TP} \
	--pipeline-model-parallel-size ${PP} \
	--micro-batch-size ${MBS} \
	--global-batch-size ${GBS} \
        --num-layers ${NLS} \
        --hidden-size ${HS} \
        --num-attention-heads ${NAH} \
	--DDP-impl ${DDP} \
	--data-path ${MEGATRON_DATA} \
	--vocab-file ${BPE_VOCAB_FILE} \
	--merge-file ${BPE_MERGE_FILE} \
        --log-interval 1 \
        --seq-length 32 \
        --max-position-embeddings 32 \
        --train-iters 3 \
        --lr-decay-iters 3 \
        --lr 0.0001 \
	--min-lr 0.00001 \
        --lr-decay-style cosine \
        --lr-warmup-fraction 0.01 \
        --split 969,30,1 \
        --eval-iters 1 \
        --eval-interval 1000 \
        --clip-grad 1.0 \
        --fp16 \
	--loss-scale 8192 "


