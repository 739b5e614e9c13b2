//! NVTX as a tool sees it: a small injection library of the test's own (NVTX's
//! `NVTX_INJECTION64_PATH` mechanism, as Nsight uses it) records the `memarray` domain's
//! ranges; a child process (this binary, running the ignored `child` test) makes ranges
//! and pool allocations under it. Checks the domain, the names, the byte payloads and the
//! nesting, a device pool's heaps and regions (NVTX's memory extension) with a context
//! current at each, that a host pool describes none, and that `MEMARRAY_NVTX=0` keeps the
//! tool from loading.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use memarray_core::{HostResource, MemoryResource};
use memarray_cuda::nvtx;
use memarray_cuda::resource::{CachingPool, DeviceResource};

/// The tool's source, embedded: the test binary may run far from this checkout.
const TOOL: &str = include_str!("nvtx_injection.c");

fn build_tool(dir: &Path) -> PathBuf {
    let src = dir.join("nvtx_injection.c");
    std::fs::write(&src, TOOL).unwrap();
    let lib = dir.join("libnvtx_test_tool.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .output()
        .unwrap_or_else(|e| panic!("the test needs a C compiler ({cc}): {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

fn run_child(lib: &Path, log: &Path, extra: &[(&str, &str)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child",
        "--ignored",
        "--test-threads=1",
        "--nocapture",
    ])
    .env("NVTX_INJECTION64_PATH", lib)
    .env("MEMARRAY_NVTX_TEST_LOG", log)
    .env_remove("MEMARRAY_NVTX");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the tool logs for the child's ranges and pool allocations; `heaps`: a device
/// pool's, which NVTX's memory extension describes (a host pool's are no CUDA memory).
fn expected(heaps: bool) -> Vec<&'static str> {
    let mut lines = vec![
        "init 16",
        "domain memarray",
        "memory extension",
        "push 0 memarray memarray.test.outer payload=0:0 size=48",
        // A 1 MiB block: an upstream allocation of its own, a heap with one region.
        "push 1 memarray memarray.alloc payload=1:1048576 size=48",
        "heap + size=1048576 usage=1 type=1 memarray pool ctx=yes",
        "region + size=1048576 in-heap count=1 ctx=yes",
        "pop 1 memarray",
        "push 1 memarray memarray.free payload=0:0 size=48",
        "region - count=1 ctx=yes",
        "pop 1 memarray",
        "push 1 memarray memarray.test.inner payload=1:7 size=48",
        "pop 1 memarray",
        // 3 MiB from a pool that keeps nothing: a 4 MiB segment (the heap), a region in
        // it, and the segment back upstream at the free.
        "push 1 memarray memarray.alloc payload=1:3145728 size=48",
        "heap + size=4194304 usage=1 type=1 memarray pool ctx=yes",
        "region + size=3145728 in-heap count=1 ctx=yes",
        "pop 1 memarray",
        "push 1 memarray memarray.free payload=0:0 size=48",
        "region - count=1 ctx=yes",
        "heap - known ctx=yes",
        "pop 1 memarray",
        "pop 0 memarray",
        // The first pool, dropped: its cached block goes back upstream.
        "heap - known ctx=yes",
    ];
    if !heaps {
        lines.retain(|l| !l.starts_with("heap ") && !l.starts_with("region "));
        return lines;
    }
    // The device child's last part: the first pool's cached block on a stream (a region
    // in its heap), freed; then the same block handed out again inside a capture of that
    // stream and freed after it: no region either way (a capture is not described, and
    // what was not described is not unregistered).
    let last = lines.pop().expect("the first pool's drop");
    lines.extend([
        "push 0 memarray memarray.alloc payload=1:1048576 size=48",
        "region + size=1048576 in-heap count=1 ctx=yes",
        "pop 0 memarray",
        "push 0 memarray memarray.free payload=0:0 size=48",
        "region - count=1 ctx=yes",
        "pop 0 memarray",
        "push 0 memarray memarray.alloc payload=1:1048576 size=48",
        "pop 0 memarray",
        "push 0 memarray memarray.free payload=0:0 size=48",
        "pop 0 memarray",
        last,
    ]);
    lines
}

fn log_of(lib: &Path, dir: &Path, pools: &str) -> String {
    let log = dir.join(format!("{pools}.log"));
    run_child(lib, &log, &[("MEMARRAY_NVTX_CHILD", pools)]);
    std::fs::read_to_string(&log).unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memarray-nvtx-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_tool_sees_the_memarray_domains_ranges_named_sized_and_nested() {
    let dir = temp_dir("host");
    let lib = build_tool(&dir);
    let text = log_of(&lib, &dir, "host");
    assert_eq!(text.lines().collect::<Vec<_>>(), expected(false), "{text}");
    // Turned off by any off word, or by a value not understood (which a front end
    // refuses at start-up): the tool is never loaded (it would create the log).
    for (i, word) in ["0", "off", "false", "no", "OFF", "garbage"]
        .iter()
        .enumerate()
    {
        let off = dir.join(format!("off-{i}.log"));
        run_child(
            &lib,
            &off,
            &[("MEMARRAY_NVTX", word), ("MEMARRAY_NVTX_CHILD", "off")],
        );
        assert!(!off.exists(), "MEMARRAY_NVTX={word} still loaded the tool");
    }
    // An on word is the default: the tool loads.
    let on = dir.join("on.log");
    run_child(
        &lib,
        &on,
        &[("MEMARRAY_NVTX", "yes"), ("MEMARRAY_NVTX_CHILD", "host")],
    );
    assert!(on.exists(), "MEMARRAY_NVTX=yes did not load the tool");
    std::fs::remove_dir_all(&dir).ok();
}

/// A device pool's upstream allocations are heaps and its blocks regions, each described
/// with the device's context current (compute-sanitizer refuses a heap without one, and
/// memarray leaves no context current between its calls).
#[test]
fn gpu_a_device_pools_heaps_and_regions_are_described_with_its_context_current() {
    if memarray_testing::gpu::gpu_or_skip().is_none() {
        return;
    }
    let dir = temp_dir("device");
    let lib = build_tool(&dir);
    let text = log_of(&lib, &dir, "device");
    assert_eq!(text.lines().collect::<Vec<_>>(), expected(true), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A pool of the child's kind: `device` over device 0's memory, else over host memory.
fn pool(keep: usize) -> CachingPool {
    if std::env::var("MEMARRAY_NVTX_CHILD").is_ok_and(|v| v == "device") {
        let device = memarray_cuda::Device::get(0).unwrap();
        CachingPool::new(Arc::new(DeviceResource::new(&device)), &device, keep)
    } else {
        CachingPool::host(Arc::new(HostResource), keep)
    }
}

#[test]
#[ignore = "run in a child process by the tests above, under the tool"]
fn child() {
    let on = std::env::var("MEMARRAY_NVTX_CHILD").is_ok_and(|v| v != "off");
    assert_eq!(nvtx::active(), on);
    let outer = nvtx::range(c"memarray.test.outer", None);
    let first = pool(1 << 30);
    let p = first.allocate(1 << 20, 64, None).unwrap();
    // SAFETY: allocated just above with this size and alignment; not used after.
    unsafe { first.deallocate(p, 1 << 20, 64, None) };
    {
        let _inner = nvtx::range(c"memarray.test.inner", Some(7));
    }
    let keeps_nothing = pool(0);
    let q = keeps_nothing.allocate(3 << 20, 64, None).unwrap();
    // SAFETY: as above.
    unsafe { keeps_nothing.deallocate(q, 3 << 20, 64, None) };
    assert_eq!(nvtx::mem_active(), on);
    drop(outer);
    if std::env::var("MEMARRAY_NVTX_CHILD").is_ok_and(|v| v == "device") {
        on_a_captured_stream(&first);
    }
}

/// The pool's cached block on a stream, then the same block (a cache hit: no upstream
/// call) handed out inside a capture of that stream and freed after the capture ended.
fn on_a_captured_stream(pool: &CachingPool) {
    let device = memarray_cuda::Device::get(0).unwrap();
    let s = memarray_cuda::Stream::new(&device).unwrap();
    // SAFETY: s is a live stream of the pool's device until the end of the function.
    let raw = unsafe { memarray_core::RawStream::from_raw(s.raw()) };
    let warm = pool.allocate(1 << 20, 64, Some(raw)).unwrap();
    // SAFETY: allocated just above with these arguments; not used after.
    unsafe { pool.deallocate(warm, 1 << 20, 64, Some(raw)) };
    s.synchronize().unwrap();
    let capture = s
        .as_ref()
        .begin_capture(&device, memarray_cuda::graph::CaptureMode::ThreadLocal)
        .unwrap();
    let again = pool.allocate(1 << 20, 64, Some(raw)).unwrap();
    assert_eq!(again, warm, "a cache hit inside the capture");
    drop(capture.end().unwrap());
    // SAFETY: as above.
    unsafe { pool.deallocate(again, 1 << 20, 64, Some(raw)) };
    s.synchronize().unwrap();
}

/// A kernel that writes one `u32` at the address it is given.
const POKE: &str = "
.version 9.0
.target sm_75
.address_size 64
.visible .entry poke(.param .u64 addr)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [addr];
    mov.u32 %r1, 7;
    st.global.u32 [%rd1], %r1;
    ret;
}
";

/// What the pool's regions give compute-sanitizer: a write 4 bytes past a 3 MiB block
/// lands inside the pool's 4 MiB segment (one `cuMemAlloc`), so memcheck sees it only
/// because the pool described the segment as a heap and the block as a region. The
/// sanitize stage of `scripts/gpu-remote.sh` runs this under memcheck twice and requires
/// an invalid write with NVTX on and none with `--nvtx no`; on its own it checks only
/// that premise.
#[test]
#[ignore = "run by the sanitize stage under compute-sanitizer, which must report its write"]
fn gpu_a_write_past_a_pool_block_inside_its_segment() {
    use memarray_cuda::launch::{Arg, LaunchConfig, Module, launch};
    let device = memarray_cuda::Device::get(0).unwrap();
    let pool = CachingPool::new(Arc::new(DeviceResource::new(&device)), &device, 1 << 30);
    let block = pool.allocate(3 << 20, 256, None).unwrap();
    // The write's premise: the block starts one 4 MiB upstream allocation, so 4 bytes
    // past it are inside that allocation (memcheck without regions sees nothing wrong).
    let stats = pool.statistics();
    assert_eq!((stats.used_bytes, stats.upstream_bytes), (3 << 20, 4 << 20));
    let module = Module::load(&device, POKE.as_bytes()).unwrap();
    let f = module.function("poke").unwrap();
    let one = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
    };
    let past = block.as_ptr() as u64 + (3 << 20);
    launch(&f, one, None, &mut [Arg::value(past)]).unwrap();
    // Under memcheck the reported write may fail the context: nothing after it is checked.
    let _ = device.synchronize();
}
