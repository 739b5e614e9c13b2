//! What a small host-device copy costs the calling thread, without Python: per call, the
//! median of 9 loops of 500 calls. Uploads are not waited for one by one (one sync ends a
//! loop, as a caller that moves many small arrays sees them); downloads wait for each
//! copy, as `to_numpy()` must. Per size (4, 16, 64, 256 KiB):
//!
//! - H2D: the driver's copy of pageable memory; the driver's copy of pinned memory; that
//!   plus an event recorded after it; a memcpy into a pinned ring slot, the pinned copy
//!   and an event (what an engine that stages small copies itself pays).
//! - D2H: the driver's copy into pageable memory, waited for; the staged short path
//!   (what a download above the direct threshold takes); the copy into pinned memory,
//!   waited for, then a memcpy out.
//! - The stream's and the event's own costs: a sync with nothing queued, an event record.
//!
//!     cargo bench -p memarray-cuda --bench small_copy
//!
//! Prints SKIPPED without a CUDA device.

use std::time::Instant;

use memarray_core::HostBuffer;
use memarray_cuda::copy;
use memarray_cuda::{DeviceBuffer, Event, Stream, resource};

const CALLS: usize = 500;

/// Median over 9 loops of the mean microseconds per call; `end` runs after each loop
/// (inside the timing).
fn per_call_us(mut f: impl FnMut(usize), mut end: impl FnMut()) -> f64 {
    for i in 0..CALLS {
        f(i);
    }
    end();
    let mut v: Vec<f64> = (0..9)
        .map(|_| {
            let t = Instant::now();
            for i in 0..CALLS {
                f(i);
            }
            end();
            t.elapsed().as_secs_f64() * 1e6 / CALLS as f64
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[4]
}

fn main() -> memarray_cuda::Result<()> {
    let Some(device) = memarray_testing::gpu_or_skip() else {
        return Ok(());
    };
    let stream = Stream::new(&device)?;
    let s = stream.as_ref();
    let sync = || s.synchronize(&device).unwrap();
    let event = Event::new(&device)?;
    println!(
        "stream sync, nothing queued      {:6.2} us",
        per_call_us(|_| sync(), || {})
    );
    println!(
        "event record                     {:6.2} us",
        per_call_us(|_| event.record(s).unwrap(), sync)
    );
    for n in [4usize << 10, 16 << 10, 64 << 10, 256 << 10] {
        let kib = n >> 10;
        let pool = resource::default_resource(&device)?;
        let d = DeviceBuffer::zeroed(&device, n, pool, s)?;
        let mut pageable: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let pinned = HostBuffer::zeroed_in(n, resource::pinned_pool(&device))?;
        // A ring of slots as large as one loop's copies: no slot is reused before the
        // loop's sync.
        let ring = HostBuffer::zeroed_in(n * CALLS, resource::pinned_pool(&device))?;
        let row = |what: &str, us: f64| println!("{kib:3} KiB {what:40} {us:6.2} us");
        row(
            "H2D driver, pageable",
            per_call_us(
                // SAFETY: a pageable source is read before the call returns.
                |_| drop(unsafe { copy::copy_htod_raw(&d, 0, pageable.as_ptr(), n, s) }),
                sync,
            ),
        );
        row(
            "H2D driver, pinned",
            per_call_us(
                // SAFETY: the pinned source is unchanged until the loop's sync.
                |_| drop(unsafe { copy::copy_htod_raw(&d, 0, pinned.as_ptr(), n, s) }),
                sync,
            ),
        );
        row(
            "H2D driver, pinned + event",
            per_call_us(
                |_| {
                    // SAFETY: as above.
                    unsafe { copy::copy_htod_raw(&d, 0, pinned.as_ptr(), n, s) }
                        .unwrap()
                        .record(&event)
                        .unwrap()
                },
                sync,
            ),
        );
        row(
            "H2D memcpy to a ring slot + pinned + event",
            per_call_us(
                |i| {
                    // SAFETY: slot i of the ring is read by no copy before the loop's sync.
                    let slot = unsafe { ring.as_mut_ptr().add(i * n) };
                    // SAFETY: `slot` has n bytes, distinct from the source.
                    unsafe { std::ptr::copy_nonoverlapping(pageable.as_ptr(), slot, n) };
                    // SAFETY: the slot is unchanged until the loop's sync.
                    unsafe { copy::copy_htod_raw(&d, 0, slot, n, s) }
                        .unwrap()
                        .record(&event)
                        .unwrap()
                },
                sync,
            ),
        );
        row(
            "D2H driver, pageable, waited",
            per_call_us(|_| copy::copy_dtoh(&mut pageable, &d, 0, s).unwrap(), || {}),
        );
        row(
            "D2H staged (short path), waited",
            per_call_us(
                |_| copy::staged_to_host(&mut pageable, &d, 0, s).unwrap(),
                || {},
            ),
        );
        row(
            "D2H pinned, waited, memcpy out",
            per_call_us(
                |_| {
                    // SAFETY: the pinned buffer is only read after the copy is waited for.
                    unsafe { copy::copy_dtoh_raw(pinned.as_mut_ptr(), &d, 0, n, s) }
                        .unwrap()
                        .synchronize()
                        .unwrap();
                    pageable.copy_from_slice(pinned.as_slice());
                },
                || {},
            ),
        );
    }
    Ok(())
}
