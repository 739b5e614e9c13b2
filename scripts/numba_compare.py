"""Runs Numba's CUDA tests under memarray's NBEP 7 plugin and under Numba's own manager
and fails if the plugin run has a failure or error the default run does not:
the check NBEP 7 made of its example plugin, kept true as the plugin grows.

    python3 scripts/numba_compare.py [--all] [--jobs 16]

Without --all: the driver and array modules (cudadrv, IPC, arrays, the CUDA Array
Interface, pinned and mapped host memory); --all: the whole numba.cuda.tests suite. Numba
0.68 under NumPy 2.5 needs np.row_stack restored before it is imported: a sitecustomize on
the children's path does it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

MODULES = [
    "numba.cuda.tests.cudadrv",
    "numba.cuda.tests.cudapy.test_ipc",
    "numba.cuda.tests.cudapy.test_array",
    "numba.cuda.tests.cudapy.test_array_methods",
    "numba.cuda.tests.cudapy.test_cuda_array_interface",
]
RESULT = re.compile(r"^(FAIL|ERROR): (\S+) \(([^)]*)\)")
SHIM = "import numpy as np\nif not hasattr(np, 'row_stack'):\n    np.row_stack = np.vstack\n"
SUMMARY = re.compile(r"^(Ran \d+ tests? in .*|OK.*|FAILED \(.*\))$")


def run(manager: str | None, targets: list[str], jobs: int, shim: str) -> tuple[set[str], str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = shim + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    if manager:
        env["NUMBA_CUDA_MEMORY_MANAGER"] = manager
    cmd = [sys.executable, "-m", "numba.runtests", "-m", str(jobs), *targets]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    out = r.stdout + r.stderr
    bad = {f"{m.group(1)} {m.group(3)}" for line in out.splitlines() if (m := RESULT.match(line))}
    summary = " | ".join(m.group(1) for line in out.splitlines() if (m := SUMMARY.match(line)))
    return bad, summary or out[-2000:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--all", action="store_true", help="the whole numba.cuda.tests suite")
    ap.add_argument("--jobs", type=int, default=16)
    args = ap.parse_args()
    targets = ["numba.cuda.tests"] if args.all else MODULES
    with tempfile.TemporaryDirectory() as shim:
        with open(os.path.join(shim, "sitecustomize.py"), "w") as f:
            f.write(SHIM)
        default, s_default = run(None, targets, args.jobs, shim)
        plugin, s_plugin = run("memarray.numba", targets, args.jobs, shim)
    print(f"Numba's manager:  {s_default}; {len(default)} failing")
    print(f"memarray plugin:  {s_plugin}; {len(plugin)} failing")
    only = sorted(plugin - default)
    fixed = sorted(default - plugin)
    for t in only:
        print(f"  only under the plugin: {t}")
    for t in fixed:
        print(f"  only under Numba's manager: {t}")
    if only:
        print("!! the plugin fails tests Numba's own manager passes")
        return 1
    print("ok: no failure or error under the plugin that Numba's manager does not have")
    return 0


if __name__ == "__main__":
    sys.exit(main())
