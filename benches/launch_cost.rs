//! The launch targets: the same kernel launched through `memarray_cuda::launch`
//! and by hand through cudarc's driver API with manual ordering (an event recorded after
//! each launch, as a user who lets other streams wait must do). Per-launch host cost on a
//! small array (median of 7 rounds of 20,000 launches, then a stream sync), and the
//! kernel's time on a 1 GiB array (median of 10 launch + sync), one run.
//!
//!     cargo bench -p memarray-cuda --bench launch_cost
//!
//! Prints SKIPPED without a CUDA device.

use std::ffi::{CStr, CString, c_void};
use std::time::Instant;

use cudarc::driver::sys;
use memarray_core::{DType, Indexer, Location};
use memarray_cuda::launch::{Arg, Module, launch};
use memarray_cuda::{RawArray, Stream};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn check(what: &str, r: sys::CUresult) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

fn main() -> memarray_cuda::Result<()> {
    let Some(device) = memarray_testing::gpu_or_skip() else {
        return Ok(());
    };
    let ptx = memarray_seed::ptx(memarray_core::DType::F32);
    let f = Module::load(&device, ptx)?.function("add_index_f32_n1")?;
    let stream = Stream::new(&device)?;
    let s = stream.as_ref();
    let cu_stream = s.raw() as sys::CUstream;

    // By hand: the same PTX loaded through cudarc, a buffer of its own, an event.
    let _ctx = device.bind()?;
    let ptx_c = CStr::from_bytes_with_nul(ptx).expect("the seed's PTX ends with its NUL");
    let (mut module, mut func, mut event) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: the device's context is current (bind); out pointers are valid.
    unsafe {
        check(
            "load",
            sys::cuModuleLoadData(&mut module, ptx_c.as_ptr().cast()),
        );
        let name = CString::new("add_index_f32_n1").unwrap();
        check(
            "function",
            sys::cuModuleGetFunction(&mut func, module, name.as_ptr()),
        );
        check(
            "event",
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            ),
        );
    }
    let hand = |ptr: u64, n: u64, cfg: &memarray_cuda::launch::LaunchConfig| {
        let mut ix = Indexer::<1>::new(ptr as usize as *mut c_void, [n]);
        let mut params = [(&raw mut ix).cast::<c_void>()];
        // SAFETY: func takes one Indexer<1>; ptr holds n f32 on this device; the stream
        // and event are live.
        unsafe {
            check(
                "launch",
                sys::cuLaunchKernel(
                    func,
                    cfg.grid[0],
                    1,
                    1,
                    cfg.block[0],
                    1,
                    1,
                    0,
                    cu_stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            );
            check("record", sys::cuEventRecord(event, cu_stream));
        }
    };

    for (label, n) in [
        ("small (1,024 f32)", 1024usize),
        ("1 GiB (268,435,456 f32)", 1 << 28),
    ] {
        let mut a = RawArray::zeros_on(DType::F32, &[n], Location::Device(0), None, None)?;
        let b = RawArray::zeros_on(DType::F32, &[n], Location::Device(0), None, None)?;
        a.synchronize(None)?;
        b.synchronize(None)?;
        let b_ptr = b.device_ptr(None)?;
        let cfg = f.config_for(n as u64);
        let (reps, rounds) = if n <= 1024 { (20_000, 7) } else { (1, 10) };
        let (mut mine, mut theirs) = (vec![], vec![]);
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..reps {
                launch(&f, cfg, Some(s), &mut [Arg::Write(&mut a)])?;
            }
            stream.synchronize()?;
            mine.push(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
            let t = Instant::now();
            for _ in 0..reps {
                hand(b_ptr, n as u64, &cfg);
            }
            stream.synchronize()?;
            theirs.push(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
        }
        let (m, h) = (median(mine), median(theirs));
        println!(
            "{label}: memarray launch {m:.2} us, by hand {h:.2} us per launch ({:+.2} us, {:.3}x)",
            m - h,
            m / h
        );
    }
    // SAFETY: nothing uses the event or module any more.
    unsafe {
        sys::cuEventDestroy_v2(event);
        sys::cuModuleUnload(module);
    }
    Ok(())
}
