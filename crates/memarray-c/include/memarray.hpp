// memarray for C++: RAII types over the C ABI (memarray.h), errors as exceptions, host
// views, and the Indexer shared with kernels (memarray/indexer.cuh). C++17; std::span
// conversions under C++20. Guide: docs/c-cpp-guide.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#if __cplusplus >= 202002L
#include <span>
#endif

#include "memarray.h"
#include "memarray/indexer.cuh"

namespace memarray {

// A failed call: the status and memarray's message.
class Error : public std::runtime_error {
public:
    Error(memarray_status status, const std::string& message)
        : std::runtime_error(message), status_(status) {}
    memarray_status status() const noexcept { return status_; }

private:
    memarray_status status_;
};

namespace detail {
inline void check(memarray_status s) {
    if (s != MEMARRAY_STATUS_OK) throw Error(s, memarray_last_error());
}
}  // namespace detail

// Where data lives: the host or a device ordinal.
constexpr int32_t host = MEMARRAY_HOST;

// The memarray_dtype of a C++ element type.
template <class T> constexpr memarray_dtype dtype_of();
template <> constexpr memarray_dtype dtype_of<bool>() { return MEMARRAY_DTYPE_BOOL; }
template <> constexpr memarray_dtype dtype_of<int8_t>() { return MEMARRAY_DTYPE_I8; }
template <> constexpr memarray_dtype dtype_of<int16_t>() { return MEMARRAY_DTYPE_I16; }
template <> constexpr memarray_dtype dtype_of<int32_t>() { return MEMARRAY_DTYPE_I32; }
template <> constexpr memarray_dtype dtype_of<int64_t>() { return MEMARRAY_DTYPE_I64; }
template <> constexpr memarray_dtype dtype_of<uint8_t>() { return MEMARRAY_DTYPE_U8; }
template <> constexpr memarray_dtype dtype_of<uint16_t>() { return MEMARRAY_DTYPE_U16; }
template <> constexpr memarray_dtype dtype_of<uint32_t>() { return MEMARRAY_DTYPE_U32; }
template <> constexpr memarray_dtype dtype_of<uint64_t>() { return MEMARRAY_DTYPE_U64; }
template <> constexpr memarray_dtype dtype_of<float>() { return MEMARRAY_DTYPE_F32; }
template <> constexpr memarray_dtype dtype_of<double>() { return MEMARRAY_DTYPE_F64; }

// A CUDA stream: memarray's own (Stream::create) or the caller's wrapped (Stream::wrap).
class Stream {
public:
    static Stream create(int32_t device) {
        memarray_stream* s = nullptr;
        detail::check(memarray_stream_create(device, &s));
        return Stream(s);
    }
    // Wraps a live CUstream / cudaStream_t of `device` (nullptr: the legacy default).
    static Stream wrap(int32_t device, void* handle) {
        memarray_stream* s = nullptr;
        detail::check(memarray_stream_wrap(device, handle, &s));
        return Stream(s);
    }
    Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    Stream& operator=(Stream&& o) noexcept {
        std::swap(s_, o.s_);
        return *this;
    }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    ~Stream() { memarray_stream_free(s_); }

    // The CUstream, usable as a cudaStream_t in <<<grid, block, 0, stream>>>.
    void* handle() const noexcept { return memarray_stream_handle(s_); }
    void synchronize() const { detail::check(memarray_stream_synchronize(s_)); }
    const memarray_stream* get() const noexcept { return s_; }

private:
    explicit Stream(memarray_stream* s) : s_(s) {}
    memarray_stream* s_;
};

// An instantiated CUDA graph (move-only): launch() runs everything its capture recorded.
class Graph {
public:
    Graph(Graph&& o) noexcept : g_(std::exchange(o.g_, nullptr)) {}
    Graph& operator=(Graph&& o) noexcept {
        std::swap(g_, o.g_);
        return *this;
    }
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    ~Graph() { memarray_graph_free(g_); }

    void launch(const Stream& s) const { detail::check(memarray_graph_launch(g_, s.get())); }
    void upload(const Stream& s) const { detail::check(memarray_graph_upload(g_, s.get())); }
    size_t node_count() const noexcept { return memarray_graph_node_count(g_); }

private:
    friend class Capture;
    explicit Graph(memarray_graph* g) : g_(g) {}
    memarray_graph* g_;
};

// A capture of one stream (move-only): work enqueued on it until end() is recorded, not
// run. Destroyed without end(), the capture ends and its work is thrown away. Modes: 0
// global, 1 thread-local, 2 relaxed.
class Capture {
public:
    Capture(const Stream& s, int32_t mode = 1) {
        detail::check(memarray_capture_begin(s.get(), mode, &c_));
    }
    Capture(Capture&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
    Capture& operator=(Capture&& o) noexcept {
        std::swap(c_, o.c_);
        return *this;
    }
    Capture(const Capture&) = delete;
    Capture& operator=(const Capture&) = delete;
    ~Capture() { memarray_capture_free(c_); }

    // Ends the capture (this object is then empty) and returns its graph.
    Graph end() {
        memarray_graph* g = nullptr;
        detail::check(memarray_capture_end(std::exchange(c_, nullptr), &g));
        return Graph(g);
    }

private:
    memarray_capture* c_ = nullptr;
};

// A memory resource (reference-counted inside; this handle is move-only).
class Resource {
public:
    static Resource host() { return make([](memarray_resource** o) { return memarray_resource_host(o); }); }
    static Resource device(int32_t d) {
        return make([d](memarray_resource** o) { return memarray_resource_device(d, o); });
    }
    static Resource pinned(int32_t d) {
        return make([d](memarray_resource** o) { return memarray_resource_pinned(d, o); });
    }
    // A caching pool over `upstream` for `device` (memarray::host: a host pool).
    static Resource pool(const Resource& upstream, int32_t device, uint64_t release_threshold) {
        return make([&](memarray_resource** o) {
            return memarray_resource_pool(upstream.r_, device, release_threshold, o);
        });
    }
    static Resource limiting(const Resource& upstream, uint64_t limit) {
        return make([&](memarray_resource** o) { return memarray_resource_limiting(upstream.r_, limit, o); });
    }
    static Resource statistics(const Resource& upstream) {
        return make([&](memarray_resource** o) { return memarray_resource_statistics(upstream.r_, o); });
    }
    static Resource default_for(int32_t d) {
        return make([d](memarray_resource** o) { return memarray_default_resource(d, o); });
    }
    Resource(Resource&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
    Resource& operator=(Resource&& o) noexcept {
        std::swap(r_, o.r_);
        return *this;
    }
    Resource(const Resource&) = delete;
    Resource& operator=(const Resource&) = delete;
    ~Resource() { memarray_resource_free(r_); }

    // The counters (only for a Resource::statistics).
    memarray_statistics stats() const {
        memarray_statistics s{};
        detail::check(memarray_resource_get_statistics(r_, &s));
        return s;
    }
    // Makes this the resource new device buffers on `device` come from.
    void set_default_for(int32_t device) const { detail::check(memarray_set_default_resource(device, r_)); }
    const memarray_resource* get() const noexcept { return r_; }

private:
    template <class F> static Resource make(F f) {
        memarray_resource* r = nullptr;
        detail::check(f(&r));
        return Resource(r);
    }
    explicit Resource(memarray_resource* r) : r_(r) {}
    memarray_resource* r_;
};

// A host view of an N-d array of T: element access by multi-index, C order. Valid while
// the data stays on the host (hold a Lock).
template <class T, int N> class HostView {
public:
    HostView(T* data, const std::array<uint64_t, N>& shape) : data_(data), shape_(shape) {}
    T* data() const noexcept { return data_; }
    uint64_t extent(int d) const noexcept { return shape_[d]; }
    uint64_t size() const noexcept {
        uint64_t n = 1;
        for (auto e : shape_) n *= e;
        return n;
    }
    T& operator[](uint64_t linear) const noexcept { return data_[linear]; }
    template <class... I> T& operator()(I... idx) const noexcept {
        static_assert(sizeof...(I) == N, "one index per dimension");
        const uint64_t ix[N] = {static_cast<uint64_t>(idx)...};
        uint64_t off = 0;
        for (int d = 0; d < N; ++d) off = off * shape_[d] + ix[d];
        return data_[off];
    }
    T* begin() const noexcept { return data_; }
    T* end() const noexcept { return data_ + size(); }
#if __cplusplus >= 202002L
    std::span<T> span() const noexcept { return {data_, static_cast<size_t>(size())}; }
#endif

private:
    T* data_;
    std::array<uint64_t, N> shape_;
};

class Array;

// Holds an array's lock for its scope; calls on the array pass token().
class Lock {
public:
    explicit Lock(const Array& a);
    Lock(Lock&& o) noexcept : a_(std::exchange(o.a_, nullptr)), token_(o.token_) {}
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    Lock& operator=(Lock&&) = delete;
    ~Lock() {
        if (a_) memarray_array_unlock(a_, token_);
    }
    uint64_t token() const noexcept { return token_; }

private:
    const memarray_array* a_;
    uint64_t token_ = 0;
};

// An N-d array on the host, a device, or both.
class Array {
public:
    // Zeros of `dtype` and `shape`, born at `location` (memarray::host or a device).
    static Array zeros(memarray_dtype dtype, const std::vector<uint64_t>& shape, int32_t location = host,
                       memarray_host_kind host_kind = MEMARRAY_HOST_KIND_AUTO, const Resource* resource = nullptr,
                       const Stream* stream = nullptr) {
        memarray_array* a = nullptr;
        detail::check(memarray_array_zeros(dtype, shape.size(), shape.data(), location, host_kind,
                                           resource ? resource->get() : nullptr,
                                           stream ? stream->get() : nullptr, &a));
        return Array(a);
    }
    template <class T>
    static Array zeros(const std::vector<uint64_t>& shape, int32_t location = host) {
        return zeros(dtype_of<T>(), shape, location);
    }
    // A host array holding a copy of `data` (C order, exactly the shape's elements).
    template <class T> static Array from_data(const std::vector<uint64_t>& shape, const T* data, size_t count) {
        memarray_array* a = nullptr;
        detail::check(memarray_array_from_data(dtype_of<T>(), shape.size(), shape.data(), data,
                                               count * sizeof(T), &a));
        return Array(a);
    }
    template <class T> static Array from_data(const std::vector<uint64_t>& shape, const std::vector<T>& v) {
        return from_data<T>(shape, v.data(), v.size());
    }
    // Takes a DLPack versioned tensor (whatever happens, it is memarray's afterwards).
    static Array from_dlpack(DLManagedTensorVersioned* t, const Stream* producer = nullptr) {
        memarray_array* a = nullptr;
        detail::check(memarray_array_from_dlpack(t, producer ? producer->get() : nullptr, &a));
        return Array(a);
    }

    Array(Array&& o) noexcept : a_(std::exchange(o.a_, nullptr)) {}
    Array& operator=(Array&& o) noexcept {
        std::swap(a_, o.a_);
        return *this;
    }
    Array(const Array&) = delete;
    Array& operator=(const Array&) = delete;
    ~Array() { memarray_array_free(a_); }

    memarray_array_info info() const {
        memarray_array_info i{};
        detail::check(memarray_array_get_info(a_, &i));
        return i;
    }
    std::vector<uint64_t> shape() const {
        auto i = info();
        return {i.shape, i.shape + i.ndim};
    }
    uint64_t size() const { return info().size; }
    int32_t location() const { return info().location; }

    // Moves the data to `location` on `stream` (nullptr: the array's last stream).
    void move_to(int32_t location, const Stream* stream = nullptr, bool sync = false, uint64_t token = 0) const {
        detail::check(memarray_array_move(a_, location, stream ? stream->get() : nullptr, sync, token));
    }
    void synchronize(uint64_t token = 0) const { detail::check(memarray_array_synchronize(a_, token)); }

    // Copies the whole array into `out` (resized to the array's elements).
    template <class T> void read(std::vector<T>& out, uint64_t token = 0) const {
        check_dtype<T>();
        out.resize(static_cast<size_t>(size()));
        detail::check(memarray_array_read(a_, out.data(), out.size() * sizeof(T), token));
    }
    template <class T> std::vector<T> to_vector(uint64_t token = 0) const {
        std::vector<T> v;
        read(v, token);
        return v;
    }
    template <class T> void write(const T* data, size_t count, uint64_t token = 0) const {
        check_dtype<T>();
        detail::check(memarray_array_write(a_, data, count * sizeof(T), token));
    }
    template <class T> void write(const std::vector<T>& v, uint64_t token = 0) const {
        write(v.data(), v.size(), token);
    }

    // The host data as an N-d view (the data must be on the host; hold `lock`).
    template <class T, int N> HostView<T, N> host_view(const Lock& lock) const {
        check_dtype<T>();
        memarray_indexer ix{};
        detail::check(memarray_array_host_indexer(a_, lock.token(), &ix));
        check_ndim(ix.ndim, N);
        std::array<uint64_t, N> shape{};
        for (int d = 0; d < N; ++d) shape[d] = ix.shape[d];
        return HostView<T, N>(static_cast<T*>(ix.data), shape);
    }

    // Exports as a DLPack versioned tensor (the caller's; end it with its deleter).
    DLManagedTensorVersioned* to_dlpack(const Stream* consumer = nullptr, uint64_t token = 0) const {
        DLManagedTensorVersioned* t = nullptr;
        detail::check(memarray_array_to_dlpack(a_, consumer ? consumer->get() : nullptr, token, &t));
        return t;
    }

    const memarray_array* get() const noexcept { return a_; }

    static void check_ndim(uint64_t ndim, int n) {
        if (ndim != static_cast<uint64_t>(n))
            throw Error(MEMARRAY_STATUS_INVALID_ARGUMENT,
                        "the array has " + std::to_string(ndim) + " dimensions, the view " + std::to_string(n));
    }

private:
    template <class T> void check_dtype() const {
        if (info().dtype != dtype_of<T>())
            throw Error(MEMARRAY_STATUS_WRONG_DTYPE, "the array's dtype is not the element type asked for");
    }
    explicit Array(memarray_array* a) : a_(a) {}
    memarray_array* a_;
};

inline Lock::Lock(const Array& a) : a_(a.get()) { detail::check(memarray_array_lock(a_, &token_)); }

// Device access for the caller's own kernel: begins in the constructor (the data on
// `device`, `stream` after the array's pending work, the array locked) and ends in the
// destructor (the stream's work becomes the array's pending work). Call end() to see
// an error; the destructor swallows it.
class DeviceAccess {
public:
    DeviceAccess(const Array& a, int32_t device, const Stream& stream, bool write, uint64_t token = 0) {
        detail::check(memarray_access_begin(a.get(), device, stream.get(), write, token, &acc_));
        detail::check(memarray_access_indexer(acc_, &ix_));
    }
    DeviceAccess(const DeviceAccess&) = delete;
    DeviceAccess& operator=(const DeviceAccess&) = delete;
    ~DeviceAccess() {
        if (acc_) memarray_access_end(acc_);
    }
    void end() { detail::check(memarray_access_end(std::exchange(acc_, nullptr))); }

    // The indexer a kernel takes (`data` is a device address).
    template <int N> Indexer<N> indexer() const {
        Array::check_ndim(ix_.ndim, N);
        Indexer<N> out{};
        out.data = ix_.data;
        for (int d = 0; d < N; ++d) out.shape[d] = ix_.shape[d];
        return out;
    }
    void* data() const noexcept { return ix_.data; }

private:
    memarray_access* acc_ = nullptr;
    memarray_indexer ix_{};
};

// An array argument of launch(): read or written by the kernel.
struct Read {
    const Array& array;
    uint64_t token = 0;
};
struct Write {
    const Array& array;
    uint64_t token = 0;
};

class Function;

// A loaded module (PTX, cubin, fatbin, or CUDA C++ through NVRTC).
class Module {
public:
    static Module load(int32_t device, const void* image, size_t size) {
        memarray_module* m = nullptr;
        detail::check(memarray_module_load(device, image, size, &m));
        return Module(m);
    }
    static Module from_source(int32_t device, const std::string& source, const std::string& name,
                              const std::vector<std::string>& options = {}) {
        std::vector<const char*> opts;
        for (auto& o : options) opts.push_back(o.c_str());
        memarray_module* m = nullptr;
        detail::check(memarray_module_from_source(device, source.c_str(), name.c_str(), opts.data(),
                                                  opts.size(), &m));
        return Module(m);
    }
    Module(Module&& o) noexcept : m_(std::exchange(o.m_, nullptr)) {}
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;
    ~Module() { memarray_module_free(m_); }
    Function function(const std::string& name) const;

private:
    explicit Module(memarray_module* m) : m_(m) {}
    memarray_module* m_;
};

class Function {
public:
    Function(Function&& o) noexcept : f_(std::exchange(o.f_, nullptr)) {}
    Function(const Function&) = delete;
    Function& operator=(const Function&) = delete;
    ~Function() { memarray_function_free(f_); }

    // One thread per element of n (kernels written as `if (i < n) ...`).
    memarray_launch_config config_for(uint64_t n) const {
        memarray_launch_config c{};
        detail::check(memarray_function_config_for(f_, n, &c));
        return c;
    }
    // The grid capped at the blocks the device holds at once: grid-stride kernels only.
    memarray_launch_config config_grid_stride(uint64_t n) const {
        memarray_launch_config c{};
        detail::check(memarray_function_config_grid_stride(f_, n, &c));
        return c;
    }
    // Launches with arrays (Read{a} / Write{a}) and trivially copyable values, ordered
    // by memarray on `stream`.
    template <class... A> void launch(const memarray_launch_config& cfg, const Stream& stream, const A&... args) const {
        memarray_kernel_arg list[sizeof...(A) > 0 ? sizeof...(A) : 1];
        size_t i = 0;
        (put(list[i++], args), ...);
        detail::check(memarray_launch(f_, &cfg, stream.get(), list, sizeof...(A)));
    }

private:
    friend class Module;
    explicit Function(memarray_function* f) : f_(f) {}
    static void put(memarray_kernel_arg& a, const Read& r) { a = {MEMARRAY_ARG_KIND_READ, r.array.get(), r.token, nullptr, 0}; }
    static void put(memarray_kernel_arg& a, const Write& w) { a = {MEMARRAY_ARG_KIND_WRITE, w.array.get(), w.token, nullptr, 0}; }
    template <class T> static void put(memarray_kernel_arg& a, const T& v) {
        static_assert(std::is_trivially_copyable<T>::value, "kernel values are trivially copyable");
        a = {MEMARRAY_ARG_KIND_VALUE, nullptr, 0, &v, sizeof(T)};
    }
    memarray_function* f_;
};

inline Function Module::function(const std::string& name) const {
    memarray_function* f = nullptr;
    detail::check(memarray_module_function(m_, name.c_str(), &f));
    return Function(f);
}

}  // namespace memarray
