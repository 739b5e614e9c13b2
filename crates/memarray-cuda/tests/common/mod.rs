//! Shared helpers for memarray-cuda's integration tests.
#![allow(dead_code)]

use memarray_core::Element;

/// Deterministic pseudo-random bytes (xorshift64*), so failures reproduce.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// The bytes of a slice of elements.
pub fn bytes_of<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: Element types are plain data of DTYPE.size() bytes without padding (the
    // trait's contract), so every byte is initialised; the length is exact.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The `k`-th test value of any element type: `0 + k` with the element's own addition
/// (wraps for small integers; bool: `k != 0`).
pub fn val<T: memarray_seed::AddIndex>(k: u64) -> T {
    T::default().add_u64(k)
}

/// The multi-index of C-order offset `linear` in `shape`, as a typed index.
pub fn index_of<const N: usize>(shape: [usize; N], linear: u64) -> [usize; N] {
    let v = memarray_core::shape::unravel(&shape, linear).expect("linear < len");
    std::array::from_fn(|d| v[d] as usize)
}

/// An i32 array's elements, read after its pending work.
pub fn i32s(a: &memarray_cuda::RawArray) -> Vec<i32> {
    let mut out = vec![0u8; a.nbytes()];
    a.read_all(&mut out, None).unwrap();
    out.chunks_exact(4)
        .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}
