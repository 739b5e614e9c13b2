#!/usr/bin/env bash
# `just test-gpu`, the half that runs here: build every GPU artifact on this machine
# (release test binaries, bench binaries, examples, the abi3 wheel) and stage them in
# gpu-run/ (git-ignored). The device machine has no Rust; it runs gpu-run/remote.sh:
#
#   device run, carry ["gpu-run"], command "bash gpu-run/remote.sh all"
#
# remote.sh stages: tests | sanitize | bench | npy | interop | overheads | dask | numba-all | demo | multi | all, several
# at once (see scripts/gpu-remote.sh). gpu-run/ with the carried peer wheels is near the
# device tool's 64 MiB: carry the parts a stage needs (bin, wheels, peer-wheels, remote.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=gpu-run
rm -rf "$STAGE"
mkdir -p "$STAGE/bin" "$STAGE/bench" "$STAGE/examples" "$STAGE/wheels" "$STAGE/lib"

# Executables from cargo's JSON messages: "<kind> <name> <path>" per line.
executables() {
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        t = m["target"]
        print(t["kind"][0], m["package_id"].split("#")[0].rsplit("/", 1)[-1] + "__" + t["name"], m["executable"])
'
}

echo "== building release test binaries"
cargo test --release --workspace --exclude memarray-python --features memarray-cuda/nccl --no-run --message-format=json 2>/dev/null \
  | executables | while read -r kind name path; do
      # The header check reads src/ with cargo: a host-side test (CI runs it).
      if [ "$kind" != example ] && [ "$name" != memarray-c__header ]; then cp "$path" "$STAGE/bin/$name"; fi
    done
echo "== building benches and examples"
{ cargo bench -p memarray-cuda -p memarray-c -p memarray-core --no-run --message-format=json 2>/dev/null || true; } \
  | executables | while read -r kind name path; do
      if [ "$kind" = bench ]; then cp "$path" "$STAGE/bench/$name"; fi
    done
{ cargo build --release -p memarray-cuda -p memarray-c --features memarray-cuda/nccl --examples --message-format=json 2>/dev/null || true; } \
  | executables | while read -r kind name path; do
      if [ "$kind" = example ]; then cp "$path" "$STAGE/examples/$name"; fi
    done
# Whole symbol tables out: the staged tree must stay under the device tool's 64 MiB.
strip "$STAGE"/bin/* "$STAGE"/bench/* "$STAGE"/examples/* 2>/dev/null || true
echo "== building the C ABI (libmemarray.so; the static library is tested in CI only: too big to carry)"
mkdir -p "$STAGE/lib"
cargo build --release -q -p memarray-c
cp target/release/libmemarray.so "$STAGE/lib/"
strip --strip-debug "$STAGE/lib/libmemarray.so"

echo "== building the abi3 wheel"
[ -x .venv/bin/maturin ] || ./dev.sh venv
.venv/bin/maturin build --release -q -o "$STAGE/wheels" >/dev/null
cp scripts/gpu-remote.sh "$STAGE/remote.sh"
# An older build's wheel for remote.sh's `overheads-ab` stage (AB_BASE=<commit>): built
# from a worktree of that commit, its target kept in target/ab between stagings.
if [ -n "${AB_BASE:-}" ]; then
  root=$PWD
  tree=$(mktemp -d)/ab
  git worktree add -q --detach "$tree" "$AB_BASE"
  mkdir -p "$STAGE/ab-wheels"
  (cd "$tree" && CARGO_TARGET_DIR="$root/target/ab" "$root/.venv/bin/maturin" build --release -q \
    -o "$root/$STAGE/ab-wheels" >/dev/null)
  git worktree remove --force "$tree"
  echo "== the wheel of $AB_BASE ($(git rev-parse --short "$AB_BASE")) staged in $STAGE/ab-wheels"
fi
# Wheels the device's Python lacks, each set downloaded once into an ignored folder of its
# own (again when its list changes) and installed there with --no-index --no-deps.
fetch_set() {  # dir, packages...
  local dir=$1; shift
  if [ ! -f "$dir/.list" ] || [ "$(cat "$dir/.list")" != "$*" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    python3 -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
      -d "$dir" "$@"
    echo "$*" > "$dir/.list"
  fi
}
# Peers (RMM, filecheck for Numba's tests, Dask and the dependencies the device lacks,
# safetensors for its loader beside memarray's).
PEERS=("rmm-cu13==26.10.*" "librmm-cu13==26.10.*" rapids-logger filecheck
  "dask==2026.8.0" "distributed==2026.8.0" partd locket tornado tblib zict importlib_metadata
  "safetensors==0.8.0")
fetch_set .peer-wheels "${PEERS[@]}"
mkdir -p "$STAGE/peer-wheels"
cp .peer-wheels/*.whl "$STAGE/peer-wheels/"
# The notebook's kernel and runner (nbclient, ipykernel, ipywidgets and what they need),
# for remote.sh's `notebook` stage: a carry of their own (about 17 MB).
NB=(nbclient nbformat ipykernel ipywidgets tqdm)
if [ ! -f .nb-wheels/.list ] || [ "$(cat .nb-wheels/.list)" != "${NB[*]}" ]; then
  rm -rf .nb-wheels && mkdir -p .nb-wheels
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .nb-wheels "${NB[@]}"
  rm -f .nb-wheels/widgetsnbextension-* .nb-wheels/psutil-*  # not needed / on the machine
  echo "${NB[*]}" > .nb-wheels/.list
fi
mkdir -p "$STAGE/nb-wheels"
cp .nb-wheels/*.whl "$STAGE/nb-wheels/"
# Ray (its cp312 wheel in two parts of at most 40 MiB, one per device call, and what the
# device lacks of its needs) and UCX for Dask, for remote.sh's `ray` and `ucx` stages.
fetch_set .ray-wheels "ray==2.60.0"
fetch_set .ray-deps jsonschema jsonschema-specifications referencing rpds-py
fetch_set .ucx-wheels "distributed-ucxx-cu13==0.52.*" "ucxx-cu13==0.52.*" "libucxx-cu13==0.52.*" \
  "libucx-cu13>=1.21,<1.22" "rapids-dask-dependency==26.10.*"
mkdir -p "$STAGE/ray-wheels" "$STAGE/ray-deps" "$STAGE/ucx-wheels"
rm -f "$STAGE"/ray-wheels/ray.part.*
split -b 40M .ray-wheels/ray-*.whl "$STAGE/ray-wheels/ray.part."
cp .ray-deps/*.whl "$STAGE/ray-deps/"
cp .ucx-wheels/*.whl "$STAGE/ucx-wheels/"
# CuPy's own test files for remote.sh's `cupy-tests` stage, from a clone of cupy/cupy
# (CUPY_REPO) at the tag of the device's CuPy (CUPY_TAG); none staged without a clone.
CUPY_TAG=${CUPY_TAG:-v14.2.0}
CUPY_TESTS=(tests/cupy_tests/creation_tests/test_from_data.py tests/cupy_tests/cuda_tests/test_graph.py
  tests/cupy_tests/cuda_tests/test_stream.py)
if [ -n "${CUPY_REPO:-}" ] && git -C "$CUPY_REPO" rev-parse -q --verify "$CUPY_TAG^{commit}" >/dev/null; then
  mkdir -p "$STAGE/cupy-tests"
  for f in "${CUPY_TESTS[@]}"; do
    git -C "$CUPY_REPO" show "$CUPY_TAG:$f" >"$STAGE/cupy-tests/$(basename "$f")"
  done
  echo "== CuPy's tests at $CUPY_TAG staged: ${CUPY_TESTS[*]}"
else
  echo "== no CuPy tests staged (set CUPY_REPO to a clone of cupy/cupy with tag $CUPY_TAG)"
fi
du -sh "$STAGE"
ls "$STAGE"/bin "$STAGE"/bench "$STAGE"/examples "$STAGE"/wheels
echo "staged; now run on the device: bash gpu-run/remote.sh all   (carry: gpu-run;"
echo "  too big for one call: scripts/gpu-sets.sh splits it into sets that fit)"
