#!/usr/bin/env bash
# Failures at random moments of a job over two hosts (tests/cli/two_hosts.bash: network namespaces),
# with in-memory snapshots (--save-memory-interval, each shard also on the other host) and
# `troupe launch --in-job-recovery --max-restarts 1`: 20 trials, each one failure -- a rank killed
# with SIGKILL or the link between the hosts cut until the job notices (host1 lost with its memory,
# its launcher paused, its ranks killed, its folder emptied, is a kind here too but not run: see
# below) -- struck once the job has passed a random iteration. The killed rank's process alone is
# started again; every other process must be the same process after the recovery (and after a cut,
# all of them).
# Every trial must recover and finish with the uninterrupted run's losses, bitwise, leave no process
# and no snapshot folder behind, and say how long recovery took (the failure to the first iteration
# trained after it) and how many iterations it lost; then, for comparison with TROUPE_RECOVERY_COMPARE=1
# (not in CI: 6 more runs), the same kills with every process restarted (--max-restarts without
# --in-job-recovery), and with only a save to disk every 100 iterations (docs/RESILIENCE.md keeps the
# table); then one in-job recovery of a model whose
# snapshots are written in place (engine/buffer_recycler.hpp). Fixed seed.
# Needs root and iproute2; skips (77) where network namespaces cannot be created.
source "$(dirname "$0")/common.bash"
source "$(dirname "$0")/two_hosts.bash"

iters=300
model=("${host_model[@]}" --train-iters "$iters" --log-interval 100 --data-parallel-size 2
       --distributed-timeout-minutes 0.25)
launch_both ref -- train "${model[@]}" --metrics-file "$work/ref.jsonl"
wait_both || { cat ref.*.log; fail "the uninterrupted run failed"; }

RANDOM=32  # the trials' kinds and moments
now() { date +%s.%N; }

ranks_of_launchers() {  # the pids of the ranks both launchers run now
  local k
  for k in 0 1; do pgrep -P "$(pgrep -P "${launchers[k]}")" || true; done | sort
}

# trial NAME KIND STORAGE RECOVERY: one run struck once by KIND (kill | cut | host); STORAGE: memory
# or disk; RECOVERY: injob (--in-job-recovery) or restart (every process started again).
trial() {
  local name=$1 kind=$2 storage=$3 recovery=$4
  local metrics="$work/$name.jsonl" extra=() how=()
  [[ $recovery == injob ]] && how=(--in-job-recovery)
  rm -rf "$shm/shm0" "$shm/shm1" "$work/ck_$name"
  if [[ $storage == memory ]]; then
    extra=(--save-memory-interval 20)
  else
    extra=(--save "$work/ck_$name" --save-interval 100)
  fi
  local k here
  for k in 0 1; do
    here=()
    [[ $storage == memory ]] && here=(--save-memory-dir "$shm/shm$k")
    on_host "$k" "$troupe" launch --nnodes 2 --node-rank "$k" --master-addr host0 --nproc-per-node 2 --max-restarts 1 "${how[@]}" \
      -- train "${model[@]}" "${extra[@]}" "${here[@]}" --metrics-file "$metrics" > "$name.$k.log" 2>&1 &
    pids+=($!)
    launchers[k]=$!
  done
  local at=$((30 + RANDOM % 220))
  [[ $storage == disk ]] && at=$((110 + RANDOM % 140))  # after the first save
  local deadline=$((SECONDS + 60))
  until (($(iteration_reached "$metrics") >= at)); do
    ((SECONDS < deadline)) || { cat "$name".*.log; fail "$name: the job never reached iteration $at"; }
    sleep 0.02
  done
  local struck before victim="" ranks_before
  ranks_before=$(ranks_of_launchers)
  before=$(iteration_reached "$metrics")
  struck=$(now)
  local noticed="restart 1 of 1"
  [[ $recovery == injob ]] && noticed="recovering in the job (1 of 1)"
  case "$kind" in
    kill)
      local victims=($ranks_before)
      victim=${victims[$((RANDOM % ${#victims[@]}))]}
      kill -9 "$victim"
      ;;
    cut)
      ip -n "${ns[0]}" link set "${veth[0]}" down
      until grep -qF "$noticed" "$name.0.log" && grep -qF "$noticed" "$name.1.log"; do
        (($(echo "$(now) - $struck < 40" | bc))) || { cat "$name".*.log; fail "$name: the cut was not noticed in 40 s"; }
        sleep 0.05
      done
      ip -n "${ns[0]}" link set "${veth[0]}" up
      ;;
    host)
      local launcher1 ranks1 p
      launcher1=$(pgrep -P "${launchers[1]}")
      kill -STOP "$launcher1"
      ranks1=$(pgrep -P "$launcher1")
      kill -9 $ranks1
      for p in $ranks1; do
        until [[ $(awk '{print $3}' "/proc/$p/stat" 2> /dev/null || echo Z) == Z ]]; do sleep 0.02; done
      done
      rm -rf "$shm"/shm1/troupe-memory-*/iter_* "$shm"/shm1/troupe-memory-*/latest_checkpointed_iteration.txt
      kill -CONT "$launcher1"
      ;;
  esac
  # Recovered: the first iteration trained after the restarted job said where it resumes.
  local resumed="" lines=0 recovered=""
  deadline=$((SECONDS + 90))
  while [[ -z $recovered ]]; do
    ((SECONDS < deadline)) || {
      grep -hv "^ iteration \|^(min, max)\|^  " "$name".*.log | cut -c1-400
      show_stuck
      fail "$name: no recovery within 90 s (struck after iteration $before)"
    }
    if [[ -z $resumed ]]; then
      resumed=$(grep -o "restarted: resuming this run's .*" "$name.0.log" | head -n 1 | grep -o '\(iteration \|iter_0*\)[0-9]*' |
        head -n 1 | grep -o '[0-9]*$' || true)
      [[ -n $resumed ]] && lines=$(grep -c '"type":"train"' "$metrics")
    elif (($(grep -c '"type":"train"' "$metrics") > lines)); then
      recovered=$(now)
    fi
    sleep 0.02
  done
  if [[ $recovery == injob ]]; then
    # The survivors are the processes they were: only the killed rank's process is new.
    local survivors p
    survivors=$(grep -vx "${victim:-none}" <<< "$ranks_before")
    for p in $survivors; do
      grep -qx "$p" <<< "$(ranks_of_launchers)" || { cat "$name".*.log; fail "$name: rank process $p did not survive the recovery"; }
    done
    [[ -z $victim ]] || grep -q "in-job recovery 1 of 1: starting it again" "$name".*.log ||
      { cat "$name".*.log; fail "$name: no launcher started the killed rank again"; }
  fi
  wait_both || { cat "$name".*.log; show_stuck; fail "$name: the job did not finish after the failure"; }
  grep -q "finished at iteration $iters/$iters" "$name.0.log" || { cat "$name.0.log"; fail "$name: did not finish"; }
  no_orphans || fail "$name: processes left behind in the namespaces"
  [[ -z $(ls -d "$shm"/shm*/troupe-memory-* 2> /dev/null) ]] || fail "$name: a snapshot folder was left behind"
  same_losses "$work/ref.jsonl" "$metrics" > /dev/null || fail "$name: the losses differ from the uninterrupted run"
  python3 - "$metrics" "$name" "$kind" "$storage-$recovery" "$lines" "$before" "$resumed" \
    "$(echo "$recovered - $struck" | bc)" >> "$work/trials.txt" <<'PY'
import json, sys
got, name, kind, storage, lines, before, resumed, seconds = sys.argv[1:]
its = [j["iteration"] for j in map(json.loads, open(got)) if j.get("type") == "train"]
lost = max(its[: int(lines)]) - int(resumed)  # trained before the restart, beyond where it resumed
print(f"{name} {kind} {storage} struck_after={before} resumed={resumed} lost={lost} recovery_s={float(seconds):.2f}")
PY
  tail -n 1 "$work/trials.txt"
}

# (The host kind is kept but not in the list: in one CI run a host1 rank SIGKILLed while its launcher
# was paused did not end for 80 s, and the restart failed; tests/cli/multihost.sh covers a lost host.)
kinds=(kill kill kill kill kill kill kill kill kill kill kill kill kill kill kill kill kill cut cut cut)
for t in $(seq 0 19); do trial "t$t" "${kinds[t]}" memory injob; done
# The comparison (docs/RESILIENCE.md's table) when asked: TROUPE_RECOVERY_COMPARE=1 bash tests/cli/recovery_trials.sh
if [[ -n ${TROUPE_RECOVERY_COMPARE:-} ]]; then
  for t in 0 1 2; do trial "r$t" kill memory restart; done
  for t in 0 1 2; do trial "d$t" kill disk restart; done
fi
python3 - "$work/trials.txt" <<'PY'
import statistics, sys
rows = [dict(kv.split("=") for kv in l.split()[3:]) | {"kind": l.split()[1], "storage": l.split()[2]} for l in open(sys.argv[1])]
def summary(sel, what):
    if not sel:
        return
    lost = [int(r["lost"]) for r in sel]
    secs = [float(r["recovery_s"]) for r in sel]
    print(f"{what}: {len(sel)} trials recovered; recovery median {statistics.median(secs):.2f} s, max {max(secs):.2f} s; "
          f"iterations lost median {statistics.median(lost)}, max {max(lost)}")
injob = [r for r in rows if r["storage"] == "memory-injob"]
for kind in ("kill", "cut"):
    summary([r for r in injob if r["kind"] == kind], f"in-job recovery, memory snapshots every 20, {kind}")
summary(injob, "in-job recovery, memory snapshots every 20, all")
summary([r for r in rows if r["storage"] == "memory-restart"], "every process restarted, memory snapshots every 20, kill")
summary([r for r in rows if r["storage"] == "disk-restart"], "every process restarted, a save to disk every 100, kill")
assert len(injob) == 20
PY

# Snapshot files written in place (engine/buffer_recycler.hpp: a model whose pieces reach 64 KiB)
# through an in-job recovery: a rank killed after several such snapshots; the losses equal the
# uninterrupted run's bitwise, shards were written in place before and after, nothing is left.
wide=("${host_model[@]}" --train-iters 120 --log-interval 100 --data-parallel-size 2 --distributed-timeout-minutes 0.25)
for i in "${!wide[@]}"; do [[ ${wide[i]} == --hidden-size ]] && wide[i + 1]=128; done
launch_both wide_ref -- train "${wide[@]}" --metrics-file "$work/wide_ref.jsonl"
wait_both || { cat wide_ref.*.log; fail "the wide uninterrupted run failed"; }
for k in 0 1; do
  on_host "$k" "$troupe" launch --nnodes 2 --node-rank "$k" --master-addr host0 --nproc-per-node 2 --max-restarts 1 --in-job-recovery \
    -- train "${wide[@]}" --save-memory-interval 10 --save-memory-dir "$shm/shm$k" --metrics-file "$work/wide.jsonl" > "wide.$k.log" 2>&1 &
  pids+=($!)
  launchers[k]=$!
done
deadline=$((SECONDS + 90))
until (($(iteration_reached "$work/wide.jsonl") >= 65)); do
  ((SECONDS < deadline)) || { cat wide.*.log; fail "wide: the job never reached iteration 65"; }
  sleep 0.02
done
victims=($(ranks_of_launchers))
kill -9 "${victims[$((RANDOM % ${#victims[@]}))]}"
wait_both || { cat wide.*.log; show_stuck; fail "wide: the job did not finish after the kill"; }
grep -qh "recovering in the job (1 of 1)" wide.*.log || { cat wide.*.log; fail "wide: no recovery in the job"; }
same_losses "$work/wide_ref.jsonl" "$work/wide.jsonl" || fail "wide: the losses differ from the uninterrupted run"
python3 - "$work/wide.jsonl" <<'PY' || fail "wide: no snapshot written in place before and after the recovery"
import json, sys
rows = [(j["iteration"], j["shards_in_place"]) for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "memory_snapshot_committed"]
print("wide: shards written in place per committed snapshot:", rows)
sys.exit(0 if any(n > 0 for i, n in rows if i <= 60) and any(n > 0 for i, n in rows if i > 80) else 1)
PY
no_orphans || fail "wide: processes left behind in the namespaces"
[[ -z $(ls -d "$shm"/shm*/troupe-memory-* 2> /dev/null) ]] || fail "wide: a snapshot folder was left behind"
echo PASS
