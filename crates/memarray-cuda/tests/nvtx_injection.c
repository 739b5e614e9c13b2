/* A minimal NVTX tool for memarray's NVTX test: it takes the domain functions (callback
 * module CORE2) and the memory extension's heap and region functions, and writes each
 * push, pop, heap and region of any domain to MEMARRAY_NVTX_TEST_LOG, each heap and region
 * call with whether a CUDA context was current on the calling thread (compute-sanitizer
 * refuses a heap without one). Declarations follow NVTX's documented binary interface
 * (version 3; memory extension 0x0102). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*fn_t)(void);
typedef const void *(*get_export_table_t)(uint32_t id);
typedef struct {
    size_t struct_size;
    int (*get_module_function_table)(int module, fn_t ***table, unsigned *size);
} callbacks_t;
typedef struct {
    uint16_t version, size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type, reserved0;
    uint64_t payload;
    int32_t message_type;
    const char *message;
} attributes_t;

static FILE *out;
static _Thread_local int depth;
static char memarray_domain;

static void *domain_create(const char *name) {
    fprintf(out, "domain %s\n", name);
    fflush(out);
    return &memarray_domain;
}

static int push(void *domain, const attributes_t *a) {
    fprintf(out, "push %d %s %s payload=%d:%llu size=%u\n", depth,
            domain == &memarray_domain ? "memarray" : "other",
            a->message_type == 1 ? a->message : "?", a->payload_type,
            (unsigned long long)a->payload, (unsigned)a->size);
    fflush(out);
    return depth++;
}

static int pop(void *domain) {
    depth--;
    fprintf(out, "pop %d %s\n", depth, domain == &memarray_domain ? "memarray" : "other");
    fflush(out);
    return depth;
}

typedef struct {
    size_t size;
    const void *ptr;
} range_t;
typedef struct {
    uint16_t compat, size;
    uint32_t reserved0, usage, type;
    size_t desc_size;
    const range_t *desc;
    uint32_t category, message_type;
    const char *message;
} heap_desc_t;
typedef struct {
    uint16_t compat, size;
    uint32_t type;
    void *heap;
    size_t count, element_size;
    const range_t *elements;
    void **handles;
} regions_t;
typedef struct {
    uint16_t compat, size;
    uint32_t ref_type;
    size_t count, element_size;
    const void *const *elements;
} unregister_t;
typedef struct {
    size_t id, count;
    intptr_t *slots;
} segment_t;
typedef struct {
    uint16_t version, size, module, compat;
    size_t segments_count;
    segment_t *segments;
    const void *get_export, *info;
} module_t;

static const void *heap_base[16];
static int heaps;

/* "yes" / "no": a CUDA context current on this thread; "-": libcuda not loaded. */
static const char *context(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (cuda == NULL) return "-";
    int (*get)(void **) = (int (*)(void **))dlsym(cuda, "cuCtxGetCurrent");
    void *ctx = NULL;
    const char *answer = get == NULL || get(&ctx) != 0 ? "-" : ctx != NULL ? "yes" : "no";
    dlclose(cuda);
    return answer;
}

static void *heap_register(void *domain, const heap_desc_t *d) {
    fprintf(out, "heap + size=%zu usage=%u type=%u %s ctx=%s\n", d->desc->size, d->usage,
            d->type, d->message_type == 1 ? d->message : "?", context());
    fflush(out);
    heap_base[heaps % 16] = d->desc->ptr;
    return (void *)&heap_base[heaps++ % 16];
}

static void heap_unregister(void *domain, void *heap) {
    fprintf(out, "heap - %s ctx=%s\n", *(const void **)heap != 0 ? "known" : "?", context());
    fflush(out);
}

static void regions_register(void *domain, const regions_t *r) {
    const char *where = r->heap == 0 ? "process"
                        : *(const void **)r->heap <= r->elements[0].ptr ? "in-heap" : "outside";
    fprintf(out, "region + size=%zu %s count=%zu ctx=%s\n", r->elements[0].size, where,
            r->count, context());
    fflush(out);
}

static void regions_unregister(void *domain, const unregister_t *u) {
    fprintf(out, "region - count=%zu ctx=%s\n", u->count, context());
    fflush(out);
}

int InitializeInjectionNvtxExtension(module_t *m) {
    if (out == NULL || m->module != 1 || m->compat != 0x0102 || m->segments_count < 1 ||
        m->segments[0].count < 6)
        return 0;
    /* As NVTX's header lays the segment out: its slot 0 is callback id 1
     * (NVTX3EXT_MEM_FN_IDX_FIRST). nvtxMemHeapRegister = 1, nvtxMemHeapUnregister = 2,
     * nvtxMemRegionsRegister = 4, nvtxMemRegionsUnregister = 6. */
    intptr_t *s = m->segments[0].slots;
    s[1 - 1] = (intptr_t)heap_register;
    s[2 - 1] = (intptr_t)heap_unregister;
    s[4 - 1] = (intptr_t)regions_register;
    s[6 - 1] = (intptr_t)regions_unregister;
    fprintf(out, "memory extension\n");
    fflush(out);
    return 1;
}

int InitializeInjectionNvtx2(get_export_table_t get) {
    const char *path = getenv("MEMARRAY_NVTX_TEST_LOG");
    if (path == NULL || (out = fopen(path, "w")) == NULL) return 0;
    const callbacks_t *cb = (const callbacks_t *)get(1);
    fn_t **table;
    unsigned size;
    if (cb == NULL || cb->struct_size < sizeof(callbacks_t) ||
        !cb->get_module_function_table(5, &table, &size) || size < 16)
        return 0;
    *table[12] = (fn_t)domain_create;
    *table[4] = (fn_t)push;
    *table[5] = (fn_t)pop;
    fprintf(out, "init %u\n", size);
    fflush(out);
    return 1;
}
