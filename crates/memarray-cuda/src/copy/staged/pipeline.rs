//! The staged pipeline: lanes, each a stream and two pinned slots, copying chunks while
//! the DMA engine drains (or fills) the slots filled (or drained) before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::device::Device;
use crate::driver;
use crate::error::{CudaError, Result};
use crate::event::Event;
use crate::stream::Stream;

use super::job::{DevSide, HostSide, Slot, Transfer};
use super::settings::{Direction, StagingConfig};
use super::short::{Short, run_short};
use crate::copy::threads::parallel;

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

fn make_lane(device: &Arc<Device>, chunk: usize) -> Result<Lane> {
    Ok(Lane {
        stream: Stream::new(device)?,
        slots: [Slot::new(device, chunk)?, Slot::new(device, chunk)?],
    })
}

/// The chunks (offset, length) lane `lane` of `lanes` copies.
pub(super) fn i_chunks(
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
    dev: DevSide<'a>,
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
                    self.dev.each(off, n, |addr, at, m| {
                        // SAFETY: pinned source kept (and not written) until `done` has
                        // completed; `at + m <= n` bytes of the slot; the device ranges
                        // were checked by the caller.
                        unsafe {
                            driver::memcpy_htod_async(addr, slot.buf.as_ptr().add(at), m, s.cu())
                        }
                    })?;
                    slot.done.record(s)?;
                }
            }
            Direction::ToHost => {
                let HostSide::Memory(host) = self.host else {
                    return Err(CudaError::InvalidArgument {
                        what: "staged copy",
                        detail: "a download needs a host destination".into(),
                    });
                };
                let issue = |j: usize| -> Result<()> {
                    let (off, n) = chunks[j];
                    let slot = &lane.slots[j % 2];
                    self.dev.each(off, n, |addr, at, m| {
                        // SAFETY: the slot is not read by the host until `done` completes
                        // (waited below); `at + m <= n` bytes of it; the device ranges were
                        // checked by the caller. Earlier DMA reading the slot ran on this
                        // stream, so it comes first.
                        unsafe {
                            driver::memcpy_dtoh_async(
                                slot.buf.as_mut_ptr().add(at),
                                addr,
                                m,
                                s.cu(),
                            )
                        }
                    })?;
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

/// Runs a staged copy: the short path below `cfg.short_below`, lanes otherwise; a fill (a
/// file read) by `cfg.fill_threads` lanes, a copy of memory by `cfg.threads`.
pub(super) fn run(device: &Arc<Device>, cfg: StagingConfig, t: Transfer<'_>) -> Result<()> {
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
    // A fill (a file read) runs on its own lanes.
    let cfg = match host {
        HostSide::Fill(_) => cfg.for_fill(),
        HostSide::Memory(_) => cfg,
    };
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
