/* safetensors reader and writer: the reader maps the file and checks every header field before
 * anything touches tensor data, so a hostile or damaged file yields an error, never a crash. */
#include "worker/model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

struct cg_st_file {
    const uint8_t *map;
    size_t map_len;
    json_t *header; /* owns the names and dtype strings the tensors point to */
    cg_st_tensor *t;
    size_t n;
};

/* Every dtype the format defines, so that an unknown string is an error and a known but
 * unusable one can be reported as unsupported by the model. */
static const struct {
    const char *name;
    size_t size;
    cg_st_dtype dtype;
} dtypes[] = {
    {"F32", 4, CG_ST_F32},       {"F16", 2, CG_ST_F16},       {"BF16", 2, CG_ST_BF16},
    {"F64", 8, CG_ST_OTHER},     {"I64", 8, CG_ST_OTHER},     {"U64", 8, CG_ST_OTHER},
    {"I32", 4, CG_ST_OTHER},     {"U32", 4, CG_ST_OTHER},     {"I16", 2, CG_ST_OTHER},
    {"U16", 2, CG_ST_OTHER},     {"I8", 1, CG_ST_OTHER},      {"U8", 1, CG_ST_OTHER},
    {"BOOL", 1, CG_ST_OTHER},    {"F8_E4M3", 1, CG_ST_OTHER}, {"F8_E5M2", 1, CG_ST_OTHER},
    {"F8_E8M0", 1, CG_ST_OTHER},
};

const char *cg_st_dtype_name(cg_st_dtype d)
{
    static const char *const names[] = {
        [CG_ST_F32] = "F32", [CG_ST_F16] = "F16", [CG_ST_BF16] = "BF16"};
    return (unsigned)d < CG_ARRAY_LEN(names) ? names[d] : "OTHER";
}

int cg_st_dtype_parse(const char *s, cg_st_dtype *out)
{
    if (!s) return -1;
    if (!strcasecmp(s, "f32") || !strcasecmp(s, "float32"))
        *out = CG_ST_F32;
    else if (!strcasecmp(s, "f16") || !strcasecmp(s, "float16"))
        *out = CG_ST_F16;
    else if (!strcasecmp(s, "bf16") || !strcasecmp(s, "bfloat16"))
        *out = CG_ST_BF16;
    else
        return -1;
    return 0;
}

size_t cg_st_dtype_size(cg_st_dtype d)
{
    return d == CG_ST_F32 ? 4 : d == CG_ST_OTHER ? 0 : 2;
}

/* ---- conversions ---- */

uint16_t cg_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN stays NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {
        /* below the smallest normal half: the subnormal mantissa is round(|f| * 2^24); the
         * scaling is exact and nearbyintf rounds to nearest even; 0x400 is the smallest normal */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint16_t)nearbyintf(a * 0x1p24f));
    }
    uint32_t v = ax - (112u << 23);
    v += 0xfffu + ((v >> 13) & 1u);
    return (uint16_t)(sign | (v >> 13));
}

uint16_t cg_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Widens n 16-bit floats at p (unaligned; bf16 when bf16, else f16) into dst. Inlined with a
 * constant bf16, so each loop converts without a branch. */
void cg_widen16(const void *src, size_t n, int bf16, float *dst)
{
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16 ? cg_bf16_to_f32(h) : cg_f16_to_f32(h);
    }
}

cg_status cg_st_to_f32(const cg_st_tensor *t, float *dst)
{
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case CG_ST_F32:
        memcpy(dst, p, t->numel * 4);
        return CG_OK;
    case CG_ST_F16:
        cg_widen16(p, t->numel, 0, dst);
        return CG_OK;
    case CG_ST_BF16:
        cg_widen16(p, t->numel, 1, dst);
        return CG_OK;
    default:
        return CG_E_UNSUPPORTED;
    }
}

/* ---- reader ---- */

static int cmp_begin(const void *a, const void *b)
{
    const cg_st_tensor *x = *(const cg_st_tensor *const *)a, *y = *(const cg_st_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const cg_st_tensor *)a)->name, ((const cg_st_tensor *)b)->name);
}

/* Validates one header entry and fills t. data/data_len: the data section. */
static cg_status parse_entry(const char *path, const char *name, json_t *v, const uint8_t *data,
                             size_t data_len, cg_st_tensor *t, char *err, size_t errlen)
{
    if (!json_is_object(v)) {
        cg_seterr(err, errlen, "%s: tensor '%s': header entry is not an object", path, name);
        return CG_E_TYPE;
    }
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!jd || !js || !jo) {
        cg_seterr(err, errlen, "%s: tensor '%s': missing '%s'", path, name,
                  !jd   ? "dtype"
                  : !js ? "shape"
                        : "data_offsets");
        return CG_E_MISSING;
    }
    if (!json_is_string(jd)) {
        cg_seterr(err, errlen, "%s: tensor '%s': dtype is not a string", path, name);
        return CG_E_TYPE;
    }
    const char *ds = json_string_value(jd);
    size_t esize = 0;
    t->dtype = CG_ST_OTHER;
    t->dtype_str = NULL;
    for (size_t i = 0; i < CG_ARRAY_LEN(dtypes); i++) {
        if (!strcmp(ds, dtypes[i].name)) {
            esize = dtypes[i].size;
            t->dtype = dtypes[i].dtype;
            t->dtype_str = dtypes[i].name;
        }
    }
    if (!t->dtype_str) {
        cg_seterr(err, errlen, "%s: tensor '%s': unknown dtype '%.32s'", path, name, ds);
        return CG_E_VALUE;
    }
    if (!json_is_array(js) || json_array_size(js) > CG_ST_MAX_DIMS) {
        cg_seterr(err, errlen, "%s: tensor '%s': shape is not an array of at most %d dims", path,
                  name, CG_ST_MAX_DIMS);
        return json_is_array(js) ? CG_E_VALUE : CG_E_TYPE;
    }
    t->ndim = (int)json_array_size(js);
    size_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(js, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0) {
            cg_seterr(err, errlen, "%s: tensor '%s': shape[%d] is not a non-negative integer", path,
                      name, i);
            return json_is_integer(d) ? CG_E_VALUE : CG_E_TYPE;
        }
        t->shape[i] = json_integer_value(d);
        if (__builtin_mul_overflow(numel, (size_t)t->shape[i], &numel)) {
            cg_seterr(err, errlen, "%s: tensor '%s': shape is too large", path, name);
            return CG_E_VALUE;
        }
    }
    size_t nbytes;
    if (__builtin_mul_overflow(numel, esize, &nbytes)) {
        cg_seterr(err, errlen, "%s: tensor '%s': shape is too large", path, name);
        return CG_E_VALUE;
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1))) {
        cg_seterr(err, errlen, "%s: tensor '%s': data_offsets is not an array of two integers",
                  path, name);
        return CG_E_TYPE;
    }
    json_int_t b = json_integer_value(json_array_get(jo, 0)),
               e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b) {
        cg_seterr(err, errlen,
                  "%s: tensor '%s': data_offsets [%lld, %lld] are not an ordered range", path, name,
                  (long long)b, (long long)e);
        return CG_E_VALUE;
    }
    if ((uint64_t)e > data_len) {
        cg_seterr(
            err, errlen,
            "%s: tensor '%s': data_offsets [%lld, %lld] extend beyond the data section of %zu "
            "bytes (file truncated?)",
            path, name, (long long)b, (long long)e, data_len);
        return CG_E_VALUE;
    }
    if ((uint64_t)(e - b) != nbytes) {
        cg_seterr(err, errlen,
                  "%s: tensor '%s': data_offsets cover %lld bytes but shape and dtype %s need %zu",
                  path, name, (long long)(e - b), t->dtype_str, nbytes);
        return CG_E_VALUE;
    }
    t->name = name;
    t->numel = numel;
    t->nbytes = nbytes;
    t->data = data + b;
    return CG_OK;
}

cg_status cg_st_open(const char *path, cg_st_file **out, char *err, size_t errlen)
{
    cg_status st = CG_OK;
    cg_st_file *f = cg_calloc(1, sizeof *f);
    cg_st_tensor **order = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *out = NULL;
    if (fd < 0) {
        cg_seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        st = CG_E_IO;
        goto out;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        cg_seterr(err, errlen, "%s: not a regular file", path);
        st = CG_E_IO;
        goto out;
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        cg_seterr(err, errlen, "%s: file is %zu bytes, too short for the 8-byte header length",
                  path, size);
        st = CG_E_VALUE;
        goto out;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        cg_seterr(err, errlen, "%s: cannot map: %s", path, strerror(errno));
        st = CG_E_IO;
        goto out;
    }
    f->map = map;
    f->map_len = size;
    uint64_t hl;
    memcpy(&hl, f->map, 8);
    if (hl > size - 8) {
        cg_seterr(err, errlen, "%s: header length %llu exceeds the file size %zu (file truncated?)",
                  path, (unsigned long long)hl, size);
        st = CG_E_VALUE;
        goto out;
    }
    if (hl > CG_ST_MAX_HEADER) {
        cg_seterr(err, errlen, "%s: header length %llu exceeds the limit of %u bytes", path,
                  (unsigned long long)hl, CG_ST_MAX_HEADER);
        st = CG_E_VALUE;
        goto out;
    }
    json_error_t jerr;
    f->header = json_loadb((const char *)f->map + 8, (size_t)hl, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->header) {
        cg_seterr(err, errlen, "%s: header is not valid JSON: %s (offset %d)", path, jerr.text,
                  jerr.position);
        st = CG_E_JSON;
        goto out;
    }
    if (!json_is_object(f->header)) {
        cg_seterr(err, errlen, "%s: header is not a JSON object", path);
        st = CG_E_TYPE;
        goto out;
    }
    const uint8_t *data = f->map + 8 + hl;
    size_t data_len = size - 8 - (size_t)hl;
    f->t = cg_calloc(json_object_size(f->header) + 1, sizeof *f->t);
    const char *name;
    json_t *v;
    json_object_foreach(f->header, name, v)
    {
        if (!strcmp(name, "__metadata__")) continue;
        st = parse_entry(path, name, v, data, data_len, &f->t[f->n], err, errlen);
        if (st != CG_OK) goto out;
        f->n++;
    }
    /* sorted by name for cg_st_find; the names point into the header, which stays put */
    qsort(f->t, f->n, sizeof *f->t, cmp_name);
    /* Tensors may not share bytes: a crafted header could otherwise alias weights. */
    order = cg_malloc((f->n + 1) * sizeof *order);
    for (size_t i = 0; i < f->n; i++)
        order[i] = &f->t[i];
    qsort(order, f->n, sizeof *order, cmp_begin);
    const cg_st_tensor *prev = NULL;
    for (size_t i = 0; i < f->n; i++) {
        if (!order[i]->nbytes) continue;
        if (prev && prev->data + prev->nbytes > order[i]->data) {
            cg_seterr(err, errlen, "%s: tensors '%s' and '%s' overlap in the data section", path,
                      prev->name, order[i]->name);
            st = CG_E_VALUE;
            goto out;
        }
        prev = order[i];
    }
    *out = f;
    f = NULL;
out:
    if (fd >= 0) close(fd);
    cg_free(&order);
    cg_st_close(&f);
    return st;
}

void cg_st_close(cg_st_file **pf)
{
    cg_st_file *f = *pf;
    if (!f) return;
    if (f->map) munmap((void *)f->map, f->map_len);
    json_decref(f->header);
    free(f->t);
    free(f);
    *pf = NULL;
}

size_t cg_st_count(const cg_st_file *f)
{
    return f->n;
}
const cg_st_tensor *cg_st_at(const cg_st_file *f, size_t i)
{
    return i < f->n ? &f->t[i] : NULL;
}

const cg_st_tensor *cg_st_find(const cg_st_file *f, const char *name)
{
    cg_st_tensor key = {.name = name};
    return f->n ? bsearch(&key, f->t, f->n, sizeof *f->t, cmp_name) : NULL;
}

/* ---- writer ---- */

cg_status cg_st_write_header(FILE *fp, const cg_st_spec *specs, size_t n, char *err, size_t errlen)
{
    cg_status st = CG_OK;
    char *text = NULL;
    json_t *root = json_object();
    json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt"));
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t numel = 1;
        json_t *shape = json_array();
        for (int d = 0; d < specs[i].ndim; d++) {
            numel *= (size_t)specs[i].shape[d];
            json_array_append_new(shape, json_integer(specs[i].shape[d]));
        }
        size_t nbytes = numel * cg_st_dtype_size(specs[i].dtype);
        json_object_set_new(root, specs[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype",
                                      cg_st_dtype_name(specs[i].dtype), "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + nbytes)));
        off += nbytes;
    }
    /* Insertion order is kept by jansson, so the same specs always dump the same text. */
    text = json_dumps(root, JSON_COMPACT);
    if (!text) {
        cg_seterr(err, errlen, "cannot encode the safetensors header");
        st = CG_E_INTERNAL;
        goto out;
    }
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    uint64_t hl = padded;
    if (fwrite(&hl, 8, 1, fp) != 1 || fwrite(text, 1, len, fp) != len) goto io;
    for (size_t i = len; i < padded; i++)
        if (fputc(' ', fp) == EOF) goto io;
    goto out;
io:
    cg_seterr(err, errlen, "cannot write the safetensors header: %s", strerror(errno));
    st = CG_E_IO;
out:
    free(text);
    json_decref(root);
    return st;
}

cg_status cg_st_write_data(FILE *fp, cg_st_dtype dtype, const float *x, size_t n)
{
    if (dtype == CG_ST_F32) return fwrite(x, 4, n, fp) == n ? CG_OK : CG_E_IO;
    uint16_t buf[1024];
    for (size_t i = 0; i < n;) {
        size_t k = CG_MIN(n - i, CG_ARRAY_LEN(buf));
        for (size_t j = 0; j < k; j++)
            buf[j] = dtype == CG_ST_F16 ? cg_f32_to_f16(x[i + j]) : cg_f32_to_bf16(x[i + j]);
        if (fwrite(buf, 2, k, fp) != k) return CG_E_IO;
        i += k;
    }
    return CG_OK;
}
