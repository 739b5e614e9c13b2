//! Your own kernels through `memarray_cuda::launch`: a module
//! loaded from PTX (the seed kernel's, standing in for a user's), arrays passed as
//! Indexers, ordering across streams without any manual event, and bad input refused
//! with errors that name the problem.

use memarray_core::{DType, Location};
use memarray_cuda::launch::{Arg, Module, launch};
use memarray_cuda::{CudaError, RawArray, Stream};
use memarray_testing::gpu::gpu_or_skip;

/// The seed kernel's f32 module (memarray-seed), standing in for a user's PTX.
fn ptx() -> &'static [u8] {
    memarray_seed::ptx(memarray_core::DType::F32)
}

fn ramp(shape: &[usize]) -> RawArray {
    let n: usize = shape.iter().product();
    let bytes: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_ne_bytes()).collect();
    RawArray::from_bytes(DType::F32, shape, &bytes, 0).unwrap()
}

fn values(a: &RawArray) -> Vec<f32> {
    let mut out = vec![0u8; a.nbytes()];
    a.read_all(&mut out, None).unwrap();
    out.chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_user_kernel_runs_on_arrays_and_orders_itself_across_streams() {
    let Some(device) = gpu_or_skip() else {
        return;
    };
    let module = Module::load(&device, ptx()).unwrap();
    let f = module.function("add_index_f32_n2").unwrap();
    assert_eq!(f.param_sizes(), &[8 + 16]);
    let (rows, cols) = (513, 77);
    let mut a = ramp(&[rows, cols]);
    // The upload runs on s1 (not waited for); the kernels on s2 and s3 must follow it and
    // each other with no manual event.
    let (s1, s2, s3) = (
        Stream::new(&device).unwrap(),
        Stream::new(&device).unwrap(),
        Stream::new(&device).unwrap(),
    );
    a.move_memory(Location::Device(0), Some(s1.as_ref()), false, None)
        .unwrap();
    let cfg = f.config_for(a.len());
    launch(&f, cfg, Some(s2.as_ref()), &mut [Arg::Write(&mut a)]).unwrap();
    launch(&f, cfg, Some(s3.as_ref()), &mut [Arg::Write(&mut a)]).unwrap();
    let got = values(&a);
    for r in 0..rows {
        for c in 0..cols {
            let want = (r * cols + c) as f32 + 2.0 * (r + c) as f32;
            assert_eq!(got[r * cols + c], want, "({r}, {c})");
        }
    }
    // A host array is moved to the device by the launch itself.
    let mut b = ramp(&[4, 5]);
    launch(&f, f.config_for(20), None, &mut [Arg::Write(&mut b)]).unwrap();
    assert_eq!(b.location(), Location::Device(0));
    assert_eq!(values(&b)[19], 19.0 + 3.0 + 4.0);
}

#[test]
fn bad_launches_are_refused_before_anything_moves() {
    let Some(device) = gpu_or_skip() else {
        return;
    };
    let module = Module::load(&device, ptx()).unwrap();
    let f = module.function("add_index_f32_n2").unwrap();
    let mut a = ramp(&[3, 4, 5]);
    let msg = |e: CudaError| e.to_string();
    // Wrong ndim: the Indexer's size does not match the parameter.
    let e = msg(launch(&f, f.config_for(60), None, &mut [Arg::Write(&mut a)]).unwrap_err());
    assert!(
        e.contains("parameter 0 is 24 bytes") && e.contains("ndim 3"),
        "{e}"
    );
    assert_eq!(a.location(), Location::Host, "nothing moved");
    // Wrong count.
    let e = msg(launch(&f, f.config_for(1), None, &mut []).unwrap_err());
    assert!(e.contains("takes 1 parameters, 0 given"), "{e}");
    let mut b = ramp(&[3, 4]);
    let e = msg(launch(
        &f,
        f.config_for(12),
        None,
        &mut [Arg::Write(&mut b), Arg::value(1.0f32)],
    )
    .unwrap_err());
    assert!(e.contains("takes 1 parameters, 2 given"), "{e}");
    // A locked array.
    let token = b.try_lock().unwrap();
    assert!(launch(&f, f.config_for(12), None, &mut [Arg::Write(&mut b)]).is_err());
    b.unlock(token).unwrap();
    // A zero grid.
    let mut cfg = f.config_for(12);
    cfg.grid[0] = 0;
    let e = msg(launch(&f, cfg, None, &mut [Arg::Write(&mut b)]).unwrap_err());
    assert!(e.contains("at least 1"), "{e}");
    // A missing kernel, an empty image, PTX that does not compile.
    let e = msg(module.function("no_such_kernel").unwrap_err());
    assert!(e.contains("no_such_kernel"), "{e}");
    assert!(Module::load(&device, b"").is_err());
    assert!(Module::load(&device, b".version 8.0\n.target sm_90\nthis is not ptx").is_err());
}

#[test]
fn cuda_source_compiles_at_run_time_and_its_errors_say_why() {
    let Some(device) = gpu_or_skip() else {
        return;
    };
    let source = r#"
        struct Ix1 { float* data; unsigned long long shape[1]; };
        extern "C" __global__ void scale(Ix1 a, float k) {
            for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < a.shape[0];
                 i += (unsigned long long)gridDim.x * blockDim.x)
                a.data[i] *= k;
        }
    "#;
    let module = match Module::from_cuda_source(&device, source, "scale.cu", &[]) {
        Err(CudaError::Unavailable { reason })
            if std::env::var("MEMARRAY_REQUIRE_NVRTC").is_err() =>
        {
            println!("SKIPPED: {reason}");
            return;
        }
        m => m.unwrap(),
    };
    let f = module.function("scale").unwrap();
    assert_eq!(f.param_sizes(), &[16, 4]);
    let mut a = ramp(&[1000]);
    let s = Stream::new(&device).unwrap();
    launch(
        &f,
        f.config_for(1000),
        Some(s.as_ref()),
        &mut [Arg::Write(&mut a), Arg::value(3.0f32)],
    )
    .unwrap();
    let got = values(&a);
    assert!(got.iter().enumerate().all(|(i, &v)| v == 3.0 * i as f32));
    let e = Module::from_cuda_source(&device, "this is not C++", "bad.cu", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.cu does not compile"), "{e}");
}
