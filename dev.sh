#!/usr/bin/env bash
# memarray developer entry point. Needs only Rust (cargo) and Python 3 >= 3.11.
#   ./dev.sh demo      build the wheel into .venv and run examples/demo.py (GPU if present)
#   ./dev.sh test      cargo test --workspace + pytest (bindings-python/tests) + the guides' blocks
#   ./dev.sh lint      clippy -D warnings, rustfmt --check, ruff
#   ./dev.sh doc       cargo doc for the workspace
#   ./dev.sh wheel     build the abi3 wheel into dist/
#   ./dev.sh bench     cargo bench, then benches/transfer.py (torch, CuPy side by side) + plot
#   ./dev.sh venv      create .venv with maturin, numpy, pytest and the wheel installed
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
VENV=.venv

venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  # Pinned to ranges tested here; quiet unless something fails.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "maturin>=1.9,<2" "numpy>=2.2.5" "pytest>=8" "ml_dtypes>=0.5" "ruff>=0.6" "mypy>=1.18" \
    "matplotlib>=3.7" "dask==2026.8.0" "distributed==2026.8.0" "mpi4py>=4.1" "mpich>=4.2"
  install_wheel
}

install_wheel() {
  # Build the release wheel and install it into the venv (no editable install: the test
  # suite exercises what users get).
  echo "== building the release wheel (about a minute the first time on 2 cores)" >&2
  "$VENV/bin/maturin" build --release -q -o target/wheels -i "$VENV/bin/python" >/dev/null
  local whl
  whl=$(ls -t target/wheels/memarray-*.whl | head -n 1)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$whl"
}

cmd=${1:-help}
shift || true
case "$cmd" in
  venv) venv ;;
  demo)
    venv
    "$VENV/bin/python" examples/demo.py "$@"
    ;;
  test)
    mkdir -p target
    rm -f target/skips.log
    # What a fresh clone's `cargo test --workspace` runs, nothing built first (the C ABI's
    # tests link the libraries cargo test builds for them), with the nccl feature on. GPU
    # tests without a device log their skip to target/skips.log: counted here, the reason
    # printed once.
    MEMARRAY_SKIP_LOG="$PWD/target/skips.log" \
      cargo test --workspace --features memarray-cuda/nccl "$@" 2>&1 | tee target/cargo-test.log
    skipped=$(grep -c '^SKIPPED: no CUDA device' target/skips.log 2>/dev/null || true)
    echo "== cargo summary: $(grep -E '^test result:' target/cargo-test.log | awk '{p+=$4; f+=$6; i+=$8} END {printf "%d passed; %d failed; %d ignored", p, f, i}');" \
      "${skipped:-0} of the passed returned early: $(grep -m1 '^SKIPPED: no CUDA device' target/skips.log 2>/dev/null || echo 'none skipped')"
    # The Python C-extension test links target/debug/libmemarray.so.
    cargo build -q -p memarray-c
    venv
    rm -f target/crashproof.txt
    # The venv installs matplotlib: its plot tests must run, not skip.
    # The C extension test builds against the libmemarray.so cargo test just built.
    MEMARRAY_REQUIRE_PLOT=1 MEMARRAY_C_LIB_DIR="$PWD/target/debug" \
      MEMARRAY_REQUIRE_DASK=1 MEMARRAY_REQUIRE_MPI=1 "$VENV/bin/python" -m pytest bindings-python/tests -q
    echo "== $(cat target/crashproof.txt 2>/dev/null || echo 'crash-proof suite: did not run')"
    echo "== docs: the Python blocks of README.md, docs/python-guide.md, docs/memory-manager.md and docs/spilling.md"
    "$VENV/bin/python" scripts/doc_blocks.py
    echo "== docs: the C and C++ blocks of docs/c-cpp-guide.md"
    "$VENV/bin/python" scripts/doc_blocks_c.py
    ;;
  lint)
    cargo clippy --workspace --all-targets --features memarray-cuda/nccl -- -D warnings
    # Without the nccl feature too (the Python crate turns it on for the whole workspace).
    cargo clippy -p memarray-core -p memarray-cuda -p memarray-dlpack -p memarray-c --all-targets -- -D warnings
    cargo fmt --all --check
    python3 scripts/layering.py
    # Intra-doc links resolve and the docs build warning-free with every feature.
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -q -p memarray-core -p memarray-cuda -p memarray-dlpack -p memarray-c \
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
    ;;
  doc)
    cargo doc --workspace --no-deps --exclude memarray-python
    # cargo makes no workspace landing page: target/doc/index.html leads to every crate.
    {
      echo '<!doctype html><meta charset="utf-8"><title>memarray</title><h1>memarray crates</h1><ul>'
      echo '<li><a href="memarray_core/index.html">memarray_core</a>: dtypes, shapes, Indexer, locks, host memory, MemoryResource</li>'
      echo '<li><a href="memarray_cuda/index.html">memarray_cuda</a>: devices, streams, events, CUDA resources, MemArray, kernels, NCCL, spilling</li>'
      echo '<li><a href="memarray_dlpack/index.html">memarray_dlpack</a>: DLPack export and import</li>'
      echo '<li><a href="memarray/index.html">memarray</a> (crate memarray-c): the C ABI</li></ul>'
    } > target/doc/index.html
    echo "== target/doc/index.html"
    ;;
  wheel)
    [ -x "$VENV/bin/maturin" ] || venv
    "$VENV/bin/maturin" build --release -o dist
    ;;
  *)
    sed -n '2,9p' "$0"
    exit 2
    ;;
esac
