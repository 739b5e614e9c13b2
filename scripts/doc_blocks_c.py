#!/usr/bin/env python3
"""Runs the C and C++ blocks of docs/c-cpp-guide.md with exactly the commands
the guide's first ```sh block shows, from the repository's root: its
`cargo build` line, then for each block its `cc` or `c++` line with the block as `app.c` /
`app.cpp` (only those two names and `-o app` point into a scratch directory), then
`./app`. A block whose info string says `gpu` needs a CUDA device: it is compiled
everywhere and run where one is present. ```cuda blocks are excerpts of
examples/cpp/particles.cu, which the GPU run builds with nvcc; they are not compiled here.
On the GPU machine (no Rust) MEMARRAY_C_LIB_DIR names the staged libraries: the cargo
line is skipped and `target/release` means that directory. Exits 1 on the first failure,
showing the block.

    python3 scripts/doc_blocks_c.py
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs/c-cpp-guide.md"
BLOCK = re.compile(r"^```(cpp|c)\b([^\n]*)\n(.*?)^```", re.S | re.M)
COMMANDS = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def guide_commands(text: str) -> dict[str, str]:
    """The guide's build, C, C++ and run command lines, comments dropped."""
    m = COMMANDS.search(text)
    if not m:
        raise SystemExit("docs/c-cpp-guide.md has no ```sh block of commands")
    out: dict[str, str] = {}
    for line in m.group(1).splitlines():
        line = line.split(" #", 1)[0].strip()
        for key, start in (
            ("build", "cargo build"),
            ("c", "cc "),
            ("cpp", "c++ "),
            ("run", "./app"),
        ):
            if line.startswith(start):
                out[key] = line
    missing = {"build", "c", "cpp", "run"} - out.keys()
    if missing:
        raise SystemExit(f"the guide's commands lack {sorted(missing)}")
    return out


def argv(line: str, lib: pathlib.Path | None, src: pathlib.Path, exe: pathlib.Path) -> list[str]:
    words = shlex.split(line.replace("$PWD", str(ROOT)))
    out = []
    for w in words:
        if w in ("app.c", "app.cpp"):
            w = str(src)
        elif w in ("app", "./app"):
            w = str(exe)
        if lib is not None:
            w = w.replace(str(ROOT / "target/release"), str(lib)).replace(
                "target/release", str(lib)
            )
        out.append(w)
    return out


def main() -> int:
    text = GUIDE.read_text()
    cmds = guide_commands(text)
    staged = os.environ.get("MEMARRAY_C_LIB_DIR")
    lib = pathlib.Path(staged) if staged else None
    if lib is None:
        print(f"$ {cmds['build']}")
        r = subprocess.run(shlex.split(cmds["build"]), cwd=ROOT, timeout=1200)
        if r.returncode != 0:
            print("FAILED: the guide's build command")
            return 1
    so = (lib or ROOT / "target/release") / "libmemarray.so"
    gpu = ctypes.CDLL(str(so)).memarray_device_count() > 0
    ran = compiled = 0
    with tempfile.TemporaryDirectory() as scratch:
        for i, m in enumerate(BLOCK.finditer(text)):
            lang, tags, code = m.group(1), m.group(2).split(), m.group(3)
            line = text.count("\n", 0, m.start()) + 1
            where = f"docs/c-cpp-guide.md:{line}"
            src = pathlib.Path(scratch) / ("app.c" if lang == "c" else "app.cpp")
            exe = pathlib.Path(scratch) / f"app{i}"
            src.write_text(code)
            cmd = argv(cmds[lang], lib, src, exe)
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
            if r.returncode != 0:
                print(
                    f"FAILED {where}: does not compile with\n  {shlex.join(cmd)}\n"
                    f"{r.stderr}\n{code}"
                )
                return 1
            if "gpu" in tags and not gpu:
                print(f"compiled only {where}: needs a CUDA device")
                compiled += 1
                continue
            run = argv(cmds["run"], lib, src, exe)
            r = subprocess.run(run, capture_output=True, text=True, timeout=120, cwd=ROOT)
            if r.returncode != 0:
                print(f"FAILED {where}: rc {r.returncode}\n{r.stdout}{r.stderr}\n{code}")
                return 1
            print(f"{where}: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else 'ok'}")
            ran += 1
    print(
        f"C/C++ doc blocks: {ran} ran, {compiled} compiled only (no GPU), with the guide's commands"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
