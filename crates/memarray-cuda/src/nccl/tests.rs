//! NCCL without a device: unique ids, reduce types and operand checks.

use super::*;
use crate::error::ArrayError;
use memarray_core::Location;

#[test]
fn unique_ids_round_trip_through_hex_and_bytes_and_garbage_is_refused() {
    let id = UniqueId::from_bytes(&std::array::from_fn::<u8, UNIQUE_ID_BYTES, _>(|i| {
        (i * 7) as u8
    }))
    .unwrap();
    assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap(), id);
    assert_eq!(
        UniqueId::from_hex(&format!("  {}\n", id.to_hex())).unwrap(),
        id
    );
    assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
    assert!(UniqueId::from_bytes(&[0; 12]).is_err());
    assert!(UniqueId::from_hex("abc").is_err());
    let mut bad = id.to_hex();
    bad.replace_range(0..2, "zz");
    assert!(UniqueId::from_hex(&bad).is_err());
    assert!(UniqueId::from_hex(&"é".repeat(128)).is_err());
    assert!(format!("{id:?}").starts_with("UniqueId("));
}

#[test]
fn reductions_parse_and_map_dtypes_nccl_has() {
    assert_eq!(ReduceOp::from_name("SUM").unwrap(), ReduceOp::Sum);
    assert_eq!(ReduceOp::from_name("mean").unwrap(), ReduceOp::Avg);
    assert!(ReduceOp::from_name("xor").is_err());
    assert_eq!(
        reduce_type(DType::F32, "t").unwrap(),
        ncclDataType_t::ncclFloat32
    );
    assert_eq!(
        reduce_type(DType::BF16, "t").unwrap(),
        ncclDataType_t::ncclBfloat16
    );
    for d in [
        DType::Bool,
        DType::I16,
        DType::U16,
        DType::Complex64,
        DType::Complex128,
    ] {
        let e = reduce_type(d, "ncclAllReduce").unwrap_err().to_string();
        assert!(e.contains("cannot reduce") && e.contains(d.name()), "{e}");
    }
}

#[test]
fn layouts_are_checked_before_any_nccl_call() {
    let a = RawArray::zeros(DType::F32, &[4], 0).unwrap();
    let b = RawArray::zeros(DType::F32, &[8], 0).unwrap();
    let c = RawArray::zeros(DType::I32, &[4], 0).unwrap();
    assert!(same_layout("x", &a, &a, 1, 1).is_ok());
    assert!(
        same_layout("x", &a, &b, 1, 2).is_ok(),
        "all-gather over 2 ranks"
    );
    assert!(
        same_layout("x", &b, &a, 2, 1).is_ok(),
        "reduce-scatter over 2 ranks"
    );
    let e = same_layout("ncclAllGather", &a, &a, 1, 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("x 2 ranks"), "{e}");
    assert!(same_layout("x", &a, &c, 1, 1).is_err(), "dtypes differ");
}

#[test]
fn a_missing_library_is_a_clear_error_not_a_panic() {
    if is_loaded() {
        memarray_testing::report_skip(
            "NCCL is loaded in this process: a failed load cannot be shown",
        );
        return;
    }
    let e = load(Some(Path::new("/nonexistent/libnccl.so.2"))).unwrap_err();
    assert!(matches!(e, NcclError::Unavailable { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("/nonexistent/libnccl.so.2") && msg.contains("MEMARRAY_NCCL_LIBRARY"),
        "{msg}"
    );
    assert!(!is_loaded(), "a failed load is not remembered");
}

#[test]
fn operands_must_be_on_the_communicators_device() {
    let a = RawArray::zeros(DType::F32, &[4], 0).unwrap();
    let e = a
        .operand_on("ncclAllReduce", 0, StreamRef::legacy(), None)
        .unwrap_err();
    assert!(
        matches!(
            e,
            CudaError::Array(ArrayError::NotOnDevice {
                expected: 0,
                location: Location::Host,
                ..
            })
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("move_memory"), "{e}");
}

#[test]
fn ranks_are_validated_before_loading_anything() {
    let id = UniqueId::from_bytes(&[0; UNIQUE_ID_BYTES]).unwrap();
    for (size, rank) in [(0, 0), (2, 2)] {
        let e = Comm::init_rank(0, size, rank, &id).unwrap_err();
        assert!(
            matches!(
                e,
                NcclError::Call {
                    call: "ncclCommInitRank",
                    ..
                }
            ),
            "{e:?}"
        );
    }
    let e = Comm::init_all(&[0, 0]).unwrap_err();
    assert!(e.to_string().contains("each device once"), "{e}");
    assert!(Comm::init_all(&[]).is_err());
}
