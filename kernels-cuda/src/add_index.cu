// add_index_tuple: adds to every element the sum of its indices, for every memarray dtype.
//
//     a[i0, i1, ..., ik] += (T)(i0 + i1 + ... + ik)
//
// with exactly the semantics of memarray_core::Element::add_u64, so a host reference
// matches bit for bit:
//   integers  the u64 sum cast to T, wrapping add
//   f32, f64  x + (T)sum, round to nearest even
//   f16, bf16 widen to float, add (float)sum, round to nearest even back
//   complex   the real part, as for its float type; the imaginary part is unchanged
//   bool      x || sum != 0 (stored as 0 or 1)
//
// Kernels: add_index_<dtype>_n<N> takes memarray::Indexer<N> for N = 1..4;
// add_index_<dtype>_nd takes Indexer<32> whose shape is right-aligned with leading 1s
// (ndim 0 and 5..32). Indices are 64-bit; grid-stride loop. No CUDA headers are needed:
// f16 conversions use PTX cvt, bf16 conversions bit manipulation (bf16 cvt needs sm_80).
//
// Regenerate the committed PTX with kernels-cuda/build.sh (PTX ISA 9.0, compute_75).

#include <memarray/indexer.cuh>

namespace {

struct Bool { uint8_t v; };
struct Half { uint16_t bits; };
struct BHalf { uint16_t bits; };
struct Complex64 { float re, im; };
struct Complex128 { double re, im; };

__device__ __forceinline__ float half_to_float(uint16_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ uint16_t float_to_half(float f) {
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bhalf_to_float(uint16_t b) {
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even; NaN stays NaN with the quiet bit set (as the `half` crate does).
__device__ __forceinline__ uint16_t float_to_bhalf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

// Integers: arithmetic in the unsigned type of the same width, so overflow wraps.
template <class T, class U>
__device__ __forceinline__ T wrapping_add(T x, uint64_t s) {
    return static_cast<T>(static_cast<U>(static_cast<U>(x) + static_cast<U>(s)));
}

__device__ __forceinline__ int8_t add_u64(int8_t x, uint64_t s) { return wrapping_add<int8_t, uint8_t>(x, s); }
__device__ __forceinline__ int16_t add_u64(int16_t x, uint64_t s) { return wrapping_add<int16_t, uint16_t>(x, s); }
__device__ __forceinline__ int32_t add_u64(int32_t x, uint64_t s) { return wrapping_add<int32_t, uint32_t>(x, s); }
__device__ __forceinline__ int64_t add_u64(int64_t x, uint64_t s) { return wrapping_add<int64_t, uint64_t>(x, s); }
__device__ __forceinline__ uint8_t add_u64(uint8_t x, uint64_t s) { return wrapping_add<uint8_t, uint8_t>(x, s); }
__device__ __forceinline__ uint16_t add_u64(uint16_t x, uint64_t s) { return wrapping_add<uint16_t, uint16_t>(x, s); }
__device__ __forceinline__ uint32_t add_u64(uint32_t x, uint64_t s) { return wrapping_add<uint32_t, uint32_t>(x, s); }
__device__ __forceinline__ uint64_t add_u64(uint64_t x, uint64_t s) { return x + s; }
__device__ __forceinline__ float add_u64(float x, uint64_t s) { return x + static_cast<float>(s); }
__device__ __forceinline__ double add_u64(double x, uint64_t s) { return x + static_cast<double>(s); }

__device__ __forceinline__ Bool add_u64(Bool x, uint64_t s) {
    return Bool{static_cast<uint8_t>(x.v != 0 || s != 0)};
}
__device__ __forceinline__ Half add_u64(Half x, uint64_t s) {
    return Half{float_to_half(half_to_float(x.bits) + static_cast<float>(s))};
}
__device__ __forceinline__ BHalf add_u64(BHalf x, uint64_t s) {
    return BHalf{float_to_bhalf(bhalf_to_float(x.bits) + static_cast<float>(s))};
}
__device__ __forceinline__ Complex64 add_u64(Complex64 x, uint64_t s) {
    return Complex64{x.re + static_cast<float>(s), x.im};
}
__device__ __forceinline__ Complex128 add_u64(Complex128 x, uint64_t s) {
    return Complex128{x.re + static_cast<double>(s), x.im};
}

// 16 bytes of consecutive elements: one vector load and store per chunk.
template <class T>
struct alignas(16) Chunk {
    static constexpr int K = sizeof(T) >= 16 ? 1 : 16 / static_cast<int>(sizeof(T));
    T e[K];
};

// Steps the multi-index idx (and the running sum of its entries) to the next C-order
// element without a division.
template <int N>
__device__ __forceinline__ void advance(const memarray::Indexer<N>& ix, uint64_t* idx,
                                        uint64_t& sum) {
    // Unrolled for the fixed small ndims; a plain loop for the 32-slot generic kernel
    // keeps its code (and the driver's JIT time) small: carries are rare anyway.
    if constexpr (N <= 4) {
        MEMARRAY_UNROLL
        for (int d = N - 1; d >= 0; --d) {
            ++idx[d];
            ++sum;
            if (idx[d] < ix.shape[d]) return;
            sum -= ix.shape[d];
            idx[d] = 0;
        }
    } else {
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
        for (int d = N - 1; d >= 0; --d) {
            ++idx[d];
            ++sum;
            if (idx[d] < ix.shape[d]) return;
            sum -= ix.shape[d];
            idx[d] = 0;
        }
    }
}

template <class T, int N>
__device__ __forceinline__ void add_index_scalar(const memarray::Indexer<N>& ix, uint64_t begin,
                                                 uint64_t n, uint64_t tid, uint64_t step) {
    T* data = static_cast<T*>(ix.data);
    for (uint64_t i = begin + tid; i < n; i += step) {
        uint64_t idx[N > 0 ? N : 1];
        ix.unravel(i, idx);
        uint64_t sum = 0;
        MEMARRAY_UNROLL
        for (int d = 0; d < N; ++d) sum += idx[d];
        data[i] = add_u64(data[i], sum);
    }
}

// Each thread takes 16-byte chunks of consecutive elements (grid-stride): one vector
// load and store per chunk, and one unravel per chunk instead of one per element. That
// keeps the kernel at memory speed for every element size. Unaligned data (a foreign
// pointer) and the tail use the scalar loop.
template <class T, int N>
__device__ __forceinline__ void add_index(const memarray::Indexer<N>& ix) {
    using C = Chunk<T>;
    constexpr int K = C::K;
    const uint64_t n = ix.len();
    const uint64_t step = static_cast<uint64_t>(blockDim.x) * gridDim.x;
    const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if ((reinterpret_cast<uintptr_t>(ix.data) & 15u) != 0) {
        add_index_scalar<T, N>(ix, 0, n, tid, step);
        return;
    }
    const uint64_t chunks = n / K;
    C* data = static_cast<C*>(ix.data);
    for (uint64_t c = tid; c < chunks; c += step) {
        C v = data[c];
        uint64_t idx[N > 0 ? N : 1];
        ix.unravel(c * K, idx);
        uint64_t sum = 0;
        MEMARRAY_UNROLL
        for (int d = 0; d < N; ++d) sum += idx[d];
        MEMARRAY_UNROLL
        for (int k = 0; k < K; ++k) {
            v.e[k] = add_u64(v.e[k], sum);
            if (k + 1 < K) advance<N>(ix, idx, sum);
        }
        data[c] = v;
    }
    add_index_scalar<T, N>(ix, chunks * K, n, tid, step);
}

}  // namespace

// build.sh compiles one module per dtype (-DMEMARRAY_DTYPE_ID=k, k = position in
// memarray_core::DType::ALL), so the driver JIT-compiles only the dtypes a process uses.
#define MEMARRAY_ADD_INDEX(NAME, T)                                                        \
    extern "C" __global__ void add_index_##NAME##_n1(memarray::Indexer<1> ix) {            \
        add_index<T, 1>(ix);                                                               \
    }                                                                                      \
    extern "C" __global__ void add_index_##NAME##_n2(memarray::Indexer<2> ix) {            \
        add_index<T, 2>(ix);                                                               \
    }                                                                                      \
    extern "C" __global__ void add_index_##NAME##_n3(memarray::Indexer<3> ix) {            \
        add_index<T, 3>(ix);                                                               \
    }                                                                                      \
    extern "C" __global__ void add_index_##NAME##_n4(memarray::Indexer<4> ix) {            \
        add_index<T, 4>(ix);                                                               \
    }                                                                                      \
    extern "C" __global__ void add_index_##NAME##_nd(memarray::Indexer<32> ix) {           \
        add_index<T, 32>(ix);                                                              \
    }

#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 0
MEMARRAY_ADD_INDEX(bool, Bool)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 1
MEMARRAY_ADD_INDEX(i8, int8_t)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 2
MEMARRAY_ADD_INDEX(i16, int16_t)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 3
MEMARRAY_ADD_INDEX(i32, int32_t)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 4
MEMARRAY_ADD_INDEX(i64, int64_t)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 5
MEMARRAY_ADD_INDEX(u8, uint8_t)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 6
MEMARRAY_ADD_INDEX(u16, uint16_t)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 7
MEMARRAY_ADD_INDEX(u32, uint32_t)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 8
MEMARRAY_ADD_INDEX(u64, uint64_t)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 9
MEMARRAY_ADD_INDEX(f16, Half)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 10
MEMARRAY_ADD_INDEX(bf16, BHalf)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 11
MEMARRAY_ADD_INDEX(f32, float)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 12
MEMARRAY_ADD_INDEX(f64, double)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 13
MEMARRAY_ADD_INDEX(c64, Complex64)
#endif
#if !defined(MEMARRAY_DTYPE_ID) || MEMARRAY_DTYPE_ID == 14
MEMARRAY_ADD_INDEX(c128, Complex128)
#endif
