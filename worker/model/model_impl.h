/* The model's insides, shared by its files: model.c (loading) and forward.c (the forward
 * pass). Not a public interface. */
#ifndef CG_MODEL_IMPL_H
#define CG_MODEL_IMPL_H

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
    void *arena;       /* f32 copies: vectors, and f32 matrices at an odd address */
    void *qarena;      /* --quant: every matrix's blocks and scales; the files are then closed */
    cg_weight embed;   /* [vocab][dim]; lookups dequantise its rows under --quant */
    cg_weight lm_head; /* [vocab][dim]; the embedding when tied */
    float *norm;       /* [dim] */
    layer_w *layers;
    cg_tokenizer *tok;
    size_t weight_bytes;
};

/* 1 when kv was made for a model of m's geometry. */
int cg_kv_matches(const cg_kv *kv, const cg_model *m);

#endif
