/* Minimal safetensors reader (mmap, validated header) and writer, internal to the reference
 * worker. Format: 8-byte little-endian header length, a JSON header mapping tensor names to
 * {dtype, shape, data_offsets}, then the data section the offsets are relative to. */
#ifndef CG_SAFETENSORS_H
#define CG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include "base/status.h"

/* Largest header the reader accepts (real checkpoints stay far below this). */
#define CG_ST_MAX_HEADER (100u * 1024u * 1024u)
#define CG_ST_MAX_DIMS 8

/* The dtypes the model can use; every other known safetensors dtype reads as CG_ST_OTHER. */
typedef enum { CG_ST_F32, CG_ST_F16, CG_ST_BF16, CG_ST_OTHER } cg_st_dtype;

typedef struct cg_st_tensor {
    const char *name; /* owned by the file */
    cg_st_dtype dtype;
    const char *dtype_str; /* as written in the header, e.g. "F32" or "I8" */
    int ndim;
    int64_t shape[CG_ST_MAX_DIMS];
    size_t numel;
    const uint8_t *data; /* inside the mapping; not aligned in general */
    size_t nbytes;
} cg_st_tensor;

typedef struct cg_st_file cg_st_file;

/* Maps path and validates the whole header: sizes, dtypes (unknown -> CG_E_VALUE), shapes,
 * data_offsets inside the data section, byte counts equal to numel * element size, no two
 * tensors overlapping. Returns CG_E_IO (cannot open/read), CG_E_VALUE (malformed), CG_E_JSON
 * (header not JSON) or CG_E_TYPE (a field of the wrong JSON type), with a message in err.
 * Caller closes with cg_st_close. */
cg_status cg_st_open(const char *path, cg_st_file **out, char *err, size_t errlen) CG_WUR;
void cg_st_close(cg_st_file **f);
/* Tensors in name order (i < cg_st_count), borrowed from the file. */
size_t cg_st_count(const cg_st_file *f);
const cg_st_tensor *cg_st_at(const cg_st_file *f, size_t i);
/* The tensor called name, or NULL. */
const cg_st_tensor *cg_st_find(const cg_st_file *f, const char *name);
/* Converts t (F32, F16 or BF16) into dst, numel floats. CG_E_UNSUPPORTED for other dtypes. */
cg_status cg_st_to_f32(const cg_st_tensor *t, float *dst) CG_WUR;

/* "F32" / "F16" / "BF16" for the three model dtypes; "f32"/"f16"/"bf16" names parse. */
const char *cg_st_dtype_name(cg_st_dtype d);
/* Parses "f32"/"f16"/"bf16" (any case); returns -1 if unknown. */
int cg_st_dtype_parse(const char *s, cg_st_dtype *out);
size_t cg_st_dtype_size(cg_st_dtype d);

/* One tensor to write: name and shape are borrowed for the call. */
typedef struct cg_st_spec {
    const char *name;
    cg_st_dtype dtype;
    int ndim;
    int64_t shape[CG_ST_MAX_DIMS];
} cg_st_spec;

/* Writes the length prefix and header for specs (data laid out in spec order, header padded
 * with spaces to 8 bytes). The caller then writes each tensor's data in the same order with
 * cg_st_write_data. Deterministic: the same specs give the same bytes. */
cg_status cg_st_write_header(FILE *fp, const cg_st_spec *specs, size_t n, char *err,
                             size_t errlen) CG_WUR;
/* Writes n floats converted to dtype (round to nearest even). */
cg_status cg_st_write_data(FILE *fp, cg_st_dtype dtype, const float *x, size_t n) CG_WUR;

/* Conversions. Widening is exact and inline: the weight products' kernels use it too. */
static inline float cg_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    float f;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in float */
        f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    if (exp == 31)
        bits = sign | 0x7f800000u | (man << 13);
    else
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    memcpy(&f, &bits, 4);
    return f;
}
static inline float cg_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
/* n 16-bit values at src (bf16 when bf16, else f16; any alignment) widened into dst. */
void cg_widen16(const void *src, size_t n, int bf16, float *dst);
uint16_t cg_f32_to_f16(float f);
uint16_t cg_f32_to_bf16(float f);

#endif
