//! Budgets per library on the ledger (their own process: the ledger and the spill hook
//! are process-wide; each test its own device or source): a budget stops the library it
//! names and no other, frees make room again, every device's budget and one device's own,
//! memarray's spillable arrays spill before its budget refuses, the counts stay exact
//! with threads allocating, and a device past the ledger's range is refused.

mod common;

use common::{Slots, alloc, free};

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use memarray_core::Location;
use memarray_core::resource::ledger::{self, BudgetScope, MAX_DEVICES};
use memarray_core::resource::{pressure, set_spill_hooks};
use memarray_core::{CoreError, Source};

fn usage_of(source: Source, place: Location) -> ledger::LibraryUsage {
    ledger::usage()
        .into_iter()
        .find(|u| u.source == source && u.place == place)
        .expect("a row for a library with a budget")
}

#[test]
fn a_budget_stops_the_library_it_names_and_no_other() {
    let (a, b) = (
        Source::register("lib_a").unwrap(),
        Source::register("lib_b").unwrap(),
    );
    let host = Slots::on(None);
    ledger::set_budget(a, BudgetScope::Place(Location::Host), Some(1000)).unwrap();
    assert_eq!(ledger::budget(a, Location::Host), Some(1000));
    let first = alloc(&host, a, 600).unwrap();
    let e = alloc(&host, a, 600).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, CoreError::OutOfMemory { bytes: 600, .. }),
        "{e:?}"
    );
    assert!(
        text.contains("lib_a's budget on host memory") && text.contains("600 of its 1000"),
        "{text}"
    );
    // The other library is not limited, and the refused bytes were never counted.
    let other = alloc(&host, b, 5000).unwrap();
    assert_eq!(ledger::live_bytes(a, Location::Host), 600);
    assert_eq!(ledger::live_bytes(b, Location::Host), 5000);
    let row = usage_of(a, Location::Host);
    assert_eq!(
        (row.live_bytes, row.budget, row.refused),
        (600, Some(1000), 1)
    );
    // A free makes room; exactly the budget fits.
    free(&host, a, first, 600);
    let whole = alloc(&host, a, 1000).unwrap();
    assert!(alloc(&host, a, 1).is_err());
    // Removed, the library allocates past it.
    ledger::set_budget(a, BudgetScope::Place(Location::Host), None).unwrap();
    let past = alloc(&host, a, 4000).unwrap();
    free(&host, a, whole, 1000);
    free(&host, a, past, 4000);
    free(&host, b, other, 5000);
    assert_eq!(ledger::live_bytes(a, Location::Host), 0);
    assert_eq!(ledger::live_bytes(b, Location::Host), 0);
    assert_eq!(host.used.load(Ordering::SeqCst), 0, "every block went back");
}

#[test]
fn every_devices_budget_and_one_devices_own() {
    let c = Source::register("lib_c").unwrap();
    let (d1, d2) = (Slots::on(Some(41)), Slots::on(Some(42)));
    ledger::set_budget(c, BudgetScope::EveryDevice, Some(100)).unwrap();
    ledger::set_budget(c, BudgetScope::Place(Location::Device(42)), Some(300)).unwrap();
    assert_eq!(ledger::budget(c, Location::Device(41)), Some(100));
    assert_eq!(ledger::budget(c, Location::Device(42)), Some(300));
    assert_eq!(
        ledger::budget(c, Location::Host),
        None,
        "host memory is no device"
    );
    assert!(alloc(&d1, c, 200).is_err());
    let p = alloc(&d2, c, 200).unwrap();
    // The device's own budget removed: every device's applies there again.
    ledger::set_budget(c, BudgetScope::Place(Location::Device(42)), None).unwrap();
    assert_eq!(ledger::budget(c, Location::Device(42)), Some(100));
    assert!(alloc(&d2, c, 1).is_err(), "200 held past the budget of 100");
    free(&d2, c, p, 200);
    ledger::set_budget(c, BudgetScope::EveryDevice, None).unwrap();
    assert_eq!(ledger::budget(c, Location::Device(41)), None);
    let far = Location::Device(MAX_DEVICES as u32);
    let e = ledger::set_budget(c, BudgetScope::Place(far), Some(1)).unwrap_err();
    assert!(e.to_string().contains("devices 0..64"), "{e}");
}

#[test]
fn memarray_spills_its_own_arrays_before_its_budget_refuses() {
    // Device 43: memarray's arrays there are "spilled" by the hook, which frees the
    // buffers it holds (counted frees) until the need is met.
    static HELD: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    static ASKED: AtomicUsize = AtomicUsize::new(0);
    let dev = Arc::new(Slots::on(Some(43)));
    let spill_dev = dev.clone();
    set_spill_hooks(
        Some(Arc::new(move |device, need| {
            ASKED.fetch_add(1, Ordering::SeqCst);
            if device != 43 {
                return 0;
            }
            let mut freed = 0;
            let mut held = HELD.lock().unwrap();
            while freed < need {
                let Some(bytes) = held.pop() else { break };
                free(&spill_dev, Source::MEMARRAY, NonNull::dangling(), bytes);
                freed += bytes;
            }
            freed
        })),
        None,
    );
    let place = Location::Device(43);
    ledger::set_budget(Source::MEMARRAY, BudgetScope::Place(place), Some(1000)).unwrap();
    for _ in 0..4 {
        alloc(&dev, Source::MEMARRAY, 250).unwrap();
        HELD.lock().unwrap().push(250);
    }
    // Full: the next 500 bytes spill two of the four, then fit.
    let p = alloc(&dev, Source::MEMARRAY, 500).unwrap();
    assert!(ASKED.load(Ordering::SeqCst) >= 1);
    assert_eq!(HELD.lock().unwrap().len(), 2);
    assert_eq!(ledger::live_bytes(Source::MEMARRAY, place), 1000);
    // Nothing left to spill but the new block: refused, naming the budget.
    HELD.lock().unwrap().clear();
    let e = alloc(&dev, Source::MEMARRAY, 600).unwrap_err();
    assert!(
        e.to_string().contains("memarray's budget on cuda:43"),
        "{e}"
    );
    // Another library on the same device is not spilled for, nor limited.
    let torch = Source::register("lib_d").unwrap();
    let asked = ASKED.load(Ordering::SeqCst);
    let q = alloc(&dev, torch, 5000).unwrap();
    assert_eq!(ASKED.load(Ordering::SeqCst), asked);
    free(&dev, torch, q, 5000);
    free(&dev, Source::MEMARRAY, p, 500);
    set_spill_hooks(None, None);
    ledger::set_budget(Source::MEMARRAY, BudgetScope::Place(place), None).unwrap();
    assert!(
        pressure::pressure_statistics().events == 0,
        "no out-of-memory event"
    );
}

#[test]
fn threads_allocating_under_a_budget_never_pass_it_and_leave_nothing_counted() {
    let e = Source::register("lib_e").unwrap();
    let dev = Arc::new(Slots::on(Some(44)));
    let place = Location::Device(44);
    ledger::set_budget(e, BudgetScope::Place(place), Some(64 * 100)).unwrap();
    let refused = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (dev, refused) = (dev.clone(), refused.clone());
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..5000 {
                    match alloc(&dev, e, 100) {
                        Ok(p) => mine.push(p),
                        Err(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    assert!(ledger::live_bytes(e, place) <= 64 * 100 + 8 * 100);
                    assert!(dev.used.load(Ordering::SeqCst) <= 64 * 100);
                    if i % 3 == 0
                        && let Some(p) = mine.pop()
                    {
                        free(&dev, e, p, 100);
                    }
                }
                for p in mine {
                    free(&dev, e, p, 100);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        refused.load(Ordering::Relaxed) > 0,
        "the budget was reached"
    );
    assert_eq!(ledger::live_bytes(e, place), 0);
    assert_eq!(dev.used.load(Ordering::SeqCst), 0);
    assert_eq!(
        usage_of(e, place).refused,
        refused.load(Ordering::Relaxed) as u64
    );
    ledger::set_budget(e, BudgetScope::Place(place), None).unwrap();
}
