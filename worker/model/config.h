/* A checkpoint's config.json as the worker runs it (DESIGN §13): the architecture
 * (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM), its geometry, RoPE with its static
 * scaling (linear, llama3, yarn) turned into one rate per frequency, and the flags that change
 * the forward pass (q/k/v biases, q/k norms, tied embeddings). Anything the worker cannot run
 * exactly is refused with a message naming the field: never loaded silently wrong. */
#ifndef CG_MODEL_CONFIG_H
#define CG_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kv/remap.h"

typedef enum { CG_ARCH_LLAMA, CG_ARCH_QWEN2, CG_ARCH_QWEN3 } cg_arch;

/* "LlamaForCausalLM", ...; static storage. */
const char *cg_arch_name(cg_arch a);

/* The largest head_dim the worker runs, and the most EOS ids a config may list. */
#define CG_MODEL_MAX_HEAD_DIM 512
#define CG_MODEL_MAX_EOS 8

typedef struct cg_model_config {
    char model_id[128]; /* "model_id" or "_name_or_path" from config.json, else the dir name */
    /* What KV computed by this model is stored under outside the process (the shared tier,
     * the disk tier, pulls between workers): "{model_id}#{16 hex}", the hex a fingerprint of
     * the weights as loaded, the config and the tokenizer (set by the loader). Two checkpoints
     * under one model id never read each other's KV. */
    char kv_model[160];
    cg_arch arch;
    int vocab_size;
    int dim;        /* hidden_size */
    int hidden_dim; /* intermediate_size */
    int n_layers;   /* num_hidden_layers */
    int n_heads;    /* num_attention_heads */
    int n_kv_heads; /* num_key_value_heads */
    int head_dim;   /* "head_dim", else dim / n_heads */
    int max_pos;    /* max_position_embeddings */
    double rope_theta;
    float norm_eps;           /* rms_norm_eps */
    cg_rope_style rope_style; /* "half" (HF) unless the chunkgate extension "rope_style" says
                                 "interleaved" */
    char rope_scaling[16];    /* "none", "linear", "llama3" or "yarn" */
    /* The RoPE rate of each frequency after scaling (head_dim / 2 entries), and yarn's
     * attention factor on cos and sin (1 otherwise). */
    double inv_freq[CG_MODEL_MAX_HEAD_DIM / 2];
    double attn_factor;
    int tie_embeddings;            /* tie_word_embeddings */
    int qkv_bias;                  /* Qwen2: biases on q, k, v */
    int qk_norm;                   /* Qwen3: RMSNorm over each head of q and k before RoPE */
    int bos_id;                    /* -1: none */
    int eos_ids[CG_MODEL_MAX_EOS]; /* eos_token_id: an id or a list of ids */
    int n_eos;
    char dtype[8]; /* dtype of the weights in memory: "f32", "f16" or "bf16" as stored, or
                    * "q8_0" / "q4_0" under --quant (set by the loader) */
} cg_model_config;

/* Reads dir/config.json into *c. Refuses (CG_E_UNSUPPORTED) another architecture, a
 * sequence-length-dependent RoPE scaling (dynamic, longrope), a sliding window in use, an
 * activation other than silu, partial rotary embeddings, biases the architecture does not
 * have; CG_E_VALUE/CG_E_TYPE/CG_E_MISSING/CG_E_JSON/CG_E_IO for a malformed file. err names
 * the file and the field. */
cg_status cg_model_config_read(const char *dir, cg_model_config *c, char *err,
                               size_t errlen) CG_WUR;

/* The same from a parsed config.json object (root is borrowed); dir names the model when the
 * object has no model id (its last path component). Messages say "config.json". */
struct json_t;
cg_status cg_model_config_parse(struct json_t *root, const char *dir, cg_model_config *c, char *err,
                                size_t errlen) CG_WUR;

/* The RoPE of c for kv/remap.h (borrows c's inv_freq table: c must outlive it). */
cg_rope cg_model_config_rope(const cg_model_config *c);

/* 1 when id is one of c's EOS ids. */
int cg_model_config_is_eos(const cg_model_config *c, int32_t id);

#endif
