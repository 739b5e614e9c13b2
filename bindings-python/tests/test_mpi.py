"""memarray.mpi: mpi_cases.py under ``mpirun -np 2`` (CI: MPICH from the package
index, not CUDA-aware; the GPU machine: its Open MPI, not CUDA-aware, so device arrays take
the staging path), the halo example checked bit for bit, and NCCL bootstrapped from MPI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from children import run_child, run_command

try:
    import mpi4py  # noqa: F401
except ImportError:
    if os.environ.get("MEMARRAY_REQUIRE_MPI") == "1":
        raise
    pytest.skip("SKIPPED: mpi4py is not installed", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def mpirun() -> str:
    """The mpirun beside this Python (a venv's MPICH), else the one on the path."""
    found = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")
    if found is None:
        if os.environ.get("MEMARRAY_REQUIRE_MPI") == "1":
            raise AssertionError("MEMARRAY_REQUIRE_MPI=1 but no mpirun")
        pytest.skip("SKIPPED: no mpirun")
    return found


def run_np2(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("PYTEST_CURRENT_TEST", None)
    return run_command(
        [mpirun(), "-np", "2", sys.executable, *args],
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )


def test_point_to_point_and_collectives_on_two_ranks():
    r = run_np2(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(HERE, "mpi_cases.py")]
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    # One summary per rank; the two ranks' lines may land on one line of the output.
    passed = re.findall(r"\d+ passed", out)
    assert len(passed) == 2 and not re.search(r"\d+ (failed|error)", out), out[-3000:]


def test_a_rank_refusing_a_collective_locally_leaves_no_rank_waiting():
    # A hang is TimeoutExpired: the test fails instead of waiting for ever.
    r = run_np2(
        [
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            os.path.join(HERE, "mpi_divergent_cases.py"),
        ],
        timeout=180,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    passed = re.findall(r"\d+ passed", out)
    assert len(passed) == 2 and not re.search(r"\d+ (failed|error)", out), out[-3000:]


def test_the_halo_example_matches_one_numpy_process_bit_for_bit():
    r = run_np2(["examples/mpi_halo.py", "--steps", "50"])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "bit for bit" in r.stdout, r.stdout


@pytest.mark.gpu
def test_the_gpu_machines_mpi_is_detected_and_device_arrays_arrive_intact():
    code = """
from mpi4py import MPI
import numpy as np, memarray, memarray.mpi as mm
c = MPI.COMM_WORLD
a = memarray.asarray(np.arange(1 << 20, dtype=np.float32) * (c.rank + 1), device="cuda")
if c.rank == 0:
    mm.send(c, a, dest=1)
else:
    b = memarray.zeros((1 << 20,), "float32", device="cuda")
    mm.recv(c, b, source=0)
    ok = bool((b.to_numpy() == np.arange(1 << 20, dtype=np.float32)).all())
    print("aware", mm.is_cuda_aware(c), "intact", ok, b.device)
"""
    r = run_np2(["-c", code])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("aware"))
    aware = line.split()[1] == "True"
    assert line.split()[3:] == ["True", "cuda:0"], line
    # The GPU machine's Open MPI is not CUDA-aware: the staging path ran.
    if "Open MPI" in run_child("from mpi4py import MPI; print(MPI.Get_library_version())").stdout:
        assert not aware, line


@pytest.mark.gpu
def test_nccl_bootstrapped_from_mpi():
    import memarray

    if memarray.cuda.device_count() < 2:
        pytest.skip("SKIPPED: NCCL from MPI needs two GPUs (one rank each); one is lent")
    code = """
from mpi4py import MPI
import numpy as np, memarray, memarray.distributed as md
comm = md.init(comm=MPI.COMM_WORLD)
a = memarray.full((1 << 16,), MPI.COMM_WORLD.rank + 1.0, "float32", device=f"cuda:{comm.device_id}")
comm.all_reduce(a)
print("sum", float(a.to_numpy()[0]), comm.device_id)
"""
    r = run_np2(["-c", code])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    sums = sorted(x.split()[1:] for x in r.stdout.splitlines() if x.startswith("sum"))
    assert sums == [["3.0", "0"], ["3.0", "1"]], r.stdout
