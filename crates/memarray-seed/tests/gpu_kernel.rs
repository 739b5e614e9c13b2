//! add_index_tuple against a host reference built from the seed's `AddIndex::add_u64`
//! and `shape::unravel`, bit for bit, for every dtype and ndim 0..=5 and 7; and an array
//! of more than 2^32 one-byte elements.

use std::sync::Arc;

use memarray_core::{Complex32, Complex64, DType, Element, HostBuffer, bf16, f16, shape};
use memarray_cuda::copy;
use memarray_cuda::{CudaError, Device, DeviceBuffer, DeviceResource, Stream};
use memarray_seed::{self as seed, AddIndex};
use memarray_testing::gpu::gpu_or_skip;

/// A deterministic, finite (no NaN: GPUs canonicalise NaN payloads) test value per index.
trait Pattern: AddIndex {
    fn make(i: u64) -> Self;
}

fn mix(i: u64) -> u64 {
    (i ^ 0x5bd1_e995)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(17)
}

macro_rules! int_pattern {
    ($($t:ty),*) => {$(
        impl Pattern for $t {
            fn make(i: u64) -> Self { mix(i) as $t }
        }
    )*};
}
int_pattern!(i8, i16, i32, i64, u8, u16, u32, u64);

impl Pattern for bool {
    fn make(i: u64) -> Self {
        mix(i).is_multiple_of(3)
    }
}
impl Pattern for f32 {
    fn make(i: u64) -> Self {
        // Mix small values, values that round when integers are added, and subnormals.
        match i % 4 {
            0 => (mix(i) % 2000) as f32 * 0.37 - 300.0,
            1 => 1.0e8 + (mix(i) % 1000) as f32,
            2 => f32::from_bits((mix(i) % 0x7F_FFFF) as u32) * if i % 8 == 2 { -1.0 } else { 1.0 },
            _ => -((mix(i) % 100_000) as f32) / 7.0,
        }
    }
}
impl Pattern for f64 {
    fn make(i: u64) -> Self {
        match i % 3 {
            0 => (mix(i) % 2000) as f64 * 0.37 - 300.0,
            1 => 1.0e17 + (mix(i) % 1000) as f64,
            _ => -((mix(i) % 100_000) as f64) / 7.0,
        }
    }
}
impl Pattern for f16 {
    fn make(i: u64) -> Self {
        // Finite f16 bit patterns, subnormals and large values included.
        let bits = (mix(i) % 0x7C00) as u16 | if i.is_multiple_of(2) { 0x8000 } else { 0 };
        f16::from_bits(bits)
    }
}
impl Pattern for bf16 {
    fn make(i: u64) -> Self {
        let bits = (mix(i) % 0x7F80) as u16 | if i.is_multiple_of(2) { 0x8000 } else { 0 };
        bf16::from_bits(bits)
    }
}
impl Pattern for Complex32 {
    fn make(i: u64) -> Self {
        Complex32::new(f32::make(i), f32::make(i + 1))
    }
}
impl Pattern for Complex64 {
    fn make(i: u64) -> Self {
        Complex64::new(f64::make(i), -f64::make(i + 7))
    }
}

const SHAPES: &[&[usize]] = &[
    &[],
    &[37],
    &[5, 9],
    &[3, 4, 5],
    &[2, 3, 4, 5],
    &[2, 3, 1, 4, 3],
    &[2, 1, 3, 2, 1, 2, 3],
    &[257, 1023],
    &[3, 0, 2],
];

fn check<T: Pattern>(dev: &Arc<Device>, s: &Stream) {
    let res = Arc::new(DeviceResource::new(dev));
    for &sh in SHAPES {
        let n = shape::checked_len(sh).unwrap();
        let input: Vec<T> = (0..n).map(T::make).collect();
        let expected: Vec<T> = input
            .iter()
            .enumerate()
            .map(|(l, &x)| {
                let idx = shape::unravel(sh, l as u64).unwrap();
                x.add_u64(idx.iter().fold(0u64, |a, &i| a.wrapping_add(i)))
            })
            .collect();
        let nbytes = std::mem::size_of_val(&input[..]);
        let buf = DeviceBuffer::zeroed(dev, nbytes, res.clone(), s.as_ref()).unwrap();
        let _ = copy::copy_htod(&buf, 0, bytes_of(&input), s.as_ref()).unwrap();
        let _ = seed::add_index_tuple(T::DTYPE, &buf, sh, s.as_ref()).unwrap();
        let mut out = HostBuffer::zeroed(nbytes).unwrap();
        copy::copy_dtoh(out.as_mut_slice(), &buf, 0, s.as_ref()).unwrap();
        if out.as_slice() != bytes_of(&expected) {
            let size = T::DTYPE.size();
            let first = (0..n as usize)
                .find(|&k| {
                    out.as_slice()[k * size..(k + 1) * size] != bytes_of(&expected[k..k + 1])[..]
                })
                .unwrap();
            // SAFETY: the host buffer is 64-aligned and holds n elements of T.
            let got = unsafe { T::load(out.as_ptr().cast::<T>().add(first)) };
            panic!(
                "{} shape {sh:?}: element {first} (index {:?}) is {got:?}, expected {:?} (input {:?})",
                T::DTYPE,
                shape::unravel(sh, first as u64).unwrap(),
                expected[first],
                input[first]
            );
        }
    }
}

#[test]
fn gpu_add_index_tuple_every_dtype_and_ndim() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    check::<bool>(&dev, &s);
    check::<i8>(&dev, &s);
    check::<i16>(&dev, &s);
    check::<i32>(&dev, &s);
    check::<i64>(&dev, &s);
    check::<u8>(&dev, &s);
    check::<u16>(&dev, &s);
    check::<u32>(&dev, &s);
    check::<u64>(&dev, &s);
    check::<f16>(&dev, &s);
    check::<bf16>(&dev, &s);
    check::<f32>(&dev, &s);
    check::<f64>(&dev, &s);
    check::<Complex32>(&dev, &s);
    check::<Complex64>(&dev, &s);
}

#[test]
fn gpu_add_index_tuple_refuses_bad_input() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let buf =
        DeviceBuffer::zeroed(&dev, 100, Arc::new(DeviceResource::new(&dev)), s.as_ref()).unwrap();
    let e = seed::add_index_tuple(DType::F32, &buf, &[5, 6], s.as_ref()).unwrap_err();
    assert!(
        matches!(
            e,
            CudaError::BufferTooSmall {
                needed: 120,
                len: 100,
                ..
            }
        ),
        "{e:?}"
    );
    let e = seed::add_index_tuple(DType::U8, &buf, &[1; 33], s.as_ref()).unwrap_err();
    assert!(e.to_string().contains("ndim 33"), "{e}");
    let e = seed::add_index_tuple(DType::U8, &buf, &[1 << 40, 1 << 40], s.as_ref()).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
    // 32 dimensions work.
    let mut sh = [1usize; 32];
    sh[0] = 4;
    sh[31] = 25;
    let _ = seed::add_index_tuple(DType::U8, &buf, &sh, s.as_ref()).unwrap();
    let mut out = [0u8; 100];
    copy::copy_dtoh(&mut out, &buf, 0, s.as_ref()).unwrap();
    assert_eq!(out[26], 1 + 1, "index (1, 0, .., 0, 1)");
}

/// More than 2^32 one-byte elements (4 GiB): offsets, unravel and the 64-bit division
/// path are exercised across the 2^31 and 2^32 boundaries.
#[test]
fn gpu_add_index_tuple_over_2_pow_32_elements() {
    let Some(dev) = gpu_or_skip() else { return };
    let n: usize = (1 << 32) + 4096;
    let last = n / 8;
    let shapes: [&[usize]; 3] = [&[n], &[2, 4, last], &[2, 2, 2, 1, last]];
    let free = dev.memory_info().unwrap().free as usize;
    if free < n + (1 << 30) {
        memarray_testing::gpu::report_skip(&format!("needs {n} bytes of free device memory"));
        return;
    }
    let s = Stream::new(&dev).unwrap();
    let buf =
        DeviceBuffer::zeroed(&dev, n, Arc::new(DeviceResource::new(&dev)), s.as_ref()).unwrap();
    for sh in shapes {
        let _ = seed::add_index_tuple(DType::U8, &buf, sh, s.as_ref()).unwrap();
    }
    let expected = |p: usize| -> u8 {
        shapes.iter().fold(0u8, |acc, sh| {
            let idx = shape::unravel(sh, p as u64).unwrap();
            acc.add_u64(idx.iter().sum())
        })
    };
    let mut starts = vec![0usize, (1 << 31) - 2048, (1 << 32) - 2048, n - 4096];
    starts.extend((1..64).map(|k| k * (n / 64) - 7));
    for start in starts {
        let mut got = vec![0u8; 4096];
        copy::copy_dtoh(&mut got, &buf, start, s.as_ref()).unwrap();
        for (k, &g) in got.iter().enumerate() {
            let p = start + k;
            assert_eq!(g, expected(p), "position {p}");
        }
    }
}

/// The bytes of a slice of elements.
fn bytes_of<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: Element types are plain data of DTYPE.size() bytes without padding (the
    // trait's contract), so every byte is initialised; the length is exact.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}
