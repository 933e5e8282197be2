/* Attention kernel throughput (cg_attn_forward) on the layouts the worker runs, as GFLOP/s and
 * as a ratio to raw OpenBLAS sgemm of the same FLOP count measured in the same run (one and two
 * OpenBLAS threads); decode also against raw sgemv over the same K/V bytes (its memory floor).
 *   usage: bench_attn [--heads H] [--kv-heads K] [--head-dim D] [--reps N] [--case SUBSTRING]
 *   default shape: chunkgate-tiny (8 heads, 4 KV heads, head_dim 32). Re-execs itself with
 *   OMP_WAIT_POLICY=passive unless the variable is set (chunkgate-worker serve sets it). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv/attn.h"
#include "base/base.h"
#include "tests/harness/harness.h"

static double now_s(void)
{
    return (double)cg_now_ns() * 1e-9;
}

static void fill(float *x, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 40) / (double)(1 << 24) - 0.5);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct shape {
    int heads, kv_heads, dim;
} shape;

typedef struct timing {
    double best, median; /* seconds */
} timing;

/* Visible (query, key) pairs of the spans: each costs 4*dim FLOPs per query head
 * (q.k and p*v, a multiply and an add each). */
static double visible_pairs(const cg_attn_span *sp, size_t ns)
{
    double n = 0;
    for (size_t s = 0; s < ns; s++)
        for (uint32_t i = sp[s].q_start; i < sp[s].q_start + sp[s].q_len; i++)
            n += (double)sp[s].prefix + (double)(i - sp[s].own_start + 1);
    return n;
}

/* Times cg_attn_forward over spans; calls of at most `block` query rows each, the way
 * cg_model_forward issues them (block 0: one call for all rows). */
static timing time_attn(const shape *sh, const cg_attn_span *spans, size_t ns, uint32_t n_slots,
                        uint32_t block, int reps)
{
    size_t plane = (size_t)n_slots * (size_t)sh->dim;
    size_t rows = 0;
    for (size_t s = 0; s < ns; s++)
        rows += spans[s].q_len;
    size_t ld = (size_t)sh->heads * (size_t)sh->dim;
    float *k = cg_malloc(plane * (size_t)sh->kv_heads * sizeof(float));
    float *v = cg_malloc(plane * (size_t)sh->kv_heads * sizeof(float));
    float *q = cg_malloc(rows * ld * sizeof(float));
    float *o = cg_malloc(rows * ld * sizeof(float));
    fill(k, plane * (size_t)sh->kv_heads, 11);
    fill(v, plane * (size_t)sh->kv_heads, 12);
    fill(q, rows * ld, 13);
    for (size_t i = 0; i < rows * ld; i++)
        q[i] *= 8.0f; /* peaked softmax rows, like a trained model's */
    cg_attn_kv kv = {k, v, plane, sh->kv_heads, sh->dim};
    cg_attn_span *sub = cg_malloc((ns + 1) * sizeof *sub);
    double *t = cg_malloc((size_t)(reps + 1) * sizeof(double));
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        double t0 = now_s();
        if (!block) {
            cg_attn_forward(&kv, sh->heads, spans, ns, q, o);
        } else {
            /* cut the spans into calls of `block` rows, as the forward's clip_spans does */
            size_t row = 0;
            for (size_t s = 0; s < ns; s++) {
                for (uint32_t a = 0; a < spans[s].q_len; a += block) {
                    sub[0] = spans[s];
                    sub[0].q_start += a;
                    sub[0].q_len = CG_MIN(block, spans[s].q_len - a);
                    cg_attn_forward(&kv, sh->heads, sub, 1, q + row * ld, o + row * ld);
                    row += sub[0].q_len;
                }
            }
        }
        if (r >= 0) t[r] = now_s() - t0;
    }
    double sum = 0;
    for (size_t i = 0; i < rows * ld; i++)
        sum += o[i];
    if (!isfinite(sum)) fprintf(stderr, "bench_attn: non-finite output\n");
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    timing res = {t[0], t[reps / 2]};
    free(t);
    free(sub);
    free(k);
    free(v);
    free(q);
    free(o);
    return res;
}

/* One BLAS call to time: c = a * b (m x k times k x n) when n > 0, else the sgemv y = a x
 * (m rows of k). */
typedef struct blas_job {
    int m, n, k;
    const float *a, *b;
    float *c;
} blas_job;

/* Best seconds of reps runs of j (after one warm-up) at `threads` OpenBLAS threads. */
static double best_blas(const blas_job *j, int threads, int reps)
{
    openblas_set_num_threads(threads);
    double best = 1e30;
    for (int r = -1; r < reps; r++) {
        double t0 = now_s();
        if (j->n > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, j->m, j->n, j->k, 1.0f, j->a,
                        j->k, j->b, j->n, 0.0f, j->c, j->n);
        else
            cblas_sgemv(CblasRowMajor, CblasNoTrans, j->m, j->k, 1.0f, j->a, j->k, j->b, 1, 0.0f,
                        j->c, 1);
        double t = now_s() - t0;
        if (r >= 0 && t < best) best = t;
    }
    openblas_set_num_threads(1);
    return best;
}

/* Best GFLOP/s of a square-ish sgemm with about `flops` FLOPs at `threads` OpenBLAS threads. */
static double sgemm_gflops(double flops, int threads, int reps)
{
    int n = (int)lround(cbrt(flops / 2.0) / 16.0) * 16;
    n = CG_MAX(n, 16);
    float *a = cg_malloc((size_t)n * n * sizeof(float)),
          *b = cg_malloc((size_t)n * n * sizeof(float));
    float *c = cg_malloc((size_t)n * n * sizeof(float));
    fill(a, (size_t)n * n, 1);
    fill(b, (size_t)n * n, 2);
    double best = best_blas(&(blas_job){n, n, n, a, b, c}, threads, reps);
    free(a);
    free(b);
    free(c);
    return 2.0 * (double)n * n * n / best * 1e-9;
}

/* Best seconds of one sgemv over `floats` floats laid out [rows][dim] (the K and V a decode
 * step reads): the memory floor of decode. */
static double sgemv_time(size_t floats, int dim, int threads, int reps)
{
    size_t rows = floats / (size_t)dim;
    float *a = cg_malloc(rows * (size_t)dim * sizeof(float)),
          *x = cg_malloc((size_t)dim * sizeof(float));
    float *y = cg_malloc(rows * sizeof(float));
    fill(a, rows * (size_t)dim, 3);
    fill(x, (size_t)dim, 4);
    double best = best_blas(&(blas_job){(int)rows, 0, dim, a, x, y}, threads, reps);
    free(a);
    free(x);
    free(y);
    return best;
}

typedef struct bcase {
    const char *name;
    cg_attn_span spans[8];
    size_t n_spans;
    uint32_t n_slots, block;
    int reps;
} bcase;

int main(int argc, char **argv)
{
    th_omp_passive(argv);
    shape sh = {8, 4, 32};
    int reps = 5;
    const char *only = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--heads"))
            sh.heads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-heads"))
            sh.kv_heads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--head-dim"))
            sh.dim = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--case"))
            only = argv[i + 1];
        else {
            fprintf(stderr,
                    "usage: bench_attn [--heads H] [--kv-heads K] [--head-dim D] [--reps N] "
                    "[--case SUBSTRING]\n");
            return 2;
        }
    }
    if (sh.heads <= 0 || sh.kv_heads <= 0 || sh.dim <= 0 || sh.heads % sh.kv_heads || reps <= 0) {
        fprintf(stderr, "bench_attn: bad shape\n");
        return 2;
    }

    /* strict RAG prompt: system 256, four chunks of 2048, question 64 (8512 slots) */
    cg_role roles[6] = {CG_ROLE_SYSTEM, CG_ROLE_CHUNK, CG_ROLE_CHUNK,
                        CG_ROLE_CHUNK,  CG_ROLE_CHUNK, CG_ROLE_QUESTION};
    uint32_t lens[6] = {256, 2048, 2048, 2048, 2048, 64};
    bcase cases[8];
    size_t nc = 0;
    cases[nc++] = (bcase){"prefill causal 2048 (one call)", {{0, 2048, 0, 0}}, 1, 2048, 0, reps};
    cases[nc++] = (bcase){"prefill causal 8192 (one call)", {{0, 8192, 0, 0}}, 1, 8192, 0, reps};
    cases[nc++] =
        (bcase){"prefill causal 8192 (1024-row calls)", {{0, 8192, 0, 0}}, 1, 8192, 1024, reps};
    bcase rag = {"strict RAG 256+4x2048+64 (full)", {{0}}, 0, 8512, 0, reps};
    rag.n_spans = cg_attn_plan(roles, lens, 6, CG_MODE_STRICT, rag.spans);
    cases[nc++] = rag;
    cases[nc++] =
        (bcase){"question 64 rows vs 8512 keys (warm)", {{8448, 64, 0, 0}}, 1, 8512, 0, reps * 8};
    cases[nc++] = (bcase){"decode 1 row vs 8512 keys", {{8512, 1, 0, 0}}, 1, 8513, 0, reps * 40};

    int nthreads = omp_get_max_threads();
    printf(
        "bench_attn: heads %d, kv heads %d, head_dim %d; OpenMP threads %d; OMP_WAIT_POLICY=%s\n",
        sh.heads, sh.kv_heads, sh.dim, nthreads, getenv("OMP_WAIT_POLICY"));
    printf("%-38s %9s %9s %9s %8s %8s %8s\n", "case", "GFLOP", "best ms", "median ms", "GFLOP/s",
           "/sgemm1", "/sgemm2");
    for (size_t c = 0; c < nc; c++) {
        const bcase *b = &cases[c];
        if (only && !strstr(b->name, only)) continue;
        double flops = visible_pairs(b->spans, b->n_spans) * sh.heads * 4.0 * sh.dim;
        /* baselines first, then OpenBLAS back at one thread as cg_model_open leaves it */
        double g1 = sgemm_gflops(flops, 1, 5), g2 = sgemm_gflops(flops, 2, 5);
        timing t = time_attn(&sh, b->spans, b->n_spans, b->n_slots, b->block, b->reps);
        double g = flops / t.best * 1e-9;
        printf("%-38s %9.3f %9.3f %9.3f %8.1f %8.2f %8.2f\n", b->name, flops * 1e-9, t.best * 1e3,
               t.median * 1e3, g, g / g1, g / g2);
        if (b->n_spans == 1 && b->spans[0].q_len == 1) {
            size_t kv_floats = (size_t)2 * sh.kv_heads * b->n_slots * (size_t)sh.dim;
            double f1 = sgemv_time(kv_floats, sh.dim, 1, 50),
                   f2 = sgemv_time(kv_floats, sh.dim, 2, 50);
            printf(
                "  decode floor: sgemv over the %.1f MiB of K+V: %.3f ms (1 thr), %.3f ms (2 thr); "
                "attention / floor(2 thr) = %.2f\n",
                (double)kv_floats * 4 / (1 << 20), f1 * 1e3, f2 * 1e3, t.best / f2);
        }
        printf("  sgemm of the same FLOPs: %.1f GFLOP/s (1 thr), %.1f GFLOP/s (2 thr)\n", g1, g2);
    }
    return 0;
}
