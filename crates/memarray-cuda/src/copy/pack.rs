//! The one layout of "many arrays in one allocation": device packs
//! ([`RawArray::pack`](crate::array::RawArray::pack)), host packs (the same call on host
//! parts) and `move_many`'s pinned staging buffer all place part `i` at `pack_layout`'s
//! offset `i`.

/// Each part of a pack starts at a multiple of this many bytes (what `cudaMalloc` aligns
/// to), so every unpacked array is as aligned as a fresh one.
pub const PACK_ALIGN: usize = 256;

/// The offset of each of `sizes` in a pack, and the pack's length in bytes.
pub fn pack_layout(sizes: &[usize]) -> (Vec<usize>, usize) {
    let mut total = 0usize;
    let offsets = sizes
        .iter()
        .map(|&n| {
            let at = total;
            total = (total + n).next_multiple_of(PACK_ALIGN);
            at
        })
        .collect();
    (offsets, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_aligns_every_part_and_covers_them() {
        let (offsets, total) = pack_layout(&[4096, 1, 0, 300, 256]);
        assert_eq!(offsets, vec![0, 4096, 4352, 4352, 4864]);
        assert_eq!(total, 5120);
        for (off, n) in offsets.iter().zip([4096, 1, 0, 300, 256]) {
            assert_eq!(off % PACK_ALIGN, 0);
            assert!(off + n <= total);
        }
        assert_eq!(pack_layout(&[]), (vec![], 0));
    }
}
