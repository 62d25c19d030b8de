#!/usr/bin/env bash
# Resuming is exact and runs are deterministic: 10 iterations straight == 5, save, --load, 5 more
# (bitwise-equal losses, gradient norms, learning rates and final evaluation), both with a decaying
# schedule stopped by Megatron's --exit-interval and with --train-iters 5 then 10 on a constant
# schedule; and the same seed gives the same losses with 1 or 2 compute threads.
source "$(dirname "$0")/common.bash"
make_corpus

small_train --train-iters 10 --num-threads 2 --save straight --metrics-file straight.jsonl > straight.log
small_train --train-iters 10 --exit-interval 5 --num-threads 2 --save resumed --metrics-file resumed.jsonl > first.log
[[ -f resumed/latest_checkpointed_iteration.txt ]] || fail "no checkpoint after 5 iterations"
[[ $(cat resumed/latest_checkpointed_iteration.txt) == 5 ]] || fail "latest iteration is not 5"
small_train --train-iters 10 --num-threads 2 --load resumed --save resumed --metrics-file resumed.jsonl > second.log
grep -q "loaded .*iteration 5" second.log || fail "the second run did not report loading iteration 5"

losses straight.jsonl > a.txt
losses resumed.jsonl > b.txt
[[ $(wc -l < a.txt) == 10 ]] || fail "expected 10 iterations in the straight run"
if ! diff a.txt b.txt; then fail "resumed losses differ from the straight run"; fi

ea=$("$troupe" eval --load straight --data-path d_text_document --eval-samples 40 --json)
eb=$("$troupe" eval --load resumed --data-path d_text_document --eval-samples 40 --json)
[[ "${ea/straight/X}" == "${eb/resumed/X}" ]] || fail "final checkpoints evaluate differently: $ea vs $eb"

# --train-iters is the total: 5 iterations, then --load with --train-iters 10 (constant learning rate,
# since a decaying schedule's length is --train-iters).
small_train --train-iters 10 --lr-decay-style constant --save c10 --metrics-file c10.jsonl > /dev/null
small_train --train-iters 5 --lr-decay-style constant --save c5 --metrics-file c5.jsonl > /dev/null
small_train --train-iters 10 --lr-decay-style constant --load c5 --save c5 --metrics-file c5.jsonl > /dev/null
losses c10.jsonl > c10.txt
losses c5.jsonl > c5.txt
diff c10.txt c5.txt || fail "constant schedule: 5 + 5 resumed differs from 10 straight"

small_train --train-iters 4 --num-threads 1 --metrics-file t1.jsonl > /dev/null
small_train --train-iters 4 --num-threads 2 --metrics-file t2.jsonl > /dev/null
small_train --train-iters 4 --num-threads 2 --metrics-file t3.jsonl > /dev/null
losses t1.jsonl > l1.txt
losses t2.jsonl > l2.txt
losses t3.jsonl > l3.txt
diff l2.txt l3.txt || fail "two identical runs gave different losses"
diff l1.txt l2.txt || fail "1 and 2 compute threads gave different losses"
first=$(head -1 a.txt | cut -d' ' -f2)
last=$(tail -1 a.txt | cut -d' ' -f2)
echo "straight run: first loss $first, last loss $last; resumed run identical"
echo PASS
