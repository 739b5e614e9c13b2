//! Where the time of a small staged copy goes: 1-4 MiB host-device copies,
//! without Python, each followed by a stream sync, medians of 300 calls. Per size and
//! direction: the DMA alone (pinned source or destination), the driver's own pageable
//! copy, staging by hand (one memcpy into a pinned buffer, one DMA) and
//! `copy::staged_to_device` / `staged_to_host` with 1 to 16 lanes on both paths (lane streams, and
//! the short path below `short_below`).
//!
//!     cargo bench -p memarray-cuda --bench staging_cost
//!
//! Prints SKIPPED without a CUDA device.

use std::time::Instant;

use memarray_core::HostBuffer;
use memarray_cuda::copy::{self, Direction, StagingConfig};
use memarray_cuda::{DeviceBuffer, Stream, resource};

const REPS: usize = 300;

fn median_us(mut f: impl FnMut()) -> f64 {
    for _ in 0..20 {
        f();
    }
    let mut v: Vec<f64> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median time for `threads` spinning threads to copy `src` into `dst` (1/threads each),
/// the hand-off an atomic store: the host copy's own scaling, without the pipeline.
fn hot_copy(threads: usize, src: &[u8], dst: *mut u8) -> f64 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let go = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let per = src.len() / threads;
    let (s, d) = (src.as_ptr() as usize, dst as usize);
    let copy = |i: usize| {
        // SAFETY: thread i copies its own `per` bytes of two live, distinct buffers.
        unsafe {
            std::ptr::copy_nonoverlapping((s + i * per) as *const u8, (d + i * per) as *mut u8, per)
        }
    };
    std::thread::scope(|sc| {
        for i in 1..threads {
            let (go, done) = (&go, &done);
            sc.spawn(move || {
                let mut seen = 0;
                loop {
                    let g = go.load(Ordering::Acquire);
                    if g == usize::MAX {
                        return;
                    }
                    if g != seen {
                        seen = g;
                        copy(i);
                        done.fetch_add(1, Ordering::AcqRel);
                    }
                    std::hint::spin_loop();
                }
            });
        }
        let mut round = 0;
        let us = median_us(|| {
            round += 1;
            done.store(0, Ordering::Release);
            go.store(round, Ordering::Release);
            copy(0);
            while done.load(Ordering::Acquire) < threads - 1 {
                std::hint::spin_loop();
            }
        });
        go.store(usize::MAX, Ordering::Release);
        us
    })
}

fn main() -> memarray_cuda::Result<()> {
    let Some(device) = memarray_testing::gpu_or_skip() else {
        return Ok(());
    };
    let stream = Stream::new(&device)?;
    let s = stream.as_ref();
    let before = [Direction::ToDevice, Direction::ToHost].map(|d| copy::staging_config(d).unwrap());
    for n in [1usize << 20, 2 << 20, 4 << 20] {
        let pool = resource::default_resource(&device)?;
        let d = DeviceBuffer::zeroed(&device, n, pool, s)?;
        let mut pageable: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let pinned = HostBuffer::zeroed_in(n, resource::pinned_pool(&device))?;
        let sync = || s.synchronize(&device).unwrap();
        let mb = n >> 20;
        let report = |what: &str, us: f64| {
            println!(
                "{mb} MiB {what:32} {us:7.1} us  {:5.1} GB/s",
                n as f64 / us / 1e3
            )
        };
        // To the device.
        report(
            "H2D pinned DMA",
            median_us(|| {
                // SAFETY: pinned source alive and unchanged until the sync below.
                unsafe { copy::copy_htod_raw(&d, 0, pinned.as_ptr(), n, s) }
                    .unwrap()
                    .synchronize()
                    .unwrap();
            }),
        );
        for pieces in [2, 4, 8] {
            let piece = n / pieces;
            report(
                &format!("H2D pinned DMA in {pieces} pieces"),
                median_us(|| {
                    for k in 0..pieces {
                        // SAFETY: pinned source alive and unchanged until the sync below.
                        let _queued = unsafe {
                            copy::copy_htod_raw(
                                &d,
                                k * piece,
                                pinned.as_ptr().add(k * piece),
                                piece,
                                s,
                            )
                        }
                        .unwrap();
                    }
                    sync();
                }),
            );
        }
        for threads in [1usize, 2, 4, 8] {
            report(
                &format!("memcpy to pinned, {threads} hot threads"),
                hot_copy(threads, &pageable, pinned.as_mut_ptr()),
            );
        }
        report(
            "H2D driver pageable",
            median_us(|| {
                // Waits for the copy itself.
                let _done = copy::copy_htod(&d, 0, &pageable, s).unwrap();
            }),
        );
        report(
            "H2D memcpy to pinned only",
            median_us(|| {
                // SAFETY: no DMA uses `pinned` here.
                unsafe { std::slice::from_raw_parts_mut(pinned.as_mut_ptr(), n) }
                    .copy_from_slice(&pageable);
            }),
        );
        report(
            "H2D by hand (memcpy + DMA)",
            median_us(|| {
                // SAFETY: the previous DMA from `pinned` finished (synced).
                unsafe { std::slice::from_raw_parts_mut(pinned.as_mut_ptr(), n) }
                    .copy_from_slice(&pageable);
                // SAFETY: as above.
                unsafe { copy::copy_htod_raw(&d, 0, pinned.as_ptr(), n, s) }
                    .unwrap()
                    .synchronize()
                    .unwrap();
            }),
        );
        let cells = [1, 2, 4, 8].map(|lanes| (lanes, 256 << 10, 0)).into_iter();
        let short = [1, 2, 4, 8, 16].map(|lanes| (lanes, 256 << 10, copy::MAX_SHORT));
        for (lanes, chunk, short_below) in cells.chain(short) {
            let path = if short_below > 0 { "short" } else { "lanes" };
            let cfg = StagingConfig {
                threads: lanes,
                fill_threads: lanes,
                chunk_bytes: chunk,
                direct_below: 0,
                lane_min: 0,
                short_below,
            };
            copy::set_staging_config(Direction::ToDevice, cfg)?;
            copy::set_staging_config(Direction::ToHost, cfg)?;
            report(
                &format!("H2D {path} {lanes} lanes"),
                median_us(|| {
                    let _queued = copy::staged_to_device(&d, 0, &pageable, s).unwrap();
                    sync();
                }),
            );
            report(
                &format!("D2H {path} {lanes} lanes"),
                median_us(|| {
                    copy::staged_to_host(&mut pageable, &d, 0, s).unwrap();
                }),
            );
        }
        // To the host.
        report(
            "D2H pinned DMA",
            median_us(|| {
                // SAFETY: nothing reads `pinned` until the sync below.
                unsafe { copy::copy_dtoh_raw(pinned.as_mut_ptr(), &d, 0, n, s) }
                    .unwrap()
                    .synchronize()
                    .unwrap();
            }),
        );
        report(
            "D2H driver pageable",
            median_us(|| {
                copy::copy_dtoh(&mut pageable, &d, 0, s).unwrap();
            }),
        );
        report(
            "D2H by hand (DMA + memcpy)",
            median_us(|| {
                // SAFETY: nothing reads `pinned` until the sync below.
                unsafe { copy::copy_dtoh_raw(pinned.as_mut_ptr(), &d, 0, n, s) }
                    .unwrap()
                    .synchronize()
                    .unwrap();
                pageable.copy_from_slice(pinned.as_slice());
            }),
        );
    }
    copy::set_staging_config(Direction::ToDevice, before[0])?;
    copy::set_staging_config(Direction::ToHost, before[1])?;
    Ok(())
}
