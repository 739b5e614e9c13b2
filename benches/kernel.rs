//! Kernel benchmark: the mirror's `add_index_tuple` on the device against a
//! device-to-device copy of the same size, measured in the same run on the same stream.
//!
//! - Subject: `RawArray::add_index_tuple_device` (through `MemArray<f32, 1>`) on arrays
//!   of 256 MiB and 1 GiB already on the device: the launch plus the mirror's
//!   bookkeeping (early-return move check, stream choice, ordering, event record).
//! - Peer: `copy::copy_dtod` (`cuMemcpyDtoDAsync`) of the same number of bytes
//!   between two device buffers.
//! - Also shown: the bare `kernel::add_index_tuple` launch on a device buffer, which
//!   separates the kernel's own bandwidth from the mirror's overhead.
//!
//! All three read and write every byte once, so throughput counts bytes read plus
//! bytes written (2 x size), as the contract's "device copy kernel 3.9 TB/s counting
//! read + write" does. Each iteration is timed with CUDA events recorded on the stream
//! just before the call and just after it returns (`Event::timed` + `elapsed_ms`).
//! Values only grow by index sums between iterations (f32, no NaN or infinity).
//!
//! After criterion's groups a summary prints, from medians of our own event-timed
//! repetitions: `kernel 256 MiB: memarray X GB/s, raw Y GB/s, ratio Z` where raw is the
//! copy, and the bare launch's figure.
//!
//! Run on a GPU machine: `cargo bench -p memarray-cuda --bench kernel`.
//! `MEMARRAY_BENCH=summary|criterion` as in `transfer.rs`. Without a CUDA device it prints
//! `SKIPPED: no CUDA device (...)` and exits 0.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Mode, Timer, configure, gbps, label, median, throughput_line};
use criterion::{BenchmarkId, Criterion, Throughput};
use memarray_core::{DType, Location};
use memarray_cuda::copy;
use memarray_cuda::resource::default_resource;
use memarray_cuda::{Device, DeviceBuffer, MemArray, Result, Stream};
use memarray_seed as seed;

const SIZES: [usize; 2] = [256 << 20, 1 << 30];

struct Rig {
    stream: Stream,
    bytes: usize,
    arr: MemArray<f32, 1>,
    src: DeviceBuffer,
    dst: DeviceBuffer,
    timer: Timer,
}

impl Rig {
    fn new(dev: &Arc<Device>, bytes: usize) -> Result<Rig> {
        let stream = Stream::new(dev)?;
        let s = stream.as_ref();
        let mut arr = MemArray::<f32, 1>::new([bytes / 4])?;
        arr.move_memory(Location::Device(0), Some(s), true, None)?;
        let r = default_resource(dev)?;
        let src = DeviceBuffer::zeroed(dev, bytes, r.clone(), s)?;
        let dst = DeviceBuffer::zeroed(dev, bytes, r, s)?;
        let mut rig = Rig {
            stream,
            bytes,
            arr,
            src,
            dst,
            timer: Timer::new(dev)?,
        };
        // Warm-up: loads the module, first launches and copies.
        rig.memarray()?;
        rig.bare_kernel()?;
        rig.copy()?;
        Ok(rig)
    }

    fn memarray(&mut self) -> Result<Duration> {
        let s = self.stream.as_ref();
        let raw = self.arr.as_raw_mut();
        self.timer
            .time(s, || seed::add_index_tuple_device(raw, Some(s), None))
    }

    fn bare_kernel(&mut self) -> Result<Duration> {
        let s = self.stream.as_ref();
        let shape = [self.bytes / 4];
        self.timer.time(s, || {
            seed::add_index_tuple(DType::F32, &self.src, &shape, s).map(drop)
        })
    }

    fn copy(&mut self) -> Result<Duration> {
        let s = self.stream.as_ref();
        self.timer.time(s, || {
            copy::copy_dtod(&self.dst, 0, &self.src, 0, self.bytes, s).map(drop)
        })
    }
}

fn bench(c: &mut Criterion, rig: &mut Rig) {
    let mut g = c.benchmark_group("kernel");
    configure(&mut g, rig.bytes);
    g.throughput(Throughput::Bytes(2 * rig.bytes as u64));
    let l = label(rig.bytes);
    type Op = fn(&mut Rig) -> Result<Duration>;
    let ops: [(&str, Op); 3] = [
        ("memarray add_index_tuple", Rig::memarray),
        ("bare add_index_tuple", Rig::bare_kernel),
        ("copy_dtod", Rig::copy),
    ];
    for (name, op) in ops {
        g.bench_function(BenchmarkId::new(name, &l), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| op(rig).expect(name)).sum())
        });
    }
    g.finish();
}

fn summary(rig: &mut Rig) -> Result<Vec<String>> {
    let (mut ours, mut bare, mut copy) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..common::reps(rig.bytes) * 2 {
        ours.push(rig.memarray()?.as_secs_f64());
        bare.push(rig.bare_kernel()?.as_secs_f64());
        copy.push(rig.copy()?.as_secs_f64());
    }
    let moved = 2 * rig.bytes;
    let what = format!("kernel {}", label(rig.bytes));
    let note = " (raw = copy_dtod; target >= 0.90)";
    let (ours, bare, copy) = (median(ours), median(bare), median(copy));
    Ok(vec![
        throughput_line(&what, moved, ours, copy, note),
        format!(
            "{what}: bare add_index_tuple launch {:.2} GB/s, ratio to copy {:.3}",
            gbps(moved, bare),
            copy / bare
        ),
    ])
}

fn main() -> anyhow::Result<()> {
    let Some(dev) = common::device_or_skip() else {
        return Ok(());
    };
    let mode = Mode::from_env();
    let mut c = Criterion::default().configure_from_args();
    let mut lines = Vec::new();
    for bytes in SIZES {
        let mut rig = Rig::new(&dev, bytes)?;
        if mode.criterion {
            bench(&mut c, &mut rig);
        }
        if mode.summary {
            lines.extend(summary(&mut rig)?);
        }
    }
    if mode.criterion {
        c.final_summary();
    }
    if mode.summary {
        let how = "f32; GB/s = 1e9 B/s of bytes read + written, from medians of \
                   event-timed repetitions; ratio = memarray / raw";
        common::print_summary("kernel", &dev, how, &lines);
    }
    Ok(())
}
