#!/usr/bin/env bash
# Publishability: every library crate packages and verifies on its own (as
# crates.io would build it), and the Python sdist builds, installs and imports in a fresh
# venv with nothing from this checkout on its path.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

echo "== cargo package (verify each library crate from its own tarball)"
mkdir -p target
# Cargo unpacks the workspace's own tarballs from a temporary local registry into its
# cache, keyed by that registry's path and the version, and builds them once per version:
# a checkout packaged before at the same path and version would verify against stale
# copies. Drop those copies and the verification builds first.
export CARGO_TARGET_DIR=target/package-check
rm -rf "$CARGO_TARGET_DIR"
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rm -rf "$cargo_home"/registry/src/*/memarray-{core,cuda,seed,dlpack}-* \
  "$cargo_home"/registry/cache/*/memarray-{core,cuda,seed,dlpack}-*
# memarray-cuda is verified with its optional `nccl` feature on (libloading + cudarc/nccl).
if ! cargo package --workspace --exclude memarray-python --allow-dirty --features memarray-cuda/nccl >target/package.log 2>&1; then
  cat target/package.log >&2
  exit 1
fi
unset CARGO_TARGET_DIR
grep -E "^\s*(Packaged|Verifying)" target/package.log
echo "cargo package: ok"

echo "== sdist: build, install into a fresh venv, import"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m venv "$work/build"
"$work/build/bin/pip" install -q --disable-pip-version-check "maturin>=1.9,<2"
"$work/build/bin/maturin" sdist -o "$work/dist" >/dev/null
sdist=$(ls "$work"/dist/memarray-*.tar.gz)
echo "sdist: $(basename "$sdist") ($(tar tzf "$sdist" | wc -l) files)"
"$PY" -m venv "$work/fresh"
"$work/fresh/bin/pip" install -q --disable-pip-version-check "$sdist"
(cd "$work" && "$work/fresh/bin/python" - <<'PY'
import pickle

import numpy as np

import memarray

a = memarray.MemArray([2, 3], np.float32)
a.read_numpy_array(np.arange(6).reshape(2, 3))
a.add_index_tuple()
a.move_memory(memarray.dlpack.kDLCPU)
assert pickle.loads(pickle.dumps(a)).to_numpy().tolist() == [[0, 2, 4], [4, 6, 8]]
print("sdist import: ok,", memarray.__file__)
PY
)

echo "== pip install . from the root, in a fresh venv (plain pip: maturin comes from PyPI)"
"$PY" -m venv "$work/root"
"$work/root/bin/pip" install -q --disable-pip-version-check .
(cd "$work" && "$work/root/bin/python" - <<'PY'
from importlib import metadata

import numpy as np

import memarray

m = metadata.metadata("memarray")
extras = set(m.get_all("Provides-Extra"))
assert {"dask", "mpi", "plot", "notebook", "all"} <= extras, extras
assert m["License-Expression"] == "Apache-2.0" and m.get_all("Project-URL"), m
assert "memarray" in (m.get_payload() or m["Description"] or "")  # the README
assert memarray.asarray(np.arange(3.0)).to_numpy().tolist() == [0.0, 1.0, 2.0]
print("pip install . : ok,", memarray.__file__, "extras", sorted(extras))
PY
)
