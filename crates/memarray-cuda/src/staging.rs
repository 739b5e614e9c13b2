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
//! - When [`upload`] returns the user's bytes have been read; when [`download`] returns
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

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

use memarray_core::HostBuffer;

use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::driver;
use crate::error::{CudaError, Result};
use crate::event::{Enqueued, Event};
use crate::stream::{Stream, StreamRef};

/// Smallest chunk a lane copies: below it the per-chunk driver calls dominate.
pub const MIN_CHUNK: usize = 64 << 10;
/// Most lanes.
pub const MAX_THREADS: usize = 64;

/// How staged copies run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingConfig {
    /// Lanes (host threads, the caller's included) of one copy.
    pub threads: usize,
    /// Largest chunk, and the size of each of a lane's two pinned slots.
    pub chunk_bytes: usize,
    /// Copies of fewer bytes go straight to the driver.
    pub direct_below: usize,
}

/// Which way a staged copy goes; each way has its own settings and its own lanes (an
/// upload and a download can run at once, one per copy engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Host to device.
    ToDevice,
    /// Device to host.
    ToHost,
}

impl StagingConfig {
    /// The measured default for `dir` (H100 host, 16 cores; two runs of
    /// `benches/staging_sweep.py --quick`, 2026-11-24, docs/benchmarks.md, "Pageable
    /// transfers, round three"). To the device: 8 lanes of 4 MiB slots (the best cell at
    /// 64 MiB, 256 MiB and 1 GiB in the second run: 35.1 / 44.1 / 48.7 GB/s against
    /// 8.1 / 7.2 / 7.7 for the driver's own pageable copy; 16 lanes led in the first run
    /// by less than the runs differ), direct below 2 MiB (at 1 MiB the two runs
    /// disagreed: staged 9.5 and 11.9 against the driver's 10.3, and a single-lane staged
    /// 1 MiB ran at 0.82x torch in `transfer.py`; at 4 MiB staging won both times). To
    /// the host: one lane per core up to 16, 1 MiB slots,
    /// direct below 1 MiB (16 lanes led from 16 MiB up; staged 11.7 against 9.2 at
    /// 1 MiB). Short copies use fewer lanes: at least 1 MiB a lane to the device,
    /// 256 KiB to the host.
    pub fn default_for(dir: Direction) -> Self {
        let lanes = std::thread::available_parallelism()
            .map_or(8, |n| n.get())
            .clamp(1, 16);
        match dir {
            Direction::ToDevice => StagingConfig {
                threads: lanes.min(8),
                chunk_bytes: 4 << 20,
                direct_below: 2 << 20,
            },
            Direction::ToHost => StagingConfig {
                threads: lanes,
                chunk_bytes: 1 << 20,
                direct_below: 1 << 20,
            },
        }
    }

    fn check(self) -> Result<Self> {
        let bad = |detail: String| CudaError::BadSetting {
            what: "staging configuration",
            detail,
        };
        if !(1..=MAX_THREADS).contains(&self.threads) {
            return Err(bad(format!(
                "threads = {} (accepted: 1 to {MAX_THREADS})",
                self.threads
            )));
        }
        if self.chunk_bytes < MIN_CHUNK || self.chunk_bytes > 1 << 30 {
            return Err(bad(format!(
                "chunk_bytes = {} (accepted: {MIN_CHUNK} to {})",
                self.chunk_bytes,
                1 << 30
            )));
        }
        Ok(self)
    }

    /// Lanes and chunk size for a copy of `len` bytes: at least `lane_min` bytes per lane
    /// (waking a lane costs more than it copies below that) and at least two chunks per
    /// lane where the size allows, so that copying and DMA overlap within each lane.
    fn plan(self, len: usize, lane_min: usize) -> (usize, usize) {
        let threads = self.threads.min(len / lane_min.max(1)).max(1);
        let per_lane = len.div_ceil(threads * 2);
        let chunk = per_lane.clamp(MIN_CHUNK, self.chunk_bytes);
        let chunks = len.div_ceil(chunk);
        (threads.min(chunks.div_ceil(2)).max(1), chunk)
    }
}

/// The fewest bytes a lane is given (`benches/staging_sweep.py`, 2026-11-24, H100 host):
/// to the device the best cells had 2 lanes at 1 MiB and 4 at 4 MiB (1 MiB a lane); to
/// the host 4 lanes at 1 MiB and 8-16 at 4 MiB (256-512 KiB a lane).
fn lane_min(dir: Direction) -> usize {
    match dir {
        Direction::ToDevice => 1 << 20,
        Direction::ToHost => 256 << 10,
    }
}

type Configs = Result<[StagingConfig; 2]>;

fn config_slot() -> &'static Mutex<Configs> {
    static SLOT: OnceLock<Mutex<Configs>> = OnceLock::new();
    SLOT.get_or_init(|| Mutex::new(from_env()))
}

fn index(dir: Direction) -> usize {
    match dir {
        Direction::ToDevice => 0,
        Direction::ToHost => 1,
    }
}

/// The defaults, with `MEMARRAY_STAGING_THREADS` / `MEMARRAY_STAGING_CHUNK` (bytes)
/// applied to both directions.
fn from_env() -> Configs {
    let mut both = [
        StagingConfig::default_for(Direction::ToDevice),
        StagingConfig::default_for(Direction::ToHost),
    ];
    for c in &mut both {
        for (var, field) in [
            ("MEMARRAY_STAGING_THREADS", &mut c.threads),
            ("MEMARRAY_STAGING_CHUNK", &mut c.chunk_bytes),
        ] {
            if let Ok(value) = std::env::var(var) {
                *field = value.trim().parse().map_err(|_| CudaError::BadEnv {
                    var,
                    value: value.clone(),
                    expected: "a positive integer",
                })?;
            }
        }
        *c = c.check()?;
    }
    Ok(both)
}

/// The settings in force for `dir` (an unparsable environment variable is an error here,
/// and in every staged copy, until [`set_config`] replaces it).
pub fn config(dir: Direction) -> Result<StagingConfig> {
    config_slot()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .map(|c| c[index(dir)])
}

/// Replaces the settings for `dir`; out-of-range values are refused with
/// [`CudaError::BadSetting`] and change nothing.
pub fn set_config(dir: Direction, c: StagingConfig) -> Result<()> {
    let c = c.check()?;
    let mut slot = config_slot().lock().unwrap_or_else(PoisonError::into_inner);
    let mut both = slot.clone().unwrap_or([
        StagingConfig::default_for(Direction::ToDevice),
        StagingConfig::default_for(Direction::ToHost),
    ]);
    both[index(dir)] = c;
    *slot = Ok(both);
    Ok(())
}

/// Copies `src` to `dst[dst_offset..]` through the pinned slots, ordered after the work
/// queued on `stream`. Returns once `src` has been read, with the operation on `stream` to
/// record (work queued on `stream` afterwards sees the data; the DMA of the last chunks
/// may still run). Always `Some`; [`crate::sync::upload`] chooses between this and the
/// driver's direct copy.
pub fn upload(
    dst: &DeviceBuffer,
    dst_offset: usize,
    src: &[u8],
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    let d = dst.range(dst_offset, src.len())?;
    let device = dst.device();
    let cfg = config(Direction::ToDevice)?;
    let src_addr = src.as_ptr() as usize;
    run(
        device,
        cfg,
        src.len(),
        stream,
        Direction::ToDevice,
        HostSide::Memory(src_addr),
        d,
    )?;
    Ok(Some(Enqueued::new(stream, device.clone())))
}

/// Copies `len` bytes that `fill(offset, buf)` produces (a file read, say) to
/// `dst[dst_offset..]`, ordered after the work queued on `stream`: each lane fills its
/// pinned slot directly, so the bytes cross host memory once. Returns once every `fill`
/// has returned; the operation on `stream` to record, as [`upload`]'s. The first error of
/// `fill` ends the copy (the device range is then partly written).
pub fn upload_with(
    dst: &DeviceBuffer,
    dst_offset: usize,
    len: usize,
    fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
    stream: StreamRef,
) -> Result<Option<Enqueued>> {
    let d = dst.range(dst_offset, len)?;
    let device = dst.device();
    let cfg = config(Direction::ToDevice)?;
    run(
        device,
        cfg,
        len,
        stream,
        Direction::ToDevice,
        HostSide::Fill(fill),
        d,
    )?;
    Ok(Some(Enqueued::new(stream, device.clone())))
}

/// Copies `src[src_offset..src_offset + dst.len()]` into `dst` through the pinned slots,
/// after the work queued on `stream`. Returns once the bytes are in `dst`
/// ([`crate::sync::download`] chooses between this and the driver's direct copy).
pub fn download(
    dst: &mut [u8],
    src: &DeviceBuffer,
    src_offset: usize,
    stream: StreamRef,
) -> Result<()> {
    let s = src.range(src_offset, dst.len())?;
    let device = src.device();
    let cfg = config(Direction::ToHost)?;
    let dst_addr = dst.as_mut_ptr() as usize;
    run(
        device,
        cfg,
        dst.len(),
        stream,
        Direction::ToHost,
        HostSide::Memory(dst_addr),
        s,
    )
}

/// Host copies of at least this many bytes are split across threads ([`copy_host`]).
pub const PARALLEL_HOST_COPY: usize = 8 << 20;

/// Copies `src` into `dst` (equal lengths, checked), on several threads from
/// [`PARALLEL_HOST_COPY`] bytes up (one per 4 MiB, at most the host-to-device lane count
/// and half the cores): one thread's memcpy reaches 9-12 GB/s, host memory bandwidth
/// several times that.
pub fn copy_host(dst: &mut [u8], src: &[u8]) -> Result<()> {
    if dst.len() != src.len() {
        return Err(memarray_core::CoreError::CopyOutOfRange {
            offset: 0,
            len: src.len(),
            capacity: dst.len(),
        }
        .into());
    }
    let len = src.len();
    let lanes = if len < PARALLEL_HOST_COPY {
        1
    } else {
        // At most half the cores: a host copy must not starve the process's other threads
        // (on 2 cores it stays on the caller's thread).
        let half = std::thread::available_parallelism().map_or(1, |n| n.get() / 2);
        let max = config(Direction::ToDevice)
            .map_or(1, |c| c.threads)
            .min(half);
        (len >> 22).clamp(1, max.max(1))
    };
    if lanes == 1 {
        dst.copy_from_slice(src);
        return Ok(());
    }
    let per = len.div_ceil(lanes);
    let (d, s) = (dst.as_mut_ptr() as usize, src.as_ptr() as usize);
    parallel(lanes, &|i| {
        let start = (i * per).min(len);
        let n = per.min(len - start);
        // SAFETY: lane i copies [start, start + n) of two distinct slices of `len`
        // bytes, borrowed (dst exclusively) until `parallel` returns; lanes' ranges are
        // disjoint.
        unsafe {
            std::ptr::copy_nonoverlapping((s + start) as *const u8, (d + start) as *mut u8, n)
        };
        Ok(())
    })
}

/// A pinned slot and the event after the DMA that last used it.
struct Slot {
    buf: HostBuffer,
    done: Event,
}

struct Lane {
    stream: Stream,
    slots: [Slot; 2],
}

/// A device's lanes for one direction, made for one chunk size.
struct Stage {
    chunk: usize,
    lanes: Vec<Lane>,
    /// Recorded on the caller's stream; every lane waits on it first.
    start: Event,
}

/// A device's stage for one direction, made on first use.
type StageSlot = Arc<Mutex<Option<Stage>>>;

fn stage_of(device: &Arc<Device>, dir: Direction) -> StageSlot {
    static STAGES: OnceLock<Mutex<HashMap<(u32, Direction), StageSlot>>> = OnceLock::new();
    STAGES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry((device.id(), dir))
        .or_default()
        .clone()
}

fn make_lane(device: &Arc<Device>, chunk: usize) -> Result<Lane> {
    let pool = crate::resource::pinned_pool(device);
    let slot = || -> Result<Slot> {
        Ok(Slot {
            // SAFETY: a slot's bytes are only read after a copy into it has written them.
            buf: unsafe { HostBuffer::uninit_in(chunk, pool.clone())? },
            done: Event::new(device)?,
        })
    };
    Ok(Lane {
        stream: Stream::new(device)?,
        slots: [slot()?, slot()?],
    })
}

/// The host side of a staged copy.
#[derive(Clone, Copy)]
enum HostSide<'a> {
    /// Host memory at this address (the caller checked the range).
    Memory(usize),
    /// A function that fills `buf` with the source's bytes from `offset` (an upload from
    /// a file: each lane reads straight into its pinned slot).
    Fill(&'a (dyn Fn(usize, &mut [u8]) -> Result<()> + Sync)),
}

/// Runs a staged copy of `len` bytes between `host` and device address `dev` (both
/// checked by the caller) on `lanes` lanes.
fn run(
    device: &Arc<Device>,
    cfg: StagingConfig,
    len: usize,
    stream: StreamRef,
    dir: Direction,
    host: HostSide<'_>,
    dev: u64,
) -> Result<()> {
    let (lanes, chunk) = cfg.plan(len, lane_min(dir));
    let stage = stage_of(device, dir);
    let mut guard = stage.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(old) = guard.as_ref()
        && old.chunk != cfg.chunk_bytes
    {
        // The slot size changed: wait for the old slots' last DMA, then replace them.
        for lane in &old.lanes {
            lane.stream.synchronize()?;
        }
        *guard = None;
    }
    let st = match guard.take() {
        Some(st) => guard.insert(st),
        None => guard.insert(Stage {
            chunk: cfg.chunk_bytes,
            lanes: Vec::new(),
            start: Event::new(device)?,
        }),
    };
    while st.lanes.len() < lanes {
        st.lanes.push(make_lane(device, st.chunk)?);
    }
    let start = &st.start;
    start.record(stream)?;
    let job = LaneJob {
        lanes,
        chunk,
        len,
        host,
        dev,
        dir,
        start,
        stage: st,
    };
    parallel(lanes, &|i| job.run(i))?;
    if dir == Direction::ToDevice {
        // Later work on the caller's stream comes after every lane's last DMA (a wait
        // captures the event as recorded now; re-recording it later changes nothing).
        for (i, lane) in st.lanes[..lanes].iter().enumerate() {
            let n = i_chunks(lanes, chunk, len, i).count();
            if n > 0 {
                stream.wait_on(device, &lane.slots[(n - 1) % 2].done)?;
            }
        }
    }
    Ok(())
}

/// The chunks (offset, length) lane `lane` of `lanes` copies.
fn i_chunks(
    lanes: usize,
    chunk: usize,
    len: usize,
    lane: usize,
) -> impl Iterator<Item = (usize, usize)> {
    (lane * chunk..len)
        .step_by(lanes * chunk)
        .map(move |off| (off, chunk.min(len - off)))
}

struct LaneJob<'a> {
    lanes: usize,
    chunk: usize,
    len: usize,
    host: HostSide<'a>,
    dev: u64,
    dir: Direction,
    start: &'a Event,
    stage: &'a Stage,
}

impl LaneJob<'_> {
    fn run(&self, i: usize) -> Result<()> {
        let lane = &self.stage.lanes[i];
        let device = self.start.device();
        let _ctx = device.bind()?;
        let s = lane.stream.as_ref();
        s.wait(self.start)?;
        let chunks: Vec<(usize, usize)> = i_chunks(self.lanes, self.chunk, self.len, i).collect();
        match self.dir {
            Direction::ToDevice => {
                for (j, &(off, n)) in chunks.iter().enumerate() {
                    let slot = &lane.slots[j % 2];
                    slot.done.synchronize()?;
                    // SAFETY: the slot holds `chunk` >= n bytes and no DMA reads it any
                    // more (its event completed above); no other lane uses this slot.
                    let into = unsafe { std::slice::from_raw_parts_mut(slot.buf.as_mut_ptr(), n) };
                    match self.host {
                        // SAFETY: `host + off .. + n` lies in the caller's source (chunks
                        // cover [0, len)).
                        HostSide::Memory(host) => unsafe {
                            std::ptr::copy_nonoverlapping(
                                (host + off) as *const u8,
                                into.as_mut_ptr(),
                                n,
                            )
                        },
                        HostSide::Fill(fill) => fill(off, into)?,
                    }
                    // SAFETY: pinned source kept (and not written) until `done` has
                    // completed; the device range was checked by the caller.
                    unsafe {
                        driver::memcpy_htod_async(
                            self.dev + off as u64,
                            slot.buf.as_ptr(),
                            n,
                            s.cu(),
                        )?;
                    }
                    slot.done.record(s)?;
                }
            }
            Direction::ToHost => {
                let HostSide::Memory(host) = self.host else {
                    return Err(CudaError::BadSetting {
                        what: "staged copy",
                        detail: "a download needs a host destination".into(),
                    });
                };
                let issue = |j: usize| -> Result<()> {
                    let (off, n) = chunks[j];
                    let slot = &lane.slots[j % 2];
                    // SAFETY: the slot is not read by the host until `done` completes
                    // (waited below); the device range was checked by the caller. Earlier
                    // DMA reading the slot ran on this stream, so it comes first.
                    unsafe {
                        driver::memcpy_dtoh_async(
                            slot.buf.as_mut_ptr(),
                            self.dev + off as u64,
                            n,
                            s.cu(),
                        )?;
                    }
                    slot.done.record(s)
                };
                for j in 0..chunks.len().min(2) {
                    issue(j)?;
                }
                for (j, &(off, n)) in chunks.iter().enumerate() {
                    let slot = &lane.slots[j % 2];
                    slot.done.synchronize()?;
                    // SAFETY: the DMA into the slot completed; `host + off .. + n` lies in
                    // the caller's destination, borrowed exclusively for the call.
                    unsafe {
                        std::ptr::copy_nonoverlapping(slot.buf.as_ptr(), (host + off) as *mut u8, n)
                    };
                    if j + 2 < chunks.len() {
                        issue(j + 2)?;
                    }
                }
            }
        }
        Ok(())
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Persistent worker threads, one per lane beyond the caller's.
fn workers(n: usize) -> Vec<mpsc::Sender<Job>> {
    static POOL: OnceLock<Mutex<Vec<mpsc::Sender<Job>>>> = OnceLock::new();
    let mut pool = POOL
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    while pool.len() < n {
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name(format!("memarray-staging-{}", pool.len() + 1))
            .spawn(move || {
                for job in rx {
                    job();
                }
            });
        if spawned.is_err() {
            break; // fewer workers: the caller's thread takes the rest
        }
        pool.push(tx);
    }
    pool[..n.min(pool.len())].to_vec()
}

/// Runs `f(0)` .. `f(n - 1)`, `f(0)` on this thread and the others on workers, and
/// returns once all have finished: the first error, or a panic turned into one.
pub(crate) fn parallel(n: usize, f: &(dyn Fn(usize) -> Result<()> + Sync)) -> Result<()> {
    let senders = workers(n.saturating_sub(1));
    let latch = Arc::new((Mutex::new((0usize, None::<CudaError>)), Condvar::new()));
    // SAFETY: `f` is only used by jobs that finish before this function returns (the
    // latch below waits for every job sent), so extending its lifetime is sound.
    let f_static: &'static (dyn Fn(usize) -> Result<()> + Sync) = unsafe { std::mem::transmute(f) };
    let mut sent = 0;
    let mut inline = vec![0usize];
    for i in 1..n {
        let latch = latch.clone();
        let job: Job = Box::new(move || {
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| f_static(i)))
                .unwrap_or_else(|_| Err(panicked()));
            let (m, cv) = &*latch;
            let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
            g.0 += 1;
            if let Err(e) = r {
                g.1.get_or_insert(e);
            }
            cv.notify_all();
        });
        match senders.get(i - 1).map(|tx| tx.send(job)) {
            Some(Ok(())) => sent += 1,
            _ => inline.push(i),
        }
    }
    let mut first = None;
    for i in inline {
        let r =
            std::panic::catch_unwind(AssertUnwindSafe(|| f(i))).unwrap_or_else(|_| Err(panicked()));
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    }
    let (m, cv) = &*latch;
    let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
    while g.0 < sent {
        g = cv.wait(g).unwrap_or_else(PoisonError::into_inner);
    }
    match first.or(g.1.take()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn panicked() -> CudaError {
    CudaError::BadSetting {
        what: "staged copy",
        detail: "a staging lane panicked".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ArrayError;

    #[test]
    fn plan_gives_each_lane_two_chunks_within_bounds() {
        let c = StagingConfig {
            threads: 8,
            chunk_bytes: 4 << 20,
            direct_below: 0,
        };
        assert_eq!(c.plan(1 << 30, 0), (8, 4 << 20));
        let (lanes, chunk) = c.plan(16 << 20, 0);
        assert_eq!((lanes, chunk), (8, 1 << 20));
        let (lanes, chunk) = c.plan(300 << 10, 0);
        assert_eq!(chunk, MIN_CHUNK);
        assert_eq!(lanes, 3);
        for len in [1usize, 4095, 65536, 1 << 20, (1 << 30) + 17] {
            let (lanes, chunk) = c.plan(len, 0);
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
            chunk_bytes: 4 << 20,
            direct_below: 0,
        };
        assert_eq!(c.plan(1 << 20, 1 << 20).0, 1);
        assert_eq!(c.plan(4 << 20, 1 << 20).0, 4);
        assert_eq!(c.plan(1 << 30, 1 << 20).0, 16);
        assert_eq!(c.plan(1 << 20, 256 << 10).0, 4);
        assert_eq!(c.plan(100, 256 << 10), (1, MIN_CHUNK));
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
                chunk_bytes: 1024,
                ..before
            },
        ] {
            let e = set_config(Direction::ToHost, bad).unwrap_err();
            assert!(matches!(e, CudaError::BadSetting { .. }), "{e}");
        }
        assert_eq!(config(Direction::ToHost).unwrap(), before);
    }

    #[test]
    fn host_copies_of_every_size_are_exact() {
        for len in [
            0usize,
            1,
            4095,
            PARALLEL_HOST_COPY - 1,
            PARALLEL_HOST_COPY + 12_345,
            37 << 20,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let mut dst = vec![0u8; len];
            copy_host(&mut dst, &src).unwrap();
            assert!(dst == src, "len {len}");
        }
        let mut short = vec![0u8; 3];
        assert!(copy_host(&mut short, &[1, 2, 3, 4]).is_err());
    }

    #[test]
    fn parallel_runs_every_index_once_and_reports_errors_and_panics() {
        let hits: Vec<std::sync::atomic::AtomicUsize> =
            (0..6).map(|_| Default::default()).collect();
        parallel(6, &|i| {
            hits[i].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        assert!(
            hits.iter()
                .all(|h| h.load(std::sync::atomic::Ordering::SeqCst) == 1)
        );
        let e = parallel(4, &|i| {
            if i == 2 {
                Err(ArrayError::NoDeviceCopy.into())
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert!(matches!(e, CudaError::Array(ArrayError::NoDeviceCopy)));
        let e = parallel(3, &|i| if i == 1 { panic!("lane") } else { Ok(()) }).unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
    }
}
