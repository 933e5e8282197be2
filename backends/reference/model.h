/* The reference worker's model: a Llama-architecture transformer on the CPU (RMSNorm, RoPE,
 * grouped-query attention, SwiGLU, CBLAS), loaded from an HF-style directory
 * (config.json + model.safetensors), plus the deterministic tiny-model generator, the
 * byte-level tokenizer and sampling. */
#ifndef CG_MODEL_H
#define CG_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "cache/status.h"
#include "cache/remap.h"
#include "cache/attn.h"

typedef struct cg_model_config {
    char model_id[128];   /* "name" from config.json "_name_or_path"/"model_id", else dir name */
    int vocab_size;
    int dim;              /* hidden_size */
    int hidden_dim;       /* intermediate_size */
    int n_layers;         /* num_hidden_layers */
    int n_heads;          /* num_attention_heads */
    int n_kv_heads;       /* num_key_value_heads */
    int head_dim;         /* dim / n_heads unless "head_dim" is given */
    int max_pos;          /* max_position_embeddings */
    double rope_theta;
    float norm_eps;       /* rms_norm_eps */
    cg_rope_style rope_style; /* "rope_style": "half" (default, HF) or "interleaved" */
    int tie_embeddings;   /* tie_word_embeddings */
    int bos_id, eos_id;
    char dtype[8];        /* storage dtype in the file: "f32", "f16", "bf16" */
} cg_model_config;

typedef struct cg_model cg_model;

/* Loads dir/config.json and dir/model.safetensors (mmapped; f16/bf16 converted to f32 at
 * load). On failure returns a status and writes a message naming the problem into err
 * (missing tensor, wrong shape or dtype, truncated file, unsupported rope_scaling, ...).
 * Never crashes on bad files. Caller frees with cg_model_free.
 * Side effect: sets OpenBLAS to one thread per call, process-wide; the forward and the
 * attention kernel use both cores through OpenMP instead (two thread pools spinning on the
 * same two cores slow each other down). */
cg_status cg_model_load(const char *dir, cg_model **out, char *err, size_t errlen) CG_WUR;
void cg_model_free(cg_model **m);
const cg_model_config *cg_model_cfg(const cg_model *m);
/* The rope parameters of the model (for cg_remap_rope). */
cg_rope cg_model_rope(const cg_model *m);

#define CG_GEN_MAX_EOS 4
typedef struct cg_model_gen_params {
    uint64_t seed;        /* default 1 */
    int n_layers;         /* default 4 */
    int dim;              /* default 256 */
    int n_heads;          /* default 8 */
    int n_kv_heads;       /* default 4 */
    int hidden_dim;       /* default 768 */
    int max_pos;          /* default 32768; with yarn, the pre-yarn context */
    cg_rope_style rope_style; /* default CG_ROPE_HALF; real architectures accept only half */
    const char *dtype;    /* "f32" (default), "f16" or "bf16" */
    const char *model_id; /* default "chunkgate-tiny" */
    /* Real architectures. vocab_size 0 is the tiny byte-level model (258 tokens, BOS 256,
     * EOS 257), whose bytes never change; the fields below then only add rope_scaling,
     * shards and a tokenizer. Otherwise the model is an HF checkpoint of `arch` with random
     * weights, every one exactly representable in both bf16 and f16 (0 or a bf16 value with
     * an exponent in f16's normal range), whatever the storage dtype. */
    const char *arch;     /* "LlamaForCausalLM", "Qwen2ForCausalLM" or "Qwen3ForCausalLM" */
    int vocab_size;       /* 0: tiny */
    int head_dim;         /* 0: dim / n_heads, key omitted; else written as "head_dim" */
    int tie_embeddings;   /* no lm_head.weight in the file */
    double rope_theta;    /* 0: key omitted (HF default 10000, as in Llama 2 configs) */
    double norm_eps;      /* rms_norm_eps (tiny: 1e-5) */
    /* NULL, "" or "none": rope_scaling null; "linear:F", "yarn:F", "llama3" (factor 8) or
     * "llama3:F", and "dynamic:F" (written so that loaders can be tested refusing it). */
    const char *rope_scaling;
    int bos_id;
    int eos_ids[CG_GEN_MAX_EOS]; /* n_eos > 1 writes a list, as Llama 3.1 configs do */
    int n_eos;
    const char *tokenizer_dir; /* NULL/"": none; else tokenizer.json and tokenizer_config.json
                                * are copied after checking them against vocab_size, BOS, EOS */
    int shards;           /* <= 1: model.safetensors; N: model-0000k-of-0000N.safetensors +
                           * model.safetensors.index.json */
} cg_model_gen_params;
/* The "tiny" preset. */
cg_model_gen_params cg_model_gen_default_params(void);
/* Fills *out with the named preset: "tiny", "llama3", "llama2", "qwen2", "qwen3" (small
 * geometries with the real vocabulary sizes and special ids of Llama 3.1, Llama 2, Qwen2.5 and
 * Qwen3) or "qwen2.5-0.5b" (the full Qwen2.5-0.5B geometry). Strings point to static storage.
 * Returns CG_E_VALUE for an unknown name. */
cg_status cg_model_gen_preset(const char *name, cg_model_gen_params *out) CG_WUR;
/* The preset names, NULL-terminated, static. */
const char *const *cg_model_gen_preset_names(void);
/* Writes a deterministic model (config.json + model.safetensors or shards + index, and the
 * tokenizer files when asked) into dir (created if missing; weight files of the other layout
 * left by an earlier run are removed). Same params -> same bytes. */
cg_status cg_model_generate(const char *dir, cg_model_gen_params p, char *err, size_t errlen) CG_WUR;

/* ---- tokenizer: byte-level. Token b (0..255) is byte b; BOS = 256, EOS = 257. ---- */
/* Tokenizes text into out (room for len + 1), prepending BOS if add_bos. Returns the count. */
size_t cg_tok_encode(const cg_model *m, const char *text, size_t len, int add_bos, int32_t *out);
/* Appends the bytes of token t (nothing for BOS/EOS/other specials) to out; returns count (0/1). */
size_t cg_tok_decode(const cg_model *m, int32_t t, char *out);

/* ---- KV buffer of one sequence, per-head layout ----
 * For each layer and kv head: K plane [cap][head_dim] and V plane [cap][head_dim]. */
typedef struct cg_kv cg_kv;
cg_kv *cg_kv_new(const cg_model *m, uint32_t cap_tokens);
void cg_kv_free(cg_kv **kv);
uint32_t cg_kv_cap(const cg_kv *kv);
float *cg_kv_k(cg_kv *kv, int layer, int head); /* -> [cap][head_dim] */
float *cg_kv_v(cg_kv *kv, int layer, int head);

/* Runs the model over n tokens written to KV slots [slot0, slot0+n), at RoPE positions
 * [pos0, pos0+n). Each layer writes the tokens' K (rotated) and V into kv, then attends
 * per spans (which must cover exactly those slots, in order). Slots outside the spans are
 * read as already-filled keys.
 * logits_last: if non-NULL, receives vocab_size logits of the last token.
 * Uses both cores. Returns CG_E_VALUE if slots exceed kv capacity or positions max_pos. */
cg_status cg_model_forward(const cg_model *m, cg_kv *kv, const int32_t *tokens, uint32_t n,
                           uint32_t slot0, int64_t pos0, const cg_attn_span *spans,
                           size_t n_spans, float *logits_last) CG_WUR;

/* ---- sampling ---- */
typedef struct cg_sampler {
    float temperature; /* <= 0: greedy */
    float top_p;       /* (0, 1]; 1 = off */
    uint64_t rng;      /* state, seeded by the request's seed */
} cg_sampler;
/* Picks the next token from logits (vocab_size floats; may be modified). */
int32_t cg_sample(cg_sampler *s, float *logits, int vocab_size);

#endif
