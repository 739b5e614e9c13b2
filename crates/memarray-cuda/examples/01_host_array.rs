//! 01: a MemArray on the host.
//!
//! Creates a 3-d array, writes and reads elements, looks at it through ndarray, runs the
//! host version of the seed's `add_index_tuple`, and locks it the way an outside
//! observer (a DLPack export) would. Needs no GPU.
//!
//! Run: `cargo run -p memarray-cuda --example 01_host_array`

use anyhow::Result;
use memarray_core::Location;
use memarray_cuda::MemArray;
use memarray_seed as seed;

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
    // Zero-filled, on the host, in pageable memory; targets device 0 when moved.
    let mut a = MemArray::<f32, 3>::new([2, 4, 7])?;
    println!(
        "created {:?} {} array: {} elements, {} bytes, on {}",
        a.shape(),
        a.dtype(),
        a.size(),
        a.nbytes(),
        a.location()
    );

    // Checked element access: out-of-range indices are errors, never panics.
    a.set([1, 2, 3], 2.5)?;
    println!("a[1, 2, 3] = {}", a.get([1, 2, 3])?);
    match a.get([2, 0, 0]) {
        Err(e) => println!("a[2, 0, 0] is refused: {e}"),
        Ok(v) => anyhow::bail!("expected an out-of-bounds error, got {v}"),
    }

    // ndarray views of the host copy: read, and write in place.
    a.view_mut()?.fill(2.0);
    println!(
        "row a[0, 0, ..] = {}",
        a.view()?.slice(ndarray::s![0, 0, ..])
    );

    // The seed's kernel, on the host: a[i, j, k] += i + j + k.
    seed::add_index_tuple_host(&mut a, None)?;
    println!(
        "after add_index_tuple_host: a[1, 3, 6] = {}",
        a.get([1, 3, 6])?
    );
    assert_eq!(a.get([1, 3, 6])?, 2.0 + 10.0);

    // Locks: while a token holds the array, every access without it is refused.
    let token = a.try_lock()?;
    println!("locked by token {}", token.id());
    if let Err(e) = a.get([0, 0, 0]) {
        println!("get without the token: {e}");
    }
    println!(
        "get with the token: {}",
        a.get_with([0, 0, 0], Some(token))?
    );
    a.unlock(token)?;

    // Moves to where the data already is return at once.
    a.move_memory(Location::Host, None, true, None)?;
    println!("unlocked; a deep clone sums to {}", a.clone().view()?.sum());
    Ok(())
}
