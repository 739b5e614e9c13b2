#!/usr/bin/env bash
# Regenerates crates/memarray-seed/src/ptx/*.ptx and crates/memarray-cuda/src/copy/ptx/*.ptx (shipped inside
# the crate that loads them) from kernels-cuda/src/*.cu (`just kernels`).
#
# The PTX is committed so a fresh clone builds without nvcc. It must load on NVIDIA
# driver 580 (CUDA 13.0), which accepts PTX ISA <= 9.0: nvcc 13.0 emits 9.0, newer nvcc
# emits newer ISAs the driver refuses. So the compiler is pinned: nvcc 13.0.88.
#
# nvcc is looked up in $NVCC, then on PATH, then /usr/local/cuda/bin, then ./.venv-nvcc;
# if none is 13.0, the pinned nvcc is installed from PyPI into ./.venv-nvcc (needs
# python3 and network). MEMARRAY_NVCC_NO_INSTALL=1 forbids that and exits 3 instead.
#
# Usage: kernels-cuda/build.sh [OUT_DIR [COPY_OUT_DIR]]
#        (defaults crates/memarray-seed/src/ptx and crates/memarray-cuda/src/copy/ptx)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${1:-$root/crates/memarray-seed/src/ptx}"
copy_out="${2:-$root/crates/memarray-cuda/src/copy/ptx}"
pinned="13.0.88"
venv="$root/.venv-nvcc"
# One place for the flags; tests/ptx_up_to_date.rs calls this script to compare.
# (177: a per-dtype build leaves the other dtypes' helpers unreferenced, by design.)
flags=(-ptx -arch=compute_75 -O3 -std=c++17 -diag-suppress 177 -I "$here/include")

version_of() { "$1" --version 2>/dev/null | sed -n 's/.*, V\([0-9.]*\).*/\1/p'; }

find_nvcc() {
    local c
    for c in "${NVCC:-}" "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc \
        "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc; do
        if [[ -n "$c" && -x "$c" && "$(version_of "$c")" == "$pinned" ]]; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

if ! nvcc="$(find_nvcc)"; then
    if [[ "${MEMARRAY_NVCC_NO_INSTALL:-0}" == "1" ]]; then
        echo "nvcc $pinned not found (PATH, /usr/local/cuda/bin, $venv)" >&2
        exit 3
    fi
    echo "installing nvcc $pinned from PyPI into $venv" >&2
    python3 -m venv "$venv"
    # nvcc pulls nvvm (cicc) and crt of the newest release unless they are pinned too,
    # and cicc decides the PTX ISA version.
    "$venv/bin/pip" install --quiet "nvidia-cuda-nvcc==$pinned" "nvidia-nvvm==$pinned" \
        "nvidia-cuda-crt==$pinned" "nvidia-cuda-runtime==$pinned"
    nvcc="$(find_nvcc)"
fi

mkdir -p "$out"
# One module per dtype, in memarray_core::DType::ALL order (kernel.rs loads them lazily).
dtypes=(bool i8 i16 i32 i64 u8 u16 u32 u64 f16 bf16 f32 f64 c64 c128)
for k in "${!dtypes[@]}"; do
    file="$out/add_index_${dtypes[$k]}.ptx"
    "$nvcc" "${flags[@]}" -DMEMARRAY_DTYPE_ID="$k" "$here/src/add_index.cu" -o "$file"
    isa="$(sed -n 's/^\.version //p' "$file")"
    echo "$file: PTX ISA $isa, $(grep -c '^.visible .entry' "$file") kernels, nvcc $pinned" >&2
done
# The copy engine's kernel (copy/many.rs).
mkdir -p "$copy_out"
file="$copy_out/copy_many.ptx"
"$nvcc" "${flags[@]}" "$here/src/copy_many.cu" -o "$file"
echo "$file: PTX ISA $(sed -n 's/^\.version //p' "$file"), nvcc $pinned" >&2
