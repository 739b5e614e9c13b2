"""Beyond one process: Dask (serializers, worker setup), MPI (``memarray.mpi``) and NCCL
communicators (``memarray.distributed``). ``memarray.dask``, ``memarray.mpi`` and
``memarray.distributed`` still import these.
"""
