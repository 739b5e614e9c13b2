//! The short path (see [`super::StagingConfig::short_below`]): one thread talks to the
//! driver, the lanes only copy host memory.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::device::Device;
use crate::driver;
use crate::error::{CudaError, Result};
use crate::event::Event;
use crate::stream::StreamRef;

use super::job::{DevSide, HostSide, Slot, Transfer, copy_to_pinned};
use super::settings::{Direction, StagingConfig};
use crate::copy::threads::panicked;
use crate::copy::threads::{parallel, spin_then_yield_until};

/// The short path's pinned buffers and the events of its pieces.
pub(super) struct Short {
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

/// A short copy to the host moves in DMA pieces of half the copy, at least this and at
/// most [`MAX_PIECE_TO_HOST`]; every lane copies its share of each piece out of pinned
/// memory as soon as the piece has landed. Each DMA call costs the caller 3-4 us (1 MiB
/// in 8 pieces took 45 us against 28 in one, H200, `benches/staging_cost.rs`), and a
/// piece read back by one thread runs at DRAM speed (1 MiB by hand, DMA then one memcpy:
/// 102 us), so pieces are few and their host copies shared.
const MIN_PIECE_TO_HOST: usize = 256 << 10;

/// Largest DMA piece of a short copy to the host: the last piece's host copy follows its
/// DMA, so the tail stays short.
const MAX_PIECE_TO_HOST: usize = 1 << 20;

/// Lanes of a short copy below 16 MiB: 4 led or tied at 1, 2 and 4 MiB both ways (H200
/// sweep, 2026-11-24), and copies of 2-4 MiB on 8 lanes sometimes took 500 us (a lane
/// descheduled while the others wait).
const SMALL_SHORT_LANES: usize = 4;

/// Most lanes of a short copy: one per 2 MiB from 16 MiB (8 lanes led at 16 MiB: 29.8 /
/// 34.0 GB/s against 27.5 / 26.0 with 4).
pub(super) const MAX_SHORT_LANES: usize = 8;

/// Pieces of a short copy of `len` bytes going `dir`: a lane per [`MIN_PIECE`] up to
/// [`SMALL_SHORT_LANES`], or one per 2 MiB up to [`MAX_SHORT_LANES`] (`lane_min` is the
/// lane path's). To the device, two pieces per lane where each is at least [`MIN_PIECE`]
/// (the DMA of the first pieces overlaps the copy of the last), otherwise fewer, each
/// copied by one lane; to the host, DMA pieces of half the copy within
/// [`MIN_PIECE_TO_HOST`] and [`MAX_PIECE_TO_HOST`], each copied out by every lane.
/// Returns (piece bytes, pieces, lanes).
pub(super) fn short_plan(cfg: StagingConfig, dir: Direction, len: usize) -> (usize, usize, usize) {
    let want = (len / MIN_PIECE).min(SMALL_SHORT_LANES).max(len >> 21);
    let lanes = cfg.threads.min(MAX_SHORT_LANES).min(want).max(1);
    let piece = match dir {
        Direction::ToDevice => len
            .div_ceil(2 * lanes)
            .max(MIN_PIECE.min(len.div_ceil(lanes))),
        Direction::ToHost => len
            .div_ceil(2)
            .clamp(MIN_PIECE_TO_HOST.min(len), MAX_PIECE_TO_HOST),
    }
    .next_multiple_of(4096);
    (piece, len.div_ceil(piece).max(1), lanes)
}

/// Lane `i`'s share of `n` bytes split `lanes` ways: (start, length), whole cache lines
/// but the last (shares past the end are empty).
pub(super) fn share(n: usize, lanes: usize, i: usize) -> (usize, usize) {
    let each = n.div_ceil(lanes).next_multiple_of(64);
    let start = (each * i).min(n);
    (start, each.min(n - start))
}

/// The short path (see [`StagingConfig::short_below`]): piece `k` belongs to lane
/// `k % lanes` (the same thread copies the same part of a buffer from call to call, so
/// repeated copies find it in that core's cache), each piece claimed once; whoever waits
/// for an unclaimed piece copies it (so a lane that never starts costs time, not a
/// deadlock). Only the calling thread talks to the driver.
pub(super) fn run_short(
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
    let flags = |n: usize| (0..n).map(|_| AtomicBool::new(false)).collect();
    // To the host every lane copies its share of every piece: a unit per (piece, lane).
    let units = match dir {
        Direction::ToDevice => pieces,
        Direction::ToHost => pieces * lanes,
    };
    let work = ShortJob {
        buf: sh.bufs[b].buf.as_mut_ptr() as usize,
        piece,
        pieces,
        lanes,
        units,
        len,
        dir,
        host: t.host,
        claimed: flags(units),
        ready: flags(pieces),
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
    /// Host copies: one per piece to the device, one per (piece, lane) to the host.
    units: usize,
    len: usize,
    dir: Direction,
    host: HostSide<'a>,
    /// The unit's host copy has an owner.
    claimed: Vec<AtomicBool>,
    /// To the device: the piece is in the buffer. To the host: it has landed (the caller
    /// waited for its event and says so).
    ready: Vec<AtomicBool>,
    /// To the host: one event per piece, recorded after its DMA.
    landed: &'a [Event],
    /// Units copied on the host.
    copied: AtomicUsize,
    /// A lane or the caller failed: everyone stops waiting.
    failed: AtomicBool,
}

impl ShortJob<'_> {
    fn span(&self, k: usize) -> (usize, usize) {
        let off = k * self.piece;
        (off, self.piece.min(self.len - off))
    }

    /// Unit `u` of a copy to the host: lane `u % lanes`'s share of piece `u / lanes` (empty
    /// where the last piece is short).
    fn unit_span(&self, u: usize) -> (usize, usize) {
        let (off, n) = self.span(u / self.lanes);
        let (start, len) = share(n, self.lanes, u % self.lanes);
        (off + start, len)
    }

    fn claim(&self, k: usize) -> bool {
        !self.claimed[k].swap(true, Ordering::AcqRel)
    }

    /// Copies unit `u` (claimed by this thread, its piece landed) out of the pinned
    /// buffer into the caller's memory, and counts it.
    fn copy_out(&self, u: usize) -> Result<()> {
        let (off, n) = self.unit_span(u);
        let HostSide::Memory(host) = self.host else {
            return Err(CudaError::InvalidArgument {
                what: "staged copy",
                detail: "a download needs a host destination".into(),
            });
        };
        // SAFETY: the unit lies in the pinned buffer (at least `len` bytes) and in the
        // caller's destination (units tile [0, len)), which is borrowed exclusively for
        // the whole copy; its piece's DMA has landed and the unit is this thread's alone.
        // (Streamed stores into the caller's memory lost here and on the lane path: 4 MiB
        // 14.5-16.0 against 16.3-19.0 GB/s, 1 GiB 27.8-33.1 against 38.9-41.9; H100,
        // 2026-11-24.)
        unsafe {
            std::ptr::copy_nonoverlapping((self.buf + off) as *const u8, (host + off) as *mut u8, n)
        };
        self.copied.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Copies piece `k` of an upload (claimed by this thread) from the user's memory into
    /// the pinned buffer, then marks it ready for its DMA.
    fn copy_in(&self, k: usize) -> Result<()> {
        debug_assert_eq!(self.dir, Direction::ToDevice, "downloads copy out by unit");
        let (off, n) = self.span(k);
        // SAFETY: the buffer holds at least `len` bytes; piece `k` is claimed by this
        // thread alone, and no DMA touches it now (its DMA is issued only after `ready`).
        let pinned = unsafe { std::slice::from_raw_parts_mut((self.buf + off) as *mut u8, n) };
        match self.host {
            HostSide::Fill(fill) => fill(off, pinned)?,
            // SAFETY: `host + off .. + n` lies in the caller's memory (pieces tile
            // [0, len)), borrowed for the whole copy.
            HostSide::Memory(host) => unsafe {
                copy_to_pinned(pinned.as_mut_ptr(), (host + off) as *const u8, n)
            },
        }
        self.ready[k].store(true, Ordering::Release);
        Ok(())
    }

    /// Lane `i` (not the caller): to the device its own pieces, in order; to the host its
    /// share of every piece, each once the caller says it landed.
    fn lane(&self, i: usize) -> Result<()> {
        if self.dir == Direction::ToHost {
            for k in 0..self.pieces {
                if !self.wait(|| self.ready[k].load(Ordering::Acquire)) {
                    return Ok(()); // the caller failed and says so
                }
                let u = k * self.lanes + i;
                if self.claim(u) {
                    self.copy_out(u)?;
                }
            }
            return Ok(());
        }
        for k in (i..self.pieces).step_by(self.lanes) {
            if self.claim(k) {
                self.copy_in(k)?;
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
    fn issue_uploads(&self, dev: DevSide<'_>, stream: StreamRef) -> Result<()> {
        let mut mine = (0..self.pieces).step_by(self.lanes).peekable();
        for k in 0..self.pieces {
            while mine.next_if(|&m| m <= k).is_some() {}
            while !self.ready[k].load(Ordering::Acquire) {
                if self.claim(k) {
                    self.copy_in(k)?;
                } else if let Some(m) = mine.next() {
                    if self.claim(m) {
                        self.copy_in(m)?;
                    }
                } else if !self.wait(|| self.ready[k].load(Ordering::Acquire)) {
                    return Ok(()); // a lane failed: its error is the copy's
                }
            }
            let (off, n) = self.span(k);
            dev.each(off, n, |addr, at, m| {
                // SAFETY: piece `k` of the pinned buffer is written and stays unwritten
                // until the buffer's `done` event (recorded after this DMA) completes;
                // `at + m <= n`; the device ranges were checked by the caller.
                unsafe {
                    driver::memcpy_htod_async(
                        addr,
                        (self.buf + off + at) as *const u8,
                        m,
                        stream.cu(),
                    )
                }
            })?;
        }
        Ok(())
    }

    /// The caller, to the host: issues every piece's DMA on `stream` with an event after
    /// each, then waits for the pieces in order, telling the lanes as each lands, and
    /// copies its own share of each; last, any share no lane has claimed.
    fn drain_downloads(&self, dev: DevSide<'_>, stream: StreamRef) -> Result<()> {
        for (k, event) in self.landed.iter().enumerate().take(self.pieces) {
            let (off, n) = self.span(k);
            dev.each(off, n, |addr, at, m| {
                // SAFETY: the host reads piece `k` only after `landed[k]` completes;
                // `at + m <= n`; the device ranges were checked by the caller.
                unsafe {
                    driver::memcpy_dtoh_async(
                        (self.buf + off + at) as *mut u8,
                        addr,
                        m,
                        stream.cu(),
                    )
                }
            })?;
            event.record(stream)?;
        }
        // One thread waits on the driver; the lanes watch a flag.
        for k in 0..self.pieces {
            self.landed[k].synchronize()?;
            self.ready[k].store(true, Ordering::Release);
            let u = k * self.lanes;
            if self.claim(u) {
                self.copy_out(u)?;
            }
        }
        // Shares of lanes that have not started yet.
        for u in 0..self.units {
            if self.claim(u) {
                self.copy_out(u)?;
            }
        }
        // Until every lane is done (a lane that failed returns its error).
        self.wait(|| self.copied.load(Ordering::Acquire) == self.units);
        Ok(())
    }
}
