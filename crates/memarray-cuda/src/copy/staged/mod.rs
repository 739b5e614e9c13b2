//! Pageable host memory to and from the device at pinned speed: a staged pipeline.
//!
//! The driver copies pageable memory through a small staging buffer of its own, on the
//! calling thread, at 7-13 GB/s. Here several host threads ("lanes") copy chunks of the
//! user's memory into pinned slots from the device's pinned pool while the DMA engine
//! drains the slots filled before (host to device), or fill the user's memory from slots
//! the DMA engine has just written (device to host):
//!
//! - Each lane owns a stream and two pinned slots, each with an event recorded after the
//!   DMA that last used it; a slot is refilled only after that event. Chunk `k` goes to
//!   lane `k % lanes`. Lane 0 runs on the calling thread, the others on persistent
//!   worker threads (no thread is spawned per call).
//! - Ordering: every lane stream first waits on an event recorded on the caller's stream
//!   (work queued before the copy comes first); after a host-to-device copy the caller's
//!   stream waits on every lane's last DMA, so work queued after it sees the data.
//! - When [`to_device`] returns the user's bytes have been read; when [`to_host`] returns
//!   they have been written. Nothing touches user memory after either returns.
//! - Whether a copy is staged at all is decided by `route` (copies below
//!   [`StagingConfig::direct_below`], and host memory the driver already knows, go
//!   straight to the driver); the functions here always stage, and never fall back.
//! - One staged copy at a time per device and direction (the slots are shared); the bus
//!   is the limit.
//!
//! The settings, per [`Direction`], come from measurement (docs/benchmarks.md,
//! "Pageable transfers"): see [`StagingConfig::default_for`]. `MEMARRAY_STAGING_THREADS` and `MEMARRAY_STAGING_CHUNK`
//! (bytes) override them once per process; [`set_config`] at any time.

mod job;
mod pipeline;
mod settings;
mod short;

pub use settings::{
    Direction, MAX_SHORT, MAX_THREADS, MIN_CHUNK, StagingConfig, config, set_config,
};

use std::sync::Arc;

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::error::Result;
use crate::event::Enqueued;
use crate::stream::StreamRef;

use job::{DevSide, HostSide, Transfer};
use pipeline::run;

/// Copies `src` to `dst[dst_offset..]` through the pinned slots, ordered after the work
/// queued on `stream`. Returns once `src` has been read, with the operation on `stream` to
/// record (work queued on `stream` afterwards sees the data; the DMA of the last chunks
/// may still run). Always `Some`; [`crate::copy::upload`] chooses between this and the
/// driver's direct copy.
pub fn to_device(
    dst: &DeviceBuffer,
    dst_offset: usize,
    src: &[u8],
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    let host = HostSide::Memory(src.as_ptr() as usize);
    to_device_from(dst, dst_offset, src.len(), host, stream)
}

/// Copies `len` bytes that `fill(offset, buf)` produces (a file read, say) to
/// `dst[dst_offset..]`, ordered after the work queued on `stream`: each lane fills its
/// pinned slot directly, so the bytes cross host memory once. Returns once every `fill`
/// has returned; the operation on `stream` to record, as [`to_device`]'s. The first error of
/// `fill` ends the copy (the device range is then partly written).
pub fn to_device_with(
    dst: &DeviceBuffer,
    dst_offset: usize,
    len: usize,
    fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    to_device_from(dst, dst_offset, len, HostSide::Fill(fill), stream)
}

/// The staged copy of `len` bytes from `host` to `dst[dst_offset..]` ([`to_device`] and
/// [`to_device_with`]).
fn to_device_from(
    dst: &DeviceBuffer,
    dst_offset: usize,
    len: usize,
    host: HostSide<'_>,
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    let t = Transfer {
        len,
        stream,
        dir: Direction::ToDevice,
        host,
        dev: DevSide::One(dst.range(dst_offset, len)?),
    };
    run(dst.device(), config(Direction::ToDevice)?, t)?;
    Ok(Some(Enqueued::new(stream, dst.device().clone())))
}

/// As [`to_device_with`], into device ranges `(address, bytes)` of `device` (checked by
/// the caller) that take `fill`'s bytes in turn: many arrays filled from one source in one
/// pipeline, with no fill and drain of the slots between them.
pub fn to_device_spans_with(
    device: &Arc<Device>,
    spans: &[(u64, usize)],
    fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    let t = Transfer {
        len: spans.iter().map(|s| s.1).sum(),
        stream,
        dir: Direction::ToDevice,
        host: HostSide::Fill(fill),
        dev: DevSide::Spans(spans),
    };
    run(device, config(Direction::ToDevice)?, t)?;
    Ok(Some(Enqueued::new(stream, device.clone())))
}

/// Copies `src[src_offset..src_offset + dst.len()]` into `dst` through the pinned slots,
/// after the work queued on `stream`. Returns once the bytes are in `dst`
/// ([`crate::copy::download`] chooses between this and the driver's direct copy).
pub fn to_host(
    dst: &mut [u8],
    src: &DeviceBuffer,
    src_offset: usize,
    stream: StreamRef,
) -> Result<()> {
    let s = src.range(src_offset, dst.len())?;
    let device = src.device();
    let cfg = config(Direction::ToHost)?;
    let dst_addr = dst.as_mut_ptr() as usize;
    let t = Transfer {
        len: dst.len(),
        stream,
        dir: Direction::ToHost,
        host: HostSide::Memory(dst_addr),
        dev: DevSide::One(s),
    };
    run(device, cfg, t)
}

#[cfg(test)]
mod tests {
    use super::job::copy_to_pinned;
    use super::pipeline::i_chunks;
    use super::short::{MAX_SHORT_LANES, share, short_plan};
    use super::*;
    use crate::error::{CudaError, SettingError};

    #[test]
    fn spans_take_the_copys_bytes_in_turn_and_one_range_takes_them_all() {
        use super::job::DevSide;
        let spans = [(1000u64, 3usize), (2000, 0), (3000, 5), (5000, 1)];
        // Byte k of the copy, where it lands.
        let want: Vec<u64> = spans
            .iter()
            .flat_map(|&(a, n)| (0..n as u64).map(move |i| a + i))
            .collect();
        for off in 0..want.len() {
            for n in 1..=want.len() - off {
                let mut got = vec![u64::MAX; n];
                let mut last_end = 0;
                DevSide::Spans(&spans)
                    .each(off, n, |addr, at, m| {
                        assert!(m > 0 && at == last_end, "in order, no gaps, no empty parts");
                        last_end = at + m;
                        for i in 0..m {
                            got[at + i] = addr + i as u64;
                        }
                        Ok(())
                    })
                    .unwrap();
                assert_eq!(got, want[off..off + n], "[{off}, {})", off + n);
            }
        }
        let mut calls = Vec::new();
        DevSide::One(7000)
            .each(16, 32, |addr, at, m| {
                calls.push((addr, at, m));
                Ok(())
            })
            .unwrap();
        assert_eq!(calls, [(7016, 0, 32)]);
    }

    #[test]
    fn plan_gives_each_lane_two_chunks_within_bounds() {
        let c = StagingConfig {
            threads: 8,
            fill_threads: 8,
            chunk_bytes: 4 << 20,
            direct_below: 0,
            lane_min: 0,
            short_below: 0,
        };
        assert_eq!(c.plan(1 << 30), (8, 4 << 20));
        let (lanes, chunk) = c.plan(16 << 20);
        assert_eq!((lanes, chunk), (8, 1 << 20));
        let (lanes, chunk) = c.plan(300 << 10);
        assert_eq!(chunk, MIN_CHUNK);
        assert_eq!(lanes, 3);
        for len in [1usize, 4095, 65536, 1 << 20, (1 << 30) + 17] {
            let (lanes, chunk) = c.plan(len);
            let covered: usize = (0..lanes)
                .flat_map(|l| i_chunks(lanes, chunk, len, l))
                .map(|(_, n)| n)
                .sum();
            assert_eq!(covered, len, "len {len}");
        }
    }

    #[test]
    fn small_copies_wake_fewer_lanes() {
        let c = StagingConfig {
            threads: 16,
            fill_threads: 16,
            chunk_bytes: 4 << 20,
            direct_below: 0,
            lane_min: 1 << 20,
            short_below: 0,
        };
        assert_eq!(c.plan(1 << 20).0, 1);
        assert_eq!(c.plan(4 << 20).0, 4);
        assert_eq!(c.plan(1 << 30).0, 16);
        let c = StagingConfig {
            lane_min: 256 << 10,
            ..c
        };
        assert_eq!(c.plan(1 << 20).0, 4);
        assert_eq!(c.plan(100), (1, MIN_CHUNK));
    }

    #[test]
    fn short_plans_tile_the_copy_in_pieces_of_at_least_the_smallest_piece() {
        let c = StagingConfig {
            threads: 4,
            fill_threads: 4,
            chunk_bytes: 1 << 20,
            direct_below: 0,
            lane_min: 8 << 20,
            short_below: MAX_SHORT,
        };
        let (up, down) = (Direction::ToDevice, Direction::ToHost);
        // To the device two pieces a lane where they stay >= 256 KiB, else one; to the
        // host DMA pieces of half the copy, 256 KiB to 1 MiB.
        assert_eq!(short_plan(c, up, 4 << 20), (512 << 10, 8, 4));
        assert_eq!(short_plan(c, down, 4 << 20), (1 << 20, 4, 4));
        assert_eq!(short_plan(c, up, 1 << 20), (256 << 10, 4, 4));
        assert_eq!(short_plan(c, down, 1 << 20), (512 << 10, 2, 4));
        assert_eq!(short_plan(c, up, 512 << 10), (256 << 10, 2, 2));
        assert_eq!(short_plan(c, down, 512 << 10), (256 << 10, 2, 2));
        assert_eq!(short_plan(c, down, 64 << 20), (1 << 20, 64, 4));
        assert_eq!(short_plan(c, up, 100), (4096, 1, 1));
        assert_eq!(short_plan(c, down, 100), (4096, 1, 1));
        // Lanes: one per 256 KiB up to 4, one per 2 MiB up to 8, whatever `threads` says.
        let wide = StagingConfig { threads: 64, ..c };
        for dir in [up, down] {
            assert_eq!(short_plan(wide, dir, 512 << 10).2, 2);
            assert_eq!(short_plan(wide, dir, 1 << 20).2, 4);
            assert_eq!(short_plan(wide, dir, 8 << 20).2, 4);
            assert_eq!(short_plan(wide, dir, 12 << 20).2, 6);
            assert_eq!(short_plan(wide, dir, 32 << 20).2, MAX_SHORT_LANES);
            for len in [
                1usize,
                4095,
                300 << 10,
                (1 << 20) + 3,
                (7 << 20) + 11,
                MAX_SHORT - 1,
            ] {
                let (piece, pieces, lanes) = short_plan(c, dir, len);
                assert!(piece % 4096 == 0 && lanes <= 4, "len {len}");
                assert!(
                    piece * pieces >= len && piece * (pieces - 1) < len,
                    "len {len}"
                );
            }
        }
    }

    #[test]
    fn lanes_shares_of_a_piece_tile_it_in_cache_lines() {
        for (n, lanes) in [
            (1 << 20, 4),
            (512 << 10, 3),
            (100, 4),
            (4096 + 7, 8),
            (64, 8),
        ] {
            let mut seen = vec![0u8; n];
            for i in 0..lanes {
                let (start, len) = share(n, lanes, i);
                assert!(start % 64 == 0 || len == 0, "{n} {lanes} {i}");
                seen[start..start + len].iter_mut().for_each(|b| *b += 1);
            }
            assert!(seen.iter().all(|&b| b == 1), "{n} {lanes}");
        }
    }

    #[test]
    fn chunks_tile_the_range_without_overlap() {
        let (lanes, chunk, len) = (3, 10, 95);
        let mut seen = vec![0u8; len];
        for l in 0..lanes {
            for (off, n) in i_chunks(lanes, chunk, len, l) {
                assert_eq!(off / chunk % lanes, l);
                seen[off..off + n].iter_mut().for_each(|b| *b += 1);
            }
        }
        assert!(seen.iter().all(|&b| b == 1));
    }

    #[test]
    fn fills_run_on_their_own_lanes() {
        let cores = std::thread::available_parallelism()
            .map_or(8, |n| n.get())
            .clamp(1, 16);
        let up = StagingConfig::default_for(Direction::ToDevice);
        assert_eq!((up.threads, up.fill_threads), (cores.min(8), cores));
        let fill = StagingConfig {
            fill_threads: 12,
            ..up
        }
        .for_fill();
        assert_eq!(fill.threads, 12);
        assert_eq!(fill.plan(1 << 30), (12, up.chunk_bytes));
        assert_eq!(
            StagingConfig {
                fill_threads: 12,
                ..up
            }
            .plan(1 << 30)
            .0,
            up.threads,
            "a copy of memory keeps its own lanes"
        );
    }

    #[test]
    fn bad_settings_are_refused_and_change_nothing() {
        let before = config(Direction::ToHost).unwrap();
        for bad in [
            StagingConfig {
                threads: 0,
                ..before
            },
            StagingConfig {
                threads: MAX_THREADS + 1,
                ..before
            },
            StagingConfig {
                fill_threads: 0,
                ..before
            },
            StagingConfig {
                fill_threads: MAX_THREADS + 1,
                ..before
            },
            StagingConfig {
                chunk_bytes: 1024,
                ..before
            },
            StagingConfig {
                lane_min: (1 << 30) + 1,
                ..before
            },
        ] {
            let e = set_config(Direction::ToHost, bad).unwrap_err();
            assert!(
                matches!(e, CudaError::Setting(SettingError::Invalid { .. })),
                "{e}"
            );
        }
        assert_eq!(config(Direction::ToHost).unwrap(), before);
    }

    #[test]
    fn streamed_copies_are_exact_at_every_length_and_alignment() {
        let src: Vec<u8> = (0..70_000).map(|i| (i * 13 % 251) as u8).collect();
        for len in [0usize, 1, 15, 4095, 4096, 4097, 4096 + 63, 65_536 + 7] {
            for (so, dof) in [(0, 0), (3, 0), (0, 5), (7, 9)] {
                let mut dst = vec![0u8; len + dof + 8];
                // SAFETY: both ranges lie in their vectors and do not overlap.
                unsafe { copy_to_pinned(dst.as_mut_ptr().add(dof), src.as_ptr().add(so), len) };
                assert!(
                    dst[dof..dof + len] == src[so..so + len],
                    "len {len} at {so}/{dof}"
                );
                assert!(dst[..dof].iter().chain(&dst[dof + len..]).all(|&b| b == 0));
            }
        }
    }
}
