/* GGUF reader (the llama.cpp checkpoint format, versions 2 and 3), internal to the worker: the
 * file is mapped and every header field is checked before anything touches tensor data, so a
 * hostile or damaged file yields an error, never a crash. Layout: magic "GGUF", version,
 * tensor count, key/value count; the key/value metadata; the tensor infos (name, dims with the
 * fastest-moving first, ggml type, offset); then, at general.alignment (32 by default), the data
 * section the offsets are relative to. The model loader (model_gguf.c) turns the metadata into
 * a config and a tokenizer and places the tensors. */
#ifndef CG_GGUF_H
#define CG_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Metadata value types. */
typedef enum {
    CG_GGUF_U8 = 0,
    CG_GGUF_I8 = 1,
    CG_GGUF_U16 = 2,
    CG_GGUF_I16 = 3,
    CG_GGUF_U32 = 4,
    CG_GGUF_I32 = 5,
    CG_GGUF_F32 = 6,
    CG_GGUF_BOOL = 7,
    CG_GGUF_STRING = 8,
    CG_GGUF_ARRAY = 9,
    CG_GGUF_U64 = 10,
    CG_GGUF_I64 = 11,
    CG_GGUF_F64 = 12
} cg_gguf_vtype;

/* The ggml tensor types the worker loads; every other type reads but is refused by the loader,
 * named by cg_gguf_type_name. */
#define CG_GGML_F32 0
#define CG_GGML_F16 1
#define CG_GGML_Q4_0 2
#define CG_GGML_Q8_0 8
#define CG_GGML_BF16 30

/* One metadata entry. Scalars: read them with the getters below. Arrays: atype and n, and the
 * elements at data (strings: through cg_gguf_arr_str). */
typedef struct cg_gguf_kv {
    const char *key; /* NUL-terminated copy */
    cg_gguf_vtype type;
    cg_gguf_vtype atype; /* arrays only */
    uint64_t n;          /* arrays only: the element count */
    const uint8_t *data; /* the value (arrays: the first element) inside the mapping */
    const uint8_t **str; /* string arrays: each element's length prefix, n of them */
} cg_gguf_kv;

#define CG_GGUF_MAX_DIMS 4

typedef struct cg_gguf_tensor {
    const char *name; /* NUL-terminated copy */
    uint32_t type;    /* ggml type */
    int ndim;
    int64_t ne[CG_GGUF_MAX_DIMS]; /* ne[0] is the fastest-moving dimension (columns) */
    int64_t numel;
    const uint8_t *data; /* inside the mapping, at the file's alignment */
    size_t nbytes;       /* for the types the worker loads; else the bytes up to the next tensor */
} cg_gguf_tensor;

typedef struct cg_gguf cg_gguf;

/* Maps path and validates it: magic, version 2 or 3, every key and string inside the file,
 * known value types, array sizes, unique keys and tensor names, at most 4 dims, tensor data
 * inside the data section, aligned, sized for its type (F32, F16, BF16, Q8_0, Q4_0) and not
 * overlapping another. CG_E_IO (cannot open or map), CG_E_VALUE (malformed, with the field in
 * err). Close with cg_gguf_close. */
cg_status cg_gguf_open(const char *path, cg_gguf **out, char *err, size_t errlen) CG_WUR;
void cg_gguf_close(cg_gguf **g);

/* The metadata entries, in the order of their keys. */
size_t cg_gguf_n_kv(const cg_gguf *g);
const cg_gguf_kv *cg_gguf_kv_at(const cg_gguf *g, size_t i);
/* The entry called key, or NULL. */
const cg_gguf_kv *cg_gguf_find(const cg_gguf *g, const char *key);
/* Integer scalar (any integer type, or bool) into *out: 0, or -1 when absent, of another type
 * or out of int64 range. */
int cg_gguf_get_int(const cg_gguf *g, const char *key, int64_t *out);
/* F32 or F64 scalar (integers too) into *out: 0, or -1. */
int cg_gguf_get_float(const cg_gguf *g, const char *key, double *out);
/* A string scalar (not NUL-terminated: *len bytes), or NULL when absent or not a string. */
const char *cg_gguf_get_str(const cg_gguf *g, const char *key, size_t *len);
/* Element i of a string array (*len bytes). */
const char *cg_gguf_arr_str(const cg_gguf_kv *kv, uint64_t i, size_t *len);
/* Element i of an integer array as int64 (0 for other element types). */
int64_t cg_gguf_arr_int(const cg_gguf_kv *kv, uint64_t i);
/* Element i of an F32 array. */
float cg_gguf_arr_f32(const cg_gguf_kv *kv, uint64_t i);

size_t cg_gguf_n_tensors(const cg_gguf *g);
const cg_gguf_tensor *cg_gguf_tensor_at(const cg_gguf *g, size_t i);
const cg_gguf_tensor *cg_gguf_find_tensor(const cg_gguf *g, const char *name);
/* t's bytes have been copied out: the whole pages of the mapping inside them leave the
 * process's memory (MADV_DONTNEED on a private read-only mapping: reading them again reads
 * the file). A quantised checkpoint repacked at load then holds its weights once, not twice. */
void cg_gguf_drop(const cg_gguf *g, const cg_gguf_tensor *t);

/* "F32", "Q6_K", ... for a ggml type; "unknown (N)" (static buffer per thread) otherwise. */
const char *cg_gguf_type_name(uint32_t type);

#endif
