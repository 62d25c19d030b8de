#!/usr/bin/env bash
# The public API as a user meets it: `cmake --install` of this build into a fresh prefix holds only
# include/troupe/ headers, libtroupe.so and the CMake package; examples/ configures out of tree in a
# clean folder with find_package(troupe) from that prefix, builds, and every example passes its own
# checks (docs/EMBEDDING.md).
source "$(dirname "$0")/common.bash"
build_dir=$(cd "$(dirname "$troupe")/.." && pwd)
[[ -f $build_dir/CMakeCache.txt ]] || fail "no CMake build folder above $troupe"

cmake --install "$build_dir" --prefix "$work/prefix" > install.log || { cat install.log; fail "cmake --install failed"; }
# Only the public headers, the library and the package.
others=$(cd "$work/prefix" && find . -type f | grep -v -E '^\./include/troupe/[a-z_]+\.hpp$|^\./lib/libtroupe\.so[.0-9]*$|^\./lib/cmake/troupe/troupe[A-Za-z-]*\.cmake$' || true)
[[ -z $others ]] || fail "the prefix holds more than the public API: $others"
[[ -f prefix/include/troupe/train.hpp && -f prefix/include/troupe/version.hpp ]] || fail "public headers missing"
[[ -f prefix/lib/cmake/troupe/troupeConfigVersion.cmake ]] || fail "no package version file"
# Each public header compiles on its own (includes only what it needs, all inside include/troupe/).
for h in prefix/include/troupe/*.hpp; do
  echo "#include <troupe/$(basename "$h")>" > one.cpp
  c++ -std=c++20 -fsyntax-only -I prefix/include one.cpp || fail "troupe/$(basename "$h") does not compile alone"
done

# A user's project: the examples folder copied elsewhere, configured against the prefix only.
cp -r "$src_dir/examples" user
cmake -S user -B user/build -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > configure.log 2>&1 ||
  { cat configure.log; fail "find_package(troupe) from the prefix failed"; }
cmake --build user/build -j 2 > build.log 2>&1 || { cat build.log; fail "the examples do not build against the prefix"; }
# A version the package cannot satisfy is refused by find_package.
mkdir toonew && cat > toonew/CMakeLists.txt <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(toonew LANGUAGES CXX)
find_package(troupe 99.0 REQUIRED)
CMAKE
if cmake -S toonew -B toonew/build -DCMAKE_PREFIX_PATH="$work/prefix" > toonew.log 2>&1; then
  fail "find_package(troupe 99.0) accepted version $(grep -o 'VERSION [0-9.]*' "$src_dir/CMakeLists.txt" | head -1)"
fi

for example in train_from_code custom_data schedule_as_data megatron_flags user_actor custom_head pipeline_mlp insert_block; do
  echo "== $example"
  "user/build/$example" > "$example.log" 2>&1 || { cat "$example.log"; fail "example $example failed"; }
  cat "$example.log"
done
# The same program in one process and under troupe launch (4 processes, one rank each).
user/build/under_launch one.txt > one.log 2>&1 || { cat one.log; fail "under_launch in one process failed"; }
"$troupe" launch --nproc-per-node 4 -- "$work/user/build/under_launch" "$work/four.txt" > four.log 2>&1 ||
  { cat four.log; fail "under_launch under troupe launch failed"; }
cat one.log four.log
python3 - one.txt four.txt <<'PY' || fail "the launched program's losses differ from the one-process run"
import sys
a = [float(x) for x in open(sys.argv[1])]
b = [float(x) for x in open(sys.argv[2])]
assert len(a) == 5 and len(a) == len(b), (a, b)
assert all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)), (a, b)
print("ok: one process and 4 launched processes give the same losses within 1e-5")
PY
echo "PASS: the installed API builds and runs every example"
