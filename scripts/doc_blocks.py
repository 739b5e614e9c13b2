#!/usr/bin/env python3
"""Runs the Python code blocks of README.md, docs/python-guide.md,
docs/memory-manager.md, docs/spilling.md and docs/beyond-one-machine.md, so the docs
cannot drift from the code.

Each file's blocks run in order in one namespace, in a scratch directory, as a reader
would paste them. A block whose info string says `python gpu` needs a CUDA device: it runs
where one is present (`just test-gpu`) and is reported as skipped, by name, elsewhere; a
block marked `python no-run` (a fragment that needs a second process or a peer library)
is only compiled. A block also marked `no-check` is left out of the type check (`--emit`):
Ray's actors, which its type hints cannot express. Exits 1 and shows the failing block on
the first error.

Then the same blocks are pasted, as a reader pastes them, into the plain interactive
interpreter (`python -i`, one session per file): an indented block needs a blank line
after it there, and a blank line inside one ends it early, so a block that runs as a
script can still fail when pasted. Any traceback there fails the run too. A `python gpu`
block must open with a comment a reader sees on GitHub (`# needs a CUDA device`).

    python3 scripts/doc_blocks.py [FILE...]
    python3 scripts/doc_blocks.py --emit OUT.py   # every block, one script, for mypy
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
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
    """Writes every block of the Python docs, in order, as one script (for `mypy --strict`);
    blocks marked `no-check` are left out."""
    parts = []
    for name in FILES:
        for line, tags, code in blocks(ROOT / name):
            if "no-check" in tags:
                continue
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
    ran = skipped = compiled = pasted = 0
    for name in argv or FILES:
        path = ROOT / name
        ns: dict = {"__name__": "__doc__"}
        session: list[str] = []
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
                    if "gpu" in tags and not code.lstrip().startswith("# needs a CUDA device"):
                        print(
                            f"FAILED {where}: a `python gpu` block opens with the comment "
                            "'# needs a CUDA device', which a reader sees on GitHub"
                        )
                        return 1
                    if "gpu" in tags and not gpu:
                        print(f"SKIPPED {where}: needs a CUDA device")
                        skipped += 1
                        continue
                    session.append(code)
                    try:
                        exec(compiled_code, ns)
                    except Exception:
                        print(f"FAILED {where}:\n{code}")
                        traceback.print_exc()
                        return 1
                    ran += 1
                failure = paste(session, scratch)
                if failure:
                    print(f"FAILED {name}: pasted into `python -i`, its blocks fail:\n{failure}")
                    return 1
                pasted += len(session)
            finally:
                os.chdir(cwd)
    print(
        f"doc blocks: {ran} ran, {skipped} skipped (no GPU), {compiled} compiled only; "
        f"{pasted} pasted into the interactive interpreter"
    )
    return 0


def paste(codes: list[str], cwd: str) -> str | None:
    """Feeds the blocks, in order, to one interactive interpreter as pasted text (each
    block a paste of its own, then Enter: a blank line between blocks); the session's
    error output when a traceback appears, else None."""
    text = "\n".join(c if c.endswith("\n") else c + "\n" for c in codes) + "\nexit()\n"
    r = subprocess.run(
        [sys.executable, "-i", "-q"],
        input=text,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env=dict(os.environ, PYTHONSTARTUP="", PYTHONINSPECT=""),
    )
    err = r.stderr.replace(">>> ", "").replace("... ", "")
    if "Traceback" in err or "Error:" in err:
        return err[-3000:]
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
