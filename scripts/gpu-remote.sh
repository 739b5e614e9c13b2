#!/usr/bin/env bash
# The device half of `just test-gpu`: runs in the repo root on the GPU machine, over the
# artifacts scripts/test-gpu.sh staged in gpu-run/. Stages (one or more, in order):
# tests rust-tests py-tests py-parallel doc-blocks sanitize bench transfer npy interop ray ray-figures ray-one overheads-ab spill-tests spill numba-all notebook demo capi multi cupy-tests all. `multi` is the 2-GPU check: it
# sets MEMARRAY_REQUIRE_PEER=1 and runs the NCCL, scatter/gather, IPC and graph tests, the
# examples and the all-reduce / IPC hand-off benches (nvidia-h200-x2).
# Everything runs with MEMARRAY_REQUIRE_GPU=1 (and _NCCL, _NVRTC), so a GPU test that would
# skip fails.
set -uo pipefail
export MEMARRAY_REQUIRE_GPU=1 MEMARRAY_REQUIRE_NCCL=1 MEMARRAY_REQUIRE_NVRTC=1 MEMARRAY_REQUIRE_MPI=1 MEMARRAY_REPO_ROOT=$PWD PYTHONUNBUFFERED=1
# The C ABI's library, for the C/C++ tests, the examples and the extension test.
export MEMARRAY_C_LIB_DIR=$PWD/gpu-run/lib
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
  # RMM, filecheck and Dask, carried: a target of their own, after memarray's on the path.
  export PYTHONPATH=/tmp/site
  if ls gpu-run/peer-wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/peers gpu-run/peer-wheels/*.whl \
      || fail "peer wheel install"
    export PYTHONPATH=/tmp/site:/tmp/peers MEMARRAY_REQUIRE_RMM=1 MEMARRAY_REQUIRE_DASK=1
  fi
  # Ray, when an earlier `ray` stage on this machine installed it: the suite runs its tests.
  if [ -d /tmp/ray-site/ray ]; then
    export PYTHONPATH=$PYTHONPATH:/tmp/ray-site MEMARRAY_REQUIRE_RAY=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
  fi
  python3 -c 'import memarray, sys; print("memarray", memarray.__file__, "cuda:", memarray.cuda.is_available(), memarray.cuda.device_count())'
  # The Rust test binaries load the NCCL of torch's nvidia-nccl wheel, as Python does.
  MEMARRAY_NCCL_LIBRARY=$(python3 -c 'import memarray.distributed as d; print(d.nccl_library() or "")')
  export MEMARRAY_NCCL_LIBRARY
  echo "NCCL: ${MEMARRAY_NCCL_LIBRARY:-not found}"
}

tests() {
  rust_tests
  py_tests
}

# The two halves of `tests`, for when the test binaries and the Python wheels do not fit
# one device call's 64 MiB together (carry gpu-run/bin, lib and wheels for the first;
# wheels, peer-wheels and lib for the second).
rust_tests() {
  echo "== cargo tests (release binaries)"
  for t in gpu-run/bin/*; do
    log="$LOGS/$(basename "$t").log"
    "$t" --test-threads=1 >"$log" 2>&1 || fail "$t"
    printf '%-48s %s\n' "$(basename "$t")" "$(grep -E '^test result:' "$log" | tail -n 1)"
    grep -E '^(SKIPPED|---- |thread .* panicked)' "$log" | head -n 20
  done
  tail -n +1 "$LOGS"/*.log >"$OUT/cargo-tests.log"
}

py_tests() {
  echo "== pytest"
  python3 -m pytest bindings-python/tests -q -rs --durations=8 -p no:cacheprovider >"$OUT/pytest.log" 2>&1 || fail pytest
  tail -n 25 "$OUT/pytest.log"
  doc_blocks
}

# The Python suite in concurrent groups (one pytest per group, each file whole in one group):
# run serially it no longer fits one 600 s device call (four groups on two H100s: 166 s
# for the longest). MEMARRAY_PY_GROUPS sets the count (default 3).
py_parallel() {
  local groups=${MEMARRAY_PY_GROUPS:-3} g pids=()
  echo "== pytest in $groups concurrent groups"
  python3 - "$groups" >"$LOGS/py-groups" <<'PY'
import pathlib, sys
# Rough seconds per file on an H100 (the rest weigh their line count / 40).
known = {"test_transfer.py": 20, "test_torch_route.py": 150, "test_interop.py": 90,
         "test_numba_cupy.py": 80, "test_spill.py": 60, "test_dask.py": 60, "test_mpi.py": 60}
files = sorted(pathlib.Path("bindings-python/tests").glob("test_*.py"))
weight = {f: known.get(f.name, len(f.read_text().splitlines()) / 40) for f in files}
n = int(sys.argv[1]); load = [0.0] * n; out = [[] for _ in range(n)]
for f in sorted(files, key=lambda f: -weight[f]):
    i = load.index(min(load)); load[i] += weight[f]; out[i].append(str(f))
for g in out:
    print(" ".join(g))
PY
  g=0
  while read -r files; do
    # shellcheck disable=SC2086
    python3 -m pytest $files -q -rs --durations=5 -p no:cacheprovider >"$OUT/pytest-$g.log" 2>&1 &
    pids+=($!); g=$((g + 1))
  done <"$LOGS/py-groups"
  for g in "${!pids[@]}"; do
    wait "${pids[$g]}" || fail "pytest group $g"
    echo "-- group $g: $(tail -n 1 "$OUT/pytest-$g.log")"
    grep -E '^(FAILED|ERROR) ' "$OUT/pytest-$g.log" | head -n 20
  done
}

doc_blocks() {
  echo "== doc blocks (GPU ones included)"
  python3 scripts/doc_blocks.py 2>&1 | tail -n 30 || fail "doc blocks"
  python3 scripts/doc_blocks_c.py 2>&1 | tail -n 10 || fail "C/C++ doc blocks"
}

# Whether a memcheck run that returned `rc` (log `$1`) passed: rc 0; or, with two GPUs or
# more visible, every error it counted is a warning about an NVTX memory call and the tests
# passed. compute-sanitizer loses the NVTX regions of memory whose device gains peer access
# after they were described (a one-file program with NVTX's own headers does the same
# without memarray; docs/benchmarks.md), and counts each failed call in its error summary.
# Prints what it decided. Usage: memcheck_ok LOG RC
memcheck_ok() {
  local log=$1 rc=$2 errors nvtx gpus
  [ "$rc" = 0 ] && return 0
  errors=$(grep -E 'ERROR SUMMARY: [0-9]+ error' "$log" | tail -n 1 | grep -oE '[0-9]+' | head -n 1)
  nvtx=$(grep -c 'Warning: Call to nvtxMem' "$log")
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "$rc" = 9 ] && [ "${gpus:-0}" -ge 2 ] && [ -n "$errors" ] && [ "$errors" = "$nvtx" ] \
    && grep -qE '^test result: ok' "$log" && ! grep -qE '^test result: FAILED' "$log" \
    && ! grep -q "didn't terminate successfully" "$log"; then
    echo "   memcheck: 0 memory errors; its $nvtx errors are NVTX API warnings after peer access (two GPUs)"
    return 0
  fi
  return 1
}

sanitize() {
  # API errors are not reported: the resource tests provoke CUDA_ERROR_OUT_OF_MEMORY and
  # the event tests an invalid handle on purpose. Every memory access is checked.
  echo "== compute-sanitizer memcheck over the Rust GPU tests"
  # gpu_nccl is left out: its kernels are NCCL's, not memarray's.
  for t in gpu-run/bin/memarray-cuda__gpu_* gpu-run/bin/memarray-seed__gpu_* gpu-run/bin/memarray-cuda__mirror_gpu; do
    [ "$t" = gpu-run/bin/memarray-cuda__gpu_nccl ] && continue
    log="$LOGS/sanitize-$(basename "$t").log"
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 "$t" --test-threads=1 \
      >"$log" 2>&1
    memcheck_ok "$log" $? || {
      fail "memcheck $t"
      # What it reported, each kind once (warnings about NVTX calls included).
      grep -E '^========= [A-Z]' "$log" | grep -v 'ERROR SUMMARY' | sed 's/ at 0x[0-9a-f]*//' \
        | sort | uniq -c | sort -rn | head -n 8
    }
    printf '%-48s %s | %s\n' "$(basename "$t")" \
      "$(grep -E '^test result:' "$log" | tail -n 1)" \
      "$(grep -E 'ERROR SUMMARY' "$log" | tail -n 1)"
  done
  # The pool's NVTX regions at work: a write past a pool block but inside its segment is
  # an invalid write with NVTX on, and invisible with --nvtx no (one cuMemAlloc).
  local t=gpu-run/bin/memarray-cuda__nvtx seen=() nvtx
  for nvtx in yes no; do
    log="$LOGS/sanitize-regions-nvtx-$nvtx.log"
    compute-sanitizer --tool memcheck --report-api-errors no --nvtx "$nvtx" "$t" --exact \
      gpu_a_write_past_a_pool_block_inside_its_segment --ignored --test-threads=1 >"$log" 2>&1
    seen+=("$(grep -c 'Invalid __global__ write' "$log")")
  done
  echo "a write past a pool block, inside its segment: invalid writes reported with NVTX on ${seen[0]}, off ${seen[1]}"
  [ "${seen[0]}" -ge 1 ] && [ "${seen[1]}" = 0 ] || fail "memcheck did not see the pool's regions"
  # The first 400 lines of each log (one failing binary's log can run to gigabytes).
  for log in "$LOGS"/sanitize-*.log; do
    echo "==> $log <=="
    head -n 400 "$log"
  done >"$OUT/sanitize.log"
}

bench() {
  echo "== benches"
  # The criterion benches; the others (*_cost, *_overhead, spill_policy) run by hand.
  for b in gpu-run/bench/memarray-cuda__transfer gpu-run/bench/memarray-cuda__resources \
    gpu-run/bench/memarray-cuda__kernel; do
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
  # memarray, torch and CuPy side by side; the JSON feeds benches/plot_transfer.py.
  python3 benches/transfer.py --json "$OUT/transfer.json" "$@" 2>&1 | tee "$OUT/transfer.log"
  # The host's own copy bandwidth beside it: a staged download's ceiling.
  python3 benches/host_bandwidth.py 2>&1 | tee "$OUT/host_bandwidth.log"
}

multi() {
  multi_rust
  multi_py
}

multi_rust() {
  export MEMARRAY_REQUIRE_PEER=1
  nvidia-smi topo -m 2>/dev/null | head -n 4
  echo "== 2-GPU Rust tests"
  for t in gpu-run/bin/memarray-cuda__gpu_nccl gpu-run/bin/memarray-cuda__gpu_multi gpu-run/bin/memarray-cuda__gpu_direct_copies gpu-run/bin/memarray-cuda__gpu_graph; do
    log="$LOGS/multi-$(basename "$t").log"
    "$t" --test-threads=1 >"$log" 2>&1 || fail "$t"
    printf '%-48s %s\n' "$(basename "$t")" "$(grep -E '^test result:' "$log" | tail -n 1)"
    grep -E '^(SKIPPED|NCCL|---- |thread .* panicked)' "$log" | head -n 20
  done
  tail -n +1 "$LOGS"/multi-*.log >"$OUT/multi-cargo.log"
  echo "== 2-GPU graph test under compute-sanitizer memcheck (NVTX memory description on)"
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    gpu-run/bin/memarray-cuda__gpu_graph --test-threads=1 >"$LOGS/multi-sanitize.log" 2>&1
  memcheck_ok "$LOGS/multi-sanitize.log" $? \
    || { tail -n 30 "$LOGS/multi-sanitize.log"; fail "2-GPU graph memcheck"; }
  grep -E '^(test result:|========= ERROR SUMMARY)' "$LOGS/multi-sanitize.log" | tail -n 2
}

# The Python half of `multi` (no test binaries to carry).
multi_py() {
  export MEMARRAY_REQUIRE_PEER=1
  echo "== 2-GPU pytest"
  python3 -m pytest bindings-python/tests/test_distributed.py bindings-python/tests/test_ipc.py \
    bindings-python/tests/test_cuda.py -q -rs -p no:cacheprovider >"$OUT/multi-pytest.log" 2>&1 || fail "multi pytest"
  # The monitor's bands, budgets and the OOM report on each of the two devices.
  python3 -m pytest bindings-python/tests/test_notebook.py bindings-python/tests/test_budgets.py \
    bindings-python/tests/test_out_of_memory.py -m gpu -q -rs -p no:cacheprovider >>"$OUT/multi-pytest.log" 2>&1 \
    || fail "multi pytest (monitor, budgets)"
  tail -n 8 "$OUT/multi-pytest.log"
  echo "== examples"
  timeout 240 python3 -m torch.distributed.run --nproc-per-node 2 --master-port 29531 examples/distributed_torch.py 2>&1 \
    | grep -vE '^(W|I)[0-9]{4}' | tail -n 5 || fail distributed_torch
  python3 examples/scatter_gather.py || fail scatter_gather
  timeout 240 python3 examples/ipc_pipeline.py --mib 256 --frames 40 || fail ipc_pipeline
  echo "== benches"
  timeout 240 python3 -m torch.distributed.run --nproc-per-node 2 --master-port 29533 benches/allreduce.py --json "$OUT/allreduce.json" 2>&1 \
    | grep -vE '^(W|I)[0-9]{4}' | tee "$OUT/allreduce.log"
  timeout 240 python3 benches/ipc_handoff.py --mib 256 --json "$OUT/ipc_handoff.json" 2>&1 | tee "$OUT/ipc_handoff.log"
  # One peer copy by the copy engines, one stream and split (Ray's IPC transport's copy).
  timeout 120 python3 benches/peer_copy.py --json "$OUT/peer_copy.json" 2>&1 | tee "$OUT/peer_copy.log"
}

interop() {
  # Torch, RMM, CuPy and Numba through memarray (targets), and Numba's driver and
  # array tests under the plugin against Numba's own manager.
  echo "== interop tests"
  python3 -m pytest bindings-python/tests/test_interop.py bindings-python/tests/test_numba_cupy.py \
    -q -rs -p no:cacheprovider 2>&1 | tail -n 15 || fail "interop pytest"
  echo "== Numba's tests: plugin against Numba's manager"
  python3 scripts/numba_compare.py 2>&1 | tee "$OUT/numba_compare.log" || fail "numba compare"
  echo "== the one-pool example (its picture goes in docs/memory-manager.md)"
  python3 examples/one_pool.py --png "$OUT/one_pool.png" || fail one_pool
  echo "== allocation targets"
  python3 benches/interop_alloc.py --json "$OUT/interop_alloc.json" 2>&1 | tee "$OUT/interop_alloc.log" \
    || echo "!! allocation targets missed"
}

capi() {
  # The C++/CUDA particle step built with CMake + nvcc against libmemarray.so,
  # checked against NumPy, and run under compute-sanitizer memcheck (a smaller case).
  echo "== C/C++ examples (CMake, nvcc)"
  rm -rf /tmp/memarray-cpp && mkdir -p /tmp/memarray-cpp/out
  cmake -S examples/cpp -B /tmp/memarray-cpp -DMEMARRAY_LIB_DIR="$MEMARRAY_C_LIB_DIR" \
    -DPython3_EXECUTABLE="$(command -v python3)" >"$LOGS/cmake.log" 2>&1 \
    && cmake --build /tmp/memarray-cpp -j 8 >>"$LOGS/cmake.log" 2>&1 || { tail -n 30 "$LOGS/cmake.log"; fail cmake; }
  /tmp/memarray-cpp/particles /tmp/memarray-cpp/out 1000000 64 10 || fail particles
  python3 examples/cpp/check_particles.py /tmp/memarray-cpp/out 1000000 64 10 || fail check_particles
  compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/memarray-cpp/particles /tmp/memarray-cpp/out 20000 16 3 \
    2>&1 | tail -n 3 || fail "memcheck particles"
  python3 examples/cpp/check_particles.py /tmp/memarray-cpp/out 20000 16 3 || fail check_particles_small
  ls /tmp/memarray-cpp/memarray_ext*.so >/dev/null 2>&1 || fail "the extension was not built by CMake"
  /tmp/memarray-cpp/saxpy || fail saxpy
}

ray_stage() {
  # Ray's cp312 wheel (79 MB) travels in two parts, one per call (carry gpu-run/ray-wheels/
  # ray.part.aa, then ray.part.ab with ray-deps and wheels), joined in /tmp, which survives
  # between calls on a warm machine. `ray_stage figures` (the `ray-figures` stage) skips
  # the tests, the pack benches and the examples: Ray's figures alone (with ray_sides.py), for a build whose
  # tests already passed; `ray_stage one` (`ray-one`) runs Ray's tests alone with one
  # visible GPU, on a machine of any size.
  local mode=${1:-}
  mkdir -p /tmp/ray-parts
  cp gpu-run/ray-wheels/ray.part.* /tmp/ray-parts/ 2>/dev/null
  if [ "$(ls /tmp/ray-parts | wc -l)" -lt 2 ]; then
    echo "Ray: $(ls /tmp/ray-parts) staged; call again with the other part"; return
  fi
  if [ ! -d /tmp/ray-site/ray ]; then
    cat /tmp/ray-parts/ray.part.* >/tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ray-site \
      /tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl gpu-run/ray-deps/*.whl || fail "Ray install"
  fi
  export PYTHONPATH=$PYTHONPATH:/tmp/ray-site MEMARRAY_REQUIRE_RAY=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
  if [ "$mode" = one ]; then
    echo "== Ray tests, one visible GPU"
    CUDA_VISIBLE_DEVICES=0 MEMARRAY_REQUIRE_PEER=0 python3 -m pytest bindings-python/tests/test_ray.py -q -rs -s \
      -p no:cacheprovider >"$OUT/pytest_ray_one.log" 2>&1 || fail "pytest ray, one GPU"
    grep -E "passed|failed|^FAILED|^E .*(Error|assert)|SKIPPED" "$OUT/pytest_ray_one.log" | tail -n 15
    return
  fi
  local peer=0
  [ "$(python3 -c 'import memarray; print(memarray.cuda.device_count())')" -ge 2 ] && peer=1
  if [ "$mode" != figures ]; then
    echo "== Ray tests"
    MEMARRAY_REQUIRE_PEER=$peer python3 -m pytest bindings-python/tests/test_ray.py -q -rs -s -p no:cacheprovider >"$OUT/pytest_ray.log" 2>&1 \
      || fail "pytest ray"
    grep -E "passed|failed|^FAILED|^E .*(Error|assert)|host arrays of 4 KiB" "$OUT/pytest_ray.log" | tail -n 15
  fi
  echo "== Ray figures"
  timeout 300 python3 benches/ray_transfer.py --json "$OUT/ray_transfer.json" >"$OUT/ray_transfer.log" 2>&1
  grep -E "ms .* GB/s|SKIPPED|land on|receiver|NCCL group|Error|per object" "$OUT/ray_transfer.log"
  if [ "$mode" = figures ]; then
    # Ray's own cost per object by kind of transport, and per value (no GPU work).
    timeout 120 python3 benches/ray_sides.py --json "$OUT/ray_sides.json" 2>&1 | grep -v WARNING
    timeout 200 python3 benches/ray_sides.py --rounds 30 --count 1000 --json "$OUT/ray_sides_1000.json" 2>&1 \
      | grep -v WARNING
    return
  fi
  echo "== packing many small arrays (the SM copy kernel, the driver's batch, torch.cat)"
  python3 benches/pack.py --json "$OUT/pack.json" || fail "pack bench"
  python3 benches/bundle_table.py --device cuda --json "$OUT/bundle_table.json" || fail "bundle table bench"
  python3 benches/small_copies.py --json "$OUT/small_copies.json" || fail "small copies bench"
  timeout 120 python3 examples/ray_pipeline.py || fail ray_pipeline
  timeout 120 python3 examples/ray_pipeline.py --nccl || fail "ray_pipeline --nccl"
}

ucx_stage() {
  # Dask over UCX (carry gpu-run/ucx-wheels, peer-wheels and wheels): the figures against
  # CuPy, then both again with UCX's protocol choice printed (UCX_PROTO_INFO).
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/ucx \
    gpu-run/ucx-wheels/*.whl || fail "UCX wheel install"
  export PYTHONPATH=$PYTHONPATH:/tmp/ucx
  echo "== Dask over UCX"
  timeout 400 python3 benches/dask_transfer.py --protocol ucxx --json "$OUT/dask_ucxx.json" 2>&1 \
    | grep -vE "^\s*$|WARNING|warn" | tee "$OUT/dask_ucxx.log"
  echo "== UCX's protocol choices, 64 MiB (UCX_PROTO_INFO=y; full log in ucx_proto.log)"
  UCX_PROTO_INFO=y timeout 300 python3 benches/dask_transfer.py --protocol ucxx --mib 64 \
    >"$OUT/ucx_proto.log" 2>&1
  grep -E "rndv|eager|cuda_ipc|cuda_copy|worker to worker" "$OUT/ucx_proto.log" | sort | uniq -c | sort -rn | head -n 30
  if [ "$(python3 -c 'import memarray; print(memarray.cuda.device_count())')" -ge 2 ]; then
    echo "== Dask over UCX, workers seeing every GPU (a plain LocalCluster)"
    UCX_PROTO_INFO=y timeout 300 python3 benches/dask_transfer.py --protocol ucxx --gpus 0 \
      >"$OUT/ucx_shared.log" 2>&1
    grep -E "rndv|rendezvous|pipeline|_ms |GB/s" "$OUT/ucx_shared.log" | grep -v INFO | sort | uniq -c | sort -rn | head -n 20
  fi
  echo "== Dask over TCP"
  timeout 300 python3 benches/dask_transfer.py --protocol tcp --json "$OUT/dask_tcp.json" 2>&1 \
    | grep -vE "^\s*$|WARNING|warn" | tail -n 14
}

demo() {
  echo "== demo and examples"
  python3 examples/demo.py || fail demo
  for e in gpu-run/examples/*; do "$e" || fail "$e"; done
}

setup
[ $# -eq 0 ] && set -- all
while [ $# -gt 0 ]; do
  case "$1" in
    tests) tests ;;
    rust-tests) rust_tests ;;
    py-tests) py_tests ;;
    py-parallel) py_parallel ;;
    doc-blocks) doc_blocks ;;
    sanitize) sanitize ;;
    bench) bench ;;
    demo) demo ;;
    capi) capi ;;
    multi) multi ;;
    multi-rust) multi_rust ;;
    multi-py) multi_py ;;
    py-files) shift; echo "== pytest $*"
      python3 -m pytest -q -rs -p no:cacheprovider "$@" >"$OUT/pytest-files.log" 2>&1 || fail "pytest $*"
      tail -n 15 "$OUT/pytest-files.log"; break ;;
    transfer) shift; transfer "$@"; break ;;
    npy) python3 benches/npy_load.py 2>&1 | tee "$OUT/npy_load.log"
      python3 benches/safetensors_load.py --json "$OUT/safetensors_load.json" 2>&1 \
        | tee "$OUT/safetensors_load.log" ;;
    interop) interop ;;
    ray) ray_stage ;;
    ray-figures) ray_stage figures ;;
    ray-one) ray_stage one ;;
    ucx) ucx_stage ;;
    dask)
      # Dask figures against CuPy, the pipeline and halo examples.
      python3 benches/dask_transfer.py --json "$OUT/dask_transfer.json" 2>&1 | tee "$OUT/dask_transfer.log"
      # 1,000 small device arrays worker to worker: a list against one Bundle.
      timeout 300 python3 benches/dask_bundle.py --device cuda --json "$OUT/dask_bundle.json" 2>&1 \
        | grep -v -E 'INFO|WARNING' | tee "$OUT/dask_bundle.log"
      python3 examples/dask_pipeline.py || fail dask_pipeline
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 python3 examples/mpi_halo.py \
        || fail mpi_halo ;;
    overheads)
      # The overhead targets (a benchmark's miss is a figure, not a failure).
      python3 benches/overheads.py --json "$OUT/overheads.json" 2>&1 | tee "$OUT/overheads.log"
      [ "${PIPESTATUS[0]}" = 0 ] || echo "!! overhead targets missed"
      # The out-of-memory report on a device (memarray past a budget) and the monitor's
      # refresh at 100,000 allocations.
      python3 benches/oom_report.py --device 0 --json "$OUT/oom_report.json" 2>&1 | tee "$OUT/oom_report.log"
      python3 benches/monitor_scale.py --json "$OUT/monitor_scale.json" 2>&1 | tee "$OUT/monitor_scale.log"
      python3 benches/worker_sample.py --json "$OUT/worker_sample.json" 2>&1 | tee "$OUT/worker_sample.log"
      python3 benches/fragmentation.py --json "$OUT/fragmentation.json" 2>&1 | tee "$OUT/fragmentation.log"
      python3 benches/offload.py --json "$OUT/offload.json" 2>&1 | tee "$OUT/offload.log"
      python3 benches/cuda_core_alloc.py --json "$OUT/cuda_core_alloc.json" 2>&1 \
        | tee "$OUT/cuda_core_alloc.log"
      [ "${PIPESTATUS[0]}" = 0 ] || echo "!! cuda.core target missed"
      # The pinned pool against torch, CuPy, cuda.core and RMM (65,536 free blocks), and
      # what small copies cost the calling thread.
      python3 benches/pinned_pool.py --json "$OUT/pinned_pool.json" 2>&1 | tee "$OUT/pinned_pool.log"
      [ "${PIPESTATUS[0]}" = 0 ] || echo "!! pinned pool targets missed"
      gpu-run/bench/memarray-cuda__small_copy 2>&1 | tee "$OUT/small_copy.log"
      # Page-locking a download's destination in place, against the staged download.
      python3 benches/pin_cost.py 2>&1 | tee "$OUT/pin_cost.log" ;;
    overheads-ab)
      # benches/overheads.py and bundle_table.py under the old build's wheel
      # (gpu-run/ab-wheels/*.whl: stage with AB_BASE=<commit> scripts/test-gpu.sh, carry
      # gpu-run/ab-wheels) and this one's, taking turns, three runs each: what a change to
      # the hot paths bought.
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site-old \
        gpu-run/ab-wheels/*.whl || fail "old wheel install"
      for i in 1 2 3; do
        for side in old new; do
          site=/tmp/site; [ "$side" = old ] && site=/tmp/site-old
          echo "-- overheads, $side build, run $i"
          PYTHONPATH=$site:${PYTHONPATH#/tmp/site} python3 benches/overheads.py \
            --json "$OUT/overheads-$side-$i.json" 2>&1 | tee -a "$OUT/overheads-ab.log" \
            | grep -E 'Tracking|spilling|from_dlpack'
          PYTHONPATH=$site:${PYTHONPATH#/tmp/site} python3 benches/bundle_table.py --device cuda \
            --json "$OUT/bundle-table-$side-$i.json" 2>&1 | tee -a "$OUT/overheads-ab.log" | tail -n 7
        done
      done ;;
    spill-tests)
      log="$LOGS/gpu_spill.log"
      gpu-run/bin/memarray-cuda__gpu_spill --test-threads=1 >"$log" 2>&1 || fail gpu_spill
      grep -E '^(test |test result:|---- |thread .* panicked)' "$log" | head -n 40
      python3 -m pytest bindings-python/tests/test_spill.py -q -rs -p no:cacheprovider 2>&1 | tail -n 40 || fail "pytest spill" ;;
    spill) python3 benches/spill.py --json "$OUT/spill.json" 2>&1 | tee "$OUT/spill.log"; [ "${PIPESTATUS[0]}" = 0 ] || fail "spill bench" ;;
    numba-all) python3 scripts/numba_compare.py --all 2>&1 | tee "$OUT/numba_all.log" || fail "numba all" ;;
    notebook)
      # The tour notebook on the GPU path, in a fresh kernel (carry gpu-run/nb-wheels).
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/nb \
        gpu-run/nb-wheels/*.whl || fail "notebook wheel install"
      PYTHONPATH=$PYTHONPATH:/tmp/nb python3 scripts/notebook_check.py "$OUT/notebook" --no-browser \
        2>&1 | grep -v WARNING || fail "tour notebook"
      PYTHONPATH=$PYTHONPATH:/tmp/nb python3 -m pytest -q -p no:cacheprovider \
        bindings-python/tests/test_notebook.py 2>&1 | tail -n 3 || fail "pytest notebook" ;;
    cupy-tests)
      # CuPy's own test files (gpu-run/cupy-tests/, taken from CuPy's repository at the
      # installed version's tag by scripts/test-gpu.sh) on CuPy's pool, then through
      # memarray's allocator: the two summaries must match.
      python3 -c 'import cupy; print("cupy", cupy.__version__)'
      ls gpu-run/cupy-tests/test_*.py >/dev/null 2>&1 || fail "no CuPy tests staged (CUPY_REPO)"
      # Files whose tests can kill their process (CUDA graph captures: test_graph.py,
      # test_stream.py) run one test per process (scripts/pytest_isolated.py), so a crash
      # is counted, not the end of the run; the others run whole.
      for f in gpu-run/cupy-tests/test_*.py; do
        for way in own memarray; do
          plugin=(); [ "$way" = memarray ] && plugin=(-p cupy_through_memarray)
          case "$(basename "$f")" in
            test_graph.py | test_stream.py)
              PYTHONPATH=$PYTHONPATH:bindings-python/tests timeout 1800 python3 scripts/pytest_isolated.py \
                "$f" --timeout 300 --jobs 8 -- "${plugin[@]}" >"$LOGS/cupy-$way.log" 2>&1
              summary=$(head -n 1 "$LOGS/cupy-$way.log") ;;
            *)
              PYTHONPATH=$PYTHONPATH:bindings-python/tests timeout 900 python3 -m pytest -q -p no:cacheprovider \
                "${plugin[@]}" "$f" >"$LOGS/cupy-$way.log" 2>&1
              summary=$(tail -n 1 "$LOGS/cupy-$way.log" | sed 's/ in .*//') ;;
          esac
          printf '%-28s %-9s %s\n' "$(basename "$f")" "$way" "$summary"
          grep -E '^(FAILED|failed:|crashed:|timed out:)' "$LOGS/cupy-$way.log" | head -n 20
          echo "$summary" >"$LOGS/cupy-$way.summary"
        done
        cmp -s "$LOGS/cupy-own.summary" "$LOGS/cupy-memarray.summary" \
          || fail "cupy tests differ through memarray: $f"
      done ;;
    all) tests; demo; capi; sanitize; interop; spill; bench ;;
    *) echo "usage: remote.sh [tests|rust-tests|py-tests|py-parallel|doc-blocks|multi-rust|multi-py|sanitize|bench|npy|interop|ray|ray-figures|ray-one|ucx|overheads|dask|spill-tests|spill|numba-all|notebook|demo|capi|multi|cupy-tests|all]... | transfer [args] | py-files FILE..."; exit 2 ;;
  esac
  shift
done
echo "== remote.sh done, rc=$rc"
exit $rc
