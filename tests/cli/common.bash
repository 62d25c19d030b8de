# Shared helpers for the CLI tests (sourced). Provides $troupe, a scratch dir $work (removed on exit),
# make_corpus (a small real-text byte-level dataset "$work/d_text_document") and fail.
set -eEuo pipefail
# A command that fails outside a condition names itself and its line, so a failed run says where.
trap 'err_rc=$?; [[ $- != *e* ]] || echo "FAIL: line $LINENO: \"$BASH_COMMAND\" exited $err_rc" >&2' ERR
src_dir=${TROUPE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
troupe=${TROUPE_BIN:-$src_dir/build/bin/troupe}
if [[ ! -x "$troupe" ]]; then
  echo "SKIP: troupe binary not found at $troupe (set TROUPE_BIN)"
  exit 77
fi
work=$(mktemp -d /tmp/troupe-cli.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"

# expect_refusal NAME PATTERN COMMAND...: COMMAND exits 2 and its stderr names PATTERN (bad input's contract).
expect_refusal() {  # name, pattern, command...
  local name=$1 pattern=$2
  shift 2
  set +e
  "$@" > "$name.out" 2> "$name.err"
  local rc=$?
  set -e
  [[ $rc == 2 ]] || { cat "$name.out" "$name.err"; fail "$name: exit $rc, not 2"; }
  grep -q -- "$pattern" "$name.err" || { cat "$name.err"; fail "$name: no '$pattern' in the message"; }
}

# same_losses A.jsonl B.jsonl: every iteration's last loss in B (a restart repeats the iterations after
# where it resumed) equals A's, bitwise, iterations 1..N in both.
same_losses() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        j = json.loads(line)
        if j.get("type") == "train":
            out[j["iteration"]] = j["lm_loss"]
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(a) == sorted(b) == list(range(1, max(a) + 1)), (sorted(a), sorted(b))
diff = [i for i in a if a[i] != b[i]]
assert not diff, [(i, a[i], b[i]) for i in diff]
print(f"{sys.argv[2]}: the {len(a)} losses equal the uninterrupted run's bitwise")
PY
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

make_corpus() {
  local src=/usr/share/games/fortunes/fortunes
  if [[ -f "$src" ]]; then
    head -c 60000 "$src" > corpus.txt
  else
    for i in $(seq 1 300); do
      printf 'The %d quick brown foxes jumped over %d lazy dogs near the river bank.\n%%\n' "$i" "$((i * 7))"
    done > corpus.txt
  fi
  "$troupe" preprocess --input corpus.txt --input-format text --text-separator % --output-prefix d \
    --tokenizer-type ByteLevelTokenizer --append-eod > /dev/null
}

# A small model and schedule used by several tests; extra flags are appended.
small_train() {
  "$troupe" train --num-layers 2 --hidden-size 48 --num-attention-heads 3 --seq-length 32 \
    --micro-batch-size 3 --global-batch-size 6 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine \
    --lr-warmup-iters 3 --weight-decay 0.1 --data-path d_text_document --tokenizer-type ByteLevelTokenizer \
    --eval-interval 1000 --log-interval 1000 "$@"
}

# kill_on_exit PID [INSPECT_FILE]: should the test end early, the job PID is killed, and with it every
# process whose command line names INSPECT_FILE (a path inside this test's own scratch dir, so that
# tests running side by side never kill each other's jobs); the scratch dir still goes.
# kill_on_exit with no arguments: the job ended, only the scratch dir goes.
kill_on_exit() {
  if (( $# == 0 )); then
    trap 'rm -rf "$work"' EXIT
  elif (( $# == 1 )); then
    trap "kill -9 $1 2>/dev/null || true; rm -rf '$work'" EXIT
  else
    trap "kill -9 $1 2>/dev/null || true; pkill -9 -f -- 'inspect-file $2' || true; rm -rf '$work'" EXIT
  fi
}

# stop_job PID INSPECT_FILE: ends a background job started with --inspect-file INSPECT_FILE (an
# absolute path in this test's scratch dir): PID, and the troupe process itself, which is not PID
# when the job was a shell function run with & (PID is then the subshell, and killing it alone left
# the job training after the test had ended); waits until no such process is left (at most 10 s).
stop_job() {
  kill "$1" 2> /dev/null || true
  pkill -f -- "inspect-file $2" 2> /dev/null || true
  wait "$1" 2> /dev/null || true
  for _ in $(seq 1 100); do pgrep -f -- "inspect-file $2" > /dev/null || return 0; sleep 0.1; done
  pkill -9 -f -- "inspect-file $2" 2> /dev/null || true
}

# Waits (at most 90 s: a loaded machine starts troupe launch's processes slowly) until file $1
# exists and is not empty: the inspect file a job writes.
wait_for_file() {
  for _ in $(seq 1 900); do [[ -s $1 ]] && return 0; sleep 0.1; done
  fail "no $1 after 90 s"
}

# Waits (at most 120 s) for checkpoint folder $1's metadata.json: the offload actor writes shards at
# nice 19, so on a machine whose cores are busy (ctest -j) it gets a small share of one.
wait_for_checkpoint() {
  for _ in $(seq 1 1200); do [[ -f $1/metadata.json ]] && return 0; sleep 0.1; done
  ls -laR "$(dirname "$1")" >&2 || true
  fail "no checkpoint $1 after 120 s"
}

# A free TCP port on loopback: troupe launch's --master-port, so that tests running side by side
# (ctest -j) do not meet on the default port.
free_port() {
  if command -v python3 > /dev/null; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
  else
    echo $((20000 + RANDOM % 9000))
  fi
}

# Prints "iteration lm_loss grad_norm lr" per training line of a metrics file, full precision.
losses() {
  /usr/bin/python3 - "$1" <<'PY' 2>/dev/null || python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("type") == "train":
        print(j["iteration"], repr(j["lm_loss"]), repr(j["grad_norm"]), repr(j["lr"]))
PY
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("type") == "train":
        print(j["iteration"], repr(j["lm_loss"]), repr(j["grad_norm"]), repr(j["lr"]))
PY
}
