/* The model's insides, shared by its files: model.c (loading) and forward.c (the forward
 * pass). Not a public interface. */
#ifndef CG_MODEL_IMPL_H
#define CG_MODEL_IMPL_H

#include <stdint.h>

#include "base/base.h"
#include "worker/model/gguf.h"
#include "worker/model/matmul.h"
#include "worker/model/model.h"
#include "worker/model/safetensors.h"

typedef struct layer_w {
    float *attn_norm, *ffn_norm;    /* [dim], f32 */
    float *bq, *bk, *bv;            /* Qwen2: [q_dim], [kv_dim], [kv_dim]; else NULL */
    float *q_norm, *k_norm;         /* Qwen3: [head_dim]; else NULL */
    cg_weight wq, wk, wv, wo;       /* [q_dim][dim], [kv_dim][dim] x2, [dim][q_dim] */
    cg_weight w_gate, w_up, w_down; /* [hidden][dim] x2, [dim][hidden] */
} layer_w;

struct cg_model {
    cg_model_config cfg;
    cg_st_file **files; /* mapped for the model's lifetime: 16-bit matrices are used in place */
    char **file_names;
    size_t n_files;
    cg_gguf *gguf;     /* a GGUF checkpoint instead of the files: mapped for the lifetime; the
                        * pages of tensors copied out are dropped (cg_gguf_drop) */
    void *arena;       /* f32 copies: vectors, and f32 matrices at an odd address */
    void *qarena;      /* --quant: every matrix's blocks and scales; the files are then closed */
    cg_weight embed;   /* [vocab][dim]; lookups dequantise its rows under --quant */
    cg_weight lm_head; /* [vocab][dim]; the embedding when tied */
    float *norm;       /* [dim] */
    layer_w *layers;
    cg_tokenizer *tok;
    size_t weight_bytes;
};

/* One tensor the architecture needs, by its Hugging Face name: where it goes and its shape
 * (d1 == 0: a vector). */
typedef struct cg_wspec {
    char name[96];
    int64_t d0, d1;
    cg_weight *mat; /* a matrix, kept in its dtype */
    float **vec;    /* a vector: copied to f32 */
} cg_wspec;

typedef struct cg_wlist {
    cg_wspec *v;
    size_t n, cap;
} cg_wlist;

/* id joins c's stop ids (ignored outside the vocabulary, when present, or when the list is
 * full). */
void cg_model_add_eos(cg_model_config *c, int64_t id);
/* After the tokenizer is open, from whatever files: its EOS joins the stop ids, and its BOS is
 * the model's when the config names none. */
void cg_model_take_tokenizer_ids(cg_model_config *c, const cg_tokenizer *t);

/* n rounded up to a multiple of 64 (a cache line, the kernels' widest load). */
static inline size_t cg_round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}
/* A fresh allocation (cg_malloc) with n bytes at a 64-byte aligned address, which it returns;
 * *raw gets the pointer to free. */
static inline void *cg_alloc64(void **raw, size_t n)
{
    *raw = cg_malloc(n + 64);
    return (void *)(((uintptr_t)*raw + 63) & ~(uintptr_t)63);
}
/* What a quantised matrix takes in m->qarena: its nq bytes of blocks, then its ns f16 block
 * scales, each 64-byte aligned. */
static inline size_t cg_qarena_bytes(size_t nq, size_t ns)
{
    return cg_round64(nq) + cg_round64(ns * 2);
}
/* The next quantised matrix's place at *cursor in m->qarena, laid out as cg_qarena_bytes says:
 * returns its blocks, sets *scales, and moves *cursor past both. */
static inline void *cg_qarena_take(char **cursor, size_t nq, size_t ns, uint16_t **scales)
{
    char *q = *cursor;
    *scales = (uint16_t *)(void *)(q + cg_round64(nq));
    *cursor = q + cg_qarena_bytes(nq, ns);
    return q;
}

/* ---- GGUF checkpoints (model_gguf.c) ---- */

/* 1 when path names a GGUF file (a regular file ending in .gguf). */
int cg_model_is_gguf(const char *path);
/* Opens the GGUF at path into m->gguf and reads its config (m->cfg) and tokenizer (m->tok)
 * from the metadata. */
cg_status cg_gguf_model_open(cg_model *m, const char *path, char *err, size_t errlen);
/* Places every tensor of l from m->gguf: 16-bit and f32 matrices in place, Q8_0 / Q4_0 ones
 * repacked into m->qarena, vectors copied to f32; refuses a type or a tensor it cannot use. */
cg_status cg_gguf_place_tensors(cg_model *m, const cg_wlist *l, char *err, size_t errlen);

/* 1 when kv was made for a model of m's geometry. */
int cg_kv_matches(const cg_kv *kv, const cg_model *m);

#endif
