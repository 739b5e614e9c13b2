use super::*;

/// A file's bytes: the length, `header` (not padded), then `data` zero bytes.
fn file(header: &str, data: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + data, 0);
    out
}

/// Reads `bytes` as a whole file: the header, or the error's text.
fn read(bytes: &[u8]) -> std::result::Result<Header, String> {
    let len = bytes.len() as u64;
    let n = header_len(bytes, len).map_err(|e| e.to_string())?;
    parse_header(&bytes[8..8 + n as usize], len).map_err(|e| e.to_string())
}

#[test]
fn a_written_header_reads_back_in_data_order() {
    let shapes: [&[usize]; 3] = [&[2, 3], &[], &[4]];
    let entries = [
        Entry {
            name: "w",
            dtype: DType::F16,
            shape: shapes[0],
        },
        Entry {
            name: "scalar \"q\"",
            dtype: DType::F64,
            shape: shapes[1],
        },
        Entry {
            name: "b",
            dtype: DType::I32,
            shape: shapes[2],
        },
    ];
    let order = write_order(&entries);
    assert_eq!(order, [1, 2, 0], "larger elements first, then by name");
    let laid: Vec<Entry<'_>> = order.iter().map(|&i| entries[i].clone()).collect();
    let meta = vec![("format".to_string(), "pt".to_string())];
    let mut bytes = write_header(&laid, &meta).unwrap();
    assert_eq!((bytes.len() - 8) % 8, 0, "padded to 8 bytes");
    bytes.resize(bytes.len() + 8 + 16 + 12, 0);
    let h = read(&bytes).unwrap();
    let got: Vec<_> = h
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.dtype, t.shape.clone(), t.begin, t.end))
        .collect();
    assert_eq!(
        got,
        [
            ("scalar \"q\"", Some(DType::F64), vec![], 0, 8),
            ("b", Some(DType::I32), vec![4], 8, 24),
            ("w", Some(DType::F16), vec![2, 3], 24, 36),
        ]
    );
    assert_eq!(h.metadata, meta);
    assert_eq!(h.data_offset, bytes.len() as u64 - 36);
}

#[test]
fn an_empty_file_of_tensors_and_dtypes_memarray_does_not_hold_are_read() {
    assert!(read(&file("{}", 0)).unwrap().tensors.is_empty());
    let h = read(&file(
        r#"{"a":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"F4","shape":[2],"data_offsets":[3,4]}}"#,
        4,
    ))
    .unwrap();
    assert_eq!(
        h.tensors[0].dtype, None,
        "read, refused by name only when loaded"
    );
    assert_eq!(h.tensors[1].dtype_name, "F4");
}

#[test]
fn every_broken_rule_is_refused_by_name() {
    let t = |dtype: &str, shape: &str, begin: u64, end: u64| {
        format!(r#""x":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{begin},{end}]}}"#)
    };
    let ok = t("F32", "[2]", 0, 8);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![1, 0, 0], "fewer than the 8"),
        ((MAX_HEADER + 1).to_le_bytes().to_vec(), "past the limit"),
        (
            {
                let mut b = 100u64.to_le_bytes().to_vec();
                b.extend_from_slice(b"{}");
                b
            },
            "past the end of the file",
        ),
        (file("[]", 0), "does not start with"),
        (file("{\"x\":1", 0), "expected ',' or '}'"),
        (
            {
                let mut b = file("{}", 0);
                b[8] = 0xff;
                b
            },
            "not UTF-8",
        ),
        (file(&format!("{{{ok},{ok}}}"), 8), "given twice"),
        (
            file(&format!("{{{}}}", t("F33", "[2]", 0, 8)), 8),
            "unknown dtype \"F33\"",
        ),
        (
            file(&format!("{{{}}}", t("F32", "[-2]", 0, 8)), 8),
            "not a size",
        ),
        (
            file(&format!("{{{}}}", t("F32", "[2.5]", 0, 8)), 8),
            "not an integer",
        ),
        (
            file(&format!("{{{}}}", t("F32", "[3]", 0, 8)), 8),
            "is 12 bytes but",
        ),
        (
            file(&format!("{{{}}}", t("F32", "[2]", 8, 0)), 8),
            "ends before it begins",
        ),
        (
            file(&format!("{{{}}}", t("F32", "[2]", 4, 12)), 12),
            "leaves a gap",
        ),
        (file(&format!("{{{ok}}}"), 9), "the file holds 9"),
        (file(&format!("{{{ok}}}"), 4), "the file holds 4"),
        (
            file(
                &format!("{{{}}}", t("F32", "[4294967296,4294967296]", 0, 8)),
                8,
            ),
            "overflows",
        ),
        (
            file(&format!("{{{}}}", t("F6_E2M3", "[3]", 0, 2)), 2),
            "not whole bytes",
        ),
        (
            file(
                r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"more":1}}"#,
                8,
            ),
            "unknown field",
        ),
        (
            file(r#"{"x":{"dtype":"F32","shape":[2]}}"#, 8),
            "no \"data_offsets\"",
        ),
        (
            file(r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}}"#, 8),
            "not [begin, end]",
        ),
        (file(r#"{"x":[1]}"#, 0), "not an object"),
        (file(r#"{"__metadata__":{"a":1}}"#, 0), "not a string"),
        (
            file(
                &format!(
                    "{{{},\"y\":{{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}}}",
                    t("F32", "[2]", 0, 8)
                ),
                12,
            ),
            "overlaps",
        ),
    ];
    for (bytes, want) in cases {
        let got = read(&bytes).expect_err(want);
        assert!(got.contains(want), "{want:?} not in {got:?}");
    }
}

#[test]
fn a_writer_refuses_what_the_format_cannot_hold() {
    let s: &[usize] = &[1];
    let e = |name, dtype| Entry {
        name,
        dtype,
        shape: s,
    };
    let err = |entries: &[Entry<'_>]| write_header(entries, &[]).unwrap_err().to_string();
    assert!(err(&[e("z", DType::Complex128)]).contains("no complex128"));
    assert!(err(&[e("a", DType::F32), e("a", DType::F32)]).contains("given twice"));
    assert!(err(&[e("__metadata__", DType::F32)]).contains("reserved"));
    for d in DType::ALL {
        assert_eq!(dtype_name(d).is_none(), d == DType::Complex128, "{d:?}");
    }
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// A valid file of three tensors.
    fn valid() -> Vec<u8> {
        let shapes: [&[usize]; 3] = [&[3, 2], &[5], &[]];
        let entries = [
            Entry {
                name: "a",
                dtype: DType::F32,
                shape: shapes[0],
            },
            Entry {
                name: "b",
                dtype: DType::U8,
                shape: shapes[1],
            },
            Entry {
                name: "c",
                dtype: DType::F64,
                shape: shapes[2],
            },
        ];
        let laid: Vec<Entry<'_>> = write_order(&entries)
            .iter()
            .map(|&i| entries[i].clone())
            .collect();
        let mut bytes = write_header(&laid, &[("k".into(), "v".into())]).unwrap();
        bytes.resize(bytes.len() + 24 + 5 + 8, 7);
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any edit of a valid file (bytes overwritten, the file cut or grown) reads as a
        /// header whose tensors tile the data exactly, or is refused: never a panic.
        #[test]
        fn edited_files_are_read_whole_or_refused(
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            cut in any::<prop::sample::Index>(),
            grow in 0usize..16,
        ) {
            let mut bytes = valid();
            for (at, b) in edits {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            let keep = cut.index(bytes.len() + 1).max(bytes.len().saturating_sub(40));
            bytes.truncate(keep);
            bytes.resize(bytes.len() + grow, 0);
            if let Ok(h) = read(&bytes) {
                let mut at = 0;
                for t in &h.tensors {
                    prop_assert_eq!(t.begin, at);
                    at = t.end;
                }
                prop_assert_eq!(h.data_offset + at, bytes.len() as u64);
            }
        }
    }
}
