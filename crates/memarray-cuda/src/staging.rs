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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// Fewest bytes a lane is given: a short copy wakes `len / lane_min` lanes at most
    /// (below some size, handing a lane its chunks costs more than it saves).
    pub lane_min: usize,
    /// Copies of fewer bytes (and at least `direct_below`) take the short path: the lanes
    /// only copy host memory, in pieces, into one pinned buffer, and the calling thread
    /// issues every DMA on the caller's stream as the pieces are ready. No lane stream,
    /// no event per chunk: at 1-4 MiB the driver calls of the lane pipeline cost as much
    /// as the copy. At most [`MAX_SHORT`].
    pub short_below: usize,
}

/// Largest `short_below`. A device keeps, per direction, pinned buffers of the largest
/// short copy so far rounded up to a power of two: two to the device, one to the host.
pub const MAX_SHORT: usize = 1 << 30;

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
    /// The measured default for `dir` (H100 hosts, 16 cores, 2026-11-24; docs/benchmarks.md,
    /// "Pageable transfers, round four"). Staged from 64 KiB to the device and 256 KiB to
    /// the host (`benches/staging_small.py`: `asarray` of 64 KiB 13.6-16.4 us a call
    /// against 18.7-21.4 direct, `to_numpy(out=)` of 256 KiB 35.0-39.6 against 45.1-45.8;
    /// at 4 KiB the driver's copy was cheaper both ways, and to the host at 64 KiB); at
    /// 1 MiB the short path ran at 16.6 GB/s to the device and 13.0 to the host against
    /// the driver's 9.9 and 7.1 (`benches/staging_sweep.py --quick`). To the device: the short path below
    /// 32 MiB (streamed stores: 26.9 GB/s at 4 MiB against 15.5 before,
    /// `examples/staging_cost.rs`; at 16 MiB 31.3-33.2 against 23.6-25.0 with lanes, at
    /// 64 MiB lanes led, 33.3-35.6 against 31.4-31.8), then 8 lanes of at least 1 MiB in
    /// 4 MiB slots (8 and 16 lanes within 7% of each other at 64 MiB and 1 GiB). To the
    /// host: the short path below 128 MiB (at 64 MiB 35.6-37.3 against 30.0-30.7 with
    /// lanes, at 256 MiB lanes led, 30.0-40.1 against 24.1-25.2), then one lane per core
    /// up to 16, at least 256 KiB each, in 1 MiB slots.
    pub fn default_for(dir: Direction) -> Self {
        let lanes = std::thread::available_parallelism()
            .map_or(8, |n| n.get())
            .clamp(1, 16);
        match dir {
            Direction::ToDevice => StagingConfig {
                threads: lanes.min(8),
                chunk_bytes: 4 << 20,
                direct_below: 64 << 10,
                lane_min: 1 << 20,
                short_below: 32 << 20,
            },
            Direction::ToHost => StagingConfig {
                threads: lanes,
                chunk_bytes: 1 << 20,
                direct_below: 256 << 10,
                lane_min: 256 << 10,
                short_below: 128 << 20,
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
        if self.lane_min > 1 << 30 {
            return Err(bad(format!(
                "lane_min = {} (accepted: 0 to {})",
                self.lane_min,
                1 << 30
            )));
        }
        if self.short_below > MAX_SHORT {
            return Err(bad(format!(
                "short_below = {} (accepted: 0 to {MAX_SHORT})",
                self.short_below
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
    /// and at least two chunks per
    /// lane where the size allows, so that copying and DMA overlap within each lane.
    fn plan(self, len: usize) -> (usize, usize) {
        let threads = self.threads.min(len / self.lane_min.max(1)).max(1);
        let per_lane = len.div_ceil(threads * 2);
        let chunk = per_lane.clamp(MIN_CHUNK, self.chunk_bytes);
        let chunks = len.div_ceil(chunk);
        (threads.min(chunks.div_ceil(2)).max(1), chunk)
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
    let t = Transfer {
        len: src.len(),
        stream,
        dir: Direction::ToDevice,
        host: HostSide::Memory(src_addr),
        dev: d,
    };
    run(device, cfg, t)?;
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
    let t = Transfer {
        len,
        stream,
        dir: Direction::ToDevice,
        host: HostSide::Fill(fill),
        dev: d,
    };
    run(device, cfg, t)?;
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
    let t = Transfer {
        len: dst.len(),
        stream,
        dir: Direction::ToHost,
        host: HostSide::Memory(dst_addr),
        dev: s,
    };
    run(device, cfg, t)
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

/// A device's stages for one direction, made on first use: one staged copy at a time.
#[derive(Default)]
struct Stages {
    lanes: Option<Stage>,
    short: Option<Short>,
}

type StageSlot = Arc<Mutex<Stages>>;

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

impl Slot {
    /// A slot of `bytes` pinned bytes from the device's pinned pool.
    fn new(device: &Arc<Device>, bytes: usize) -> Result<Slot> {
        Ok(Slot {
            // SAFETY: a slot's bytes are only read after a copy into them has written
            // them.
            buf: unsafe { HostBuffer::uninit_in(bytes, crate::resource::pinned_pool(device))? },
            done: Event::new(device)?,
        })
    }
}

fn make_lane(device: &Arc<Device>, chunk: usize) -> Result<Lane> {
    Ok(Lane {
        stream: Stream::new(device)?,
        slots: [Slot::new(device, chunk)?, Slot::new(device, chunk)?],
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

/// One staged copy: `len` bytes between `host` and device address `dev` (both checked by
/// the caller), ordered on `stream`.
#[derive(Clone, Copy)]
struct Transfer<'a> {
    len: usize,
    stream: StreamRef,
    dir: Direction,
    host: HostSide<'a>,
    dev: u64,
}

/// Runs a staged copy: the short path below `cfg.short_below`, lanes otherwise.
fn run(device: &Arc<Device>, cfg: StagingConfig, t: Transfer<'_>) -> Result<()> {
    let Transfer {
        len,
        stream,
        dir,
        host,
        dev,
    } = t;
    if len == 0 {
        return Ok(());
    }
    let stage = stage_of(device, dir);
    let mut stages = stage.lock().unwrap_or_else(PoisonError::into_inner);
    if len < cfg.short_below {
        return run_short(&mut stages.short, device, cfg, t);
    }
    let (lanes, chunk) = cfg.plan(len);
    let guard = &mut stages.lanes;
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

/// The short path's pinned buffers and the events of its pieces.
struct Short {
    /// All of one size (the largest short copy so far, rounded up). Two to the device (one copy's memcpy overlaps the previous copy's DMA), one to
    /// the host (a download has drained its buffer before it returns).
    bufs: Vec<Slot>,
    next: usize,
    /// One per piece of a copy to the host, recorded after the piece's DMA.
    landed: Vec<Event>,
}

/// Smallest piece of a short copy to the device (and the unit of its lane count): each
/// DMA call costs about 2 us of the caller's time (`examples/staging_cost.rs`), as long as
/// a 128 KiB copy at 55 GB/s.
const MIN_PIECE: usize = 256 << 10;

/// Smallest piece of a short copy to the host: the caller issues every DMA at once, and
/// the last piece's copy out of pinned memory follows the last DMA, so smaller pieces
/// shorten that tail. 1 MiB to NumPy 10.4-13.4 -> 12.1-13.7 GB/s, 2 MiB 12.1-15.5 ->
/// 14.1-16.4 (H100, four alternating runs of each, 2026-11-24).
const MIN_PIECE_TO_HOST: usize = 128 << 10;

/// Lanes of a short copy below 16 MiB: 4 led or tied at 1, 2 and 4 MiB both ways (H200
/// sweep, 2026-11-24), and copies of 2-4 MiB on 8 lanes sometimes took 500 us (a lane
/// descheduled while the others wait).
const SMALL_SHORT_LANES: usize = 4;

/// Most lanes of a short copy: one per 2 MiB from 16 MiB (8 lanes led at 16 MiB: 29.8 /
/// 34.0 GB/s against 27.5 / 26.0 with 4).
const MAX_SHORT_LANES: usize = 8;

/// Pieces of a short copy of `len` bytes going `dir`: a lane per [`MIN_PIECE`] up to
/// [`SMALL_SHORT_LANES`], or one per 2 MiB up to [`MAX_SHORT_LANES`] (`lane_min` is the
/// lane path's); two pieces per lane where each is at least the direction's smallest
/// piece ([`MIN_PIECE`], [`MIN_PIECE_TO_HOST`]; the DMA of the first pieces overlaps the
/// copy of the last), otherwise fewer. Returns (piece bytes, pieces, lanes).
fn short_plan(cfg: StagingConfig, dir: Direction, len: usize) -> (usize, usize, usize) {
    let want = (len / MIN_PIECE).min(SMALL_SHORT_LANES).max(len >> 21);
    let lanes = cfg.threads.min(MAX_SHORT_LANES).min(want).max(1);
    let min_piece = match dir {
        Direction::ToDevice => MIN_PIECE,
        Direction::ToHost => MIN_PIECE_TO_HOST,
    };
    let piece = len
        .div_ceil(2 * lanes)
        .max(min_piece.min(len.div_ceil(lanes)))
        .next_multiple_of(4096);
    (piece, len.div_ceil(piece).max(1), lanes)
}

/// The short path (see [`StagingConfig::short_below`]): piece `k` belongs to lane
/// `k % lanes` (the same thread copies the same part of a buffer from call to call, so
/// repeated copies find it in that core's cache), each piece claimed once; whoever waits
/// for an unclaimed piece copies it (so a lane that never starts costs time, not a
/// deadlock). Only the calling thread talks to the driver.
fn run_short(
    slot: &mut Option<Short>,
    device: &Arc<Device>,
    cfg: StagingConfig,
    t: Transfer<'_>,
) -> Result<()> {
    let (len, stream, dir, dev) = (t.len, t.stream, t.dir, t.dev);
    if slot.as_ref().is_some_and(|s| s.bufs[0].buf.len() < len) {
        let old = slot.take().expect("checked");
        for b in &old.bufs {
            b.done.synchronize()?;
        }
    }
    let sh = match slot.take() {
        Some(sh) => slot.insert(sh),
        None => {
            // Sized by the copies seen (the next power of two), not by `short_below`: a
            // process that moves 1 MiB holds 2 MiB of pinned memory here, not 128.
            let cap = len.next_power_of_two().max(1 << 20);
            let n = if dir == Direction::ToDevice { 2 } else { 1 };
            let bufs = (0..n)
                .map(|_| Slot::new(device, cap))
                .collect::<Result<_>>()?;
            slot.insert(Short {
                bufs,
                next: 0,
                landed: Vec::new(),
            })
        }
    };
    let (piece, pieces, lanes) = short_plan(cfg, dir, len);
    let b = sh.next;
    sh.next = (b + 1) % sh.bufs.len();
    let _ctx = device.bind()?;
    // The buffer's last DMA (one or two copies ago) is done before it is written again.
    sh.bufs[b].done.synchronize()?;
    while dir == Direction::ToHost && sh.landed.len() < pieces {
        sh.landed.push(Event::new(device)?);
    }
    let flags = || (0..pieces).map(|_| AtomicBool::new(false)).collect();
    let work = ShortJob {
        buf: sh.bufs[b].buf.as_mut_ptr() as usize,
        piece,
        pieces,
        lanes,
        len,
        dir,
        host: t.host,
        claimed: flags(),
        ready: flags(),
        landed: &sh.landed,
        copied: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
    };
    let copied = parallel(lanes, &|i| {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| match (i, dir) {
            (0, Direction::ToDevice) => work.issue_uploads(dev, stream),
            (0, Direction::ToHost) => work.drain_downloads(dev, stream),
            _ => work.lane(i),
        }))
        .unwrap_or_else(|_| Err(panicked()));
        if r.is_err() {
            // Nobody waits for pieces that will not come.
            work.failed.store(true, Ordering::Release);
        }
        r
    });
    // Whatever was issued, the buffer is reused only after it.
    sh.bufs[b].done.record(stream)?;
    copied
}

/// One short copy, shared by its lanes.
struct ShortJob<'a> {
    /// The pinned buffer.
    buf: usize,
    piece: usize,
    pieces: usize,
    lanes: usize,
    len: usize,
    dir: Direction,
    host: HostSide<'a>,
    /// The piece's host copy has an owner.
    claimed: Vec<AtomicBool>,
    /// To the device: the piece is in the buffer. To the host: its DMA and the event
    /// after it (`landed`) are queued.
    ready: Vec<AtomicBool>,
    /// To the host: one event per piece, recorded after its DMA.
    landed: &'a [Event],
    /// Pieces copied on the host.
    copied: AtomicUsize,
    /// A lane or the caller failed: everyone stops waiting.
    failed: AtomicBool,
}

impl ShortJob<'_> {
    fn span(&self, k: usize) -> (usize, usize) {
        let off = k * self.piece;
        (off, self.piece.min(self.len - off))
    }

    fn claim(&self, k: usize) -> bool {
        !self.claimed[k].swap(true, Ordering::AcqRel)
    }

    /// Copies piece `k` (claimed by this thread) between the user's memory and the pinned
    /// buffer, then marks it: ready to the device, or counted to the host.
    fn copy(&self, k: usize) -> Result<()> {
        let (off, n) = self.span(k);
        // SAFETY: the buffer holds at least `len` bytes; piece `k` is claimed by this
        // thread alone, and no DMA touches it now (to the device: its DMA is issued only
        // after `ready`; to the host: its DMA has landed).
        let pinned = unsafe { std::slice::from_raw_parts_mut((self.buf + off) as *mut u8, n) };
        match (self.dir, self.host) {
            (Direction::ToDevice, HostSide::Fill(fill)) => fill(off, pinned)?,
            // SAFETY: `host + off .. + n` lies in the caller's memory (pieces tile
            // [0, len)), borrowed for the whole copy.
            (Direction::ToDevice, HostSide::Memory(host)) => unsafe {
                copy_to_pinned(pinned.as_mut_ptr(), (host + off) as *const u8, n)
            },
            // SAFETY: as above; the caller's destination is borrowed exclusively.
            // (Streamed stores into the caller's memory lost here and on the lane path:
            // 4 MiB 14.5-16.0 against 16.3-19.0 GB/s, 1 GiB 27.8-33.1 against 38.9-41.9;
            // H100, 2026-11-24.)
            (Direction::ToHost, HostSide::Memory(host)) => unsafe {
                std::ptr::copy_nonoverlapping(pinned.as_ptr(), (host + off) as *mut u8, n)
            },
            (Direction::ToHost, HostSide::Fill(_)) => {
                return Err(CudaError::BadSetting {
                    what: "staged copy",
                    detail: "a download needs a host destination".into(),
                });
            }
        }
        match self.dir {
            Direction::ToDevice => self.ready[k].store(true, Ordering::Release),
            Direction::ToHost => {
                self.copied.fetch_add(1, Ordering::AcqRel);
            }
        }
        Ok(())
    }

    /// Lane `i` (not the caller): its own pieces, in order (to the host, once landed).
    fn lane(&self, i: usize) -> Result<()> {
        for k in (i..self.pieces).step_by(self.lanes) {
            if self.dir == Direction::ToHost {
                if !self.wait(|| self.ready[k].load(Ordering::Acquire)) {
                    return Ok(()); // the caller failed and says so
                }
                // Each lane waits for its own piece's DMA: nobody relays it.
                self.landed[k].synchronize()?;
            }
            if self.claim(k) {
                self.copy(k)?;
            }
        }
        Ok(())
    }

    /// Waits (spinning, then sleeping in short steps) until `ok()`; false if the copy
    /// failed meanwhile.
    fn wait(&self, ok: impl Fn() -> bool) -> bool {
        let failed = || self.failed.load(Ordering::Acquire);
        if spin_then_yield_until(|| ok() || failed()) && !failed() {
            return true;
        }
        while !ok() {
            if failed() {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        true
    }

    /// The caller, to the device: copies its own pieces and issues each piece's DMA on
    /// `stream` in order as soon as it is in the buffer; a piece nobody has claimed when
    /// its turn comes, it copies itself.
    fn issue_uploads(&self, dev: u64, stream: StreamRef) -> Result<()> {
        let mut mine = (0..self.pieces).step_by(self.lanes).peekable();
        for k in 0..self.pieces {
            while mine.next_if(|&m| m <= k).is_some() {}
            while !self.ready[k].load(Ordering::Acquire) {
                if self.claim(k) {
                    self.copy(k)?;
                } else if let Some(m) = mine.next() {
                    if self.claim(m) {
                        self.copy(m)?;
                    }
                } else if !self.wait(|| self.ready[k].load(Ordering::Acquire)) {
                    return Ok(()); // a lane failed: its error is the copy's
                }
            }
            let (off, n) = self.span(k);
            // SAFETY: piece `k` of the pinned buffer is written and stays unwritten until
            // the buffer's `done` event (recorded after this DMA) completes; the device
            // range was checked by the caller.
            unsafe {
                driver::memcpy_htod_async(
                    dev + off as u64,
                    (self.buf + off) as *const u8,
                    n,
                    stream.cu(),
                )?;
            }
        }
        Ok(())
    }

    /// The caller, to the host: issues every piece's DMA on `stream` with an event after
    /// each (a lane starts waiting for its piece as soon as it is queued), then copies
    /// its own pieces and any no lane has claimed.
    fn drain_downloads(&self, dev: u64, stream: StreamRef) -> Result<()> {
        for (k, event) in self.landed.iter().enumerate().take(self.pieces) {
            let (off, n) = self.span(k);
            // SAFETY: the host reads piece `k` only after `landed[k]` completes; the
            // device range was checked by the caller.
            unsafe {
                driver::memcpy_dtoh_async(
                    (self.buf + off) as *mut u8,
                    dev + off as u64,
                    n,
                    stream.cu(),
                )?;
            }
            event.record(stream)?;
            self.ready[k].store(true, Ordering::Release);
        }
        // Its own pieces, then those of lanes that have not started yet.
        let mine = (0..self.pieces).step_by(self.lanes);
        for k in mine.chain(0..self.pieces) {
            if !self.claimed[k].load(Ordering::Acquire) {
                self.landed[k].synchronize()?;
                if self.claim(k) {
                    self.copy(k)?;
                }
            }
        }
        // Until every lane is done (a lane that failed returns its error).
        self.wait(|| self.copied.load(Ordering::Acquire) == self.pieces);
        Ok(())
    }
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

/// How long a worker (and a caller waiting for its workers) spins before it sleeps. Waking
/// a sleeping thread costs 10-50 us (the core may be in a deep idle state), as long as a
/// staged copy of 1 MiB takes; copies that follow each other within this window find
/// their lanes awake.
pub const SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// How long a thread waiting inside a copy (for a piece, a DMA, its lanes) yields the
/// core between checks once [`SPIN`] has passed, before it sleeps: a lane descheduled
/// for a moment must not send every other waiter to sleep (on the device's virtual
/// machines a sleeping thread took hundreds of microseconds to wake, and copies of
/// 1-4 MiB fell from 60 us to 500 us).
const YIELD: std::time::Duration = std::time::Duration::from_millis(2);

/// Spins until `ready()` or [`SPIN`] has passed; whether `ready()` held.
fn spin_until(ready: impl Fn() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= SPIN {
            return ready();
        }
    }
}

/// [`spin_until`], then yields the core between checks until [`YIELD`] has passed;
/// whether `ready()` held.
fn spin_then_yield_until(ready: impl Fn() -> bool) -> bool {
    if spin_until(&ready) {
        return true;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < YIELD {
        if ready() {
            return true;
        }
        std::thread::yield_now();
    }
    ready()
}

/// A persistent worker: a one-job mailbox and the thread that empties it.
struct Worker {
    job: Mutex<Option<Job>>,
    pending: AtomicBool,
    thread: std::thread::Thread,
}

impl Worker {
    fn give(&self, job: Job) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
        self.pending.store(true, Ordering::Release);
        // Cheap unless the worker sleeps (then one futex wake).
        self.thread.unpark();
    }

    fn serve(&self) {
        loop {
            if !spin_until(|| self.pending.load(Ordering::Acquire)) {
                // A `give` between the check and `park` leaves the unpark token, so
                // `park` returns at once.
                std::thread::park();
                continue;
            }
            self.pending.store(false, Ordering::Relaxed);
            let job = self
                .job
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(job) = job {
                job();
            }
        }
    }
}

/// Most worker threads in the process (concurrent copies share them; a lane with no
/// worker left runs on the caller's thread).
const MAX_WORKERS: usize = 2 * MAX_THREADS;

/// The idle workers, and how many exist, in the fork generation that started them (a
/// forked child has none of its parent's threads: it starts its own).
struct Pool {
    idle: Vec<Arc<Worker>>,
    started: usize,
    generation: u64,
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        Mutex::new(Pool {
            idle: Vec::new(),
            started: 0,
            generation: memarray_core::fork::generation(),
        })
    })
}

/// Up to `n` idle workers, starting threads while fewer than [`MAX_WORKERS`] exist. Each
/// serves one caller at a time: concurrent copies (an upload and a download, two
/// devices) get disjoint workers, and a job that itself runs `parallel` cannot wait on
/// its own thread.
fn take_workers(n: usize) -> Vec<Arc<Worker>> {
    let mut p = pool().lock().unwrap_or_else(PoisonError::into_inner);
    let generation = memarray_core::fork::generation();
    if p.generation != generation {
        // The parent's workers do not exist here; their handles are dropped unused.
        p.idle.clear();
        p.started = 0;
        p.generation = generation;
    }
    let keep = p.idle.len().saturating_sub(n);
    let mut got = p.idle.split_off(keep);
    while got.len() < n && p.started < MAX_WORKERS {
        match start_worker(p.started + 1) {
            Some(w) => {
                p.started += 1;
                got.push(w);
            }
            None => break, // fewer workers: the caller's thread takes the rest
        }
    }
    got
}

fn give_back(workers: Vec<Arc<Worker>>) {
    let mut p = pool().lock().unwrap_or_else(PoisonError::into_inner);
    // Workers of a parent (a fork happened while they were lent) are not kept.
    if p.generation == memarray_core::fork::generation() {
        p.idle.extend(workers);
    }
}

fn start_worker(number: usize) -> Option<Arc<Worker>> {
    let (tx, rx) = mpsc::channel::<Arc<Worker>>();
    let handle = std::thread::Builder::new()
        .name(format!("memarray-staging-{number}"))
        .spawn(move || {
            if let Ok(w) = rx.recv() {
                w.serve();
            }
        })
        .ok()?;
    let w = Arc::new(Worker {
        job: Mutex::new(None),
        pending: AtomicBool::new(false),
        thread: handle.thread().clone(),
    });
    tx.send(w.clone()).ok()?;
    Some(w)
}

/// Counts finished jobs; the waiter spins for [`SPIN`], then sleeps on the condvar.
struct Latch {
    left: AtomicUsize,
    error: Mutex<Option<CudaError>>,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Latch {
    fn done(&self, r: Result<()>) {
        if let Err(e) = r {
            self.error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert(e);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Under the lock: a waiter between its check and its wait cannot miss this.
            let _g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.cv.notify_all();
        }
    }

    fn wait(&self) -> Option<CudaError> {
        if !spin_then_yield_until(|| self.left.load(Ordering::Acquire) == 0) {
            let mut g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            while self.left.load(Ordering::Acquire) > 0 {
                g = self.cv.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
        }
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Runs `f(0)` .. `f(n - 1)`, `f(0)` on this thread and the others on workers, and
/// returns once all have finished: the first error, or a panic turned into one.
pub(crate) fn parallel(n: usize, f: &(dyn Fn(usize) -> Result<()> + Sync)) -> Result<()> {
    let run = |i: usize| {
        std::panic::catch_unwind(AssertUnwindSafe(|| f(i))).unwrap_or_else(|_| Err(panicked()))
    };
    if n <= 1 {
        return (0..n).try_for_each(run);
    }
    let helpers = take_workers(n - 1);
    let latch = Arc::new(Latch {
        left: AtomicUsize::new(helpers.len()),
        error: Mutex::new(None),
        lock: Mutex::new(()),
        cv: Condvar::new(),
    });
    // SAFETY: `f` is only used by jobs that finish before this function returns (the
    // latch below waits for every job given), so extending its lifetime is sound.
    let f_static: &'static (dyn Fn(usize) -> Result<()> + Sync) = unsafe { std::mem::transmute(f) };
    for (k, w) in helpers.iter().enumerate() {
        let latch = latch.clone();
        let i = k + 1;
        w.give(Box::new(move || {
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| f_static(i)))
                .unwrap_or_else(|_| Err(panicked()));
            latch.done(r);
        }));
    }
    // Lane 0 and any lanes no worker could be started for run here.
    let mut first = None;
    for i in std::iter::once(0).chain(helpers.len() + 1..n) {
        if let Err(e) = run(i) {
            first.get_or_insert(e);
        }
    }
    let theirs = latch.wait();
    give_back(helpers);
    match first.or(theirs) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Copies `n` bytes into pinned memory that only the DMA engine reads next, with
/// non-temporal stores on x86-64: the destination lines are not read for ownership first
/// (a DMA read has just taken them out of the CPU's caches, so each would be fetched
/// from memory), so the copy moves two bytes of memory traffic per byte instead of three.
///
/// # Safety
/// 1. `src` is valid for reads and `dst` for writes of `n` bytes; they do not overlap.
unsafe fn copy_to_pinned(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if n >= 4096 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = dst.align_offset(16).min(n);
        // SAFETY: item 1; `head`, the 64-byte blocks and the tail tile [0, n) of both
        // ranges; stores through `d` are 16-byte aligned (the head aligned it).
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (mut d, mut s, mut left) = (dst.add(head), src.add(head), n - head);
            while left >= 64 {
                let v = [0, 16, 32, 48].map(|o| _mm_loadu_si128(s.add(o).cast::<__m128i>()));
                for (o, x) in [0, 16, 32, 48].into_iter().zip(v) {
                    _mm_stream_si128(d.add(o).cast::<__m128i>(), x);
                }
                (d, s, left) = (d.add(64), s.add(64), left - 64);
            }
            std::ptr::copy_nonoverlapping(s, d, left);
            // The streamed stores are visible before the DMA is issued.
            _mm_sfence();
        }
        return;
    }
    // SAFETY: item 1.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
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
            chunk_bytes: 1 << 20,
            direct_below: 0,
            lane_min: 8 << 20,
            short_below: MAX_SHORT,
        };
        let (up, down) = (Direction::ToDevice, Direction::ToHost);
        // Two pieces a lane where they stay >= 256 KiB (to the device) or 128 KiB (to
        // the host), else one.
        assert_eq!(short_plan(c, up, 4 << 20), (512 << 10, 8, 4));
        assert_eq!(short_plan(c, down, 4 << 20), (512 << 10, 8, 4));
        assert_eq!(short_plan(c, up, 1 << 20), (256 << 10, 4, 4));
        assert_eq!(short_plan(c, down, 1 << 20), (128 << 10, 8, 4));
        assert_eq!(short_plan(c, up, 512 << 10), (256 << 10, 2, 2));
        assert_eq!(short_plan(c, down, 512 << 10), (128 << 10, 4, 2));
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
            StagingConfig {
                lane_min: (1 << 30) + 1,
                ..before
            },
        ] {
            let e = set_config(Direction::ToHost, bad).unwrap_err();
            assert!(matches!(e, CudaError::BadSetting { .. }), "{e}");
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
    fn issue26_item1_a_forked_child_starts_its_own_workers() {
        use std::sync::atomic::AtomicUsize;
        // The parent has idle workers; a child inherits their handles, not their threads.
        parallel(4, &|_| Ok(())).unwrap();
        // SAFETY: the child runs Rust code of this crate, then _exit (no harness code).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: ends the child if the work below hangs (the old pool handed jobs to
            // threads that do not exist in a child).
            unsafe { libc::alarm(10) };
            let total = AtomicUsize::new(0);
            let ok = parallel(4, &|_| {
                total.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .is_ok();
            let code = if ok && total.load(Ordering::SeqCst) == 4 {
                0
            } else {
                1
            };
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(
            status, 0,
            "the child's parallel work hung or failed: status {status}"
        );
    }

    #[test]
    fn parallel_calls_nest_run_concurrently_and_wake_sleeping_workers() {
        use std::sync::atomic::AtomicUsize;
        let total = AtomicUsize::new(0);
        // Nested: a lane that itself runs `parallel` gets other workers, not itself.
        parallel(3, &|_| {
            parallel(3, &|_| {
                total.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        })
        .unwrap();
        assert_eq!(total.load(Ordering::SeqCst), 9);
        // Concurrent callers get disjoint workers; each index runs once per call.
        std::thread::scope(|sc| {
            for _ in 0..6 {
                sc.spawn(|| {
                    for _ in 0..50 {
                        parallel(4, &|_| {
                            total.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        })
                        .unwrap();
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::SeqCst), 9 + 6 * 50 * 4);
        // Workers past their spin sleep, and a job wakes them.
        std::thread::sleep(SPIN * 5);
        parallel(4, &|_| {
            total.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        assert_eq!(total.load(Ordering::SeqCst), 9 + 1200 + 4);
        assert!(pool().lock().unwrap().started <= MAX_WORKERS);
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
