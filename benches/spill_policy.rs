//! Hit rates of the spill policy against fixed LRU and MRU ("measure and
//! choose"), on a cyclic scan of 64 equal chunks at 2x and 4x the budget and on skewed
//! reuse (8 hot arrays of 64).
//!
//!     cargo bench -p memarray-core --bench spill_policy

use std::collections::HashSet;

use memarray_core::spill::{Expert, SpillPolicy};

/// Replays `trace` with room for `capacity` arrays under `p`; the hit rate over the second
/// half (after learning).
fn hit_rate(trace: &[u64], capacity: usize, mut p: SpillPolicy) -> f64 {
    let mut resident = HashSet::new();
    let (mut hits, mut counted) = (0usize, 0usize);
    for (i, &id) in trace.iter().enumerate() {
        let hit = resident.contains(&id);
        if i >= trace.len() / 2 {
            counted += 1;
            hits += usize::from(hit);
        }
        if hit {
            p.touch(id);
            continue;
        }
        while resident.len() >= capacity {
            let (victim, expert) = p.choose(|_| true).unwrap();
            resident.remove(&victim);
            p.spilled(victim, expert);
        }
        p.restored(id);
        resident.insert(id);
    }
    hits as f64 / counted as f64
}

fn main() {
    let cyclic: Vec<u64> = (0..20).flat_map(|_| 0..64u64).collect();
    let mut x = 12345u64;
    let skewed: Vec<u64> = (0..40_000)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = x >> 33;
            if r % 10 < 8 { r % 8 } else { 8 + r % 56 }
        })
        .collect();
    println!(
        "{:<34} {:>6} {:>6} {:>9}",
        "trace (room for)", "LRU", "MRU", "adaptive"
    );
    for (name, trace, cap) in [
        ("cyclic 64 chunks (32: 2x budget)", &cyclic, 32),
        ("cyclic 64 chunks (16: 4x budget)", &cyclic, 16),
        ("skewed reuse, 8 hot of 64 (16)", &skewed, 16),
    ] {
        println!(
            "{name:<34} {:>6.3} {:>6.3} {:>9.3}",
            hit_rate(trace, cap, SpillPolicy::fixed(Expert::Lru)),
            hit_rate(trace, cap, SpillPolicy::fixed(Expert::Mru)),
            hit_rate(trace, cap, SpillPolicy::new())
        );
    }
}
