#!/bin/bash
# deepspeedai/Megatron-DeepSpeed 4efb479d5317ce9b86096b9d8e3e8030b0b5263b examples/sc21/run_table_1.sh
# Shrunk for troupe's CI (tests/cli/megatron_real_scripts.sh): sizes, paths and the launcher changed, nothing else. The 1.7B case (the one it runs) made tiny on one rank; the other sizes' branches left out.

# ================================
# Choose the case to run.
# ================================
# model size options = [1.7B, 3.6B, 7.5B, 18B, 39B, 76B, 145B, 310B, 530B, 1T]
MODEL_SIZE=1.7B






if [ ${MODEL_SIZE} == "1.7B" ]; then
    TP=1
    PP=1
    MBS=2
    GBS=4
    NLS=2
    HS=32
    NAH=4
    DDP=torch
    NNODES=1
    MEGATRON_EXTRA_PARAMS="--activations-checkpoint-method uniform "
else
    echo "Invalid configuration"
    exit 1
fi


# Name of the job
export JOB_NAME=results_table_1_model_size_${MODEL_SIZE}


# Import the configs.
. `pwd`/CONFIG.sh


# Submit the job.
. `pwd`/SBATCH.sh


exit 0



