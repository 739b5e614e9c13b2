//! [`SpillPolicy`]: which resident array to spill next.
//!
//! Least recently used alone thrashes on a cyclic scan larger than the budget (every access
//! misses: the array just spilled is the next one needed); most recently used is optimal
//! there and poor under reuse. The policy measures which of the two the workload rewards
//! and follows it, by set dueling (as CPU caches choose between LRU and a scan-resistant
//! insertion policy): two shadow caches of array ids only, one LRU and one MRU, each as
//! large (in arrays) as what is resident now, replay every access; their misses decay with
//! a window of about 64 accesses, and the expert whose shadow missed less chooses the next
//! victim. Deterministic, O(1) per access. The traces in the tests below show both
//! workloads.
//!
//! The policy sees array ids only; the registry ([`super::SpillRegistry`]) decides which
//! arrays may be spilled at all.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Ids are small distinct integers: one multiply spreads them (SipHash costs more than
/// the rest of an access).
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub(super) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
pub(super) type IdSet = std::collections::HashSet<u64, BuildHasherDefault<IdHasher>>;

/// Which expert chooses victims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expert {
    /// Least recently used.
    Lru,
    /// Most recently used.
    Mru,
}

/// Ids ordered by last use: a doubly linked list in a slab, indexed by id, so a use, a
/// removal and the oldest or newest are O(1).
#[derive(Debug, Default)]
struct Recency {
    index: IdMap<u32>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Least recently used.
    head: Option<u32>,
    /// Most recently used.
    tail: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    id: u64,
    prev: Option<u32>,
    next: Option<u32>,
}

impl Recency {
    fn contains(&self, id: u64) -> bool {
        self.index.contains_key(&id)
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        match prev {
            Some(p) => self.nodes[p as usize].next = next,
            None => self.head = next,
        }
        match next {
            Some(n) => self.nodes[n as usize].prev = prev,
            None => self.tail = prev,
        }
    }

    fn push_newest(&mut self, i: u32) {
        self.nodes[i as usize].prev = self.tail;
        self.nodes[i as usize].next = None;
        match self.tail {
            Some(t) => self.nodes[t as usize].next = Some(i),
            None => self.head = Some(i),
        }
        self.tail = Some(i);
    }

    /// Makes `id` the most recently used if it is listed; whether it was (one lookup).
    fn touch_listed(&mut self, id: u64) -> bool {
        let Some(&i) = self.index.get(&id) else {
            return false;
        };
        self.unlink(i);
        self.push_newest(i);
        true
    }

    /// Adds `id`, which is not listed, as the most recently used (one insert, no lookup
    /// before it).
    fn add(&mut self, id: u64) {
        let node = Node {
            id,
            prev: None,
            next: None,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 arrays")
            }
        };
        self.index.insert(id, i);
        self.push_newest(i);
    }

    fn remove(&mut self, id: u64) -> bool {
        match self.index.remove(&id) {
            Some(i) => {
                self.unlink(i);
                self.free.push(i);
                true
            }
            None => false,
        }
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    /// The id `expert` evicts first.
    fn first(&self, expert: Expert) -> Option<u64> {
        let i = match expert {
            Expert::Lru => self.head,
            Expert::Mru => self.tail,
        }?;
        Some(self.nodes[i as usize].id)
    }

    /// Candidates in `expert`'s eviction order.
    fn order(&self, expert: Expert) -> impl Iterator<Item = u64> + '_ {
        let mut at = match expert {
            Expert::Lru => self.head,
            Expert::Mru => self.tail,
        };
        std::iter::from_fn(move || {
            let n = self.nodes[at? as usize];
            at = match expert {
                Expert::Lru => n.next,
                Expert::Mru => n.prev,
            };
            Some(n.id)
        })
    }
}

/// A shadow cache: ids only, evicting by its expert, counting (decayed) misses.
#[derive(Debug)]
struct Shadow {
    expert: Expert,
    ids: Recency,
    misses: f64,
}

impl Shadow {
    fn new(expert: Expert) -> Self {
        Self {
            expert,
            ids: Recency::default(),
            misses: 0.0,
        }
    }

    fn access(&mut self, id: u64, capacity: usize) {
        self.misses *= DECAY;
        if self.ids.touch_listed(id) {
            return;
        }
        self.misses += 1.0;
        while self.ids.len() >= capacity.max(1) {
            let Some(victim) = self.ids.first(self.expert) else {
                break;
            };
            self.ids.remove(victim);
        }
        self.ids.add(id);
    }
}

/// Weight of a miss after one more access: a window of about 64 accesses.
const DECAY: f64 = 63.0 / 64.0;

/// The set-dueling LRU / MRU victim chooser.
#[derive(Debug)]
pub struct SpillPolicy {
    resident: Recency,
    shadows: [Shadow; 2],
    fixed: Option<Expert>,
}

impl Default for SpillPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl SpillPolicy {
    /// An empty policy (LRU until the shadows say otherwise).
    pub fn new() -> Self {
        Self {
            resident: Recency::default(),
            shadows: [Shadow::new(Expert::Lru), Shadow::new(Expert::Mru)],
            fixed: None,
        }
    }

    /// A policy that always lets `expert` choose: the baselines the adaptive one is
    /// measured against.
    pub fn fixed(expert: Expert) -> Self {
        Self {
            fixed: Some(expert),
            ..Self::new()
        }
    }

    /// The expert that chooses victims now.
    pub fn expert(&self) -> Expert {
        if let Some(e) = self.fixed {
            return e;
        }
        if self.shadows[1].misses < self.shadows[0].misses {
            Expert::Mru
        } else {
            Expert::Lru
        }
    }

    fn access(&mut self, id: u64) {
        let listed = self.resident.contains(id);
        let capacity = self.resident.len() + usize::from(!listed);
        for s in &mut self.shadows {
            s.access(id, capacity);
        }
        if listed {
            self.resident.touch_listed(id);
        } else {
            self.resident.add(id);
        }
    }

    /// Records a use of resident array `id` (made resident now if it was not).
    pub fn touch(&mut self, id: u64) {
        self.access(id);
    }

    /// Records that spilled array `id` is needed again and resident now.
    pub fn restored(&mut self, id: u64) {
        self.access(id);
    }

    /// Forgets array `id` (freed by its owner).
    pub fn remove(&mut self, id: u64) {
        self.resident.remove(id);
        for s in &mut self.shadows {
            s.ids.remove(id);
        }
    }

    /// Whether `id` is resident as far as the policy knows.
    pub fn is_resident(&self, id: u64) -> bool {
        self.resident.contains(id)
    }

    /// The next victim among resident arrays that `allowed` accepts, and the expert that
    /// chose it; `None` when there is none. Confirm with [`SpillPolicy::spilled`].
    pub fn choose(&mut self, mut allowed: impl FnMut(u64) -> bool) -> Option<(u64, Expert)> {
        let expert = self.expert();
        self.resident
            .order(expert)
            .find(|&id| allowed(id))
            .map(|id| (id, expert))
    }

    /// Records that `id` was spilled (it is no longer resident; the shadows keep their own
    /// view).
    pub fn spilled(&mut self, id: u64, _expert: Expert) {
        self.resident.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Replays `trace` (array ids) with room for `capacity` arrays; returns the hit rate
    /// over the second half (after learning).
    fn replay(
        p: &mut SpillPolicy,
        resident: &mut HashSet<u64>,
        trace: &[u64],
        capacity: usize,
    ) -> f64 {
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
        hits as f64 / counted.max(1) as f64
    }

    fn hit_rate(trace: &[u64], capacity: usize, mut p: SpillPolicy) -> f64 {
        replay(&mut p, &mut HashSet::new(), trace, capacity)
    }

    fn cyclic(n: u64, passes: usize) -> Vec<u64> {
        (0..passes).flat_map(|_| 0..n).collect()
    }

    /// Skewed reuse: a hot set of 8 arrays used most of the time, 56 cold ones sometimes.
    fn skewed(len: usize) -> Vec<u64> {
        let mut x = 12345u64;
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = x >> 33;
                if r % 10 < 8 { r % 8 } else { 8 + r % 56 }
            })
            .collect()
    }

    #[test]
    fn a_cyclic_scan_larger_than_the_budget_does_not_thrash() {
        // 64 chunks, room for 32 (data at 2x the budget) and 16 (4x), 20 passes.
        let trace = cyclic(64, 20);
        for (capacity, mru_floor) in [(32, 0.45), (16, 0.2)] {
            let lru = hit_rate(&trace, capacity, SpillPolicy::fixed(Expert::Lru));
            let mru = hit_rate(&trace, capacity, SpillPolicy::fixed(Expert::Mru));
            let adaptive = hit_rate(&trace, capacity, SpillPolicy::new());
            assert_eq!(lru, 0.0, "LRU thrashes on a loop larger than the cache");
            assert!(mru > mru_floor, "{mru}");
            assert!(adaptive > 0.8 * mru, "adaptive {adaptive} vs MRU {mru}");
        }
    }

    #[test]
    fn reuse_keeps_the_hot_set_resident() {
        let trace = skewed(40_000);
        let lru = hit_rate(&trace, 16, SpillPolicy::fixed(Expert::Lru));
        let mru = hit_rate(&trace, 16, SpillPolicy::fixed(Expert::Mru));
        let adaptive = hit_rate(&trace, 16, SpillPolicy::new());
        assert!(lru > mru, "LRU {lru} should beat MRU {mru} under reuse");
        assert!(adaptive > 0.95 * lru, "adaptive {adaptive} vs LRU {lru}");
    }

    #[test]
    fn the_choice_follows_the_workload() {
        let mut p = SpillPolicy::new();
        let mut resident = HashSet::new();
        replay(&mut p, &mut resident, &cyclic(64, 10), 32);
        assert_eq!(p.expert(), Expert::Mru);
        replay(&mut p, &mut resident, &skewed(4_000), 32);
        assert_eq!(p.expert(), Expert::Lru);
    }

    #[test]
    fn arrays_not_allowed_are_never_chosen_and_removed_ones_are_forgotten() {
        let mut p = SpillPolicy::new();
        for id in 0..5 {
            p.touch(id);
        }
        p.remove(3);
        assert!(!p.is_resident(3));
        for _ in 0..100 {
            let (v, _) = p.choose(|id| id % 2 == 1).unwrap();
            assert_eq!(v, 1, "only 1 is allowed and resident");
        }
        assert!(p.choose(|_| false).is_none());
    }
}
