//! 03: an NCCL all-reduce over every visible GPU from one process (feature `nccl`), and
//! scatter / gather of one array across them.
//!
//! Without a GPU or without libnccl this prints why and exits with status 77 (`NEEDS`). With one GPU
//! the communicator has one rank (the all-reduce then copies).
//!
//! Run: `cargo run -p memarray-cuda --features nccl --example 03_collectives`
//! (set `MEMARRAY_NCCL_LIBRARY` to libnccl.so.2 if it is not on the loader path).

use anyhow::{Result, ensure};
use memarray_core::{DType, Location};
use memarray_cuda::nccl::{self, Comm, ReduceOp, group};
use memarray_cuda::{RawArray, device_count};
use memarray_seed as seed;

fn i32s(a: &RawArray) -> Result<Vec<i32>> {
    let mut out = vec![0u8; a.nbytes()];
    a.read_all(&mut out, None)?;
    Ok(out
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The exit status of every memarray example (Rust and Python) when this machine lacks
/// what it needs (a GPU, NCCL): 77, the "skipped" status of automake's and meson's test
/// harnesses, so a script tells "not here" from "failed".
pub const NEEDS: i32 = 77;

fn main() -> std::process::ExitCode {
    // Errors print with Display (`{e:#}`: the message and its causes), not Debug.
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let n = match device_count() {
        Ok(n) if n > 0 => n,
        other => {
            let why = other
                .err()
                .map_or("no device is visible".into(), |e| e.to_string());
            println!("This example needs an NVIDIA GPU; none is usable here: {why}");
            std::process::exit(NEEDS);
        }
    };
    let info = match nccl::load(None) {
        Ok(info) => info,
        Err(e) => {
            println!("This example needs NCCL: {e}");
            std::process::exit(NEEDS);
        }
    };
    println!("NCCL {:?} from {}", info.version, info.path.display());
    let devices: Vec<u32> = (0..n).collect();

    // One rank per device; rank r holds [r + 1; len]. Every rank ends with the sum.
    let comms = Comm::init_all(&devices)?;
    let len = 1 << 20;
    let mut parts = Vec::new();
    for c in &comms {
        let v = (c.rank() as i32 + 1).to_ne_bytes();
        let loc = Location::Device(c.device_id());
        parts.push(RawArray::full_on(DType::I32, &[len], loc, &v, None, None)?);
    }
    group(|| {
        for (c, a) in comms.iter().zip(parts.iter_mut()) {
            c.all_reduce_in_place(a, ReduceOp::Sum, None)?;
        }
        Ok(())
    })?;
    let want = (1..=n as i32).sum::<i32>();
    for (c, a) in comms.iter().zip(&parts) {
        ensure!(
            i32s(a)?.iter().all(|&x| x == want),
            "rank {} is wrong",
            c.rank()
        );
    }
    println!("all-reduce over {n} GPU(s): every element of every rank = {want}");

    // One array split across the devices, the kernel run on each part, joined back.
    let rows = 10_001;
    let bytes: Vec<u8> = (0..rows as i32 * 8).flat_map(|v| v.to_ne_bytes()).collect();
    let a = RawArray::from_bytes(DType::I32, &[rows, 8], &bytes, 0)?;
    let targets = if n > 1 { devices.clone() } else { vec![0, 0] };
    let mut pieces = a.scatter(&targets, None)?;
    for p in &mut pieces {
        seed::add_index_tuple_device(p, None, None)?;
    }
    let refs: Vec<&RawArray> = pieces.iter().collect();
    let joined = i32s(&RawArray::gather(&refs, Location::Host)?)?;
    let mut start = 0;
    for p in &pieces {
        for i in 0..p.shape()[0] {
            for j in 0..8 {
                let k = (start + i) * 8 + j;
                ensure!(joined[k] == k as i32 + (i + j) as i32, "element {k}");
            }
        }
        start += p.shape()[0];
    }
    println!("scatter over {targets:?}, kernel per part, gather: {rows}x8 elements checked");
    Ok(())
}
