#!/usr/bin/env bash
# troupe launch + comm-check end to end: 4 ranks meet; a rank killed with SIGKILL or failing with code 3
# stops the job within seconds and is named; SIGINT is passed on; a peer with a wrong job token is
# refused, logged by rank 0, and the job carries on.
source "$(dirname "$0")/common.bash"

bg_pids=()
trap 'for p in "${bg_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT


now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# wait_for_text FILE TEXT SECONDS
wait_for_text() {
  local i
  for ((i = 0; i < $3 * 20; i++)); do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  cat "$1" >&2
  fail "'$2' did not appear in $1 within $3 s"
}

# The rank a child process runs, from its environment.
rank_of() { tr '\0' '\n' < "/proc/$1/environ" | sed -n 's/^TROUPE_RANK=//p'; }

children_of() {
  if command -v pgrep > /dev/null; then
    pgrep -P "$1" || true
  else
    for stat in /proc/[0-9]*/stat; do
      awk -v p="$1" '$4 == p { print $1 }' "$stat" 2>/dev/null || true
    done
  fi
}

# --- 4 ranks meet -------------------------------------------------------------------------------
port=$(free_port)
"$troupe" launch --nproc-per-node 4 --master-port "$port" -- comm-check > ok.out 2> ok.err ||
  { cat ok.out ok.err >&2; fail "launch of 4 ranks failed"; }
for r in 0 1 2 3; do
  grep -q "^rank $r/4 on host" ok.out || { cat ok.out >&2; fail "rank $r/4 missing from the output"; }
done
grep -q "comm-check: all 4 rank(s) ok" ok.out || fail "no final ok line"
echo "ok: 4 ranks meet"

# --- --new-token ----------------------------------------------------------------------------------
token=$("$troupe" launch --new-token)
[[ "$token" =~ ^[0-9a-f]{64}$ ]] || fail "--new-token printed '$token'"
[[ "$token" != "$("$troupe" launch --new-token)" ]] || fail "two tokens are equal"
echo "ok: --new-token"

# --- usage errors ---------------------------------------------------------------------------------
set +e
env -u TROUPE_JOB_TOKEN "$troupe" launch --nnodes 2 --master-addr 10.0.0.1 -- comm-check > /dev/null 2> usage.err
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "--nnodes 2 without a token: exit $rc, want 2"
grep -q "TROUPE_JOB_TOKEN" usage.err || { cat usage.err >&2; fail "no token hint"; }
set +e
"$troupe" launch --nproc-per-node 0 -- comm-check > /dev/null 2> usage.err
rc=$?
set -e
[[ $rc -eq 2 ]] && grep -q -- "--nproc-per-node" usage.err || fail "--nproc-per-node 0: exit $rc"
echo "ok: usage errors"

# --- a rank killed with SIGKILL stops the job -----------------------------------------------------
port=$(free_port)
"$troupe" launch --nproc-per-node 4 --master-port "$port" -- comm-check --hold-seconds 60 > kill.out 2> kill.err &
launcher=$!
bg_pids+=("$launcher")
wait_for_text kill.out "comm-check: bootstrap ok" 30
victim=""
for child in $(children_of "$launcher"); do
  [[ "$(rank_of "$child")" == 2 ]] && victim=$child
done
[[ -n "$victim" ]] || fail "cannot find rank 2 among the children of launcher $launcher"
start=$(now)
kill -9 "$victim"
set +e
wait "$launcher"
rc=$?
set -e
took=$(elapsed "$start")
[[ $rc -ne 0 ]] || fail "the launcher exited 0 after rank 2 was killed"
awk -v t="$took" 'BEGIN { exit !(t < 10) }' || fail "the launcher took $took s to stop after a rank died"
grep -q "rank 2 (pid $victim) was killed by signal 9 (SIGKILL)" kill.err || { cat kill.err >&2; fail "SIGKILL not reported"; }
for child in $(children_of "$launcher"); do fail "child $child outlived the launcher"; done
echo "ok: SIGKILL of rank 2 stopped the job in $took s (exit $rc)"

# --- a rank that fails with code 3 -------------------------------------------------------------------
port=$(free_port)
start=$(now)
set +e
"$troupe" launch --nproc-per-node 4 --master-port "$port" -- comm-check --hold-seconds 60 --fail-rank 2 \
  --fail-after 1 > fail.out 2> fail.err
rc=$?
set -e
took=$(elapsed "$start")
[[ $rc -ne 0 ]] || fail "the launcher exited 0 although rank 2 failed"
grep -Eq "rank 2 \(pid [0-9]+\) exited with code 3" fail.err || { cat fail.err >&2; fail "exit code 3 not reported"; }
awk -v t="$took" 'BEGIN { exit !(t < 10) }' || fail "took $took s"
echo "ok: rank 2 failing with code 3 stopped the job in $took s (exit $rc)"

# --- SIGINT to the launcher is passed on ----------------------------------------------------------
port=$(free_port)
"$troupe" launch --nproc-per-node 3 --master-port "$port" --prefix-output -- comm-check --hold-seconds 60 \
  > int.out 2> int.err &
launcher=$!
bg_pids+=("$launcher")
wait_for_text int.out "[rank 0] comm-check: bootstrap ok" 30
grep -q "^\[rank 0\] rank 2/3 on host" int.out || { cat int.out >&2; fail "--prefix-output lines missing"; }
start=$(now)
kill -INT "$launcher"
set +e
wait "$launcher"
rc=$?
set -e
took=$(elapsed "$start")
[[ $rc -eq 130 ]] || { cat int.err >&2; fail "SIGINT: launcher exit $rc, want 130"; }
grep -q "received SIGINT" int.err || fail "the launcher did not say it passed SIGINT on"
awk -v t="$took" 'BEGIN { exit !(t < 10) }' || fail "took $took s"
echo "ok: SIGINT passed on, launcher done in $took s"

# --- ranks that ignore SIGINT and SIGTERM are killed after the grace period -------------------------
port=$(free_port)
"$troupe" launch --nproc-per-node 2 --master-port "$port" --stop-grace 1 -- comm-check --hold-seconds 60 \
  --ignore-stop-signals > deaf.out 2> deaf.err &
launcher=$!
bg_pids+=("$launcher")
wait_for_text deaf.out "comm-check: bootstrap ok" 30
start=$(now)
kill -TERM "$launcher"
set +e
wait "$launcher"
rc=$?
set -e
took=$(elapsed "$start")
[[ $rc -eq 143 ]] || { cat deaf.err >&2; fail "SIGTERM: launcher exit $rc, want 143"; }
grep -q "only by SIGKILL after the 1 s grace" deaf.err || { cat deaf.err >&2; fail "no SIGKILL escalation reported"; }
awk -v t="$took" 'BEGIN { exit !(t >= 0.9 && t < 10) }' || fail "took $took s, want the 1 s grace"
echo "ok: deaf ranks killed after the grace period, launcher done in $took s"

# --- a peer with a wrong token is refused and logged; the job carries on --------------------------
port=$(free_port)
"$troupe" launch --nproc-per-node 2 --master-port "$port" -- comm-check --hold-seconds 4 > token.out 2> token.err &
launcher=$!
bg_pids+=("$launcher")
wait_for_text token.out "comm-check: bootstrap ok" 30
set +e
env -u RANK -u WORLD_SIZE TROUPE_RANK=1 TROUPE_WORLD_SIZE=2 TROUPE_MASTER_ADDR=127.0.0.1 TROUPE_MASTER_PORT="$port" \
  TROUPE_JOB_TOKEN=0000wrong0000wrong0000wrong0000 "$troupe" comm-check --connect-timeout 10 > peer.out 2> peer.err
peer_rc=$?
wait "$launcher"
rc=$?
set -e
[[ $peer_rc -ne 0 ]] || fail "the peer with a wrong token was let in"
grep -q "wrong job token" peer.err || { cat peer.err >&2; fail "the peer was not told why"; }
grep -q "refused a peer claiming rank 1 of 2.*wrong job token from 127.0.0.1:" token.err ||
  { cat token.err >&2; fail "rank 0 did not log the refusal with the peer's address"; }
grep -q "0000wrong0000wrong" token.err && fail "the wrong token was printed"
[[ $rc -eq 0 ]] || { cat token.out token.err >&2; fail "the job failed after refusing the peer (exit $rc)"; }
echo "ok: wrong token refused and logged; the job finished"

echo PASS
