#!/usr/bin/env bash
# A rank SIGKILLed at any moment of a multi-process job, UCX setup included: the other ranks fail
# cleanly (exit code 1, a message naming the dead rank and its host; never a signal, an abort, a
# UCX fatal error or backtrace), and nothing of the job is left in /dev/shm (troupe's segments are
# anonymous, UCX's posix transport is not used). Ranks started directly (torchrun-style variables,
# as srun or mpirun would), so the survivors' own exit is seen, and under troupe launch (which
# stops the survivors itself) with kills from the first milliseconds on. UCX setup steps are hit
# with TROUPE_FAULT_UCX_KILL=rank<R>@<step> (the rank SIGKILLs itself there).
source "$(dirname "$0")/common.bash"
make_corpus

seed=${TROUPE_TEST_SEED:-$RANDOM}
RANDOM=$seed
echo "seed $seed (TROUPE_TEST_SEED reproduces the moments)"

# Pipeline-parallel over 3 ranks: activations large enough for UCX rendezvous (cma reads) between
# the stages, and data-parallel-free all_reduce traffic for the embedding.
model=(--num-layers 3 --hidden-size 96 --num-attention-heads 4 --seq-length 128 --micro-batch-size 4
       --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 3
       --data-path d_text_document --tokenizer-type ByteLevelTokenizer --eval-interval 1000 --num-threads 1
       --train-iters 1000000 --log-interval 1000 --pipeline-model-parallel-size 3)
n=3
shm_before=$(ls -A /dev/shm | sort)

# Names in /dev/shm that were not there at the start and are still there a moment later (not
# counting troupe-cli.*: the scratch folders of CLI tests running beside this one, two_hosts.bash's).
shm_left() {
  local fresh
  fresh=$(comm -13 <(echo "$shm_before") <(ls -A /dev/shm | grep -v '^troupe-cli\.' | sort))
  [[ -z "$fresh" ]] && return 0
  sleep 0.3
  comm -12 <(echo "$fresh") <(ls -A /dev/shm | sort)
}

# A UCX fatal error, a backtrace, a caught signal or troupe's report of a UCX fatal error. (UCX's
# non-fatal error lines may appear: it logs one when it attaches a dead peer's segment.)
no_ucx_noise() {  # name, files...
  local name=$1
  shift
  if grep -E -H "UCX +FATAL|Caught signal|backtrace|UCX failed fatally|Aborted" "$@"; then
    fail "$name: a fatal error inside UCX (above)"
  fi
}

check_shm() {
  local left
  left=$(shm_left)
  [[ -z "$left" ]] || fail "$1: left in /dev/shm: $left"
}

random_ms() {  # lo hi -> a number of milliseconds in [lo, hi)
  echo $(($1 + RANDOM % ($2 - $1)))
}

# --- ranks started directly --------------------------------------------------------------------
pids=()
start_direct() {  # name, then extra environment assignments
  local name=$1
  shift
  local port token
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  token=$("$troupe" launch --new-token)
  pids=()
  for r in $(seq 0 $((n - 1))); do
    env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      TROUPE_JOB_TOKEN=$token "$@" "$troupe" train "${model[@]}" > "$name.$r.log" 2>&1 &
    pids+=($!)
  done
}

# Waits for every rank (60 s at most): the victim must have died by SIGKILL and each survivor must
# exit 1 naming a failed rank with its host ("rank 2 (host vm, pid 4242)"; rank 0 as the bootstrap
# names it: "rank 0 at 127.0.0.1:29500"), at least one of them the victim. (During UCX setup one
# failure can cascade: a rank whose setup failed destroys its world, and a slower peer then cannot
# connect to it; the first failure can only be the victim's death.)
check_direct() {  # name victim
  local name=$1 victim=$2 code named=0
  for r in $(seq 0 $((n - 1))); do
    if ! timeout 60 tail --pid="${pids[$r]}" -f /dev/null; then
      kill -9 "${pids[@]}" 2> /dev/null || true
      fail "$name: rank $r still runs 60 s after rank $victim died"
    fi
    code=0
    wait "${pids[$r]}" || code=$?
    if (( r == victim )); then
      (( code == 137 )) || { cat "$name.$r.log" >&2; fail "$name: rank $r should have died by SIGKILL (exit $code)"; }
      continue
    fi
    (( code == 1 )) || { cat "$name.$r.log" >&2; fail "$name: survivor rank $r exited $code (want 1)"; }
    grep -Eq "rank [0-9]+ (\(host |at )" "$name.$r.log" ||
      { cat "$name.$r.log" >&2; fail "$name: survivor rank $r names no failed rank and its host"; }
    if grep -Eq "rank $victim (\(host |at )" "$name.$r.log"; then named=1; fi
  done
  (( named == 1 )) || { cat "$name".*.log >&2; fail "$name: no survivor names rank $victim"; }
  no_ucx_noise "$name" "$name".*.log
  check_shm "$name"
}

# UCX setup steps after the first exchange (every rank has joined the rendezvous by then, so every
# survivor learns of the death at once), each rank once as the victim.
victim=0
for step in exchange endpoints attach ready; do
  start_direct "setup_$step" TROUPE_FAULT_UCX_KILL="rank$victim@$step"
  check_direct "setup_$step" "$victim"
  grep -q "TROUPE_FAULT_UCX_KILL=rank$victim@$step" "setup_$step.$victim.log" || fail "setup_$step: the fault did not fire"
  victim=$(((victim + 1) % n))
done

# Training: a random rank at a random moment after the job is running.
for t in 1 2 3; do
  start_direct "train_$t"
  for _ in $(seq 1 600); do grep -q "measured sgemm peak" "train_$t.0.log" && break; sleep 0.05; done
  victim=$((RANDOM % n))
  ms=$(random_ms 0 1500)
  sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
  kill -9 "${pids[$victim]}"
  echo "train_$t: rank $victim killed ${ms} ms into training"
  check_direct "train_$t" "$victim"
done

# --- under troupe launch: from the first milliseconds on ----------------------------------------
launch_kill() {  # name, victim, delay in ms (or "" to let a fault kill it), then extra environment
  local name=$1 victim=$2 ms=$3 launcher code=0 child
  shift 3
  env "$@" "$troupe" launch --nproc-per-node $n -- train "${model[@]}" > "$name.log" 2>&1 &
  launcher=$!
  if [[ -n "$ms" ]]; then
    # The launcher's children in rank order (it starts them in order).
    for _ in $(seq 1 200); do (( $(pgrep -P $launcher | wc -l) == n )) && break; sleep 0.005; done
    child=$(pgrep -P $launcher | sort -n | sed -n "$((victim + 1))p")
    sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
    kill -9 "$child" 2> /dev/null || true
  fi
  timeout 60 tail --pid=$launcher -f /dev/null || { kill -9 $launcher; fail "$name: the launcher still runs after 60 s"; }
  wait $launcher || code=$?
  (( code == 1 )) || { cat "$name.log" >&2; fail "$name: troupe launch exited $code (want 1)"; }
  # The launcher names the dead rank, or (when it finds a survivor's exit first) the survivors do.
  grep -Eq "rank $victim \((pid [0-9]*\) was killed by signal 9|host )" "$name.log" ||
    { cat "$name.log" >&2; fail "$name: nothing names rank $victim as dead"; }
  no_ucx_noise "$name" "$name.log"
  check_shm "$name"
}

launch_kill launch_worker 1 "" TROUPE_FAULT_UCX_KILL=rank1@worker
launch_kill launch_segment 2 "" TROUPE_FAULT_UCX_KILL=rank2@segment
for t in 1 2 3 4; do
  victim=$((RANDOM % n))
  ms=$(random_ms 0 1200)
  echo "launch_$t: rank $victim killed ${ms} ms after it started"
  launch_kill "launch_$t" "$victim" "$ms"
done
echo PASS
