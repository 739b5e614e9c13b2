#!/usr/bin/env bash
# Runs the CPU test binaries of memarray-core and memarray-dlpack, and the C ABI's C and
# C++ tests, under valgrind memcheck: zero errors required, definite leaks counted as errors. Installs valgrind
# from Debian when missing (CI runs as root). Prints each binary's ERROR SUMMARY line.
#   MEMARRAY_FUZZ_CASES   DLPack fuzz cases under valgrind (default 5000; 100,000 in
#                         the plain cargo test run)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null; then
  echo "== installing valgrind (apt-get)"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi

mapfile -t bins < <(cargo test -p memarray-core -p memarray-dlpack --no-run \
  --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])
')
[ "${#bins[@]}" -gt 0 ] || { echo "no test binaries found" >&2; exit 1; }

export MEMARRAY_FUZZ_CASES=${MEMARRAY_FUZZ_CASES:-5000}
export PROPTEST_CASES=${PROPTEST_CASES:-64}
export MEMARRAY_UNDER_VALGRIND=1
status=0
total=0
for b in "${bins[@]}"; do
  log="target/valgrind-$(basename "$b").log"
  if valgrind --tool=memcheck --error-exitcode=99 --leak-check=full --suppressions=scripts/valgrind.supp \
    --errors-for-leak-kinds=definite --log-file="$log" "$b" -q --test-threads=2 \
    >"$log.out" 2>&1; then
    :
  else
    status=1
    tail -20 "$log.out" >&2
  fi
  summary=$(grep -h "ERROR SUMMARY" "$log" | tail -1 | sed 's/^==[0-9]*== //')
  n=$(echo "$summary" | awk '{print $3}')
  total=$((total + ${n:-1}))
  echo "valgrind $(basename "$b"): $summary; $(grep -h '^test result' "$log.out" | tail -1)"
done
# The C ABI's C and C++ tests, compiled by tests/native.rs and run under
# valgrind there (each program's ERROR SUMMARY is printed; any error fails the test).
cargo build -q -p memarray-c
if MEMARRAY_NATIVE_VALGRIND=1 cargo test -q -p memarray-c --test native -- --nocapture \
  --test-threads=1 >target/valgrind-native.out 2>&1; then
  :
else
  status=1
  tail -40 target/valgrind-native.out >&2
fi
grep -E "ERROR SUMMARY|checks passed" target/valgrind-native.out | sed 's/^/valgrind native: /'
native=$(grep -h "ERROR SUMMARY" target/valgrind-native.out | awk '{s += $5} END {print s + 0}')
total=$((total + native))
# The same C/C++ programs against the release library, which C users link: its inlining
# must still match scripts/valgrind.supp (the probes' frames are kept out of line).
cargo build -q --release -p memarray-c
if MEMARRAY_NATIVE_VALGRIND=1 cargo test -q --release -p memarray-c --test native -- --nocapture \
  --test-threads=1 >target/valgrind-native-release.out 2>&1; then
  :
else
  status=1
  tail -40 target/valgrind-native-release.out >&2
fi
grep -E "ERROR SUMMARY|checks passed" target/valgrind-native-release.out | sed 's/^/valgrind native (release): /'
release=$(grep -h "ERROR SUMMARY" target/valgrind-native-release.out | awk '{s += $5} END {print s + 0}')
total=$((total + release))
echo "== valgrind summary: ${#bins[@]} test binaries and $(grep -c "ERROR SUMMARY" target/valgrind-native.out) C/C++ programs (debug and release), $total errors"
exit $status
