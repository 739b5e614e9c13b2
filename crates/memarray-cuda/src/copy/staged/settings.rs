//! The staged copies' settings, per [`Direction`]: defaults from measurement, the
//! environment (`MEMARRAY_STAGING_THREADS`, `MEMARRAY_STAGING_CHUNK`), [`set_config`].

use std::sync::{Mutex, OnceLock, PoisonError};

use crate::error::{CudaError, Result, SettingError};

/// Smallest chunk a lane copies: below it the per-chunk driver calls dominate.
pub const MIN_CHUNK: usize = 64 << 10;
/// Most lanes.
pub const MAX_THREADS: usize = crate::copy::threads::MAX_LANES;

/// How staged copies run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingConfig {
    /// Lanes (host threads, the caller's included) of one copy.
    pub threads: usize,
    /// Lanes of a copy whose bytes a fill produces ([`super::to_device_with`]: a `.npy`
    /// or safetensors load). A read through the kernel copies out of the page cache at
    /// about half a memory copy's speed per thread, so a fill takes more lanes than a copy
    /// of memory.
    pub fill_threads: usize,
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
    /// The measured default for `dir` (H100 hosts, 16 cores, 2026-11-24 and 2026-11-26;
    /// docs/benchmarks.md, "Pageable transfers, round four" and "Throughput, round four").
    /// Staged from 64 KiB both ways (`benches/staging_small.py`: `asarray` of 64 KiB
    /// 13.6-16.4 us a call against 18.7-21.4 direct; `to_numpy(out=)` of 64 KiB 20.4 / 20.3
    /// against 21.2 / 21.8 direct since downloads move in few DMA pieces, of 256 KiB 40.7 /
    /// 41.1 against 50.5 / 51.8; at 4 KiB the driver's copy is cheaper both ways); at
    /// 1 MiB the short path ran at 16.6 GB/s to the device and 13.0 to the host against
    /// the driver's 9.9 and 7.1 (`benches/staging_sweep.py --quick`). To the device: the short path below
    /// 32 MiB (streamed stores: 26.9 GB/s at 4 MiB against 15.5 before,
    /// `examples/staging_cost.rs`; at 16 MiB 31.3-33.2 against 23.6-25.0 with lanes, at
    /// 64 MiB lanes led, 33.3-35.6 against 31.4-31.8), then 8 lanes of at least 1 MiB in
    /// 4 MiB slots (8 and 16 lanes within 7% of each other at 64 MiB and 1 GiB). To the
    /// host: the short path below 128 MiB (at 64 MiB 35.6-37.3 against 30.0-30.7 with
    /// lanes, at 256 MiB lanes led, 30.0-40.1 against 24.1-25.2), then one lane per core
    /// up to 16, at least 256 KiB each, in 1 MiB slots. Fills (file loads): one lane per
    /// core up to 16 (2 GiB of safetensors from the page cache onto an H200 with 16
    /// cores, `benches/load_phases.py`: 8 lanes 35.1 GB/s, 12 lanes 48.3, 16 lanes 50.0,
    /// the pinned copy 55.4; 8 and 16 MiB slots slower at every lane count).
    pub fn default_for(dir: Direction) -> Self {
        let lanes = std::thread::available_parallelism()
            .map_or(8, |n| n.get())
            .clamp(1, 16);
        match dir {
            Direction::ToDevice => StagingConfig {
                threads: lanes.min(8),
                fill_threads: lanes,
                chunk_bytes: 4 << 20,
                direct_below: 64 << 10,
                lane_min: 1 << 20,
                short_below: 32 << 20,
            },
            Direction::ToHost => StagingConfig {
                threads: lanes,
                fill_threads: lanes,
                chunk_bytes: 1 << 20,
                direct_below: 64 << 10,
                lane_min: 256 << 10,
                short_below: 128 << 20,
            },
        }
    }

    fn check(self) -> Result<Self> {
        let bad = |detail: String| {
            CudaError::from(SettingError::Invalid {
                what: "staging configuration",
                detail,
            })
        };
        for (name, n) in [
            ("threads", self.threads),
            ("fill_threads", self.fill_threads),
        ] {
            if !(1..=MAX_THREADS).contains(&n) {
                return Err(bad(format!("{name} = {n} (accepted: 1 to {MAX_THREADS})")));
            }
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

    /// The settings a fill's copy runs by: `fill_threads` lanes.
    pub(super) fn for_fill(self) -> Self {
        Self {
            threads: self.fill_threads,
            ..self
        }
    }

    /// Lanes and chunk size for a copy of `len` bytes: at least `lane_min` bytes per lane
    /// and at least two chunks per
    /// lane where the size allows, so that copying and DMA overlap within each lane.
    pub(super) fn plan(self, len: usize) -> (usize, usize) {
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

/// The defaults, with `MEMARRAY_STAGING_THREADS` (lanes of every copy, fills included) /
/// `MEMARRAY_STAGING_CHUNK` (bytes) applied to both directions.
fn from_env() -> Configs {
    let mut both = [
        StagingConfig::default_for(Direction::ToDevice),
        StagingConfig::default_for(Direction::ToHost),
    ];
    for c in &mut both {
        for (var, fields) in [
            (
                "MEMARRAY_STAGING_THREADS",
                [&mut c.threads, &mut c.fill_threads].as_mut_slice(),
            ),
            (
                "MEMARRAY_STAGING_CHUNK",
                [&mut c.chunk_bytes].as_mut_slice(),
            ),
        ] {
            if let Some(value) = crate::env::var(var)? {
                let n = value.trim().parse().map_err(|_| {
                    CudaError::from(SettingError::Env {
                        var,
                        value: value.clone(),
                        expected: "a positive integer",
                    })
                })?;
                fields.iter_mut().for_each(|f| **f = n);
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
/// [`SettingError::Invalid`] and change nothing.
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
