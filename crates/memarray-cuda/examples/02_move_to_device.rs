//! 02: move a MemArray to the GPU, run the seed's kernel there, and bring it back.
//!
//! On a machine without CUDA this prints why and exits with status 77 (`NEEDS`).
//!
//! Run: `cargo run -p memarray-cuda --example 02_move_to_device`

use anyhow::{Context, Result, ensure};
use memarray_core::Location;
use memarray_cuda::{Device, HostKind, MemArray, Stream, device_count};
use memarray_seed as seed;

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
    let count = match device_count() {
        Ok(n) if n > 0 => n,
        other => {
            let why = other
                .err()
                .map_or("no device is visible".into(), |e| e.to_string());
            println!("This example needs an NVIDIA GPU; none is usable here: {why}");
            println!("(01_host_array shows the host side, which works everywhere.)");
            std::process::exit(NEEDS);
        }
    };
    let dev = Device::get(0)?;
    println!("{count} CUDA device(s); using cuda:0 = {}", dev.name());

    // Pinned host memory makes the copies asynchronous and full speed.
    let shape = [2, 4, 7];
    let mut a = MemArray::<f32, 3>::with_options(shape, 0, HostKind::Pinned)?;
    a.view_mut()?.fill(2.0);

    // All work goes on one stream; nothing blocks the host until we read.
    let stream = Stream::new(&dev)?;
    let s = Some(stream.as_ref());
    a.move_memory(Location::Device(0), s, false, None)?;
    println!(
        "moved to {} (device pointer {:?})",
        a.location(),
        a.indexer(None)?.data
    );
    seed::add_index_tuple_device(a.as_raw_mut(), s, None).context("launching add_index_tuple")?;
    // Reading one element on the device waits for the kernel, without moving the data.
    println!("a[1, 3, 6] read on the device = {}", a.get([1, 3, 6])?);
    a.move_memory(Location::Host, s, false, None)?;

    // Host access waits for the pending copy: no torn reads even with sync = false.
    let v = a.view()?;
    for ((i, j, k), &x) in v.indexed_iter() {
        ensure!(x == 2.0 + (i + j + k) as f32, "a[{i}, {j}, {k}] = {x}");
    }
    println!(
        "back on the {}: all {} elements equal 2 + i + j + k",
        a.location(),
        a.size()
    );
    Ok(())
}
