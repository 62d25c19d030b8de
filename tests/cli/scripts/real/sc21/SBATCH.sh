#!/bin/bash
# deepspeedai/Megatron-DeepSpeed 4efb479d5317ce9b86096b9d8e3e8030b0b5263b examples/sc21/SBATCH.sh
# Shrunk for troupe's CI (tests/cli/megatron_real_scripts.sh): sizes, paths and the launcher changed, nothing else. The launcher: sbatch of SRUN.sh becomes running SRUN.sh here.


bash SRUN.sh

exit 0



