/* GGUF reader: a cursor walks the mapped header with a bounds check on every read, so nothing
 * past the end of the file is ever touched; the tensor data is then checked against the data
 * section before the loader sees it. */
#include "worker/model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "GGUF data is little-endian; this reader assumes a little-endian host"
#endif

#define GGUF_MAGIC 0x46554747u /* "GGUF" */
#define MAX_ENTRIES (1u << 20) /* keys, and tensors: real files hold a few thousand */

struct cg_gguf {
    const uint8_t *map;
    size_t map_len;
    cg_gguf_kv *kv;
    size_t n_kv;
    cg_gguf_tensor *t;
    size_t n_t;
};

/* ggml's type names, by type number (gaps are types ggml has removed). */
static const char *const type_names[] = {
    [0] = "F32",     [1] = "F16",      [2] = "Q4_0",   [3] = "Q4_1",    [6] = "Q5_0",
    [7] = "Q5_1",    [8] = "Q8_0",     [9] = "Q8_1",   [10] = "Q2_K",   [11] = "Q3_K",
    [12] = "Q4_K",   [13] = "Q5_K",    [14] = "Q6_K",  [15] = "Q8_K",   [16] = "IQ2_XXS",
    [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S",
    [22] = "IQ2_S",  [23] = "IQ4_XS",  [24] = "I8",    [25] = "I16",    [26] = "I32",
    [27] = "I64",    [28] = "F64",     [29] = "IQ1_M", [30] = "BF16",   [34] = "TQ1_0",
    [35] = "TQ2_0",  [39] = "MXFP4",
};

const char *cg_gguf_type_name(uint32_t type)
{
    static __thread char buf[24];
    if (type < CG_ARRAY_LEN(type_names) && type_names[type]) return type_names[type];
    snprintf(buf, sizeof buf, "unknown (%u)", type);
    return buf;
}

/* Elements and bytes per block of a type the worker loads (a plain type is a block of one);
 * 0 for the others. */
static int type_block(uint32_t type, size_t *bytes)
{
    switch (type) {
    case CG_GGML_F32:
        *bytes = 4;
        return 1;
    case CG_GGML_F16:
    case CG_GGML_BF16:
        *bytes = 2;
        return 1;
    case CG_GGML_Q8_0:
        *bytes = 34;
        return 32;
    case CG_GGML_Q4_0:
        *bytes = 18;
        return 32;
    default:
        return 0;
    }
}

/* ---- the cursor ---- */

typedef struct cur {
    const uint8_t *p, *end;
    char *err;
    size_t errlen;
    const char *what; /* the field being read, for messages */
} cur;

static bool take(cur *c, size_t n, const uint8_t **at)
{
    if ((size_t)(c->end - c->p) < n) {
        cg_seterr(c->err, c->errlen, "GGUF: %s runs past the end of the file", c->what);
        return false;
    }
    *at = c->p;
    c->p += n;
    return true;
}

static bool rd_u32(cur *c, uint32_t *v)
{
    const uint8_t *at;
    if (!take(c, 4, &at)) return false;
    memcpy(v, at, 4);
    return true;
}

static bool rd_u64(cur *c, uint64_t *v)
{
    const uint8_t *at;
    if (!take(c, 8, &at)) return false;
    memcpy(v, at, 8);
    return true;
}

/* A string: u64 length, then the bytes. *s points at the length prefix. */
static bool rd_str(cur *c, const uint8_t **s, uint64_t *len)
{
    *s = c->p;
    const uint8_t *at;
    if (!rd_u64(c, len)) return false;
    if (*len > (uint64_t)(c->end - c->p)) {
        cg_seterr(c->err, c->errlen,
                  "GGUF: %s: a string of %llu bytes runs past the end of "
                  "the file",
                  c->what, (unsigned long long)*len);
        return false;
    }
    return take(c, (size_t)*len, &at);
}

static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case CG_GGUF_U8:
    case CG_GGUF_I8:
    case CG_GGUF_BOOL:
        return 1;
    case CG_GGUF_U16:
    case CG_GGUF_I16:
        return 2;
    case CG_GGUF_U32:
    case CG_GGUF_I32:
    case CG_GGUF_F32:
        return 4;
    case CG_GGUF_U64:
    case CG_GGUF_I64:
    case CG_GGUF_F64:
        return 8;
    default:
        return 0;
    }
}

static char *dup_str(const uint8_t *s)
{
    uint64_t n;
    memcpy(&n, s, 8);
    return cg_strndup((const char *)s + 8, (size_t)n);
}

/* Reads a name (what: "a metadata key", "a tensor name") into *out, a copy that the caller
 * frees even on failure; fails when it is empty or holds a NUL byte. Later errors name it. */
static bool read_name(cur *c, const char *what, const char **out)
{
    const uint8_t *s;
    uint64_t len;
    c->what = what;
    if (!rd_str(c, &s, &len)) return false;
    *out = dup_str(s);
    if (strlen(*out) != len || !len) {
        cg_seterr(c->err, c->errlen, "GGUF: %s is empty or holds a NUL byte", what);
        return false;
    }
    c->what = *out;
    return true;
}

static bool read_kv(cur *c, cg_gguf_kv *kv)
{
    if (!read_name(c, "a metadata key", &kv->key)) return false;
    uint32_t type;
    if (!rd_u32(c, &type)) return false;
    kv->type = (cg_gguf_vtype)type;
    if (type == CG_GGUF_STRING) {
        uint64_t len;
        kv->data = c->p;
        return rd_str(c, &kv->data, &len);
    }
    if (type != CG_GGUF_ARRAY) {
        size_t sz = scalar_size(type);
        if (!sz) {
            cg_seterr(c->err, c->errlen,
                      "GGUF: '%.100s' has value type %u, which GGUF does not "
                      "define",
                      kv->key, type);
            return false;
        }
        return take(c, sz, &kv->data);
    }
    uint32_t at;
    if (!rd_u32(c, &at) || !rd_u64(c, &kv->n)) return false;
    kv->atype = (cg_gguf_vtype)at;
    if (at == CG_GGUF_STRING) {
        /* each element is at least its 8-byte length */
        if (kv->n > (uint64_t)(c->end - c->p) / 8) {
            cg_seterr(c->err, c->errlen, "GGUF: '%.100s': %llu strings cannot fit in the file",
                      kv->key, (unsigned long long)kv->n);
            return false;
        }
        kv->data = c->p;
        kv->str = cg_malloc((size_t)(kv->n ? kv->n : 1) * sizeof *kv->str);
        for (uint64_t i = 0; i < kv->n; i++) {
            uint64_t len;
            if (!rd_str(c, &kv->str[i], &len)) return false;
        }
        return true;
    }
    size_t sz = scalar_size(at);
    if (!sz) {
        cg_seterr(c->err, c->errlen,
                  "GGUF: '%.100s' is an array of type %u, which the worker "
                  "does not read",
                  kv->key, at);
        return false;
    }
    if (kv->n > (uint64_t)(c->end - c->p) / sz) {
        cg_seterr(c->err, c->errlen, "GGUF: '%.100s': %llu elements run past the end of the file",
                  kv->key, (unsigned long long)kv->n);
        return false;
    }
    return take(c, (size_t)kv->n * sz, &kv->data);
}

static bool read_tensor_info(cur *c, cg_gguf_tensor *t, uint64_t *offset)
{
    if (!read_name(c, "a tensor name", &t->name)) return false;
    uint32_t nd;
    if (!rd_u32(c, &nd)) return false;
    if (nd < 1 || nd > CG_GGUF_MAX_DIMS) {
        cg_seterr(c->err, c->errlen, "GGUF: tensor '%.100s' has %u dims (1 to %d)", t->name, nd,
                  CG_GGUF_MAX_DIMS);
        return false;
    }
    t->ndim = (int)nd;
    t->numel = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t ne;
        if (!rd_u64(c, &ne)) return false;
        if (ne == 0 || ne > (1ull << 40) || (uint64_t)t->numel > (1ull << 42) / ne) {
            cg_seterr(c->err, c->errlen, "GGUF: tensor '%.100s' has dim %u of size %llu", t->name,
                      d, (unsigned long long)ne);
            return false;
        }
        t->ne[d] = (int64_t)ne;
        t->numel *= (int64_t)ne;
    }
    return rd_u32(c, &t->type) && rd_u64(c, offset);
}

static int by_offset(const void *a, const void *b)
{
    const cg_gguf_tensor *x = *(const cg_gguf_tensor *const *)a,
                         *y = *(const cg_gguf_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

static int by_key(const void *a, const void *b)
{
    return strcmp(((const cg_gguf_kv *)a)->key, ((const cg_gguf_kv *)b)->key);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const cg_gguf_tensor *)a)->name, ((const cg_gguf_tensor *)b)->name);
}

/* Data inside the data section, aligned, sized and not overlapping; then the arrays sorted for
 * lookups, with duplicates refused. */
static bool check_layout(cg_gguf *g, const uint8_t *data0, uint64_t align, char *err, size_t errlen)
{
    const uint8_t *end = g->map + g->map_len;
    cg_gguf_tensor **ord = cg_malloc((g->n_t ? g->n_t : 1) * sizeof *ord);
    bool ok = true;
    for (size_t i = 0; i < g->n_t; i++)
        ord[i] = &g->t[i];
    qsort(ord, g->n_t, sizeof *ord, by_offset);
    for (size_t i = 0; i < g->n_t && ok; i++) {
        cg_gguf_tensor *t = ord[i];
        const uint8_t *next = i + 1 < g->n_t ? ord[i + 1]->data : end;
        size_t bsz = 0;
        const int blk = type_block(t->type, &bsz);
        /* as ggml lays them out, a block never spans two rows */
        size_t want = blk ? (size_t)(t->numel / blk) * bsz : (size_t)(next - t->data);
        if (blk && t->ne[0] % blk) {
            cg_seterr(err, errlen,
                      "GGUF: tensor '%.100s' of type %s has rows of %lld elements, not whole "
                      "blocks of %d",
                      t->name, cg_gguf_type_name(t->type), (long long)t->ne[0], blk);
            ok = false;
        } else if ((size_t)(t->data - data0) % align) {
            cg_seterr(err, errlen,
                      "GGUF: tensor '%.100s' is not at a multiple of the alignment "
                      "(%llu)",
                      t->name, (unsigned long long)align);
            ok = false;
        } else if (want > (size_t)(next - t->data)) {
            cg_seterr(err, errlen, "GGUF: tensor '%.100s' (%zu bytes of %s) %s", t->name, want,
                      cg_gguf_type_name(t->type),
                      next == end ? "runs past the end of the file" : "overlaps the next tensor");
            ok = false;
        }
        t->nbytes = want;
    }
    free(ord);
    if (!ok) return false;
    qsort(g->kv, g->n_kv, sizeof *g->kv, by_key);
    qsort(g->t, g->n_t, sizeof *g->t, by_name);
    for (size_t i = 1; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, g->kv[i - 1].key)) {
            cg_seterr(err, errlen, "GGUF: metadata key '%.100s' appears twice", g->kv[i].key);
            return false;
        }
    for (size_t i = 1; i < g->n_t; i++)
        if (!strcmp(g->t[i].name, g->t[i - 1].name)) {
            cg_seterr(err, errlen, "GGUF: tensor '%.100s' appears twice", g->t[i].name);
            return false;
        }
    return true;
}

static bool parse(cg_gguf *g, char *err, size_t errlen)
{
    cur c = {g->map, g->map + g->map_len, err, errlen, "the header"};
    uint32_t magic, version;
    uint64_t n_t, n_kv;
    if (!rd_u32(&c, &magic)) return false;
    if (magic != GGUF_MAGIC) {
        cg_seterr(err, errlen, "not a GGUF file (the magic is not \"GGUF\")");
        return false;
    }
    if (!rd_u32(&c, &version) || !rd_u64(&c, &n_t) || !rd_u64(&c, &n_kv)) return false;
    if (version != 2 && version != 3) {
        cg_seterr(err, errlen, "GGUF version %u is not supported (2 and 3 are)", version);
        return false;
    }
    if (n_t > MAX_ENTRIES || n_kv > MAX_ENTRIES) {
        cg_seterr(err, errlen, "GGUF: %llu tensors and %llu metadata keys (at most %u each)",
                  (unsigned long long)n_t, (unsigned long long)n_kv, MAX_ENTRIES);
        return false;
    }
    /* a key takes at least 13 bytes and a tensor's entry 33: counts the file cannot hold are
     * refused before anything is allocated for them */
    if (n_kv * 13 + n_t * 33 > (uint64_t)(c.end - c.p)) {
        cg_seterr(err, errlen, "GGUF: %llu tensors and %llu metadata keys do not fit in the file",
                  (unsigned long long)n_t, (unsigned long long)n_kv);
        return false;
    }
    g->kv = cg_calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    for (g->n_kv = 0; g->n_kv < n_kv; g->n_kv++)
        if (!read_kv(&c, &g->kv[g->n_kv])) {
            g->n_kv++; /* its key and strings are freed with the rest */
            return false;
        }
    uint64_t align = 32;
    for (size_t i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, "general.alignment")) {
            int64_t a = -1;
            if (g->kv[i].type == CG_GGUF_U32) {
                uint32_t v;
                memcpy(&v, g->kv[i].data, 4);
                a = v;
            }
            /* the format asks for a multiple of 8, so that every element type is aligned
             * in place; the F32 and 16-bit weights are used where they lie */
            if (a < 8 || a > 65536 || (a & (a - 1))) {
                cg_seterr(err, errlen,
                          "GGUF: general.alignment must be a u32 power of two from 8 to "
                          "65536");
                return false;
            }
            align = (uint64_t)a;
        }
    uint64_t *offs = cg_malloc((n_t ? n_t : 1) * sizeof *offs);
    g->t = cg_calloc(n_t ? n_t : 1, sizeof *g->t);
    bool ok = true;
    for (g->n_t = 0; g->n_t < n_t && ok; g->n_t++)
        ok = read_tensor_info(&c, &g->t[g->n_t], &offs[g->n_t]);
    size_t hdr = (size_t)(c.p - g->map);
    size_t data_off = (size_t)((hdr + align - 1) / align * align);
    if (ok && data_off > g->map_len && n_t) {
        cg_seterr(err, errlen, "GGUF: the data section starts past the end of the file");
        ok = false;
    }
    for (size_t i = 0; i < g->n_t && ok; i++) {
        if (offs[i] > g->map_len - data_off) {
            cg_seterr(err, errlen, "GGUF: tensor '%.100s' starts past the end of the file",
                      g->t[i].name);
            ok = false;
            break;
        }
        g->t[i].data = g->map + data_off + offs[i];
    }
    free(offs);
    return ok && check_layout(g, g->map + data_off, align, err, errlen);
}

cg_status cg_gguf_open(const char *path, cg_gguf **out, char *err, size_t errlen)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        cg_seterr(err, errlen, "%s: %s", path, strerror(errno));
        return CG_E_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 24) {
        cg_seterr(err, errlen, "%s: not a GGUF file (too short, or not a regular file)", path);
        close(fd);
        return CG_E_VALUE;
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        cg_seterr(err, errlen, "%s: mmap: %s", path, strerror(errno));
        return CG_E_IO;
    }
    cg_gguf *g = cg_calloc(1, sizeof *g);
    g->map = map;
    g->map_len = (size_t)sb.st_size;
    if (!parse(g, err, errlen)) {
        cg_gguf_close(&g);
        return CG_E_VALUE;
    }
    *out = g;
    return CG_OK;
}

void cg_gguf_close(cg_gguf **gp)
{
    cg_gguf *g = *gp;
    if (!g) return;
    *gp = NULL;
    for (size_t i = 0; i < g->n_kv; i++) {
        free((char *)g->kv[i].key);
        free(g->kv[i].str);
    }
    for (size_t i = 0; i < g->n_t; i++)
        free((char *)g->t[i].name);
    free(g->kv);
    free(g->t);
    munmap((void *)g->map, g->map_len);
    free(g);
}

void cg_gguf_drop(const cg_gguf *g, const cg_gguf_tensor *t)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)t->data + page - 1) & ~(page - 1);
    const uintptr_t hi = ((uintptr_t)t->data + t->nbytes) & ~(page - 1);
    if ((const uint8_t *)lo < g->map || hi > (uintptr_t)g->map + g->map_len || hi <= lo) return;
    madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: a failure leaves the pages mapped */
}

/* ---- lookups ---- */

const cg_gguf_kv *cg_gguf_find(const cg_gguf *g, const char *key)
{
    cg_gguf_kv k = {.key = key};
    return bsearch(&k, g->kv, g->n_kv, sizeof *g->kv, by_key);
}

/* n (at most 8) little-endian bytes at p, zero-extended (this file builds only on
 * little-endian hosts). */
static uint64_t load_le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    memcpy(&v, p, n);
    return v;
}

static int64_t scalar_int(cg_gguf_vtype t, const uint8_t *p, int *ok)
{
    *ok = 1;
    switch (t) {
    case CG_GGUF_U8:
    case CG_GGUF_BOOL:
        return *p;
    case CG_GGUF_I8:
        return (int8_t)*p;
    case CG_GGUF_U16:
        return (uint16_t)load_le(p, 2);
    case CG_GGUF_I16:
        return (int16_t)load_le(p, 2);
    case CG_GGUF_U32:
        return (uint32_t)load_le(p, 4);
    case CG_GGUF_I32:
        return (int32_t)load_le(p, 4);
    case CG_GGUF_U64: {
        const uint64_t v = load_le(p, 8);
        if (v > INT64_MAX) break;
        return (int64_t)v;
    }
    case CG_GGUF_I64:
        return (int64_t)load_le(p, 8);
    default:
        break;
    }
    *ok = 0;
    return 0;
}

int cg_gguf_get_int(const cg_gguf *g, const char *key, int64_t *out)
{
    const cg_gguf_kv *kv = cg_gguf_find(g, key);
    if (!kv) return -1;
    int ok;
    int64_t v = scalar_int(kv->type, kv->data, &ok);
    if (!ok) return -1;
    *out = v;
    return 0;
}

int cg_gguf_get_float(const cg_gguf *g, const char *key, double *out)
{
    const cg_gguf_kv *kv = cg_gguf_find(g, key);
    if (!kv) return -1;
    if (kv->type == CG_GGUF_F32) {
        float f;
        memcpy(&f, kv->data, 4);
        *out = f;
        return 0;
    }
    if (kv->type == CG_GGUF_F64) {
        memcpy(out, kv->data, 8);
        return 0;
    }
    int64_t v;
    if (cg_gguf_get_int(g, key, &v) != 0) return -1;
    *out = (double)v;
    return 0;
}

const char *cg_gguf_get_str(const cg_gguf *g, const char *key, size_t *len)
{
    const cg_gguf_kv *kv = cg_gguf_find(g, key);
    if (!kv || kv->type != CG_GGUF_STRING) return NULL;
    uint64_t n;
    memcpy(&n, kv->data, 8);
    *len = (size_t)n;
    return (const char *)kv->data + 8;
}

const char *cg_gguf_arr_str(const cg_gguf_kv *kv, uint64_t i, size_t *len)
{
    uint64_t n;
    memcpy(&n, kv->str[i], 8);
    *len = (size_t)n;
    return (const char *)kv->str[i] + 8;
}

int64_t cg_gguf_arr_int(const cg_gguf_kv *kv, uint64_t i)
{
    int ok;
    int64_t v = scalar_int(kv->atype, kv->data + i * scalar_size(kv->atype), &ok);
    return ok ? v : 0;
}

float cg_gguf_arr_f32(const cg_gguf_kv *kv, uint64_t i)
{
    float f = 0;
    if (kv->atype == CG_GGUF_F32) memcpy(&f, kv->data + i * 4, 4);
    return f;
}

size_t cg_gguf_n_kv(const cg_gguf *g)
{
    return g->n_kv;
}

const cg_gguf_kv *cg_gguf_kv_at(const cg_gguf *g, size_t i)
{
    return &g->kv[i];
}

size_t cg_gguf_n_tensors(const cg_gguf *g)
{
    return g->n_t;
}

const cg_gguf_tensor *cg_gguf_tensor_at(const cg_gguf *g, size_t i)
{
    return &g->t[i];
}

const cg_gguf_tensor *cg_gguf_find_tensor(const cg_gguf *g, const char *name)
{
    cg_gguf_tensor k = {.name = name};
    return bsearch(&k, g->t, g->n_t, sizeof *g->t, by_name);
}
