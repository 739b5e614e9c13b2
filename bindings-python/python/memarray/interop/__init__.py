"""Framework glue: each library that allocates through memarray or hands it memory
(torch, CuPy, Numba, RMM, cuda.core) has its module here, as RMM keeps its allocators in
``rmm.allocators``. ``memarray.torch`` and the other old names still import these.
"""
