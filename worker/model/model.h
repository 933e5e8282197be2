/* The worker's model: Hugging Face checkpoints of LlamaForCausalLM, Qwen2ForCausalLM and
 * Qwen3ForCausalLM on the CPU (RMSNorm, RoPE with static scaling, grouped-query attention,
 * q/k/v biases, q/k norms, SwiGLU), loaded from config.json + safetensors (one file or
 * sharded; f32, f16, bf16 weights kept in their dtype and mmapped), with the checkpoint's
 * tokenizer; the per-head KV buffer of a sequence; the forward pass over a batch of sequences;
 * sampling; and the deterministic test-model generator. DESIGN §13. */
#ifndef CG_MODEL_H
#define CG_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "kv/attn.h"
#include "kv/remap.h"
#include "worker/model/config.h"
#include "worker/model/tokenizer.h"

typedef struct cg_model cg_model;

/* Opens the checkpoint in dir: config.json (worker/model/config.h), the weights from
 * model.safetensors or the shards of model.safetensors.index.json (kept mapped; 16-bit
 * matrices are used in place), and tokenizer.json (+ tokenizer_config.json). A checkpoint
 * without tokenizer.json is accepted only with a byte vocabulary (at most 512 tokens, BOS and
 * EOS above 255: the generated tiny model), which gets the byte tokenizer. Refused, with a
 * message naming the file and the tensor or field: a missing tensor, a wrong shape or dtype,
 * a tensor the architecture does not use, a tokenizer larger than the vocabulary. Never
 * crashes on bad files. Caller closes with cg_model_close.
 * Side effect: sets OpenBLAS to one thread per call, process-wide: the forward pass shares
 * the cores out through OpenMP (two thread pools spinning on two cores slow each other). */
cg_status cg_model_open(const char *dir, cg_model **out, char *err, size_t errlen) CG_WUR;

/* Weight quantisation chosen at load (--quant; DESIGN §19). */
typedef enum cg_quant {
    CG_QUANT_NONE, /* matrices kept in the checkpoint's dtype, mapped */
    CG_QUANT_Q8,   /* CG_DTYPE_Q8_0: int8 blocks of 32 with an f16 scale (worker/model/matmul.h) */
    CG_QUANT_Q4,   /* CG_DTYPE_Q4_0: 4-bit blocks of 32 with an f16 scale */
    CG_QUANT_COUNT
} cg_quant;
/* "none", "q8", "q4", NULL-terminated (the worker's --quant choices). */
extern const char *const cg_quant_names[];
const char *cg_quant_name(cg_quant q);

/* cg_model_open, then, unless quant is CG_QUANT_NONE, every matrix the forward pass multiplies
 * (q/k/v/o, gate/up/down, the embedding and the LM head; a tied head is the one quantised
 * embedding) quantised to the blocks of `quant` and the safetensors files unmapped: the model
 * then holds only the quantised matrices and f32 vectors, embedding lookups dequantise a row,
 * and cg_model_cfg(m)->dtype reads "q8_0" or "q4_0". Refused (CG_E_UNSUPPORTED, naming the
 * tensor) when a matrix's in-features are not a multiple of 32 (q8) or 64 (q4). Quantising uses
 * the OpenMP threads (a 0.5B model: about a second). */
cg_status cg_model_open_quant(const char *dir, cg_quant quant, cg_model **out, char *err,
                              size_t errlen) CG_WUR;
void cg_model_close(cg_model **m);
const cg_model_config *cg_model_cfg(const cg_model *m);
/* The model's tokenizer (borrowed; lives as long as the model). */
const cg_tokenizer *cg_model_tokenizer(const cg_model *m);
/* The RoPE of the model (for cg_remap_rope); borrows the model's frequency table. */
cg_rope cg_model_rope(const cg_model *m);
/* Bytes of the weights as stored (mapped or copied). */
size_t cg_model_weight_bytes(const cg_model *m);

#define CG_GEN_MAX_EOS 4
typedef struct cg_model_gen_params {
    uint64_t seed;            /* default 1 */
    int n_layers;             /* default 4 */
    int dim;                  /* default 256 */
    int n_heads;              /* default 8 */
    int n_kv_heads;           /* default 4 */
    int hidden_dim;           /* default 768 */
    int max_pos;              /* default 32768; with yarn, the pre-yarn context */
    cg_rope_style rope_style; /* default CG_ROPE_HALF; real architectures accept only half */
    const char *dtype;        /* "f32" (default), "f16" or "bf16" */
    const char *model_id;     /* default "chunkgate-tiny" */
    /* Real architectures. vocab_size 0 is the tiny byte-level model (258 tokens, BOS 256,
     * EOS 257), whose bytes never change; the fields below then only add rope_scaling,
     * shards and a tokenizer. Otherwise the model is an HF checkpoint of `arch` with random
     * weights, every one exactly representable in both bf16 and f16 (0 or a bf16 value with
     * an exponent in f16's normal range), whatever the storage dtype. */
    const char *arch;   /* "LlamaForCausalLM", "Qwen2ForCausalLM" or "Qwen3ForCausalLM" */
    int vocab_size;     /* 0: tiny */
    int head_dim;       /* 0: dim / n_heads, key omitted; else written as "head_dim" */
    int tie_embeddings; /* no lm_head.weight in the file */
    double rope_theta;  /* 0: key omitted (HF default 10000, as in Llama 2 configs) */
    double norm_eps;    /* rms_norm_eps (tiny: 1e-5) */
    /* NULL, "" or "none": rope_scaling null; "linear:F", "yarn:F", "llama3" (factor 8) or
     * "llama3:F", and "dynamic:F" (written so that loaders can be tested refusing it). */
    const char *rope_scaling;
    int bos_id;
    int eos_ids[CG_GEN_MAX_EOS]; /* n_eos > 1 writes a list, as Llama 3.1 configs do */
    int n_eos;
    const char *tokenizer_dir; /* NULL/"": none; else tokenizer.json and tokenizer_config.json
                                * are copied after checking them against vocab_size, BOS, EOS */
    int shards;                /* <= 1: model.safetensors; N: model-0000k-of-0000N.safetensors +
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
cg_status cg_model_generate(const char *dir, cg_model_gen_params p, char *err,
                            size_t errlen) CG_WUR;

/* ---- tokens ---- */

/* Longest stream text cg_tok_decode writes. */
#define CG_TOKEN_MAX_BYTES 256
/* Tokenizes text with the model's tokenizer, with its BOS when add_bos (the post-processor's
 * template). Returns the ids (caller frees) and their count in *n; NULL (*n 0) for text the
 * tokenizer refuses (invalid UTF-8 for a tokenizer.json model) or that gives no token. A
 * real tokenizer may give more tokens than bytes (SentencePiece's U+2581 for a space, byte
 * fallback): no bound on the count is assumed. */
int32_t *cg_tok_encode(const cg_model *m, const char *text, size_t len, int add_bos, size_t *n);
/* Writes the bytes token t adds to a generated text into out (room for CG_TOKEN_MAX_BYTES;
 * special tokens and unknown ids add nothing); returns the count. */
size_t cg_tok_decode(const cg_model *m, int32_t t, char *out);

/* ---- KV buffer of one sequence, per-head layout ----
 * For each layer and kv head: K plane [cap][head_dim] and V plane [cap][head_dim]. */
typedef struct cg_kv cg_kv;
cg_kv *cg_kv_new(const cg_model *m, uint32_t cap_tokens);
void cg_kv_free(cg_kv **kv);
uint32_t cg_kv_cap(const cg_kv *kv);
/* Bytes of its capacity (its pages are mapped as slots are first written). */
size_t cg_kv_bytes(const cg_kv *kv);
float *cg_kv_k(cg_kv *kv, int layer, int head); /* -> [cap][head_dim] */
float *cg_kv_v(cg_kv *kv, int layer, int head);
/* Copies slots [0, n) of every plane of src into dst (same model; n <= both capacities). */
void cg_kv_copy_slots(cg_kv *dst, cg_kv *src, uint32_t n);

/* ---- forward pass ---- */

/* One sequence's rows in a forward call. Rows go to KV slots slot0 + i at RoPE positions
 * pos0 + i, or, when slots / pos are given, to slots[i] at pos[i] (scattered rows: a selective
 * recompute). Each layer writes the rows' K (rotated) and V into kv, then the rows attend per
 * spans (which list the rows' slots in row order; other slots are read as already filled). */
typedef struct cg_fwd_seq {
    cg_kv *kv;
    const int32_t *tokens; /* n tokens */
    uint32_t n;
    uint32_t slot0;
    int64_t pos0;
    const uint32_t *slots; /* optional, n entries */
    const int64_t *pos;    /* optional, n entries */
    const cg_attn_span *spans;
    size_t n_spans;
    float *logits; /* optional: receives vocab_size logits of the last row */
    /* Optional, for prompt logprobs (echo): row i's log-softmax evaluated at next[i] (the
     * token that follows row i; < 0 for none) and its row_top_k most likely tokens go to
     * row_lp[i] (logprob, NAN without a next token), row_top_ids/row_top_lps[i * row_top_k
     * ...]. Costs one lm_head product per row. */
    const int32_t *next;
    float *row_lp;
    int32_t *row_top_ids;
    float *row_top_lps;
    int row_top_k;
    /* Optional, full distributions (a teacher-forced comparison): rows [row_logits_from, n) each
     * receive vocab_size logits at row_logits + (i - row_logits_from) * vocab_size. Costs one
     * lm_head product per such row. */
    float *row_logits;
    uint32_t row_logits_from;
    /* Optional, for ranking tokens before a selective recompute (CacheBlend): with stop_k set,
     * only layers [0, stop_layer) run (writing their K/V into kv as usual); at layer stop_layer
     * every row's K (normed, biased and rotated as kv would hold it) and V go to
     * stop_k + i * kv_dim and stop_v + i * kv_dim (kv_dim = n_kv_heads * head_dim) instead of
     * kv, and nothing after that runs (no logits). A call with stop_k holds one sequence. */
    int stop_layer;
    float *stop_k, *stop_v;
    /* Optional, for choosing the chunk tokens a question reads (recompute_select "question"):
     * every layer's queries of the rows (normed, biased and rotated as attention reads them)
     * go to capture_q + (i * n_layers + layer) * n_heads * head_dim for row i. */
    float *capture_q;
    /* 0 from callers; cg_fwd_seq_slice sets it to the slice's first row in the sequence it was
     * cut from, where row_logits, stop_k / stop_v and capture_q (which a slice shares) are
     * indexed. */
    uint32_t row_off;
    /* Optional (background work that must yield): read between layers; once non-zero the call
     * stops with CG_E_UNAVAILABLE, its rows' KV written for some layers only (run them again:
     * a row's result does not depend on what an earlier try left in its own slots). */
    const int *interrupt;
} cg_fwd_seq;

/* Which kernels the weight products use: prefill chunks (sgemm on widened panels) or decode
 * rows (the batch-invariant kernel: a row's result does not depend on the other rows of the
 * call). Logits always come from the decode kernel, and so do prefill calls of few rows (at
 * most 64, or 256 with the AVX-512 variant), where it is the faster of the two. */
typedef enum { CG_FWD_PREFILL, CG_FWD_DECODE } cg_fwd_kind;

/* Buffers a forward call reuses (activations, widened weight panels). One per thread that
 * runs forwards; NULL in a call uses temporary ones. */
typedef struct cg_fwd_scratch cg_fwd_scratch;
cg_fwd_scratch *cg_fwd_scratch_new(void);
void cg_fwd_scratch_free(cg_fwd_scratch **s);

/* Runs the model over the rows of n_seqs sequences at once: the weight products see every
 * row of the call, attention runs per sequence over its own KV. Uses both cores. Returns
 * CG_E_VALUE for rows outside a KV's capacity or the model's positions, a token outside the
 * vocabulary, or spans that do not list the rows; CG_E_UNAVAILABLE when interrupted. */
cg_status cg_model_forward_batch(const cg_model *m, const cg_fwd_seq *seqs, size_t n_seqs,
                                 cg_fwd_kind kind, cg_fwd_scratch *scratch) CG_WUR;

/* Rows [r0, r0+n) of q as a sequence of their own (spans clipped; logits only when the slice
 * holds q's last row). spans receives the clipped spans: room for q->n_spans. */
cg_fwd_seq cg_fwd_seq_slice(const cg_fwd_seq *q, uint32_t r0, uint32_t n, cg_attn_span *spans);

/* One sequence, contiguous rows: n tokens to slots [slot0, slot0+n) at positions
 * [pos0, pos0+n), on the prefill kernels. logits_last: optional, vocab_size logits of the last
 * token. */
cg_status cg_model_forward(const cg_model *m, cg_kv *kv, const int32_t *tokens, uint32_t n,
                           uint32_t slot0, int64_t pos0, const cg_attn_span *spans, size_t n_spans,
                           float *logits_last) CG_WUR;

/* ---- sampling ---- */
typedef struct cg_sampler {
    float temperature; /* <= 0: greedy */
    float top_p;       /* (0, 1]; 1 = off */
    uint64_t rng;      /* state, seeded by the request's seed */
} cg_sampler;
/* Picks the next token from logits (vocab_size floats; may be modified). */
int32_t cg_sample(cg_sampler *s, float *logits, int vocab_size);
/* The same, and *raw receives the chosen token's logit as it was before sampling. */
int32_t cg_sample_keep(cg_sampler *s, float *logits, int vocab_size, float *raw);
/* The log-softmax of a logits row: returns its log-normaliser (log-sum-exp, in double) and
 * writes the k most likely entries (at most vocab; best first, ties to the lower id) with their
 * log-probabilities into ids/lps. */
double cg_logprobs_top(const float *logits, int vocab, int k, int32_t *ids, float *lps);

#endif
