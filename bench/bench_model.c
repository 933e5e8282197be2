/* Reference model throughput: prefill tokens/s at 512/2048/8192 tokens and decode tokens/s at
 * a ~2k context. Baselines measured in the same run: a raw cblas_sgemm of the MLP's shape (the
 * FLOP rate the projections could reach), the attention kernel alone on the same spans (to
 * split the forward's time), and raw sgemv over all weights (the decode floor).
 *   usage: bench_model [model_dir]   (default: a generated chunkgate-tiny in a temp dir) */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/model/model.h"
#include "base/base.h"
#include "tests/harness/harness.h"

static void pseudo_tokens(int32_t *t, uint32_t n, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = 32 + (int32_t)((seed >> 33) % 95);
    }
}

static void fill(float *x, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 40) / (double)(1 << 24) - 0.5);
    }
}

/* The attention kernel alone over the spans a prefill of n tokens issues (the forward's blocks
 * of 1024 query rows, every layer), on random q/K/V: subtracted from the forward's time it
 * leaves the time of the projections and the elementwise work. */
static double attn_time(const cg_model_config *c, uint32_t n, uint32_t block)
{
    const int hd = c->head_dim, Q = c->n_heads * hd;
    size_t plane = (size_t)n * hd;
    float *k = cg_malloc(plane * c->n_kv_heads * 4), *v = cg_malloc(plane * c->n_kv_heads * 4);
    float *q = cg_malloc((size_t)CG_MIN(n, block) * Q * 4),
          *o = cg_malloc((size_t)CG_MIN(n, block) * Q * 4);
    fill(k, plane * c->n_kv_heads, 11);
    fill(v, plane * c->n_kv_heads, 12);
    fill(q, (size_t)CG_MIN(n, block) * Q, 13);
    cg_attn_kv kv = {k, v, plane, c->n_kv_heads, hd};
    double t0 = th_now_s();
    for (uint32_t b0 = 0; b0 < n; b0 += block) {
        cg_attn_span sp = {b0, CG_MIN(block, n - b0), 0, 0};
        for (int l = 0; l < c->n_layers; l++)
            cg_attn_forward(&kv, c->n_heads, &sp, 1, q, o);
    }
    double t = th_now_s() - t0;
    free(k);
    free(v);
    free(q);
    free(o);
    return t;
}

/* The projection GEMMs of a prefill of n tokens issued the way the forward issues them (blocks
 * of 1024 rows, each block's rows split between the OpenMP threads, one single-threaded sgemm
 * per thread), on dummy weights. */
static double proj_time(const cg_model_config *c, uint32_t n, uint32_t block)
{
    const int D = c->dim, H = c->hidden_dim, Q = c->n_heads * c->head_dim,
              KV = c->n_kv_heads * c->head_dim;
    const int shapes[7][2] = {{Q, D}, {KV, D}, {KV, D}, {D, Q}, {H, D}, {H, D}, {D, H}};
    uint32_t B = CG_MIN(n, block);
    size_t big = (size_t)CG_MAX(CG_MAX(D, H), Q);
    float *x = cg_malloc((size_t)B * big * 4), *y = cg_malloc((size_t)B * big * 4);
    float *w = cg_malloc(big * big * 4);
    fill(x, (size_t)B * big, 1);
    fill(w, big * big, 2);
    double t0 = th_now_s();
    for (uint32_t b0 = 0; b0 < n; b0 += B) {
        int nb = (int)CG_MIN(B, n - b0);
        for (int l = 0; l < c->n_layers; l++)
            for (int s = 0; s < 7; s++) {
                int out = shapes[s][0], in = shapes[s][1];
#pragma omp parallel
                {
                    int t = omp_get_thread_num(), nt = omp_get_num_threads();
                    int a = nb * t / nt, b = nb * (t + 1) / nt;
                    if (b > a)
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b - a, out, in, 1.0f,
                                    x + (size_t)a * in, in, w, in, 0.0f, y + (size_t)a * out, out);
                }
            }
    }
    double t = th_now_s() - t0;
    free(x);
    free(y);
    free(w);
    return t;
}

/* The attention kernel alone for one decode step (one query row, every layer) at context ctx. */
static double attn_decode_time(const cg_model_config *c, uint32_t ctx, int steps)
{
    const int hd = c->head_dim, Q = c->n_heads * hd;
    size_t plane = (size_t)(ctx + 1) * hd;
    float *k = cg_malloc(plane * c->n_kv_heads * 4), *v = cg_malloc(plane * c->n_kv_heads * 4);
    float *q = cg_malloc((size_t)Q * 4), *o = cg_malloc((size_t)Q * 4);
    fill(k, plane * c->n_kv_heads, 21);
    fill(v, plane * c->n_kv_heads, 22);
    fill(q, (size_t)Q, 23);
    cg_attn_kv kv = {k, v, plane, c->n_kv_heads, hd};
    cg_attn_span sp = {ctx, 1, 0, 0};
    double best = 1e30;
    for (int w = 0; w < 4; w++) {
        double t0 = th_now_s();
        for (int s = 0; s < steps; s++)
            for (int l = 0; l < c->n_layers; l++)
                cg_attn_forward(&kv, c->n_heads, &sp, 1, q, o);
        best = fmin(best, (th_now_s() - t0) / steps);
    }
    free(k);
    free(v);
    free(q);
    free(o);
    return best;
}

/* The same for one decode step: sgemv over every weight matrix plus the head. */
static double gemv_floor(const cg_model_config *c, int steps)
{
    const int D = c->dim, H = c->hidden_dim, Q = c->n_heads * c->head_dim,
              KV = c->n_kv_heads * c->head_dim;
    const int shapes[7][2] = {{Q, D}, {KV, D}, {KV, D}, {D, Q}, {H, D}, {H, D}, {D, H}};
    float **w = cg_malloc((size_t)c->n_layers * 7 * sizeof *w);
    size_t big = (size_t)CG_MAX(CG_MAX(D, H), Q);
    float *x = cg_malloc(big * 4), *y = cg_malloc((size_t)CG_MAX((int)big, c->vocab_size) * 4);
    float *head = cg_malloc((size_t)c->vocab_size * D * 4);
    fill(x, big, 3);
    fill(head, (size_t)c->vocab_size * D, 4);
    for (int i = 0; i < c->n_layers * 7; i++) {
        w[i] = cg_malloc((size_t)shapes[i % 7][0] * shapes[i % 7][1] * 4);
        fill(w[i], (size_t)shapes[i % 7][0] * shapes[i % 7][1], (uint64_t)i + 5);
    }
    double t0 = th_now_s();
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < c->n_layers * 7; i++)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, shapes[i % 7][0], shapes[i % 7][1], 1.0f, w[i],
                        shapes[i % 7][1], x, 1, 0.0f, y, 1);
        cblas_sgemv(CblasRowMajor, CblasNoTrans, c->vocab_size, D, 1.0f, head, D, x, 1, 0.0f, y, 1);
    }
    double t = (th_now_s() - t0) / steps;
    for (int i = 0; i < c->n_layers * 7; i++)
        free(w[i]);
    free(w);
    free(x);
    free(y);
    free(head);
    return t;
}

/* GFLOP/s of one raw sgemm of shape m x n x k (best of reps). */
static double raw_sgemm_gflops(int m, int n, int k, int reps)
{
    float *a = cg_malloc((size_t)m * k * 4), *b = cg_malloc((size_t)n * k * 4),
          *c = cg_malloc((size_t)m * n * 4);
    fill(a, (size_t)m * k, 7);
    fill(b, (size_t)n * k, 8);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = th_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
        best = fmin(best, th_now_s() - t0);
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * m * n * k / best * 1e-9;
}

int main(int argc, char **argv)
{
    char err[512], tmpl[] = "/tmp/cg_bench_model_XXXXXX";
    const char *dir = argc > 1 ? argv[1] : NULL;
    int own = 0;
    if (!dir) {
        dir = mkdtemp(tmpl);
        if (!dir ||
            cg_model_generate(dir, cg_model_gen_default_params(), err, sizeof err) != CG_OK) {
            fprintf(stderr, "generate: %s\n", err);
            return 1;
        }
        own = 1;
    }
    /* Baselines first: the load switches OpenBLAS to one thread per call. */
    int blas_threads = openblas_get_num_threads();
    double raw_mt = raw_sgemm_gflops(1024, 768, 256, 7);
    double raw_sq = raw_sgemm_gflops(1024, 1024, 1024, 3);
    cg_model *m = NULL;
    if (cg_model_open(dir, &m, err, sizeof err) != CG_OK) {
        fprintf(stderr, "load: %s\n", err);
        return 1;
    }
    const cg_model_config *c = cg_model_cfg(m);
    const int D = c->dim, H = c->hidden_dim, Q = c->n_heads * c->head_dim,
              KV = c->n_kv_heads * c->head_dim, L = c->n_layers;
    double raw_1t = raw_sgemm_gflops(1024, H, D, 7);
    double gemv_t = gemv_floor(c, 64);
    openblas_set_num_threads(blas_threads);
    double gemv_mt = gemv_floor(c, 64);
    openblas_set_num_threads(1);
    printf("model %s: %d layers, dim %d, heads %d/%d, head_dim %d, hidden %d, vocab %d\n",
           c->model_id, L, D, c->n_heads, c->n_kv_heads, c->head_dim, H, c->vocab_size);
    printf("threads: OpenMP %d (forward and attention), OpenBLAS %d per call inside the model; "
           "baselines with OpenBLAS's own %d threads\n",
           omp_get_max_threads(), openblas_get_num_threads(), blas_threads);
    printf("baseline raw cblas_sgemm 1024x768x256: %.1f GFLOP/s with %d OpenBLAS threads, %.1f "
           "with 1; 1024^3: %.1f GFLOP/s\n",
           raw_mt, blas_threads, raw_1t, raw_sq);

    const double proj_flops_tok =
        2.0 * L * ((double)D * (Q + 2 * KV) + (double)Q * D + 3.0 * D * H);
    const uint32_t sizes[3] = {512, 2048, 8192};
    for (int i = 0; i < 3; i++) {
        uint32_t n = sizes[i];
        int32_t *tok = cg_malloc(n * sizeof *tok);
        pseudo_tokens(tok, n, n);
        cg_kv *kv = cg_kv_new(m, n);
        float *lg = cg_malloc((size_t)c->vocab_size * 4);
        cg_attn_span sp = {0, n, 0, 0};
        int reps = n <= 512 ? 15 : n <= 2048 ? 8 : 3;
        double best = 1e30, att = 1e30, proj = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = th_now_s();
            if (cg_model_forward(m, kv, tok, n, 0, 0, &sp, 1, lg) != CG_OK) return 1;
            best = fmin(best, th_now_s() - t0);
            att = fmin(att, attn_time(c, n, 1024));
            proj = fmin(proj, proj_time(c, n, 1024));
        }
        double attn_flops = (double)L * c->n_heads * 4.0 * c->head_dim * ((double)n * (n + 1) / 2);
        printf("prefill %5u tokens: %.3f s = %5.0f tokens/s | attention kernel alone %.3f s (%.1f "
               "GFLOP/s) | projection sgemms alone %.3f s = %.1f GFLOP/s = %.2f x raw sgemm | "
               "rest %.0f%%\n",
               n, best, n / best, att, attn_flops / att * 1e-9, proj,
               proj_flops_tok * n / proj * 1e-9, proj_flops_tok * n / proj * 1e-9 / raw_mt,
               100.0 * fmax(0.0, best - att - proj) / best);
        cg_kv_free(&kv);
        free(lg);
        free(tok);
    }

    /* decode: single-token steps after a 2048-token prompt */
    {
        const uint32_t ctx = 2048, steps = 1024;
        int32_t *tok = cg_malloc((ctx + steps) * sizeof *tok);
        pseudo_tokens(tok, ctx + steps, 5);
        cg_kv *kv = cg_kv_new(m, ctx + steps);
        float *lg = cg_malloc((size_t)c->vocab_size * 4);
        cg_attn_span sp = {0, ctx, 0, 0};
        if (cg_model_forward(m, kv, tok, ctx, 0, 0, &sp, 1, lg) != CG_OK) return 1;
        /* best window of 64 steps: the figure least disturbed by other load on the machine */
        double per = 1e30;
        for (uint32_t w = 0; w < steps; w += 64) {
            double t0 = th_now_s();
            for (uint32_t s = w; s < w + 64; s++) {
                cg_attn_span one = {ctx + s, 1, 0, 0};
                if (cg_model_forward(m, kv, tok + ctx + s, 1, ctx + s, ctx + s, &one, 1, lg) !=
                    CG_OK)
                    return 1;
            }
            per = fmin(per, (th_now_s() - t0) / 64);
        }
        double att = attn_decode_time(c, ctx + steps / 2, 64);
        printf("decode at context %u-%u: %.3f ms/token = %.0f tokens/s; attention kernel alone "
               "%.3f ms/token (%.0f%%); raw sgemv over all weights %.3f ms/token (1 thread), "
               "%.3f ms/token (%d threads); step/raw sgemv %.1f\n",
               ctx, ctx + steps, per * 1e3, 1.0 / per, att * 1e3, 100.0 * att / per, gemv_t * 1e3,
               gemv_mt * 1e3, blas_threads, per / fmin(gemv_t, gemv_mt));
        cg_kv_free(&kv);
        free(lg);
        free(tok);
    }
    cg_model_close(&m);
    if (own) th_rmrf(dir);
    return 0;
}
