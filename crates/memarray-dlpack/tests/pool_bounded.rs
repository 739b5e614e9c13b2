//! The export pools: bounded memory over many export/delete cycles, and the FIFO
//! quarantine that keeps a deleted struct out of reuse. One process, tests serialised,
//! so the process-wide counters are this file's alone.

mod common;

use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Instant;

use memarray_dlpack::pool::{MAX_FREE, QUARANTINE};
use memarray_dlpack::{
    DType, Device, ExportSpec, ImportedTensor, call_deleter_unversioned, call_deleter_versioned,
    export_unversioned, export_versioned, pool_stats,
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn spec() -> ExportSpec {
    let data = 0x10_0000 as *mut c_void; // never dereferenced
    ExportSpec::contiguous(data, Device::cuda(0), DType::F32, vec![16, 16, 4])
}

/// Resident set size in bytes (Linux), else `None`.
fn rss_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn cycle_versioned() {
    let p = export_versioned(spec(), Box::new(vec![0u8; 64])).unwrap();
    // SAFETY: a fresh export, handed over; the import's drop deletes it.
    drop(unsafe { ImportedTensor::from_versioned(p) }.unwrap());
}

fn cycle_unversioned() {
    let p = export_unversioned(spec(), Box::new(vec![0u8; 64])).unwrap();
    // SAFETY: a live export we own.
    unsafe { call_deleter_unversioned(p) };
}

#[test]
fn hundred_thousand_cycles_keep_the_pool_and_rss_bounded() {
    let _g = serial();
    for _ in 0..10_000 {
        cycle_versioned();
        cycle_unversioned();
    }
    let rss0 = rss_bytes();
    let before = pool_stats();
    for _ in 0..100_000 {
        cycle_versioned();
        cycle_unversioned();
    }
    let after = pool_stats();
    for (name, b, a) in [
        ("versioned", before.versioned, after.versioned),
        ("unversioned", before.unversioned, after.unversioned),
    ] {
        assert_eq!(a.live, 0, "{name}: {a:?}");
        // After warm-up the free list is past the quarantine: every export reuses.
        assert_eq!(
            a.fresh_allocations, b.fresh_allocations,
            "{name}: {b:?} -> {a:?}"
        );
        assert_eq!(a.reused - b.reused, 100_000, "{name}: {b:?} -> {a:?}");
        assert!(
            a.allocated() <= b.allocated().max(QUARANTINE + 1),
            "{name}: {a:?}"
        );
        assert!(a.allocated() <= MAX_FREE, "{name}: {a:?}");
    }
    // Under valgrind RSS is valgrind's own (scripts/valgrind.sh sets this); the pool
    // counts above still prove the bound, and valgrind's leak check covers the rest.
    let under_valgrind = std::env::var_os("MEMARRAY_UNDER_VALGRIND").is_some();
    if under_valgrind {
        eprintln!("RSS bound not checked under valgrind");
    }
    if let (Some(a), Some(b), false) = (rss0, rss_bytes(), under_valgrind) {
        // A leak of one slot (608 B) or owner per cycle would add over 60 MB here.
        let growth = b.saturating_sub(a);
        assert!(
            growth < 4 << 20,
            "RSS grew by {growth} bytes over 100,000 cycles"
        );
    }
}

#[test]
fn deleted_struct_is_quarantined_and_a_repeat_call_is_a_no_op() {
    let _g = serial();
    // Other tests may have left slots in the free list, ahead of the victim (FIFO).
    let ahead = pool_stats().versioned.free;
    let victim = export_versioned(spec(), Box::new(())).unwrap();
    // SAFETY: live export we own.
    unsafe { call_deleter_versioned(victim) };

    for i in 0..QUARANTINE {
        let (drops, owner) = common::counted();
        let p = export_versioned(spec(), owner).unwrap();
        assert_ne!(p, victim, "victim reused after only {i} later deletions");
        // A stray repeat on the victim must not end the live export `p`.
        // SAFETY: the victim was deleted fewer than QUARANTINE deletions ago.
        unsafe { call_deleter_versioned(victim) };
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        // SAFETY: live export we own.
        unsafe { call_deleter_versioned(p) };
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
    // Past the quarantine the victim comes back once the slots freed before it are used.
    let mut held = Vec::new();
    let p = loop {
        let p = export_versioned(spec(), Box::new(())).unwrap();
        if p == victim {
            break p;
        }
        held.push(p);
        assert!(
            held.len() <= ahead,
            "victim not reused after the {ahead} slots ahead of it (FIFO)"
        );
    };
    for q in held.into_iter().chain([p]) {
        // SAFETY: live exports we own.
        unsafe { call_deleter_versioned(q) };
    }
}

#[test]
fn a_burst_of_live_exports_is_trimmed_back_after_deletion() {
    let _g = serial();
    let n = 3 * MAX_FREE;
    let live: Vec<_> = (0..n)
        .map(|_| export_unversioned(spec(), Box::new(())).unwrap())
        .collect();
    assert!(pool_stats().unversioned.live >= n);
    for p in live {
        // SAFETY: live exports we own.
        unsafe { call_deleter_unversioned(p) };
    }
    let s = pool_stats().unversioned;
    assert_eq!(s.live, 0, "{s:?}");
    assert!(s.free <= MAX_FREE, "{s:?}");
    assert!(s.deallocated >= (n - MAX_FREE) as u64, "{s:?}");
}

/// `cargo test --release -p memarray-dlpack --test pool_bounded -- --ignored --nocapture`
#[test]
#[ignore = "timing; run in release"]
fn export_delete_timing() {
    let _g = serial();
    const N: u32 = 1_000_000;
    for (name, f) in [
        (
            "versioned export + call_deleter",
            (|| {
                let p = export_versioned(spec(), Box::new(())).unwrap();
                // SAFETY: live export we own.
                unsafe { call_deleter_versioned(p) };
            }) as fn(),
        ),
        ("unversioned export + call_deleter", || {
            let p = export_unversioned(spec(), Box::new(())).unwrap();
            // SAFETY: live export we own.
            unsafe { call_deleter_unversioned(p) };
        }),
        ("versioned export + import + drop", || {
            let p = export_versioned(spec(), Box::new(())).unwrap();
            // SAFETY: a fresh export, handed over.
            drop(unsafe { ImportedTensor::from_versioned(p) }.unwrap());
        }),
    ] {
        for _ in 0..10_000 {
            f();
        }
        let t = Instant::now();
        for _ in 0..N {
            f();
        }
        let ns = t.elapsed().as_nanos() as f64 / f64::from(N);
        println!("{name}: {ns:.0} ns per cycle");
        assert!(ns < 1000.0, "{name}: {ns} ns");
    }
}
