// memarray::Indexer<N>: a data pointer and a C-order shape, passed to kernels by value.
//
// Mirrors memarray_core::Indexer<N> (crates/memarray-core/src/indexer.rs) field for field:
//     #[repr(C)] struct Indexer<const N: usize> { data: *mut c_void, shape: [u64; N] }
// crates/memarray-core/tests/indexer_layout.rs compiles this header with the host C++
// compiler and checks size, field offsets, offset() and unravel() against Rust.
//
// Counts and offsets are 64-bit (arrays over 2^31 elements work). unravel() divides in
// 32 bits whenever dividend and divisor fit, which is several times faster on GPUs.
// Plain C++ compilers can include this header: __host__/__device__ expand to nothing.
// NVRTC can too (Module::from_cuda_source with -I kernels-cuda/include).
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC has no C library headers: the two fixed-width types this header uses, as glibc
// spells them on LP64 (so a source that also includes <cuda/std/cstdint> still agrees).
#if !defined(_STDINT_H) && !defined(__CUDA_STD_CSTDINT)
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
#endif
#else
#include <stddef.h>
#include <stdint.h>
#endif

#if !defined(__CUDACC__)
#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#endif

#if defined(__CUDA_ARCH__)
#define MEMARRAY_UNROLL _Pragma("unroll")
#else
#define MEMARRAY_UNROLL
#endif

namespace memarray {

template <int N>
struct Indexer {
    void* data;
    uint64_t shape[N];

    // Number of elements: the product of the shape.
    __host__ __device__ uint64_t len() const {
        uint64_t n = 1;
        MEMARRAY_UNROLL
        for (int d = 0; d < N; ++d) n *= shape[d];
        return n;
    }

    // C-order linear offset of the multi-index idx[0..N), in elements. Unchecked.
    __host__ __device__ uint64_t offset(const uint64_t* idx) const {
        uint64_t off = 0;
        MEMARRAY_UNROLL
        for (int d = 0; d < N; ++d) off = off * shape[d] + idx[d];
        return off;
    }

    // The multi-index of C-order offset `linear` (< len()), written to idx[0..N).
    // Unrolled for N <= 4; a plain loop for larger N keeps the generic 32-slot kernel
    // small (its PTX, and the driver's JIT time at first launch, were 70% of the file).
    __host__ __device__ void unravel(uint64_t linear, uint64_t* idx) const {
        if constexpr (N <= 4) {
            MEMARRAY_UNROLL
            for (int d = N - 1; d >= 0; --d) linear = unravel_step(d, linear, idx);
        } else {
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
            for (int d = N - 1; d >= 0; --d) linear = unravel_step(d, linear, idx);
        }
    }

    // idx[d] = linear % shape[d]; returns linear / shape[d]. 32-bit division when both
    // fit, none for extent 1 (the leading 1s of right-aligned shapes).
    __host__ __device__ uint64_t unravel_step(int d, uint64_t linear, uint64_t* idx) const {
        const uint64_t extent = shape[d];
        if (extent == 1) {
            idx[d] = 0;
            return linear;
        }
        if ((linear >> 32) == 0 && (extent >> 32) == 0) {
            const uint32_t l = static_cast<uint32_t>(linear);
            const uint32_t e = static_cast<uint32_t>(extent);
            const uint32_t q = l / e;
            idx[d] = l - q * e;
            return q;
        }
        const uint64_t q = linear / extent;
        idx[d] = linear - q * extent;
        return q;
    }
};

// A 0-d array: one element at `data`.
template <>
struct Indexer<0> {
    void* data;

    __host__ __device__ uint64_t len() const { return 1; }
    __host__ __device__ uint64_t offset(const uint64_t*) const { return 0; }
    __host__ __device__ void unravel(uint64_t, uint64_t*) const {}
};

static_assert(sizeof(Indexer<0>) == 8, "Indexer<0> must match memarray_core::Indexer<0>");
static_assert(sizeof(Indexer<3>) == 32, "Indexer<3> must match memarray_core::Indexer<3>");
#if !defined(__CUDACC_RTC__)  // NVRTC has no offsetof; host and nvcc builds check it
static_assert(offsetof(Indexer<3>, shape) == 8, "shape must follow the data pointer");
#endif

}  // namespace memarray
