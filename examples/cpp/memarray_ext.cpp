// A C++ extension module that makes memarray arrays and returns them to Python through
// DLPack (a "dltensor_versioned" capsule): memarray.from_dlpack, NumPy and torch read
// them zero-copy. Built by examples/cpp/CMakeLists.txt or by the command in
// bindings-python/tests/test_c_extension.py.
//
//   import memarray_ext, memarray, numpy as np
//   a = memarray.from_dlpack(memarray_ext.ramp(5))   # host: [0, 0.5, 1, 1.5, 2]
//   g = memarray.from_dlpack(memarray_ext.ramp(5, 0))  # the same on device 0
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <vector>

#include "memarray.hpp"

static const char* kName = "dltensor_versioned";

// A capsule no consumer took still owns its tensor.
static void drop_capsule(PyObject* cap) {
    if (PyCapsule_IsValid(cap, kName)) {
        auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kName));
        if (t && t->deleter) t->deleter(t);
    }
}

// ramp(n, device=-1): float32 [0, 0.5, 1, ...] of n elements, on the host (-1) or a device.
static PyObject* ramp(PyObject*, PyObject* args) {
    long long n = 0;
    int device = memarray::host;
    if (!PyArg_ParseTuple(args, "L|i", &n, &device)) return nullptr;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return nullptr;
    }
    try {
        std::vector<float> v(static_cast<size_t>(n));
        for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i);
        auto a = memarray::Array::from_data<float>({static_cast<uint64_t>(n)}, v);
        if (device != memarray::host) a.move_to(device, nullptr, /*sync=*/true);
        DLManagedTensorVersioned* t = a.to_dlpack();
        // The tensor keeps the memory; the array handle goes out of scope here.
        PyObject* cap = PyCapsule_New(t, kName, drop_capsule);
        if (!cap) t->deleter(t);
        return cap;
    } catch (const memarray::Error& e) {
        PyErr_SetString(e.status() == MEMARRAY_STATUS_CUDA_UNAVAILABLE ? PyExc_OSError : PyExc_RuntimeError,
                        e.what());
        return nullptr;
    }
}

static PyMethodDef methods[] = {
    {"ramp", ramp, METH_VARARGS, "ramp(n, device=-1): a memarray array as a DLPack capsule"},
    {nullptr, nullptr, 0, nullptr},
};

static PyModuleDef module = {PyModuleDef_HEAD_INIT, "memarray_ext", nullptr, -1, methods};

PyMODINIT_FUNC PyInit_memarray_ext() { return PyModule_Create(&module); }
