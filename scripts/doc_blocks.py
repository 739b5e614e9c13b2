#!/usr/bin/env python3
"""Runs the Python code blocks of README.md, docs/python-guide.md,
docs/memory-manager.md, docs/spilling.md and docs/beyond-one-machine.md (issue 14, point
6), so the docs cannot drift from the code.

Each file's blocks run in order in one namespace, in a scratch directory, as a reader
would paste them. A block whose info string says `python gpu` needs a CUDA device: it runs
where one is present (`just test-gpu`) and is reported as skipped, by name, elsewhere; a
block marked `python no-run` (a fragment that needs a second process or a peer library)
is only compiled. Exits 1 and shows the failing block on the first error.

    python3 scripts/doc_blocks.py [FILE...]
    python3 scripts/doc_blocks.py --emit OUT.py   # every block, one script, for mypy
"""

from __future__ import annotations

import os
import pathlib
import re
import sys
import tempfile
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = [
    "README.md",
    "docs/python-guide.md",
    "docs/memory-manager.md",
    "docs/spilling.md",
    "docs/beyond-one-machine.md",
]
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(path: pathlib.Path):
    text = path.read_text()
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        yield line, m.group(1).split(), m.group(2)


def emit(out: str) -> int:
    """Writes every block of the Python docs, in order, as one script (for `mypy --strict`)."""
    parts = []
    for name in FILES:
        for line, tags, code in blocks(ROOT / name):
            parts.append(f"# {name}:{line} {' '.join(tags)}\n{code}")
    pathlib.Path(out).write_text("\n".join(parts))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--emit"]:
        return emit(argv[1])
    import numpy as np

    import memarray

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # numba 0.68 (the GPU machine's) imports it; NumPy 2.5 dropped it

    gpu = memarray.cuda.is_available()
    ran = skipped = compiled = 0
    for name in argv or FILES:
        path = ROOT / name
        ns: dict = {"__name__": "__doc__"}
        with tempfile.TemporaryDirectory() as scratch:
            cwd = os.getcwd()
            os.chdir(scratch)
            try:
                for line, tags, code in blocks(path):
                    where = f"{name}:{line}"
                    compiled_code = compile(code, where, "exec")
                    if "no-run" in tags:
                        compiled += 1
                        continue
                    if "gpu" in tags and not gpu:
                        print(f"SKIPPED {where}: needs a CUDA device")
                        skipped += 1
                        continue
                    try:
                        exec(compiled_code, ns)
                    except Exception:
                        print(f"FAILED {where}:\n{code}")
                        traceback.print_exc()
                        return 1
                    ran += 1
            finally:
                os.chdir(cwd)
    print(f"doc blocks: {ran} ran, {skipped} skipped (no GPU), {compiled} compiled only")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
