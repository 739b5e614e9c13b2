//! `copy_to` between every pair of memory kinds: host, pinned, managed, file and
//! device memory; data goes through each pair and back, and bad ranges are refused.

use std::sync::Arc;

use memarray_core::{FileResource, HostBuffer, HostResource, MemoryResource};
use memarray_cuda::copy::{Span, copy_to};
use memarray_cuda::{DeviceBuffer, DeviceResource, ManagedResource, PinnedResource, StreamRef};
use memarray_testing::gpu::gpu_or_skip;

enum Mem {
    Host(HostBuffer),
    Device(DeviceBuffer),
}

impl Mem {
    fn span(&self, offset: usize) -> Span<'_> {
        match self {
            Mem::Host(b) => Span::Host(b, offset),
            Mem::Device(b) => Span::Device(b, offset),
        }
    }
}

/// A named maker of fresh memory of one kind.
type Kind<'a> = (&'a str, Box<dyn Fn() -> Mem>);

#[test]
fn gpu_sync_to_between_every_pair_of_kinds() {
    let Some(dev) = gpu_or_skip() else { return };
    const N: usize = (3 << 20) + 5;
    let path = std::env::temp_dir().join(format!("memarray-gpu-sync-{}", std::process::id()));
    let file: Arc<dyn MemoryResource> = Arc::new(FileResource::create(&path).unwrap());
    let kinds: Vec<Kind> = vec![
        (
            "host",
            Box::new(|| Mem::Host(HostBuffer::zeroed_in(N, Arc::new(HostResource)).unwrap())),
        ),
        ("pinned", {
            let r: Arc<dyn MemoryResource> = Arc::new(PinnedResource::new(&dev));
            Box::new(move || Mem::Host(HostBuffer::zeroed_in(N, r.clone()).unwrap()))
        }),
        ("managed", {
            let r: Arc<dyn MemoryResource> = Arc::new(ManagedResource::new(&dev));
            Box::new(move || Mem::Host(HostBuffer::zeroed_in(N, r.clone()).unwrap()))
        }),
        ("file", {
            let r = file.clone();
            Box::new(move || Mem::Host(HostBuffer::zeroed_in(N, r.clone()).unwrap()))
        }),
        ("device", {
            let d = dev.clone();
            let r: Arc<dyn MemoryResource> = Arc::new(DeviceResource::new(&dev));
            Box::new(move || {
                Mem::Device(DeviceBuffer::zeroed(&d, N, r.clone(), StreamRef::legacy()).unwrap())
            })
        }),
    ];
    let pattern: Vec<u8> = (0..N).map(|i| (i * 7 % 251) as u8).collect();
    let source = HostBuffer::from_bytes(&pattern, Arc::new(HostResource)).unwrap();
    for (a_name, make_a) in &kinds {
        for (b_name, make_b) in &kinds {
            let (a, b) = (make_a(), make_b());
            let out = HostBuffer::zeroed(N).unwrap();
            copy_to(a.span(0), Span::Host(&source, 0), N, None).unwrap();
            copy_to(b.span(0), a.span(0), N, None).unwrap();
            copy_to(Span::Host(&out, 0), b.span(0), N, None).unwrap();
            assert_eq!(out.as_slice(), &pattern[..], "{a_name} -> {b_name}");
            assert!(
                copy_to(b.span(1), a.span(0), N, None).is_err(),
                "{a_name} -> {b_name}: out of range"
            );
        }
    }
    drop(kinds);
    drop(file);
    std::fs::remove_file(&path).ok();
}
