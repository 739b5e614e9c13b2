//! The Rust API of safetensors files on host arrays (no GPU needed): a save read back by
//! name, the writer's order and checks, a file of a dtype memarray does not hold.

use std::sync::atomic::AtomicU64;

use memarray_core::safetensors::Entry;
use memarray_core::{DType, Location};
use memarray_cuda::{RawArray, SafetensorsWriter};

fn host(dtype: DType, shape: &[usize], fill: u8) -> RawArray {
    let mut a = RawArray::empty_on(dtype, shape, Location::Host, None, None).unwrap();
    for (i, b) in a.host_bytes_mut(None).unwrap().iter_mut().enumerate() {
        *b = fill.wrapping_add(i as u8);
    }
    a
}

#[test]
fn a_save_reads_back_by_name_with_its_metadata() {
    let dir = std::env::temp_dir().join(format!("memarray-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a.safetensors");
    let (w, b, s) = (
        host(DType::BF16, &[4, 3], 7),
        host(DType::I64, &[5], 100),
        host(DType::F32, &[], 1),
    );
    let meta = vec![("k".to_string(), "v".to_string())];
    let done = AtomicU64::new(0);
    RawArray::save_safetensors(&path, &[("w", &w), ("b", &b), ("s", &s)], &meta, &done).unwrap();
    assert_eq!(done.into_inner(), 24 + 40 + 4);
    let h = RawArray::safetensors_header(&path).unwrap();
    let order: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        order,
        ["b", "s", "w"],
        "larger elements first, then by name"
    );
    let (got, m) = RawArray::load_safetensors(
        &path,
        Location::Host,
        None,
        Some(&["w", "s"]),
        &AtomicU64::new(0),
    )
    .unwrap();
    assert_eq!(m, meta);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["s", "w"], "in data order");
    assert_eq!(
        got[1].1.host_bytes(None).unwrap(),
        w.host_bytes(None).unwrap()
    );
    assert_eq!(got[1].1.shape(), &[4, 3]);
    let e = RawArray::load_safetensors(
        &path,
        Location::Host,
        None,
        Some(&["x"]),
        &AtomicU64::new(0),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no tensor named \"x\""), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_writer_takes_arrays_in_its_order_and_checks_each() {
    let dir = std::env::temp_dir().join(format!("memarray-stw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    let shape = [2usize];
    let entries = [
        Entry {
            name: "small",
            dtype: DType::U8,
            shape: &shape,
        },
        Entry {
            name: "big",
            dtype: DType::F64,
            shape: &shape,
        },
    ];
    let mut w = SafetensorsWriter::create(&path, &entries, &[]).unwrap();
    assert_eq!(w.order(), [1, 0]);
    let done = AtomicU64::new(0);
    let wrong = host(DType::U8, &[2], 0);
    let e = w.write(&wrong, &done).unwrap_err();
    assert!(e.to_string().contains("changed since the header"), "{e}");
    w.write(&host(DType::F64, &[2], 0), &done).unwrap();
    drop(w); // the file is locked while a writer holds it
    let short = SafetensorsWriter::create(&path, &entries, &[]).unwrap();
    assert!(
        short
            .finish()
            .unwrap_err()
            .to_string()
            .contains("0 of 2 arrays written")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
