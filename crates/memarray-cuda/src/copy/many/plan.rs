//! Which way each of many device-to-device copies goes: runs that continue each other
//! merged first (`coalesce`), then the small ones into kernel launches of at most
//! [`TABLE_MAX`] and the rest to the driver (`plan`).

use super::TABLE_MAX;

/// Merges runs of copies that continue each other on both sides (copy `i + 1` starts
/// where copy `i` ends, in the source and in the destination) into one copy each, while
/// the merged copy stays within `cap` bytes, and leaves out empty copies. The merged copy
/// moves the same bytes. Only the kernel may take a merged copy: two allocations can be
/// adjacent in the address space, and the driver refuses a copy that spans both, so
/// `cap` is the kernel's limit (0 without the kernel: nothing merges).
pub(super) fn coalesce(
    dsts: &[u64],
    srcs: &[u64],
    lens: &[usize],
    cap: usize,
) -> (Vec<u64>, Vec<u64>, Vec<usize>) {
    let (mut d, mut s, mut n) = (Vec::<u64>::new(), Vec::<u64>::new(), Vec::<usize>::new());
    for ((&dst, &src), &len) in dsts.iter().zip(srcs).zip(lens) {
        if len == 0 {
            continue;
        }
        if let (Some(&ld), Some(&ls), Some(ln)) = (d.last(), s.last(), n.last_mut()) {
            let end = *ln as u64;
            if *ln + len <= cap
                && ld.checked_add(end) == Some(dst)
                && ls.checked_add(end) == Some(src)
            {
                *ln += len;
                continue;
            }
        }
        d.push(dst);
        s.push(src);
        n.push(len);
    }
    (d, s, n)
}

/// Which copies (by index) each kernel launch takes, at most [`TABLE_MAX`] a launch, and
/// which go to the driver: those over `limit` (all of them without the kernel, `None`);
/// empty copies go nowhere.
pub(super) fn plan(lens: &[usize], limit: Option<usize>) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut launches: Vec<Vec<usize>> = Vec::new();
    let mut driver = Vec::new();
    for (i, &n) in lens.iter().enumerate() {
        if n == 0 {
            continue;
        }
        if limit.is_some_and(|l| n <= l) {
            match launches.last_mut() {
                Some(l) if l.len() < TABLE_MAX => l.push(i),
                _ => launches.push(vec![i]),
            }
        } else {
            driver.push(i);
        }
    }
    (launches, driver)
}

#[cfg(test)]
mod tests {
    use super::super::KERNEL_MAX;
    use super::*;

    #[test]
    fn small_copies_fill_launches_of_at_most_a_table_and_the_rest_go_to_the_driver() {
        let mut lens = vec![4096; TABLE_MAX + 5];
        lens[3] = 0;
        lens[7] = KERNEL_MAX;
        lens[8] = KERNEL_MAX + 1;
        let (launches, driver) = plan(&lens, Some(KERNEL_MAX));
        assert_eq!(driver, vec![8]);
        assert_eq!(launches.len(), 2);
        assert_eq!(launches[0].len(), TABLE_MAX);
        assert!(launches[0].contains(&7) && !launches[0].contains(&3));
        let all: Vec<usize> = launches.concat();
        assert_eq!(
            all.len(),
            lens.len() - 2,
            "every non-empty small copy, once"
        );
        assert!(all.windows(2).all(|w| w[0] < w[1]), "in order");
        let (none, driver) = plan(&lens, None);
        assert!(none.is_empty());
        assert_eq!(driver.len(), lens.len() - 1, "all but the empty one");
        assert_eq!(
            plan(&[], Some(KERNEL_MAX)),
            (Vec::<Vec<usize>>::new(), vec![])
        );
    }

    #[test]
    fn copies_that_continue_each_other_merge_and_others_stay() {
        // 0 and 1 continue each other on both sides; 2 continues 1 only in the source;
        // 3 is empty; 4 continues 2 on both sides.
        let dsts = [1000, 1100, 5000, 7, 5050];
        let srcs = [9000, 9100, 9150, 9, 9200];
        let lens = [100, 50, 50, 0, 30];
        let (d, s, n) = coalesce(&dsts, &srcs, &lens, 1000);
        assert_eq!(d, vec![1000, 5000]);
        assert_eq!(s, vec![9000, 9150]);
        assert_eq!(n, vec![150, 80]);
        let total: usize = lens.iter().sum();
        assert_eq!(n.iter().sum::<usize>(), total, "the same bytes");
        // A merge stops at the cap (the kernel's limit); without the kernel none happen.
        let (d, _, n) = coalesce(&dsts, &srcs, &lens, 149);
        assert_eq!((d, n), (vec![1000, 1100, 5000], vec![100, 50, 80]));
        let (_, _, n) = coalesce(&dsts, &srcs, &lens, 0);
        assert_eq!(n, vec![100, 50, 50, 30]);
        // No wrap-around at the top of the address space.
        let (d, _, n) = coalesce(&[u64::MAX - 9, 0], &[0, 10], &[10, 5], 1000);
        assert_eq!((d.len(), n), (2, vec![10, 5]));
        assert_eq!(coalesce(&[], &[], &[], 1000), (vec![], vec![], vec![]));
    }
}
