/* A minimal NVTX tool for memarray's NVTX test: it takes the domain functions (callback
 * module CORE2) and writes each push and pop of any domain to MEMARRAY_NVTX_TEST_LOG.
 * Declarations follow NVTX's documented binary interface (version 3). */
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
