"""Collectives where one rank refuses locally (test_mpi.py runs this under ``mpirun -np 2``
with a timeout): every rank must raise the same type, naming the refusing rank, and both
must still be in step afterwards. Before ranks agreed, the refusing rank left and the other
waited in MPI until killed."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import memarray
import memarray.mpi as mm

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
assert size == 2, "run with mpirun -np 2"


def in_step() -> None:
    # A real collective after the refusal: both ranks reach it, and its result is right.
    x = memarray.asarray(np.full(3, rank + 1.0))
    mm.allreduce(comm, x)
    assert x.to_numpy().tolist() == [3.0, 3.0, 3.0]


def locked_on(r: int, a: memarray.MemArray):
    return a.get_dlpack() if rank == r else _nothing()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("refuser", [0, 1])
def test_allreduce_with_one_rank_locked_raises_lock_error_everywhere(refuser):
    a = memarray.asarray(np.ones(4))
    with locked_on(refuser, a), pytest.raises(memarray.LockError, match=f"rank {refuser}|lock"):
        mm.allreduce(comm, a)
    assert a.to_numpy().tolist() == [1.0] * 4  # nothing changed anywhere
    in_step()


def test_bcast_whose_root_is_locked_raises_everywhere():
    a = memarray.asarray(np.full(4, float(rank)))
    with locked_on(0, a), pytest.raises(memarray.LockError):
        mm.bcast(comm, a, root=0)
    assert a.to_numpy().tolist() == [float(rank)] * 4
    in_step()


def test_allreduce_of_float16_on_one_rank_only_raises_value_error_everywhere():
    a = memarray.zeros((4,), "float16" if rank == 1 else "float32")
    with pytest.raises(ValueError, match="float16") as e:
        mm.allreduce(comm, a)
    if rank == 0:
        assert "rank 1 refused" in str(e.value)
    in_step()


def test_scatter_with_a_wrong_shaped_root_array_raises_everywhere():
    out = memarray.zeros((3,), "float64")
    src = memarray.zeros((5, 3), "float64") if rank == 0 else None
    with pytest.raises(ValueError, match="scatter"):
        mm.scatter(comm, src, out, root=0)
    in_step()


@pytest.mark.parametrize("call", ["reduce", "gather", "allgather", "alltoall"])
def test_every_collective_agrees_on_a_locked_array(call):
    a = memarray.zeros((2, 3), "float32")
    fn = getattr(mm, call)
    with locked_on(1, a), pytest.raises(memarray.LockError):
        fn(comm, a)
    in_step()


def test_no_refusal_costs_one_small_allreduce_and_results_are_right():
    a = memarray.asarray(np.arange(6.0) * (rank + 1))
    mm.allreduce(comm, a)
    assert a.to_numpy().tolist() == (np.arange(6.0) * 3).tolist()
