#!/usr/bin/env python3
"""Compiles and runs the C and C++ blocks of docs/c-cpp-guide.md (issue 17) against
libmemarray.so (MEMARRAY_C_LIB_DIR, default target/debug), each block a whole program.
A block whose info string says `gpu` needs a CUDA device: it is compiled everywhere and
run where one is present. ```cuda blocks are excerpts of examples/cpp/particles.cu,
which the GPU run builds with nvcc; they are not compiled here. Exits 1 on the first
failure, showing the block.

    python3 scripts/doc_blocks_c.py
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs/c-cpp-guide.md"
BLOCK = re.compile(r"^```(cpp|c)\b([^\n]*)\n(.*?)^```", re.S | re.M)


def main() -> int:
    lib = pathlib.Path(os.environ.get("MEMARRAY_C_LIB_DIR", ROOT / "target/debug"))
    if not (lib / "libmemarray.so").exists():
        print(f"FAILED: no libmemarray.so in {lib} (cargo build -p memarray-c)")
        return 1
    gpu = ctypes.CDLL(str(lib / "libmemarray.so")).memarray_device_count() > 0
    text = GUIDE.read_text()
    ran = compiled = 0
    with tempfile.TemporaryDirectory() as scratch:
        for i, m in enumerate(BLOCK.finditer(text)):
            lang, tags, code = m.group(1), m.group(2).split(), m.group(3)
            line = text.count("\n", 0, m.start()) + 1
            where = f"docs/c-cpp-guide.md:{line}"
            src = pathlib.Path(scratch) / f"block{i}.{'c' if lang == 'c' else 'cpp'}"
            exe = pathlib.Path(scratch) / f"block{i}"
            src.write_text(code)
            cmd = (["cc", "-std=c11"] if lang == "c" else ["c++", "-std=c++17"]) + [
                "-Wall",
                "-Werror",
                f"-I{ROOT / 'crates/memarray-c/include'}",
                f"-I{ROOT / 'kernels-cuda/include'}",
                f'-DMEMARRAY_INCLUDE="{ROOT / "kernels-cuda/include"}"',
                str(src),
                f"-L{lib}",
                "-lmemarray",
                f"-Wl,-rpath,{lib}",
                "-o",
                str(exe),
            ]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAILED {where}: does not compile\n{r.stderr}\n{code}")
                return 1
            if "gpu" in tags and not gpu:
                print(f"compiled only {where}: needs a CUDA device")
                compiled += 1
                continue
            r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                print(f"FAILED {where}: rc {r.returncode}\n{r.stdout}{r.stderr}\n{code}")
                return 1
            print(f"{where}: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else 'ok'}")
            ran += 1
    print(f"C/C++ doc blocks: {ran} ran, {compiled} compiled only (no GPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
