#!/bin/bash
# deepspeedai/Megatron-DeepSpeed 4efb479d5317ce9b86096b9d8e3e8030b0b5263b examples/sc21/SRUN.sh
# Shrunk for troupe's CI (tests/cli/megatron_real_scripts.sh): sizes, paths and the launcher changed, nothing else. The launcher: srun of python pretrain_gpt.py in a container becomes troupe train (one process).

#SBATCH -t 0:30:00 --exclusive --mem=0 --overcommit --ntasks-per-node=8


THIS_DIR=`pwd`
DATETIME=`date +'date_%y-%m-%d_time_%H-%M-%S'`
mkdir -p ${THIS_DIR}/logs


CMD="${TROUPE} train ${MEGATRON_PARAMS}"


sh -c "${CMD}" > ${THIS_DIR}/logs/${JOB_NAME}_$DATETIME.log 2>&1

