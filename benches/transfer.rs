//! Transfer benchmarks: `MemArray::move_memory` against the raw driver copy it wraps,
//! measured in the same run on the same stream with the same kind of host memory.
//!
//! - Subject: `MemArray<u8, 1>` with `HostKind::Pinned`, host -> device (H2D) and
//!   device -> host (D2H), at 4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB and 1 GiB; and with
//!   `HostKind::Pageable` at 16 MiB and 1 GiB.
//! - Peer: `copy::copy_htod_raw` / `copy_dtoh_raw` (`cuMemcpyHtoDAsync` /
//!   `cuMemcpyDtoHAsync`) between a host buffer of the same kind and size and a device
//!   buffer, on the same owned stream.
//!
//! How a move is timed so that every timed iteration really copies: `move_memory` to
//! where the data already is returns at once, so an iteration is a round trip of which
//! only one half is timed. H2D: time the move to the device, then move back to the host
//! untimed (`sync = true`). D2H: move to the device untimed (`sync = true`), then time
//! the move to the host. The array rests on the host between iterations, and its device
//! buffer, allocated once by a warm-up round trip, is reused: what is timed is the copy
//! plus memarray's bookkeeping (lock check, stream choice, ordering, event record), not
//! the first-use allocation. The peer does exactly the same round trips with the raw
//! copies, so both sides see the same PCIe and cache state.
//!
//! Throughput groups are timed with CUDA events (`Event::timed` + `elapsed_ms`) recorded
//! on the stream just before the call and just after it returns; the stream is idle
//! at the start, so host overhead that delays the enqueue is part of the time. The
//! `latency 4 KiB` group measures host wall-clock time per operation including its
//! synchronisation (`move_memory(.., sync = true)` against the raw copy followed by
//! `cuStreamSynchronize`), since the target is "a 4 KiB move_memory costs at most 2 us
//! more than the raw driver copy".
//!
//! After criterion's groups, a summary prints one line per size and direction from the
//! medians of our own event-timed repetitions (criterion's output is hard to grep):
//! `H2D 16 MiB: memarray X GB/s, raw Y GB/s, ratio Z`, then the latency lines.
//!
//! Run on a GPU machine: `cargo bench -p memarray-cuda --bench transfer` (or the staged
//! binary with `--bench --noplot`). `MEMARRAY_BENCH=summary` runs only the summary
//! (fast), `MEMARRAY_BENCH=criterion` only criterion. Without a CUDA device it prints
//! `SKIPPED: no CUDA device (...)` and exits 0.

mod common;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Mode, Timer, configure, label, median, throughput_line};
use criterion::{BenchmarkId, Criterion, Throughput};
use memarray_core::{HostBuffer, HostResource, Location, MemoryResource};
use memarray_cuda::copy;
use memarray_cuda::resource::default_resource;
use memarray_cuda::{Device, DeviceBuffer, HostKind, MemArray, PinnedResource, Result, Stream};

const PINNED_SIZES: [usize; 6] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30];
const PAGEABLE_SIZES: [usize; 2] = [16 << 20, 1 << 30];
const LATENCY_BYTES: usize = 4 << 10;
const LATENCY_REPS: usize = 2000;
const DEV0: Location = Location::Device(0);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    H2D,
    D2H,
}

impl fmt::Display for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dir::H2D => "H2D",
            Dir::D2H => "D2H",
        })
    }
}

/// One size and host kind: the array under test and the raw peer's buffers.
struct Rig {
    stream: Stream,
    bytes: usize,
    arr: MemArray<u8, 1>,
    host: HostBuffer,
    buf: DeviceBuffer,
    timer: Timer,
}

impl Rig {
    fn new(dev: &Arc<Device>, bytes: usize, kind: HostKind) -> Result<Rig> {
        let stream = Stream::new(dev)?;
        let arr = MemArray::<u8, 1>::with_options([bytes], 0, kind)?;
        let resource: Arc<dyn MemoryResource> = match kind {
            HostKind::Pinned => Arc::new(PinnedResource::new(dev)),
            _ => Arc::new(HostResource),
        };
        let host = HostBuffer::zeroed_in(bytes, resource)?;
        let buf = DeviceBuffer::zeroed(dev, bytes, default_resource(dev)?, stream.as_ref())?;
        let mut rig = Rig {
            stream,
            bytes,
            arr,
            host,
            buf,
            timer: Timer::new(dev)?,
        };
        // Warm-up: allocates the array's device buffer, touches every page both ways.
        rig.memarray(Dir::H2D)?;
        rig.raw(Dir::H2D)?;
        Ok(rig)
    }

    /// One memarray round trip; returns the event-timed duration of the `dir` half.
    fn memarray(&mut self, dir: Dir) -> Result<Duration> {
        let s = self.stream.as_ref();
        let arr = &mut self.arr;
        let t = match dir {
            Dir::H2D => {
                let t = self
                    .timer
                    .time(s, || arr.move_memory(DEV0, Some(s), false, None))?;
                arr.move_memory(Location::Host, Some(s), true, None)?;
                t
            }
            Dir::D2H => {
                arr.move_memory(DEV0, Some(s), true, None)?;
                self.timer
                    .time(s, || arr.move_memory(Location::Host, Some(s), false, None))?
            }
        };
        debug_assert_eq!(arr.location(), Location::Host);
        Ok(t)
    }

    /// One raw round trip; returns the event-timed duration of the `dir` half.
    fn raw(&mut self, dir: Dir) -> Result<Duration> {
        let s = self.stream.as_ref();
        match dir {
            Dir::H2D => {
                let t = self.timer.time(s, || self.raw_htod().map(drop))?;
                self.raw_dtoh()?.synchronize()?;
                Ok(t)
            }
            Dir::D2H => {
                self.raw_htod()?.synchronize()?;
                self.timer.time(s, || self.raw_dtoh().map(drop))
            }
        }
    }

    /// Wall-clock time of one memarray move in `dir` with `sync = true` (the untimed
    /// other half of the round trip excluded).
    fn memarray_latency(&mut self, dir: Dir) -> Result<Duration> {
        let s = Some(self.stream.as_ref());
        let (to, back) = match dir {
            Dir::H2D => (DEV0, Location::Host),
            Dir::D2H => (Location::Host, DEV0),
        };
        if dir == Dir::D2H {
            self.arr.move_memory(back, s, true, None)?;
        }
        let t0 = Instant::now();
        self.arr.move_memory(to, s, true, None)?;
        let t = t0.elapsed();
        if dir == Dir::H2D {
            self.arr.move_memory(back, s, true, None)?;
        }
        Ok(t)
    }

    /// Wall-clock time of one raw copy in `dir` followed by a stream synchronize.
    fn raw_latency(&mut self, dir: Dir) -> Result<Duration> {
        if dir == Dir::D2H {
            self.raw_htod()?.synchronize()?;
        }
        let t0 = Instant::now();
        match dir {
            Dir::H2D => self.raw_htod()?.synchronize()?,
            Dir::D2H => self.raw_dtoh()?.synchronize()?,
        }
        let t = t0.elapsed();
        if dir == Dir::H2D {
            self.raw_dtoh()?.synchronize()?;
        }
        Ok(t)
    }

    fn raw_htod(&self) -> Result<memarray_cuda::Enqueued> {
        // SAFETY: the host buffer lives in the rig and nothing writes it while copies
        // are in flight: every round trip synchronizes before the next one starts.
        unsafe {
            copy::copy_htod_raw(
                &self.buf,
                0,
                self.host.as_ptr(),
                self.bytes,
                self.stream.as_ref(),
            )
        }
    }

    fn raw_dtoh(&self) -> Result<memarray_cuda::Enqueued> {
        // SAFETY: as in raw_htod; nothing reads the host buffer before the copy is
        // synchronized.
        unsafe {
            copy::copy_dtoh_raw(
                self.host.as_mut_ptr(),
                &self.buf,
                0,
                self.bytes,
                self.stream.as_ref(),
            )
        }
    }
}

fn bench_pair(c: &mut Criterion, rig: &mut Rig, kind: &str, dir: Dir) {
    let mut g = c.benchmark_group(format!("{dir} {kind}"));
    configure(&mut g, rig.bytes);
    g.throughput(Throughput::Bytes(rig.bytes as u64));
    let l = label(rig.bytes);
    g.bench_function(BenchmarkId::new("memarray", &l), |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| rig.memarray(dir).expect("memarray move_memory"))
                .sum()
        })
    });
    g.bench_function(BenchmarkId::new("raw", &l), |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rig.raw(dir).expect("raw copy")).sum())
    });
    g.finish();
}

/// Medians of interleaved memarray and raw repetitions, as one summary line.
fn summary_pair(rig: &mut Rig, kind: &str, dir: Dir) -> Result<String> {
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..common::reps(rig.bytes) {
        ours.push(rig.memarray(dir)?.as_secs_f64());
        raw.push(rig.raw(dir)?.as_secs_f64());
    }
    let note = if kind.is_empty() && rig.bytes >= 16 << 20 {
        " (target >= 0.95)"
    } else {
        ""
    };
    let what = format!("{dir} {}{kind}", label(rig.bytes));
    Ok(throughput_line(
        &what,
        rig.bytes,
        median(ours),
        median(raw),
        note,
    ))
}

fn bench_latency(c: &mut Criterion, rig: &mut Rig) {
    let mut g = c.benchmark_group(format!("latency {}", label(rig.bytes)));
    configure(&mut g, rig.bytes);
    for dir in [Dir::H2D, Dir::D2H] {
        g.bench_function(format!("memarray {dir}"), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| rig.memarray_latency(dir).expect("memarray move_memory"))
                    .sum()
            })
        });
        g.bench_function(format!("raw {dir}"), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| rig.raw_latency(dir).expect("raw copy"))
                    .sum()
            })
        });
    }
    g.finish();
}

fn summary_latency(rig: &mut Rig, dir: Dir) -> Result<String> {
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..LATENCY_REPS {
        ours.push(rig.memarray_latency(dir)?.as_secs_f64() * 1e6);
        raw.push(rig.raw_latency(dir)?.as_secs_f64() * 1e6);
    }
    let (a, b) = (median(ours), median(raw));
    Ok(format!(
        "latency {dir} {}: memarray {a:.2} us, raw {b:.2} us, overhead {:.2} us (target <= 2 us)",
        label(rig.bytes),
        a - b
    ))
}

fn main() -> anyhow::Result<()> {
    let Some(dev) = common::device_or_skip() else {
        return Ok(());
    };
    let mode = Mode::from_env();
    let mut c = Criterion::default().configure_from_args();
    let (mut h2d, mut d2h, mut other) = (Vec::new(), Vec::new(), Vec::new());
    let runs = PINNED_SIZES
        .iter()
        .map(|&b| (b, HostKind::Pinned, ""))
        .chain(
            PAGEABLE_SIZES
                .iter()
                .map(|&b| (b, HostKind::Pageable, " pageable")),
        );
    for (bytes, kind, suffix) in runs {
        let mut rig = Rig::new(&dev, bytes, kind)?;
        let name = if suffix.is_empty() {
            "pinned"
        } else {
            "pageable"
        };
        for (dir, lines) in [(Dir::H2D, &mut h2d), (Dir::D2H, &mut d2h)] {
            if mode.criterion {
                bench_pair(&mut c, &mut rig, name, dir);
            }
            if mode.summary {
                lines.push(summary_pair(&mut rig, suffix, dir)?);
            }
        }
        if bytes == LATENCY_BYTES && kind == HostKind::Pinned {
            if mode.criterion {
                bench_latency(&mut c, &mut rig);
            }
            if mode.summary {
                other.push(summary_latency(&mut rig, Dir::H2D)?);
                other.push(summary_latency(&mut rig, Dir::D2H)?);
            }
        }
    }
    if mode.criterion {
        c.final_summary();
    }
    if mode.summary {
        let lines: Vec<String> = h2d.into_iter().chain(d2h).chain(other).collect();
        let how = "pinned unless marked; GB/s = 1e9 B/s from medians of event-timed \
                   repetitions; ratio = memarray / raw";
        common::print_summary("transfer", &dev, how, &lines);
    }
    Ok(())
}
