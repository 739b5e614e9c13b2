//! The cost of the per-library ledger and budget check on memarray's allocation path, on
//! the CPU: the check alone (count and budget load, then the free's count), and an
//! allocation and free through the allocation path against the same pair called on the
//! resource directly, with no budget, with one set and with a watermark set (neither
//! reached). The resource hands out a dangling pointer, so the figures are the path's own
//! cost. Median of 9 rounds of 1,000,000, the cases alternating within each round.
//!
//!     cargo bench -p memarray-core --bench budget_check

use std::hint::black_box;
use std::ptr::NonNull;
use std::time::Instant;

use memarray_core::resource::ledger::{self, BudgetScope};
use memarray_core::resource::watermark::{WatermarkCallback, set_watermark};
use memarray_core::resource::{allocate_with_relief, deallocate_counted};
use memarray_core::{Location, MemoryKind, MemoryResource, RawStream, Result, Source};

/// Device memory of device 0 that costs nothing: a dangling pointer, never dereferenced.
#[derive(Debug)]
struct Free;

impl MemoryResource for Free {
    fn allocate(&self, _: usize, _: usize, _: Option<RawStream>) -> Result<NonNull<u8>> {
        Ok(NonNull::dangling())
    }
    fn allocate_zeroed(&self, _: usize, _: usize, _: Option<RawStream>) -> Result<NonNull<u8>> {
        Ok(NonNull::dangling())
    }
    unsafe fn deallocate(&self, _: NonNull<u8>, _: usize, _: usize, _: Option<RawStream>) {}
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }
    fn is_accessible_from(&self, _: Location) -> bool {
        false
    }
    fn device_id(&self) -> Option<u32> {
        Some(0)
    }
    fn name(&self) -> &str {
        "free"
    }
}

const N: u32 = 1_000_000;

fn time(f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..N {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(N)
}

fn main() {
    let r = Free;
    let place = Location::Device(0);
    let s = Source::MEMARRAY;
    let mut direct = || {
        let p = black_box(&r).allocate(1024, 256, None).unwrap();
        // SAFETY: from r with these arguments, freed once.
        unsafe { r.deallocate(p, 1024, 256, None) };
    };
    let mut path = || {
        let p = allocate_with_relief(black_box(&r), 1024, 256, None, false).unwrap();
        // SAFETY: from r through the allocation path for memarray, freed once.
        unsafe { deallocate_counted(&r, s, p, 1024, 256, None) };
    };
    let mut check = || {
        ledger::try_reserve(s, black_box(place), 1024).unwrap();
        ledger::release(s, black_box(place), 1024);
    };
    let cases = [
        "direct",
        "path, no budget",
        "path, budget set",
        "the check alone",
        "path, watermark",
    ];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..9 {
        ledger::set_budget(s, BudgetScope::Place(place), None).unwrap();
        runs[0].push(time(&mut direct));
        runs[1].push(time(&mut path));
        ledger::set_budget(s, BudgetScope::Place(place), Some(1 << 40)).unwrap();
        runs[2].push(time(&mut path));
        runs[3].push(time(&mut check));
        ledger::set_budget(s, BudgetScope::Place(place), None).unwrap();
        let never: WatermarkCallback = std::sync::Arc::new(|_, _, _| Ok(()));
        set_watermark(place, Some((1 << 40, never))).unwrap();
        runs[4].push(time(&mut path));
        set_watermark(place, None).unwrap();
    }
    let med: Vec<f64> = runs
        .iter_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
        .collect();
    println!("allocate + free of 1 KiB, ns per pair (median of 9 rounds of {N}):");
    for (name, m) in cases.iter().zip(&med) {
        println!("  {name:<18} {m:6.1}");
    }
    println!(
        "the ledger and budget check: {:.1} ns per allocation and free; the whole path over the direct call: +{:.1} ns (no budget), +{:.1} ns (a budget set), +{:.1} ns (a watermark set, not reached)",
        med[3],
        med[1] - med[0],
        med[2] - med[0],
        med[4] - med[0]
    );
}
