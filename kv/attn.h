/* Segment-aware attention (DESIGN §5) without an n x n mask: each query row sees at most two
 * key ranges, so work skips masked blocks. One place holds the visibility rule. */
#ifndef CG_ATTN_H
#define CG_ATTN_H

#include <stddef.h>
#include <stdint.h>
#include "cache/split.h"
#include "cache/key.h"

/* Query slots [q_start, q_start+q_len) of one segment. The query at slot i sees key slots
 * [0, prefix) and [own_start, i]. prefix <= own_start <= q_start.
 *   plain causal (system, question, reference): own_start = 0, prefix = 0
 *   strict chunk starting at slot c:           own_start = c, prefix = 0
 *   sys chunk starting at c after system of s: own_start = c, prefix = s */
typedef struct cg_attn_span {
    uint32_t q_start, q_len;
    uint32_t own_start;
    uint32_t prefix;
} cg_attn_span;

/* Builds the spans of DESIGN §5 for segments laid out back to back from slot 0.
 * roles/lens: n_segs segments in prompt order. spans_out has room for n_segs entries.
 * Returns the number of spans written (segments with len 0 are skipped). */
size_t cg_attn_plan(const cg_role *roles, const uint32_t *lens, size_t n_segs, cg_mode mode,
                    cg_attn_span *spans_out);

/* One layer's KV in the per-head layout: head h's K rows at k + h*head_stride, each row
 * head_dim floats, row t = slot t. Same for v. */
typedef struct cg_attn_kv {
    const float *k, *v;
    size_t head_stride; /* floats between heads, >= n_slots*head_dim */
    int n_kv_heads, head_dim;
} cg_attn_kv;

/* Attention for all query rows of the spans, in span order.
 * q:   [n_rows][n_heads*head_dim], RoPE already applied; row r belongs to the r-th slot
 *      when the spans' slots are listed in order.
 * out: [n_rows][n_heads*head_dim].
 * Grouped-query: query head h uses kv head h / (n_heads / n_kv_heads).
 * Scale 1/sqrt(head_dim). Uses both cores. */
void cg_attn_forward(const cg_attn_kv *kv, int n_heads, const cg_attn_span *spans, size_t n_spans,
                     const float *q, float *out);

/* How much attention query rows pay each key slot: for each of the n_q rows of q (each as in
 * cg_attn_forward, n_heads * head_dim floats, a row every ld floats) and each of its heads, the
 * softmax (scale 1/sqrt(head_dim)) of its scores over key slots [0, n_keys) of kv is added into
 * mass[0, n_keys), in double. Every row and head adds weights that sum to 1. For choosing the
 * tokens a question reads; one thread, scratch of 16 * n_keys floats. */
void cg_attn_key_mass(const cg_attn_kv *kv, int n_heads, const float *q, size_t ld, size_t n_q,
                      size_t n_keys, double *mass);

/* Caps the vectors the softmax loops may use at run time: 0 scalar, 1 SSE2, 2 AVX2+FMA,
 * 3 AVX-512F (the default: the widest the CPU has). The worker passes its kernels' cap
 * (CG_MATMUL_ISA), so avx2 there leaves no AVX-512 instruction in a forward pass. */
void cg_attn_set_max_isa(int level);

/* Debug/test dump: mask[i*n_slots + j] = 1 where slot i may attend slot j per spans, else 0.
 * Rows of slots outside every span are all 0. For small n only. */
void cg_attn_mask_dense(const cg_attn_span *spans, size_t n_spans, size_t n_slots, uint8_t *mask);

#endif
