#!/usr/bin/env bash
# The device half of `just test-gpu`: runs in the repo root on the GPU machine, over the
# artifacts scripts/test-gpu.sh staged in gpu-run/. Stages: tests sanitize bench transfer demo all.
# Everything runs with MEMARRAY_REQUIRE_GPU=1, so a GPU test that would skip fails.
set -uo pipefail
export MEMARRAY_REQUIRE_GPU=1 MEMARRAY_REPO_ROOT=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/memarray-out}
LOGS=/tmp/memarray-logs   # one log per binary; combined copies go to $OUT (8 files max)
mkdir -p "$OUT" "$LOGS"
PATH=/usr/local/cuda/bin:$PATH
rc=0
fail() { echo "!! FAILED: $*"; rc=1; }

setup() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  nvcc --version | tail -n 2 | head -n 1
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site gpu-run/wheels/*.whl \
    || fail "wheel install"
  export PYTHONPATH=/tmp/site
  python3 -c 'import memarray, sys; print("memarray", memarray.__file__, "cuda:", memarray.cuda.is_available(), memarray.cuda.device_count())'
}

tests() {
  echo "== cargo tests (release binaries)"
  for t in gpu-run/bin/*; do
    log="$LOGS/$(basename "$t").log"
    "$t" --test-threads=1 >"$log" 2>&1 || fail "$t"
    printf '%-48s %s\n' "$(basename "$t")" "$(grep -E '^test result:' "$log" | tail -n 1)"
    grep -E '^(SKIPPED|---- |thread .* panicked)' "$log" | head -n 20
  done
  tail -n +1 "$LOGS"/*.log >"$OUT/cargo-tests.log"
  echo "== pytest"
  python3 -m pytest bindings-python/tests -q -rs -p no:cacheprovider >"$OUT/pytest.log" 2>&1 || fail pytest
  tail -n 25 "$OUT/pytest.log"
}

sanitize() {
  # API errors are not reported: the resource tests provoke CUDA_ERROR_OUT_OF_MEMORY and
  # the event tests an invalid handle on purpose. Every memory access is checked.
  echo "== compute-sanitizer memcheck over the Rust GPU tests"
  for t in gpu-run/bin/memarray-cuda__gpu_* gpu-run/bin/memarray-cuda__mirror_gpu; do
    log="$LOGS/sanitize-$(basename "$t").log"
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 "$t" --test-threads=1 \
      >"$log" 2>&1 || fail "memcheck $t"
    printf '%-48s %s | %s\n' "$(basename "$t")" \
      "$(grep -E '^test result:' "$log" | tail -n 1)" \
      "$(grep -E 'ERROR SUMMARY' "$log" | tail -n 1)"
  done
  tail -n +1 "$LOGS"/sanitize-*.log >"$OUT/sanitize.log"
}

bench() {
  echo "== benches"
  for b in gpu-run/bench/*; do
    "$b" --bench --noplot 2>&1 | grep -vE '^(Benchmarking|Warning|\s*$)' >"$LOGS/$(basename "$b").log"
    grep -E 'GB/s|us|ratio|SKIPPED' "$LOGS/$(basename "$b").log" | grep -v '^  ' | head -n 60
  done
  tail -n +1 "$LOGS"/memarray-cuda__*bench*.log "$LOGS"/memarray-cuda__transfer.log \
    "$LOGS"/memarray-cuda__kernel.log >"$OUT/bench.log" 2>/dev/null
  CUDA_CACHE_DISABLE=1 python3 benches/first_launch.py 2>&1 | tee "$OUT/first_launch.log"
  python3 benches/host_kind.py 2>&1 | tee "$OUT/host_kind.log"
  # A benchmark, not a test: a missed target is reported, not counted as a failure (the
  # torch.from_dlpack target is out of memarray's reach; docs/benchmarks.md says why).
  python3 benches/python_interop.py 2>&1 | tee "$OUT/python_interop.log" \
    || echo "!! interop targets missed (see docs/benchmarks.md)"
  transfer
}

transfer() {
  # memarray, torch and CuPy side by side (issue 8); the JSON feeds benches/plot_transfer.py.
  python3 benches/transfer.py --json "$OUT/transfer.json" "$@" 2>&1 | tee "$OUT/transfer.log"
}

demo() {
  echo "== demo and examples"
  python3 examples/demo.py || fail demo
  for e in gpu-run/examples/*; do "$e" || fail "$e"; done
}

setup
case "${1:-all}" in
  tests) tests ;;
  sanitize) sanitize ;;
  bench) bench ;;
  demo) demo ;;
  transfer) shift; transfer "$@" ;;
  all) tests; demo; sanitize; bench ;;
  *) echo "usage: remote.sh tests|sanitize|bench|transfer [args]|demo|all"; exit 2 ;;
esac
echo "== remote.sh done, rc=$rc"
exit $rc
