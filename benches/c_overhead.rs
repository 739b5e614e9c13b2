//! The C ABI's per-call overhead against the Rust API (target: within 10%), on a
//! small array: create from 1 KiB of data, move to the device on a stream (async), begin
//! and end device access, free. Both loops run the same memarray code; the C side adds
//! handles, the boundary guard, the per-thread status and the lock a C access takes.
//! Medians of 31 batches of 2,000 iterations, alternating the two.
//!
//!     cargo bench -p memarray-c --bench c_overhead

use std::time::Instant;

use memarray::*;
use memarray_core::{DType, Location};
use memarray_cuda::launch::{begin_access, end_access};
use memarray_cuda::{Device, RawArray, Stream};

const ITERS: usize = 2000;
const BATCHES: usize = 31;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let Ok(device) = Device::get(0) else {
        println!("SKIPPED: no CUDA device");
        return;
    };
    let stream = Stream::new(&device).unwrap();
    let data = vec![1u8; 1024];
    let shape = [256usize];
    let rust_batch = || {
        let t = Instant::now();
        for _ in 0..ITERS {
            let mut a = RawArray::from_bytes(DType::F32, &shape, &data, 0).unwrap();
            a.move_memory(Location::Device(0), Some(stream.as_ref()), false, None)
                .unwrap();
            let buf = begin_access(&mut a, &device, stream.as_ref(), None).unwrap();
            std::hint::black_box(buf.device_ptr());
            end_access(&mut a, device.clone(), stream.as_ref(), true).unwrap();
            drop(a);
        }
        t.elapsed().as_secs_f64() * 1e6 / ITERS as f64
    };
    let mut cs: *mut memarray_stream = std::ptr::null_mut();
    // SAFETY: `cs` is writable.
    let made = unsafe { memarray_stream_create(0, &mut cs) };
    assert_eq!(made, memarray_status::Ok);
    let c_shape = [256u64];
    let c_batch = || {
        let t = Instant::now();
        for _ in 0..ITERS {
            let mut a: *mut memarray_array = std::ptr::null_mut();
            let mut acc: *mut memarray_access = std::ptr::null_mut();
            let mut ix = std::mem::MaybeUninit::<memarray_indexer>::uninit();
            // SAFETY: live handles, valid pointers and sizes, as a C caller passes them.
            unsafe {
                let ok = memarray_status::Ok;
                assert_eq!(
                    memarray_array_from_data(
                        memarray_dtype::F32 as i32,
                        1,
                        c_shape.as_ptr(),
                        data.as_ptr().cast(),
                        data.len(),
                        &mut a
                    ),
                    ok
                );
                assert_eq!(memarray_array_move(a, 0, cs, false, 0), ok);
                assert_eq!(memarray_access_begin(a, 0, cs, true, 0, &mut acc), ok);
                assert_eq!(memarray_access_indexer(acc, ix.as_mut_ptr()), ok);
                std::hint::black_box(ix.assume_init().data);
                assert_eq!(memarray_access_end(acc), ok);
                memarray_array_free(a);
            }
        }
        t.elapsed().as_secs_f64() * 1e6 / ITERS as f64
    };
    // Warm up pools and streams.
    rust_batch();
    c_batch();
    let (mut rust, mut c) = (Vec::new(), Vec::new());
    for _ in 0..BATCHES {
        rust.push(rust_batch());
        c.push(c_batch());
    }
    stream.synchronize().unwrap();
    // SAFETY: `cs` is live and not used afterwards.
    unsafe { memarray_stream_free(cs) };
    let (r, c) = (median(rust), median(c));
    println!(
        "create + move + begin/end access + free, 1 KiB: Rust API {r:.2} us, C ABI {c:.2} us \
         per iteration: C/Rust {:.3} (target <= 1.10: {})",
        c / r,
        if c / r <= 1.10 { "met" } else { "MISSED" }
    );
}
