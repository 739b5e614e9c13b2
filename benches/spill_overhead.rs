//! What spilling enabled costs when nothing spills: a 1 MiB device array made and dropped
//! through `SharedArray` (the path every Python array takes), and one call on a live
//! array, with spilling off and on (no budget), interleaved; medians of 7 rounds.
//!
//!     cargo bench -p memarray-cuda --bench spill_overhead
//!
//! Prints SKIPPED without a CUDA device.

use std::time::Instant;

use memarray_core::{DType, Location};
use memarray_cuda::RawArray;
use memarray_cuda::array::SharedArray;
use memarray_cuda::spill::{self, SpillSettings};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A 1 MiB array made on device 0.
fn mib() -> memarray_cuda::Result<RawArray> {
    RawArray::empty_on(DType::F32, &[1 << 18], Location::Device(0), None, None)
}

fn main() -> memarray_cuda::Result<()> {
    if memarray_testing::gpu_or_skip().is_none() {
        return Ok(());
    }
    let n = 20_000;
    let make_drop = || -> memarray_cuda::Result<f64> {
        let t = Instant::now();
        for _ in 0..n {
            drop(SharedArray::new(mib()?));
        }
        Ok(t.elapsed().as_nanos() as f64 / n as f64)
    };
    let live = SharedArray::new(mib()?);
    let call = || {
        let t = Instant::now();
        for _ in 0..n {
            live.with(|r| r.has_pending_work());
        }
        t.elapsed().as_nanos() as f64 / n as f64
    };
    let raw_only = || -> memarray_cuda::Result<f64> {
        let t = Instant::now();
        for _ in 0..n {
            drop(mib()?);
        }
        Ok(t.elapsed().as_nanos() as f64 / n as f64)
    };
    // The two halves apart: wrapping made arrays, and dropping them.
    let phases = || -> memarray_cuda::Result<(f64, f64)> {
        let m = 2000;
        let raws: Vec<RawArray> = (0..m)
            .map(|_| mib())
            .collect::<memarray_cuda::Result<_>>()?;
        let t = Instant::now();
        let shared: Vec<SharedArray> = raws.into_iter().map(SharedArray::new).collect();
        let wrap = t.elapsed().as_nanos() as f64 / m as f64;
        let t = Instant::now();
        drop(shared);
        Ok((wrap, t.elapsed().as_nanos() as f64 / m as f64))
    };
    make_drop()?;
    let (mut wrap_off, mut wrap_on, mut drop_off, mut drop_on) = (vec![], vec![], vec![], vec![]);
    for _ in 0..7 {
        let (w, d) = phases()?;
        wrap_off.push(w);
        drop_off.push(d);
        spill::enable(0, SpillSettings::default())?;
        let (w, d) = phases()?;
        wrap_on.push(w);
        drop_on.push(d);
        spill::disable(0);
    }
    println!(
        "wrap a made array: off {:.0} ns, on {:.0} ns; drop it: off {:.0} ns, on {:.0} ns",
        median(wrap_off),
        median(wrap_on),
        median(drop_off),
        median(drop_on)
    );
    let (mut off, mut on, mut call_off, mut call_on) = (vec![], vec![], vec![], vec![]);
    let (mut raw_off, mut raw_on) = (vec![], vec![]);
    for _ in 0..7 {
        off.push(make_drop()?);
        call_off.push(call());
        raw_off.push(raw_only()?);
        spill::enable(0, SpillSettings::default())?;
        on.push(make_drop()?);
        call_on.push(call());
        raw_on.push(raw_only()?);
        spill::disable(0);
    }
    let (raw_off, raw_on) = (median(raw_off), median(raw_on));
    println!(
        "make + drop the bare RawArray (never listed): off {raw_off:.0} ns, on {raw_on:.0} ns ({:+.0} ns)",
        raw_on - raw_off
    );
    let (off, on, call_off, call_on) = (median(off), median(on), median(call_off), median(call_on));
    println!(
        "make + drop a 1 MiB device array: off {off:.0} ns, on {on:.0} ns ({:+.0} ns, {:.3}x)",
        on - off,
        on / off
    );
    println!(
        "one call on a live array: off {call_off:.0} ns, on {call_on:.0} ns ({:+.0} ns)",
        call_on - call_off
    );
    Ok(())
}
