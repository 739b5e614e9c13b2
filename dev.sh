#!/usr/bin/env bash
# memarray developer entry point. Needs only Rust (cargo) and Python 3 >= 3.11.
#   ./dev.sh demo      build the wheel into .venv and run examples/demo.py (GPU if present)
#   ./dev.sh test      cargo test --workspace + pytest (bindings-python/tests) + the guides' blocks,
#                      quiet (logs in target/), one verdict line at the end; -v shows all
#   ./dev.sh lint      clippy -D warnings, rustfmt --check, ruff
#   ./dev.sh doc       cargo doc for the workspace and an index of the crates (--open opens it)
#   ./dev.sh wheel     build the abi3 wheel into dist/
#   ./dev.sh bench     cargo bench, then benches/transfer.py (torch, CuPy side by side) + plot
#   ./dev.sh venv      create .venv with maturin, numpy, pytest and the wheel installed
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
VENV=.venv

# What the demo needs (the wheel's build tool and its one dependency), and what the tests
# and lint add. Pinned to ranges tested here; quiet unless something fails.
DEMO_PACKAGES=("maturin>=1.9,<2" "numpy>=2.2.5")
TEST_PACKAGES=("pytest>=8" "pytest-timeout>=2.3" "ml_dtypes>=0.5" "ruff>=0.6" "mypy>=1.18" "matplotlib>=3.7" "ipywidgets>=8"
  "nbclient>=0.10" "nbformat>=5.10" "nbconvert>=7.16" "ipykernel>=6.29" "tqdm>=4.66"
  "voila>=0.5.8,<0.6" "websocket-client>=1.8"
  "dask==2026.8.0" "distributed==2026.8.0" "mpi4py>=4.1" "mpich>=4.2" "ray==2.60.0"
  "safetensors==0.8.0")

make_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  echo "== installing into $VENV: $* (pip, quiet)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"
}

venv() {
  make_venv "${DEMO_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
  install_wheel
}

install_wheel() {
  # Build the release wheel and install it into the venv (no editable install: the test
  # suite exercises what users get). Cargo's progress shows on a terminal (and with -v);
  # otherwise one line says what is happening.
  local progress=-q
  if [ -t 2 ] || [ "${MEMARRAY_VERBOSE:-0}" = 1 ]; then
    progress=
    echo "== building the release wheel (cargo's progress below; under a minute the first time on 2 idle cores, seconds after)" >&2
  else
    echo "== building the release wheel (under a minute the first time on 2 idle cores, seconds after)" >&2
  fi
  "$VENV/bin/maturin" build --release $progress -o target/wheels -i "$VENV/bin/python" >/dev/null
  local whl
  whl=$(ls -t target/wheels/memarray-*.whl | head -n 1)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$whl"
}

# "N passed; M failed; K skipped" of one runner's output, for the verdict.
pytest_counts() {
  python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
last = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|error)", l)]
line = last[-1] if last else ""
n = {k: sum(int(m) for m in re.findall(r"(\d+) " + k, line)) for k in ("passed", "failed", "skipped", "error")}
print(f"{n['passed']} passed; {n['failed'] + n['error']} failed; {n['skipped']} skipped")
PY
}

cmd=${1:-help}
shift || true
case "$cmd" in
  venv) venv ;;
  demo)
    # Only what the demo needs: the wheel and NumPy (torch and CuPy are used when present).
    make_venv "${DEMO_PACKAGES[@]}"
    install_wheel
    "$VENV/bin/python" examples/demo.py "$@"
    ;;
  test)
    # Quiet by default: each runner's detail goes to a log under target/, its summary here,
    # and one verdict adds them up. -v (or MEMARRAY_VERBOSE=1) shows everything.
    verbose=${MEMARRAY_VERBOSE:-0}
    if [ "${1:-}" = "-v" ]; then
      verbose=1
      shift
    fi
    export MEMARRAY_VERBOSE=$verbose
    show() { if [ "$verbose" = 1 ]; then tee "$1"; else cat >"$1"; fi; }
    mkdir -p target
    rm -f target/skips.log
    failed=0
    # What a fresh clone's `cargo test --workspace` runs, nothing built first (the C ABI's
    # tests link the libraries cargo test builds for them), with the nccl feature on. GPU
    # tests without a device log their skip to target/skips.log: counted here, the reason
    # printed once.
    echo "== cargo test --workspace (compiling first: a few minutes cold; log: target/cargo-test.log)"
    MEMARRAY_SKIP_LOG="$PWD/target/skips.log" \
      cargo test --workspace --features memarray-cuda/nccl "$@" 2>&1 | show target/cargo-test.log \
      || failed=1
    grep -E '^(failures:|---- |test result: FAILED)' target/cargo-test.log | head -n 40 || true
    gpu_only=$(grep -c '^SKIPPED: no CUDA device' target/skips.log 2>/dev/null || true)
    cargo_counts=$(grep -E '^test result:' target/cargo-test.log | awk '{p+=$4; f+=$6; i+=$8} END {printf "%d passed; %d failed; %d ignored", p, f, i}')
    echo "== cargo summary: $cargo_counts; ${gpu_only:-0} of the passed returned early: $(grep -m1 '^SKIPPED: no CUDA device' target/skips.log 2>/dev/null || echo 'none skipped')"
    # The Python C-extension test links target/debug/libmemarray.so.
    cargo build -q -p memarray-c || failed=1
    venv
    rm -f target/crashproof.txt
    # The venv installs matplotlib: its plot tests must run, not skip.
    # The C extension test builds against the libmemarray.so cargo test just built.
    echo "== pytest bindings-python/tests (log: target/pytest.log)"
    # Where chromium is installed (CI installs it), the tour notebook must render in it.
    if command -v chromium >/dev/null; then export MEMARRAY_REQUIRE_BROWSER=1; fi
    # A test past 20 minutes fails with every thread's stack (its children have timeouts
    # of their own, at most 15 minutes) instead of holding the run.
    MEMARRAY_REQUIRE_PLOT=1 MEMARRAY_C_LIB_DIR="$PWD/target/debug" \
      MEMARRAY_REQUIRE_DASK=1 MEMARRAY_REQUIRE_MPI=1 MEMARRAY_REQUIRE_RAY=1 "$VENV/bin/python" -m pytest bindings-python/tests -q \
      --timeout 1200 \
      2>&1 | show target/pytest.log || failed=1
    grep -E '^(FAILED|ERROR) ' target/pytest.log | head -n 40 || true
    py_counts=$(pytest_counts target/pytest.log)
    echo "== pytest summary: $py_counts; $(grep -m1 -oE '^ *[0-9]+ +SKIPPED: no CUDA device' target/pytest.log | awk '{print $1}' || echo 0) of the skipped need a GPU"
    echo "== $(cat target/crashproof.txt 2>/dev/null || echo 'crash-proof suite: did not run')"
    echo "== docs: the Python blocks of README.md, docs/python-guide.md, docs/memory-manager.md and docs/spilling.md"
    "$VENV/bin/python" scripts/doc_blocks.py 2>&1 | show target/doc-blocks.log || failed=1
    doc_summary=$(grep -E '^doc blocks:' target/doc-blocks.log | tail -n 1)
    echo "== $doc_summary"
    echo "== docs: the C and C++ blocks of docs/c-cpp-guide.md"
    "$VENV/bin/python" scripts/doc_blocks_c.py 2>&1 | show target/doc-blocks-c.log || failed=1
    c_summary=$(grep -E '^C/C\+\+ doc blocks:' target/doc-blocks-c.log | tail -n 1)
    echo "== $c_summary"
    if [ "$failed" = 0 ]; then verdict=PASSED; else verdict=FAILED; fi
    echo "== verdict: $verdict | cargo: $cargo_counts (${gpu_only:-0} GPU-only returned early) | pytest: $py_counts | ${doc_summary:-doc blocks: did not run} | ${c_summary:-C/C++ doc blocks: did not run}"
    [ "$failed" = 0 ]
    ;;
  lint)
    cargo clippy --workspace --all-targets --features memarray-cuda/nccl -- -D warnings
    # Without the nccl feature too (the Python crate turns it on for the whole workspace).
    cargo clippy -p memarray-core -p memarray-cuda -p memarray-seed -p memarray-dlpack -p memarray-c --all-targets -- -D warnings
    cargo fmt --all --check
    python3 scripts/layering.py
    # Intra-doc links resolve and the docs build warning-free with every feature.
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -q -p memarray-core -p memarray-cuda -p memarray-seed -p memarray-dlpack -p memarray-c \
      --features memarray-cuda/nccl
    [ -x "$VENV/bin/ruff" ] || venv
    "$VENV/bin/ruff" check bindings-python examples benches scripts
    "$VENV/bin/ruff" format --check bindings-python examples benches scripts
    # Stubs checked against the built module; examples and the guide's blocks type-check.
    "$VENV/bin/python" -m mypy.stubtest memarray --mypy-config-file bindings-python/pyproject.toml \
      --allowlist bindings-python/stubtest-allowlist.txt
    "$VENV/bin/python" scripts/doc_blocks.py --emit target/guide_blocks.py
    "$VENV/bin/python" -m mypy --config-file bindings-python/pyproject.toml examples/*.py target/guide_blocks.py
    ;;
  bench)
    # Rust criterion benches, then memarray / torch / CuPy side by side and the plot.
    # The Python bench needs torch and CuPy in .venv (it says so and skips otherwise).
    cargo bench -p memarray-cuda "$@"
    venv
    mkdir -p target
    rm -f target/transfer.json
    "$VENV/bin/python" benches/transfer.py --json target/transfer.json
    if [ -f target/transfer.json ]; then
      "$VENV/bin/python" benches/plot_transfer.py target/transfer.json target/transfer.png
    fi
    # Host memory against NumPy, a Bundle's table across a pickle (no GPU needed).
    "$VENV/bin/python" benches/host_load.py
    "$VENV/bin/python" benches/bundle_table.py
    "$VENV/bin/python" benches/dask_bundle.py 2>&1 | grep -v -E 'INFO|WARNING'
    ;;
  doc)
    cargo doc --workspace --no-deps --exclude memarray-python
    # The C ABI crate is left out of plain `cargo doc` (its lib sets doc = false, so
    # `cargo doc --open` lands on memarray_core, which leads to memarray_cuda); built here.
    cargo doc -p memarray-c --no-deps
    # cargo makes no workspace landing page: target/doc/index.html leads to every crate.
    {
      echo '<!doctype html><meta charset="utf-8"><title>memarray</title><h1>memarray crates</h1><ul>'
      echo '<li><a href="memarray_core/index.html">memarray_core</a>: dtypes, shapes, Indexer, locks, host memory, MemoryResource</li>'
      echo '<li><a href="memarray_cuda/index.html">memarray_cuda</a>: devices, streams, events, CUDA resources, MemArray, kernels, NCCL, spilling</li>'
      echo '<li><a href="memarray_dlpack/index.html">memarray_dlpack</a>: DLPack export and import</li>'
      echo '<li><a href="memarray/index.html">memarray</a> (crate memarray-c): the C ABI</li></ul>'
    } > target/doc/index.html
    echo "== target/doc/index.html"
    if [ "${1:-}" = "--open" ]; then
      "$PY" -m webbrowser -t "file://$PWD/target/doc/index.html" >/dev/null
    fi
    ;;
  wheel)
    [ -x "$VENV/bin/maturin" ] || venv
    "$VENV/bin/maturin" build --release -o dist
    ;;
  *)
    sed -n '2,10p' "$0"
    exit 2
    ;;
esac
