//! What asking "is this stream being captured?" costs outside a capture: memarray's
//! `StreamRef::capture` (the one check every recording, waiting and host-copy path asks)
//! against the bare `cuStreamGetCaptureInfo` it wraps, per call, medians of 7 rounds of
//! 200,000 calls on a memarray stream, one run.
//!
//!     cargo bench -p memarray-cuda --bench capture_check
//!
//! Prints SKIPPED without a CUDA device.

use std::time::Instant;

use cudarc::driver::sys;
use memarray_cuda::Stream;
use memarray_cuda::graph::Capture;

const CALLS: u32 = 200_000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn per_call_ns(mut f: impl FnMut()) -> f64 {
    let rounds = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..CALLS {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(CALLS)
        })
        .collect();
    median(rounds)
}

fn main() -> memarray_cuda::Result<()> {
    let Some(device) = memarray_testing::gpu_or_skip() else {
        return Ok(());
    };
    let stream = Stream::new(&device)?;
    let s = stream.as_ref();
    let ours = per_call_ns(|| {
        let c = s.capture(&device).expect("capture status");
        assert_eq!(c, Capture::None);
    });
    let _ctx = device.bind()?;
    let raw = s.raw() as sys::CUstream;
    let bare = per_call_ns(|| {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: sys::cuuint64_t = 0;
        // SAFETY: a live stream of the bound context; the optional outputs are null.
        let r = unsafe {
            sys::cuStreamGetCaptureInfo_v2(
                raw,
                &mut status,
                &mut id,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    });
    println!(
        "capture check outside a capture: memarray StreamRef::capture {ours:.1} ns/call, \
         bare cuStreamGetCaptureInfo {bare:.1} ns/call ({:.2}x)",
        ours / bare
    );
    Ok(())
}
