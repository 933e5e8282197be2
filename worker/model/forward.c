/* The forward pass over a batch of sequences (worker/model/model.h): the weight products see
 * every row of the call at once (each weight read once per call), attention runs per sequence
 * over its own KV. Llama, Qwen2 (q/k/v biases) and Qwen3 (q/k RMSNorm per head before RoPE). */
#include "worker/model/model_impl.h"

#include <math.h>
#include <omp.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* Rows per pass through the layers. Bounds the scratch memory of a long prefill, and is big
 * enough that sgemm runs near its peak. Splitting the rows of a sequence is exact: a query
 * row's visible keys depend only on its own slot. */
#define FWD_BLOCK 1024u

struct cg_fwd_scratch {
    size_t rows, logit_cap;
    float *x, *xb, *q, *att, *k, *v, *g, *u, *cos, *sin, *lg_in, *lg_out;
    int64_t *pos;
    cg_attn_span *spans;
    size_t spans_cap;
    cg_matmul_scratch *mm;
};

cg_fwd_scratch *cg_fwd_scratch_new(void)
{
    cg_fwd_scratch *s = cg_calloc(1, sizeof *s);
    s->mm = cg_matmul_scratch_new();
    return s;
}

void cg_fwd_scratch_free(cg_fwd_scratch **sp)
{
    cg_fwd_scratch *s = *sp;
    if (!s) return;
    float **bufs[] = {&s->x, &s->xb, &s->q,   &s->att, &s->k,     &s->v,
                      &s->g, &s->u,  &s->cos, &s->sin, &s->lg_in, &s->lg_out};
    for (size_t i = 0; i < CG_ARRAY_LEN(bufs); i++)
        cg_free(bufs[i]);
    free(s->pos);
    free(s->spans);
    cg_matmul_scratch_free(&s->mm);
    cg_free(sp);
}

/* Makes room for rows rows of every activation. */
static void scratch_reserve(cg_fwd_scratch *s, const cg_model_config *c, size_t rows)
{
    if (rows <= s->rows) return;
    const size_t D = (size_t)c->dim, Q = (size_t)c->n_heads * (size_t)c->head_dim;
    const size_t KV = (size_t)c->n_kv_heads * (size_t)c->head_dim, H = (size_t)c->hidden_dim;
    const size_t half = (size_t)c->head_dim / 2;
    s->x = cg_realloc(s->x, rows * D * sizeof(float));
    s->xb = cg_realloc(s->xb, rows * CG_MAX(D, Q) * sizeof(float));
    s->q = cg_realloc(s->q, rows * Q * sizeof(float));
    s->att = cg_realloc(s->att, rows * Q * sizeof(float));
    s->k = cg_realloc(s->k, rows * KV * sizeof(float));
    s->v = cg_realloc(s->v, rows * KV * sizeof(float));
    s->g = cg_realloc(s->g, rows * H * sizeof(float));
    s->u = cg_realloc(s->u, rows * H * sizeof(float));
    s->cos = cg_realloc(s->cos, rows * half * sizeof(float));
    s->sin = cg_realloc(s->sin, rows * half * sizeof(float));
    s->pos = cg_realloc(s->pos, rows * sizeof(int64_t));
    s->rows = rows;
}

/* ---- elementwise kernels ---- */

/* Elementwise work is small next to the products; it goes parallel only for long blocks. */
#define PAR_ELEMS ((size_t)1 << 16)

/* out[t] = x[t] / rms(x[t]) * w, per row of dim (as HF computes it: in f32 with the mean of
 * squares; here accumulated in double). Rows are independent. */
static void rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps)
{
#pragma omp parallel for if ((size_t)n * dim >= PAR_ELEMS) schedule(static)
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * dim;
        float *o = out + (size_t)t * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float r = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++)
            o[i] = xr[i] * r * w[i];
    }
}

static void add_into(float *x, const float *y, size_t n)
{
#pragma omp parallel for if (n >= PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

/* x[t] += b for each of n rows of width w. */
static void add_bias(float *x, const float *b, size_t n, size_t w)
{
    for (size_t t = 0; t < n; t++)
        for (size_t i = 0; i < w; i++)
            x[t * w + i] += b[i];
}

/* SiLU gate times up: g = g * sigmoid(g) * u. libm's expf is a scalar call and was an eighth
 * of a short prefill, so exp is computed here 4 lanes at a time: x = k*ln2 + r, Cephes'
 * polynomial for e^r, 2^k built in the exponent bits; max error 1.4 ulp over the clamped range
 * [-87, 88] (beyond it the sigmoid is 0 or 1 to float precision anyway). */
#define EXP_LO -87.0f
#define EXP_HI 88.0f
#define EXP_POLY(p, r)                                                                             \
    p = 1.9875691500e-4f, p = p * r + 1.3981999507e-3f, p = p * r + 8.3334519073e-3f,              \
    p = p * r + 4.1665795894e-2f, p = p * r + 1.6666665459e-1f, p = p * r + 5.0000001201e-1f

static inline float exp_scalar(float x)
{
    x = x > EXP_LO ? x : EXP_LO;
    x = x < EXP_HI ? x : EXP_HI;
    float k = (x * 1.44269504089f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - k * 0.693359375f + k * 2.12194440e-4f, p;
    EXP_POLY(p, r);
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, 4);
    return p * two_k;
}

static void swiglu_range(float *g, const float *u, size_t a, size_t b)
{
    size_t i = a;
#ifdef __SSE2__
    const __m128 lo = _mm_set1_ps(EXP_LO), hi = _mm_set1_ps(EXP_HI), one = _mm_set1_ps(1.0f);
    const __m128 magic = _mm_set1_ps(12582912.0f);
    for (; i + 4 <= b; i += 4) {
        __m128 gv = _mm_loadu_ps(g + i);
        __m128 x = _mm_min_ps(_mm_max_ps(_mm_sub_ps(_mm_setzero_ps(), gv), lo), hi);
        __m128 k = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(1.44269504089f)), magic), magic);
        __m128 r = _mm_add_ps(_mm_sub_ps(x, _mm_mul_ps(k, _mm_set1_ps(0.693359375f))),
                              _mm_mul_ps(k, _mm_set1_ps(2.12194440e-4f)));
        __m128 p = _mm_set1_ps(1.9875691500e-4f);
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.3981999507e-3f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(8.3334519073e-3f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(4.1665795894e-2f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.6666665459e-1f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(5.0000001201e-1f));
        p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, r), r), r), one);
        __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(k), _mm_set1_epi32(127)), 23);
        __m128 ex = _mm_mul_ps(p, _mm_castsi128_ps(e));
        __m128 out = _mm_mul_ps(_mm_div_ps(gv, _mm_add_ps(one, ex)), _mm_loadu_ps(u + i));
        _mm_storeu_ps(g + i, out);
    }
#endif
    for (; i < b; i++)
        g[i] = g[i] / (1.0f + exp_scalar(-g[i])) * u[i];
}

/* The split points of each thread are a function of the row count only, and swiglu is
 * elementwise: a row's result does not depend on the rows around it. */
static void swiglu(float *g, const float *u, size_t n)
{
    const int par = n >= PAR_ELEMS / 4;
#pragma omp parallel if (par)
    {
        size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        /* split at multiples of 4 so the vector loop covers all but the tail */
        size_t a = (n * t / nt) & ~(size_t)3, b = t + 1 == nt ? n : (n * (t + 1) / nt) & ~(size_t)3;
        swiglu_range(g, u, a, b);
    }
}

/* One row of a weight matrix (an embedding) widened to f32. */
static void weight_row(const cg_weight *w, int row, float *out)
{
    const size_t cols = (size_t)w->cols, off = (size_t)row * cols;
    if (w->dtype == CG_DTYPE_F32) {
        memcpy(out, (const float *)w->data + off, cols * sizeof(float));
        return;
    }
    if (w->dtype == CG_DTYPE_Q8_0 || w->dtype == CG_DTYPE_Q4_0) {
        cg_matmul_dequant_row(w, row, out);
        return;
    }
    cg_widen16((const uint8_t *)w->data + off * 2, cols, w->dtype == CG_DTYPE_BF16, out);
}

/* Prompt pieces of up to this many rows take the decode kernel as well: the prefill path
 * widens every panel of W at each call whatever n, which costs more than the product itself
 * for a few dozen rows (a 45-token system prompt, a question, a short request). With AVX-512
 * the decode kernel also outruns the widened sgemm (OpenBLAS 0.3.21, AVX2-class kernels) on the
 * scheduler's 256-row pieces: 1.5-1.6x in the same run (bench/README.md, "chunkgate-worker
 * against llama.cpp"). */
#define SMALL_ROWS 64
#define SMALL_ROWS_AVX512 256

/* Block-quantised weights (--quant): the decode kernel quantises activations to int8, which
 * about doubles the loss against the 16-bit model (qwen2.5-0.5b geometry, 128 positions: mean
 * KL 3.1e-2 at q8 with int8 activations, 1.6e-2 with f32 ones; llama.cpp's Q8_0 3.0e-2), so
 * prompt pieces above SMALL_ROWS take the prefill path's f32 activations on every ISA.
 * CG_QUANT_INT_ROWS=N moves that limit (benchmarks). */
static int quant_small_rows(void)
{
    static int v = -1;
    int r = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (r < 0) {
        const char *e = getenv("CG_QUANT_INT_ROWS");
        r = e && *e ? atoi(e) : SMALL_ROWS;
        __atomic_store_n(&v, r, __ATOMIC_RELAXED);
    }
    return r;
}

static void matmul(const cg_weight *w, const float *x, int n, float *y, cg_fwd_kind kind,
                   cg_fwd_scratch *s)
{
    const int small = w->dtype == CG_DTYPE_Q8_0 || w->dtype == CG_DTYPE_Q4_0 ? quant_small_rows()
                      : cg_matmul_isa_active() >= CG_MATMUL_ISA_AVX512       ? SMALL_ROWS_AVX512
                                                                             : SMALL_ROWS;
    if (kind == CG_FWD_DECODE || n <= small)
        cg_matmul_decode(w, x, n, y);
    else
        cg_matmul_prefill(w, x, n, y, s->mm);
}

/* ---- checks ---- */

static uint32_t row_slot(const cg_fwd_seq *q, uint32_t i)
{
    return q->slots ? q->slots[i] : q->slot0 + i;
}

static int64_t row_pos(const cg_fwd_seq *q, uint32_t i)
{
    return q->pos ? q->pos[i] : q->pos0 + (int64_t)i;
}

/* The spans list the rows' slots in row order, and expose only keys before each query. */
static int spans_valid(const cg_fwd_seq *q)
{
    uint32_t row = 0;
    for (size_t i = 0; i < q->n_spans; i++) {
        const cg_attn_span *s = &q->spans[i];
        if (s->q_len == 0 || s->prefix > s->own_start || s->own_start > s->q_start) return 0;
        for (uint32_t o = 0; o < s->q_len; o++, row++)
            if (row >= q->n || row_slot(q, row) != s->q_start + o) return 0;
    }
    return row == q->n;
}

static cg_status check_seq(const cg_model *m, const cg_fwd_seq *q)
{
    const cg_model_config *c = &m->cfg;
    if (!q->n || !q->tokens || !q->spans || !q->kv || !cg_kv_matches(q->kv, m)) return CG_E_VALUE;
    for (uint32_t i = 0; i < q->n; i++) {
        int64_t p = row_pos(q, i);
        if (row_slot(q, i) >= cg_kv_cap(q->kv) || p < 0 || p >= c->max_pos) return CG_E_VALUE;
        if (q->tokens[i] < 0 || q->tokens[i] >= c->vocab_size) return CG_E_VALUE;
    }
    if (q->row_lp &&
        (!q->next || q->row_top_k < 0 || (q->row_top_k && (!q->row_top_ids || !q->row_top_lps))))
        return CG_E_VALUE;
    if (q->stop_k && (!q->stop_v || q->stop_layer < 0 || q->stop_layer >= c->n_layers))
        return CG_E_VALUE;
    return spans_valid(q) ? CG_OK : CG_E_VALUE;
}

/* ---- one block of rows ---- */

/* The block's sequences and where their rows sit in the activations. */
typedef struct block {
    const cg_fwd_seq *seqs;
    size_t n_seqs;
    size_t *row0; /* first activation row of each sequence */
    size_t rows;
} block;

/* k and v of every row as the KV holds them: bias (Qwen2), per-head RMSNorm of k (Qwen3),
 * RoPE on k. */
static void prepare_kv(const cg_model *m, const layer_w *L, cg_fwd_scratch *s, size_t rows)
{
    const cg_model_config *c = &m->cfg;
    const size_t hd = (size_t)c->head_dim, KV = (size_t)c->n_kv_heads * hd;
    if (L->bk) {
        add_bias(s->k, L->bk, rows, KV);
        add_bias(s->v, L->bv, rows, KV);
    }
    if (L->k_norm)
        rmsnorm(s->k, s->k, L->k_norm, (int)(rows * (size_t)c->n_kv_heads), (int)hd, c->norm_eps);
    const cg_rope rope = cg_model_rope(m);
    cg_rope_rotate(&rope, s->k, rows, c->n_kv_heads, s->cos, s->sin);
}

/* q and k of every row: bias (Qwen2), per-head RMSNorm (Qwen3), RoPE; v's bias. */
static void prepare_qk(const cg_model *m, const layer_w *L, cg_fwd_scratch *s, size_t rows)
{
    const cg_model_config *c = &m->cfg;
    const size_t hd = (size_t)c->head_dim;
    if (L->bq) add_bias(s->q, L->bq, rows, (size_t)c->n_heads * hd);
    if (L->q_norm)
        rmsnorm(s->q, s->q, L->q_norm, (int)(rows * (size_t)c->n_heads), (int)hd, c->norm_eps);
    const cg_rope rope = cg_model_rope(m);
    cg_rope_rotate(&rope, s->q, rows, c->n_heads, s->cos, s->sin);
    prepare_kv(m, L, s, rows);
}

/* Writes each row's K and V into its sequence's KV, then attends per sequence. */
static void attend(const cg_model *m, const block *b, int l, cg_fwd_scratch *s)
{
    const cg_model_config *c = &m->cfg;
    const size_t hd = (size_t)c->head_dim, Q = (size_t)c->n_heads * hd;
    const size_t KVd = (size_t)c->n_kv_heads * hd;
    for (size_t i = 0; i < b->n_seqs; i++) {
        const cg_fwd_seq *q = &b->seqs[i];
        for (int h = 0; h < c->n_kv_heads; h++) {
            float *kp = cg_kv_k(q->kv, l, h), *vp = cg_kv_v(q->kv, l, h);
            for (uint32_t t = 0; t < q->n; t++) {
                size_t r = b->row0[i] + t, slot = row_slot(q, t);
                memcpy(kp + slot * hd, s->k + r * KVd + (size_t)h * hd, hd * sizeof(float));
                memcpy(vp + slot * hd, s->v + r * KVd + (size_t)h * hd, hd * sizeof(float));
            }
        }
        cg_attn_kv akv = {cg_kv_k(q->kv, l, 0), cg_kv_v(q->kv, l, 0), (size_t)cg_kv_cap(q->kv) * hd,
                          c->n_kv_heads, (int)hd};
        cg_attn_forward(&akv, c->n_heads, q->spans, q->n_spans, s->q + b->row0[i] * Q,
                        s->att + b->row0[i] * Q);
    }
}

/* cg_fwd_seq.capture_q: layer l's queries of the rows of the sequences that ask for them. */
static void capture_q(const cg_model *m, const block *b, int l, const cg_fwd_scratch *s)
{
    const size_t Q = (size_t)m->cfg.n_heads * (size_t)m->cfg.head_dim;
    const size_t NL = (size_t)m->cfg.n_layers;
    for (size_t i = 0; i < b->n_seqs; i++) {
        const cg_fwd_seq *q = &b->seqs[i];
        if (!q->capture_q) continue;
        for (uint32_t t = 0; t < q->n; t++)
            memcpy(q->capture_q + ((size_t)(q->row_off + t) * NL + (size_t)l) * Q,
                   s->q + (b->row0[i] + t) * Q, Q * sizeof(float));
    }
}

static void run_layer(const cg_model *m, const block *b, int l, cg_fwd_kind kind, cg_fwd_scratch *s)
{
    const cg_model_config *c = &m->cfg;
    const layer_w *L = &m->layers[l];
    const int n = (int)b->rows, D = c->dim;
    rmsnorm(s->xb, s->x, L->attn_norm, n, D, c->norm_eps);
    matmul(&L->wq, s->xb, n, s->q, kind, s);
    matmul(&L->wk, s->xb, n, s->k, kind, s);
    matmul(&L->wv, s->xb, n, s->v, kind, s);
    prepare_qk(m, L, s, b->rows);
    capture_q(m, b, l, s);
    attend(m, b, l, s);
    matmul(&L->wo, s->att, n, s->xb, kind, s);
    add_into(s->x, s->xb, (size_t)n * (size_t)D);
    rmsnorm(s->xb, s->x, L->ffn_norm, n, D, c->norm_eps);
    matmul(&L->w_gate, s->xb, n, s->g, kind, s);
    matmul(&L->w_up, s->xb, n, s->u, kind, s);
    swiglu(s->g, s->u, (size_t)n * (size_t)c->hidden_dim);
    matmul(&L->w_down, s->g, n, s->xb, kind, s);
    add_into(s->x, s->xb, (size_t)n * (size_t)D);
}

/* The last row of each sequence that wants logits: final norm, then the lm_head on the decode
 * kernel (one read of the head for all of them; a row's logits do not depend on the others). */
static void logits(const cg_model *m, const block *b, cg_fwd_scratch *s)
{
    const cg_model_config *c = &m->cfg;
    const size_t D = (size_t)c->dim, V = (size_t)c->vocab_size;
    size_t n = 0;
    for (size_t i = 0; i < b->n_seqs; i++)
        n += b->seqs[i].logits != NULL;
    if (!n) return;
    if (n > s->logit_cap) {
        s->lg_in = cg_realloc(s->lg_in, n * D * sizeof(float));
        s->lg_out = cg_realloc(s->lg_out, n * V * sizeof(float));
        s->logit_cap = n;
    }
    size_t k = 0;
    for (size_t i = 0; i < b->n_seqs; i++) {
        if (!b->seqs[i].logits) continue;
        size_t last = b->row0[i] + b->seqs[i].n - 1;
        rmsnorm(s->lg_in + k * D, s->x + last * D, m->norm, 1, (int)D, c->norm_eps);
        k++;
    }
    if (n == 1) {
        for (size_t i = 0; i < b->n_seqs; i++)
            if (b->seqs[i].logits) cg_matmul_decode(&m->lm_head, s->lg_in, 1, b->seqs[i].logits);
        return;
    }
    cg_matmul_decode(&m->lm_head, s->lg_in, (int)n, s->lg_out);
    k = 0;
    for (size_t i = 0; i < b->n_seqs; i++)
        if (b->seqs[i].logits) memcpy(b->seqs[i].logits, s->lg_out + (k++) * V, V * sizeof(float));
}

/* The log-softmax of a logits row at tok, its top k entries (best first) into ids/lps. */
static float row_logprobs(const float *lg, int vocab, int32_t tok, int k, int32_t *ids, float *lps)
{
    double lse = cg_logprobs_top(lg, vocab, k, ids, lps);
    return tok >= 0 && tok < vocab ? (float)((double)lg[tok] - lse) : NAN;
}

#define LP_ROWS 16

/* Prompt logprobs of every row of q (rows row0.. of the activations): final norm and lm_head
 * for LP_ROWS rows at a time. */
static void prompt_logprobs(const cg_model *m, const cg_fwd_seq *q, size_t row0, cg_fwd_scratch *s)
{
    const cg_model_config *c = &m->cfg;
    const size_t D = (size_t)c->dim, V = (size_t)c->vocab_size;
    if (LP_ROWS > s->logit_cap) {
        s->lg_in = cg_realloc(s->lg_in, LP_ROWS * D * sizeof(float));
        s->lg_out = cg_realloc(s->lg_out, LP_ROWS * V * sizeof(float));
        s->logit_cap = LP_ROWS;
    }
    for (uint32_t t0 = 0; t0 < q->n; t0 += LP_ROWS) {
        int n = (int)CG_MIN(LP_ROWS, q->n - t0);
        rmsnorm(s->lg_in, s->x + (row0 + t0) * D, m->norm, n, (int)D, c->norm_eps);
        cg_matmul_decode(&m->lm_head, s->lg_in, n, s->lg_out);
        for (int i = 0; i < n; i++) {
            size_t t = t0 + (size_t)i, k = (size_t)q->row_top_k;
            q->row_lp[t] = row_logprobs(s->lg_out + (size_t)i * V, (int)V, q->next[t], q->row_top_k,
                                        q->row_top_ids + t * k, q->row_top_lps + t * k);
        }
    }
}

/* Rows [row_logits_from, n) of q (rows row0.. of the activations): final norm and lm_head,
 * LP_ROWS rows at a time, straight into the caller's buffer. */
static void full_logits(const cg_model *m, const cg_fwd_seq *q, size_t row0, cg_fwd_scratch *s)
{
    const cg_model_config *c = &m->cfg;
    const size_t D = (size_t)c->dim, V = (size_t)c->vocab_size;
    const uint32_t from = q->row_logits_from;
    uint32_t t = from > q->row_off ? from - q->row_off : 0;
    if (t >= q->n) return;
    if (LP_ROWS > s->logit_cap) {
        s->lg_in = cg_realloc(s->lg_in, LP_ROWS * D * sizeof(float));
        s->lg_out = cg_realloc(s->lg_out, LP_ROWS * V * sizeof(float));
        s->logit_cap = LP_ROWS;
    }
    for (; t < q->n; t += LP_ROWS) {
        int n = (int)CG_MIN(LP_ROWS, q->n - t);
        rmsnorm(s->lg_in, s->x + (row0 + t) * D, m->norm, n, (int)D, c->norm_eps);
        cg_matmul_decode(&m->lm_head, s->lg_in, n,
                         q->row_logits + (size_t)(q->row_off + t - from) * V);
    }
}

/* The ranking exit (cg_fwd_seq.stop_k): layer l's K and V of the block's one sequence, as
 * run_layer would write them into its KV, into the caller's buffers. */
static void stop_kv(const cg_model *m, const block *b, int l, cg_fwd_kind kind, cg_fwd_scratch *s)
{
    const cg_model_config *c = &m->cfg;
    const layer_w *L = &m->layers[l];
    const cg_fwd_seq *q = &b->seqs[0];
    const int n = (int)b->rows;
    const size_t hd = (size_t)c->head_dim, KV = (size_t)c->n_kv_heads * hd;
    rmsnorm(s->xb, s->x, L->attn_norm, n, c->dim, c->norm_eps);
    matmul(&L->wk, s->xb, n, s->k, kind, s);
    matmul(&L->wv, s->xb, n, s->v, kind, s);
    prepare_kv(m, L, s, b->rows);
    memcpy(q->stop_k + (size_t)q->row_off * KV, s->k, b->rows * KV * sizeof(float));
    memcpy(q->stop_v + (size_t)q->row_off * KV, s->v, b->rows * KV * sizeof(float));
}

/* 1 when a sequence of the call was asked to stop (cg_fwd_seq.interrupt). */
static int interrupted(const cg_fwd_seq *seqs, size_t n_seqs)
{
    for (size_t i = 0; i < n_seqs; i++)
        if (seqs[i].interrupt && __atomic_load_n(seqs[i].interrupt, __ATOMIC_ACQUIRE)) return 1;
    return 0;
}

/* Runs the layers over the rows of seqs (at most FWD_BLOCK rows in all); returns 1 when
 * interrupted between two layers. */
static int run_block(const cg_model *m, const cg_fwd_seq *seqs, size_t n_seqs, cg_fwd_kind kind,
                     cg_fwd_scratch *s)
{
    const cg_model_config *c = &m->cfg;
    const size_t D = (size_t)c->dim;
    size_t *row0 = cg_malloc(n_seqs * sizeof *row0), rows = 0;
    for (size_t i = 0; i < n_seqs; i++) {
        row0[i] = rows;
        rows += seqs[i].n;
    }
    scratch_reserve(s, c, rows);
    for (size_t i = 0; i < n_seqs; i++)
        for (uint32_t t = 0; t < seqs[i].n; t++) {
            weight_row(&m->embed, seqs[i].tokens[t], s->x + (row0[i] + t) * D);
            s->pos[row0[i] + t] = row_pos(&seqs[i], t);
        }
    /* one cos/sin table per row for all layers */
    const cg_rope rope = cg_model_rope(m);
    cg_rope_angles(&rope, s->pos, rows, s->cos, s->sin);
    block b = {seqs, n_seqs, row0, rows};
    const int stop = seqs[0].stop_k != NULL; /* then n_seqs == 1 */
    const int n_layers = stop ? seqs[0].stop_layer : c->n_layers;
    for (int l = 0; l < n_layers; l++) {
        if (interrupted(seqs, n_seqs)) {
            free(row0);
            return 1;
        }
        run_layer(m, &b, l, kind, s);
    }
    if (stop) {
        stop_kv(m, &b, n_layers, kind, s);
        free(row0);
        return 0;
    }
    for (size_t i = 0; i < n_seqs; i++) {
        if (seqs[i].row_lp) prompt_logprobs(m, &seqs[i], row0[i], s);
        if (seqs[i].row_logits) full_logits(m, &seqs[i], row0[i], s);
    }
    logits(m, &b, s);
    free(row0);
    return 0;
}

cg_fwd_seq cg_fwd_seq_slice(const cg_fwd_seq *q, uint32_t r0, uint32_t n, cg_attn_span *spans)
{
    cg_fwd_seq sub = *q;
    sub.tokens = q->tokens + r0;
    sub.n = n;
    sub.row_off = q->row_off + r0;
    if (q->slots)
        sub.slots = q->slots + r0;
    else
        sub.slot0 = q->slot0 + r0;
    if (q->pos)
        sub.pos = q->pos + r0;
    else
        sub.pos0 = q->pos0 + r0;
    if (r0 + n < q->n) sub.logits = NULL;
    if (q->row_lp) {
        size_t k = (size_t)q->row_top_k;
        sub.next = q->next + r0;
        sub.row_lp = q->row_lp + r0;
        sub.row_top_ids = q->row_top_ids + r0 * k;
        sub.row_top_lps = q->row_top_lps + r0 * k;
    }
    size_t k = 0;
    uint32_t row = 0;
    for (size_t i = 0; i < q->n_spans; row += q->spans[i].q_len, i++) {
        uint32_t a = row, e = row + q->spans[i].q_len;
        if (e <= r0 || a >= r0 + n) continue;
        uint32_t from = CG_MAX(a, r0), to = CG_MIN(e, r0 + n);
        spans[k] = q->spans[i];
        spans[k].q_start += from - a;
        spans[k].q_len = to - from;
        k++;
    }
    sub.spans = spans;
    sub.n_spans = k;
    return sub;
}

cg_status cg_model_forward_batch(const cg_model *m, const cg_fwd_seq *seqs, size_t n_seqs,
                                 cg_fwd_kind kind, cg_fwd_scratch *scratch)
{
    size_t rows = 0;
    if (!n_seqs || !seqs) return CG_E_VALUE;
    for (size_t i = 0; i < n_seqs; i++) {
        cg_status st = check_seq(m, &seqs[i]);
        if (st != CG_OK) return st;
        if (seqs[i].stop_k && n_seqs > 1) return CG_E_VALUE;
        rows += seqs[i].n;
    }
    cg_fwd_scratch *s = scratch ? scratch : cg_fwd_scratch_new();
    int stopped = 0;
    if (rows <= FWD_BLOCK) {
        stopped = run_block(m, seqs, n_seqs, kind, s);
    } else {
        /* A long prefill: each sequence in blocks of rows. */
        for (size_t i = 0; i < n_seqs; i++) {
            const cg_fwd_seq *q = &seqs[i];
            if (q->n_spans > s->spans_cap) {
                s->spans = cg_realloc(s->spans, q->n_spans * sizeof *s->spans);
                s->spans_cap = q->n_spans;
            }
            for (uint32_t r0 = 0; r0 < q->n && !stopped; r0 += FWD_BLOCK) {
                cg_fwd_seq sub = cg_fwd_seq_slice(q, r0, CG_MIN(FWD_BLOCK, q->n - r0), s->spans);
                stopped = run_block(m, &sub, 1, kind, s);
            }
        }
    }
    if (!scratch) cg_fwd_scratch_free(&s);
    return stopped ? CG_E_UNAVAILABLE : CG_OK;
}

cg_status cg_model_forward(const cg_model *m, cg_kv *kv, const int32_t *tokens, uint32_t n,
                           uint32_t slot0, int64_t pos0, const cg_attn_span *spans, size_t n_spans,
                           float *logits_last)
{
    cg_fwd_seq q = {.kv = kv,
                    .tokens = tokens,
                    .n = n,
                    .slot0 = slot0,
                    .pos0 = pos0,
                    .spans = spans,
                    .n_spans = n_spans,
                    .logits = logits_last};
    return cg_model_forward_batch(m, &q, 1, CG_FWD_PREFILL, NULL);
}
