#! /bin/bash
# Megatron-LM's examples/pretrain_gpt.sh ("Runs the 345M parameter model"), shrunk: sizes, paths
# and iteration counts made small, `python pretrain_gpt.py` replaced by troupe train. Every other
# flag is as Megatron-LM wrote it, --fp16 included.

RANK=${RANK:-0}
WORLD_SIZE=${WORLD_SIZE:-1}

DATA_PATH=${DATA_PATH:-<Specify path and file prefix>_text_document}
CHECKPOINT_PATH=${CHECKPOINT_PATH:-<Specify path>}
VOCAB=${VOCAB:-gpt2-vocab.json}
MERGES=${MERGES:-gpt2-merges.txt}

${TROUPE:-troupe} train \
       --num-layers 2 \
       --hidden-size 48 \
       --num-attention-heads 4 \
       --micro-batch-size 2 \
       --global-batch-size 4 \
       --seq-length 32 \
       --max-position-embeddings 32 \
       --train-iters 30 \
       --lr-decay-iters 24 \
       --save $CHECKPOINT_PATH \
       --load $CHECKPOINT_PATH \
       --data-path $DATA_PATH \
       --vocab-file $VOCAB \
       --merge-file $MERGES \
       --data-impl mmap \
       --split 949,50,1 \
       --distributed-backend nccl \
       --lr 0.00015 \
       --min-lr 1.0e-5 \
       --lr-decay-style cosine \
       --weight-decay 1e-2 \
       --clip-grad 1.0 \
       --lr-warmup-fraction .13 \
       --checkpoint-activations \
       --log-interval 10 \
       --save-interval 10000 \
       --eval-interval 1000 \
       --eval-iters 10 \
       --fp16 "$@"
