// The C++ header's host paths: RAII, exceptions, host views, locks, DLPack, resources
// (run by tests/native.rs, under valgrind in CI).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "memarray.hpp"

static int checks = 0;
#define CHECK(cond)                                                                 \
    do {                                                                            \
        ++checks;                                                                   \
        if (!(cond)) {                                                              \
            std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            std::exit(1);                                                           \
        }                                                                           \
    } while (0)

// `f` throws memarray::Error with `status` and a message containing `text`.
template <class F> static void throws(F f, memarray_status status, const char* text) {
    try {
        f();
    } catch (const memarray::Error& e) {
        CHECK(e.status() == status);
        CHECK(std::strstr(e.what(), text) != nullptr);
        return;
    }
    CHECK(!"no exception");
}

int main() {
    using memarray::Array;
    // A 2-d host view indexes in C order; writes are seen by reads.
    auto a = Array::zeros<float>({3, 4});
    CHECK(a.shape() == (std::vector<uint64_t>{3, 4}) && a.size() == 12 && a.location() == memarray::host);
    {
        memarray::Lock lock(a);
        auto v = a.host_view<float, 2>(lock);
        for (uint64_t i = 0; i < 3; ++i)
            for (uint64_t j = 0; j < 4; ++j) v(i, j) = float(10 * i + j);
        CHECK(v[6] == 12.0f && v.extent(1) == 4);
        throws([&] { a.write(std::vector<float>(12, 1.0f)); }, MEMARRAY_STATUS_LOCKED, "lock");
        throws([&] { memarray::Lock again(a); }, MEMARRAY_STATUS_LOCKED, "lock");
        throws([&] { a.host_view<float, 3>(lock); }, MEMARRAY_STATUS_INVALID_ARGUMENT, "3");
        throws([&] { a.host_view<int32_t, 2>(lock); }, MEMARRAY_STATUS_WRONG_DTYPE, "dtype");
    }
    auto back = a.to_vector<float>();
    CHECK(back[1 * 4 + 3] == 13.0f && back[11] == 23.0f);
    throws([&] { a.to_vector<double>(); }, MEMARRAY_STATUS_WRONG_DTYPE, "dtype");
    throws([&] { a.write(std::vector<float>(5, 1.0f)); }, MEMARRAY_STATUS_INVALID_ARGUMENT, "");

    // Moves are cheap: handles move, never copy.
    Array b = std::move(a);
    CHECK(b.to_vector<float>()[11] == 23.0f);

    // DLPack out and back in, sharing memory; the tensor outlives the first array.
    auto c = Array::from_data<int64_t>({2, 2}, std::vector<int64_t>{1, 2, 3, 4});
    DLManagedTensorVersioned* t = c.to_dlpack();
    { Array gone = std::move(c); }
    auto d = Array::from_dlpack(t);
    CHECK(d.to_vector<int64_t>()[3] == 4);

    // Resources: a limit refuses, statistics count, the array keeps its resource.
    auto host = memarray::Resource::host();
    auto stats = memarray::Resource::statistics(host);
    auto limited = memarray::Resource::limiting(stats, 4096);
    auto e = Array::zeros(MEMARRAY_DTYPE_U8, {4000}, memarray::host, MEMARRAY_HOST_KIND_PAGEABLE, &limited);
    CHECK(stats.stats().current_bytes >= 4000);
    throws([&] { Array::zeros(MEMARRAY_DTYPE_U8, {200}, memarray::host, MEMARRAY_HOST_KIND_PAGEABLE, &limited); },
           MEMARRAY_STATUS_OUT_OF_MEMORY, "");
    throws([&] { host.stats(); }, MEMARRAY_STATUS_INVALID_ARGUMENT, "counts nothing");

    // Errors are per thread: another thread's failure leaves this one's message alone.
    throws([&] { Array::zeros(MEMARRAY_DTYPE_U8, {1}, -9); }, MEMARRAY_STATUS_INVALID_ARGUMENT, "location -9");
    std::thread([] { (void)memarray_array_get_info(nullptr, nullptr); }).join();
    CHECK(std::strstr(memarray_last_error(), "location -9") != nullptr);

    if (memarray_device_count() == 0) {
        throws([] { memarray::Stream::create(0); }, MEMARRAY_STATUS_CUDA_UNAVAILABLE, "");
    } else {
        auto s = memarray::Stream::create(0);
        auto g = Array::from_data<float>({4}, std::vector<float>{1, 2, 3, 4});
        {
            memarray::DeviceAccess acc(g, 0, s, /*write=*/false);
            auto ix = acc.indexer<1>();
            CHECK(ix.data != nullptr && ix.shape[0] == 4 && g.location() == 0);
            throws([&] { g.move_to(memarray::host, nullptr, true); }, MEMARRAY_STATUS_LOCKED, "");
            acc.end();
        }
        CHECK(g.to_vector<float>()[2] == 3.0f);
        // Graphs: a capture that recorded nothing launches all the same; a bad mode and a
        // default stream throw; a capture dropped without end() leaves the stream usable.
        throws([&] { memarray::Capture bad(s, 9); }, MEMARRAY_STATUS_INVALID_ARGUMENT, "capture mode 9");
        auto legacy = memarray::Stream::wrap(0, nullptr);
        throws([&] { memarray::Capture bad(legacy); }, MEMARRAY_STATUS_INVALID_ARGUMENT, "default stream");
        memarray::Graph graph = memarray::Capture(s).end();
        CHECK(graph.node_count() == 0);
        graph.upload(s);
        graph.launch(s);
        s.synchronize();
        { memarray::Capture dropped(s, 2); }
        s.synchronize();
    }
    std::printf("test_cpp: %d checks passed\n", checks);
    return 0;
}
