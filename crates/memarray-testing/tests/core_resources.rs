//! The conformance suite over memarray-core's own resources and adaptors (memarray-cuda's
//! run it from their tests).

use memarray_testing::conformance::check_all;
use std::sync::Arc;

use memarray_core::resource::{
    FileResource, HostResource, LimitingAdaptor, LoggingAdaptor, MemoryResource, RetryAdaptor,
    StatisticsAdaptor,
};

fn host() -> Arc<dyn MemoryResource> {
    Arc::new(HostResource)
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("memarray-{name}-{}", std::process::id()))
}

#[test]
fn host_resource_conforms() {
    check_all(host());
}

#[test]
fn file_resource_conforms() {
    let path = temp("conformance-file");
    check_all(Arc::new(FileResource::create(&path).unwrap()));
    std::fs::remove_file(&path).ok();
}

#[test]
fn adaptors_conform() {
    check_all(Arc::new(StatisticsAdaptor::new(host())));
    check_all(Arc::new(LimitingAdaptor::new(host(), u64::MAX / 4)));
    check_all(Arc::new(RetryAdaptor::new(host())));
    check_all(Arc::new(memarray_core::TrackingAdaptor::new(
        host(),
        memarray_core::Source::MEMARRAY,
    )));
    check_all(Arc::new(LoggingAdaptor::new(
        host(),
        Box::new(std::io::sink()),
    )));
}

#[test]
fn a_stack_of_every_adaptor_over_a_file_conforms() {
    let path = temp("conformance-stack");
    let file: Arc<dyn MemoryResource> = Arc::new(FileResource::create(&path).unwrap());
    let stack = Arc::new(StatisticsAdaptor::new(Arc::new(LoggingAdaptor::new(
        Arc::new(RetryAdaptor::new(Arc::new(LimitingAdaptor::new(
            file,
            1 << 40,
        )))),
        Box::new(std::io::sink()),
    ))));
    check_all(stack);
    std::fs::remove_file(&path).ok();
}
