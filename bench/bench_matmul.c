/* Weight-product throughput (worker/model/matmul.c) at the Qwen2.5-0.5B shapes, as ratios to
 * baselines measured in the same run:
 *   prefill, n = 512 rows per projection: cg_matmul_prefill on f32, bf16 and f16 weights, the
 *     int8-per-row option and the Q8_0 / Q4_0 blocks of --quant q8 / q4 vs plain sgemm on f32
 *     weights (both cores, each thread one sgemm on half the rows of x, as the forward pass did
 *     before); GFLOP/s and ratio. The blocks run twice: in the active variant (amx or
 *     AVX512-BF16 tiles where the CPU has them) and in avx512 (widened to f32 for sgemm).
 *   decode, n = 1..16: cg_matmul_decode over several layers' weights (more bytes than L3) and
 *     over lm_head vs a plain 2-thread read of the same bytes (f32, bf16, f16, the int8-per-row
 *     option, and the Q8_0 / Q4_0 blocks of --quant q8 / q4); GB/s of weight bytes and ratio.
 *   read, --read-only MiB: the plain 2-thread read alone over a buffer of that size, one line
 *     of GB/s (median and best); what bench/llamacpp/versus.mjs --bandwidth measures decode
 *     against, in the same run.
 *   usage: bench_matmul [--reps N] [--layers L] [--isa generic|avx2|avx512] [--skip-prefill]
 *          [--skip-decode] [--read-only MiB]
 * Re-execs itself with OMP_WAIT_POLICY=passive unless the variable is set (as the worker runs). */
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"
#include "worker/model/matmul.h"

/* Qwen2.5-0.5B */
#define HIDDEN 896
#define QDIM 896
#define KVDIM 128
#define INTER 4864
#define VOCAB 151936
#define PREFILL_N 512

typedef struct proj {
    const char *name;
    int rows, cols;
} proj;

static const proj projs[] = {{"q_proj", QDIM, HIDDEN},     {"k_proj", KVDIM, HIDDEN},
                             {"v_proj", KVDIM, HIDDEN},    {"o_proj", HIDDEN, QDIM},
                             {"gate_proj", INTER, HIDDEN}, {"up_proj", INTER, HIDDEN},
                             {"down_proj", HIDDEN, INTER}};
#define NPROJ ((int)CG_ARRAY_LEN(projs))

/* the checkpoint dtypes, then the int8 option (reported apart, never a baseline) */
#define NDT 4
static const cg_dtype dts[NDT] = {CG_DTYPE_F32, CG_DTYPE_BF16, CG_DTYPE_F16, CG_DTYPE_Q8};
static const char *const dt_names[NDT] = {"f32", "bf16", "f16", "q8"};
/* the block types of --quant q8 / q4, quantised from the f16 weights as the worker does at load */
static const cg_dtype qdts[2] = {CG_DTYPE_Q8_0, CG_DTYPE_Q4_0};
static const char *const qnames[2] = {"q8_0", "q4_0"};

static double now_s(void)
{
    return (double)cg_now_ns() * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Random weights in [-0.5, 0.5) in dtype dt (16-bit ones by truncating the f32 bits: the
 * values only need to be finite; Q8: random int8, scales set by weights_new). */
static void fill_weights(void *dst, cg_dtype dt, size_t count, uint64_t seed)
{
#pragma omp parallel
    {
        size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        size_t a = count * t / nt, b = count * (t + 1) / nt;
        uint64_t s = seed + t * 0x9e3779b97f4a7c15ull;
        for (size_t i = a; i < b; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            float f = (float)((double)(s >> 40) / (double)(1 << 24) - 0.5);
            if (dt == CG_DTYPE_F32) {
                ((float *)dst)[i] = f;
            } else if (dt == CG_DTYPE_Q8) {
                ((int8_t *)dst)[i] = (int8_t)(int)(f * 254.0f);
            } else if (dt == CG_DTYPE_BF16) {
                uint32_t u;
                memcpy(&u, &f, 4);
                ((uint16_t *)dst)[i] = (uint16_t)(u >> 16);
            } else {
                /* |f| < 0.5: exponent and 10 mantissa bits, truncated */
                uint32_t u;
                memcpy(&u, &f, 4);
                int e = (int)((u >> 23) & 255) - 127 + 15;
                uint16_t h = (uint16_t)((u >> 16) & 0x8000);
                if (e > 0) h |= (uint16_t)((unsigned)e << 10 | ((u >> 13) & 1023));
                ((uint16_t *)dst)[i] = h;
            }
        }
    }
}

static void fill_x(float *x, size_t n, uint64_t s)
{
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / (double)(1 << 24) - 0.5);
    }
}

/* ---- baselines ---- */

/* The forward pass's f32 product before this module: rows of x split between the threads,
 * each one single-threaded sgemm against all of W. */
static void sgemm_baseline(const float *x, int n, const float *w, int rows, int cols, float *y)
{
#pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int a = (int)((int64_t)n * t / nt), b = (int)((int64_t)n * (t + 1) / nt);
        if (b > a)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b - a, rows, cols, 1.0f,
                        x + (size_t)a * cols, cols, w, cols, 0.0f, y + (size_t)a * rows, rows);
    }
}

__attribute__((target("avx2"))) static uint64_t read_avx2(const char *p, size_t bytes)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    uint64_t r = (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
    for (; i < bytes; i++)
        r ^= (uint8_t)p[i];
    return r;
}

static uint64_t read_plain(const char *p, size_t bytes)
{
    uint64_t r = 0, v;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        memcpy(&v, p + i, 8);
        r ^= v;
    }
    for (; i < bytes; i++)
        r ^= (uint8_t)p[i];
    return r;
}

static volatile uint64_t sink;

/* A plain read of `bytes` with both threads, each its contiguous half. */
static void read_2threads(const void *p, size_t bytes)
{
    const int avx2 = __builtin_cpu_supports("avx2");
    uint64_t r = 0;
#pragma omp parallel reduction(^ : r)
    {
        size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        size_t a = bytes * t / nt / 64 * 64,
               b = t + 1 == nt ? bytes : bytes * (t + 1) / nt / 64 * 64;
        r ^= avx2 ? read_avx2((const char *)p + a, b - a) : read_plain((const char *)p + a, b - a);
    }
    sink = r;
}

/* ---- weights ---- */

/* One matrix of dtype dt (in *arena, Q8 scales in *scales; caller frees both). */
static cg_weight weights_new(cg_dtype dt, int rows, int cols, uint64_t seed, void **arena,
                             float **scales)
{
    size_t cnt = (size_t)rows * (size_t)cols;
    *arena = cg_malloc(cnt * cg_dtype_size(dt));
    fill_weights(*arena, dt, cnt, seed);
    *scales = cg_malloc((size_t)rows * sizeof(float));
    for (int r = 0; r < rows; r++)
        (*scales)[r] = 0.5f / 127.0f;
    return (cg_weight){.data = *arena,
                       .dtype = dt,
                       .rows = rows,
                       .cols = cols,
                       .scale = dt == CG_DTYPE_Q8 ? *scales : NULL};
}

typedef struct wset {
    cg_weight *w; /* count matrices inside one arena, as in an mmapped file */
    int count;
    void *arena;
    float *scales;     /* Q8: one per row of every matrix */
    uint16_t *bscales; /* Q8_0 / Q4_0: the block scales of every matrix, in one arena too */
    size_t bytes;      /* every byte a pass reads: values and block scales */
} wset;

/* The f16 set s quantised to Q8_0 or Q4_0 by the worker's cg_matmul_quantize (as --quant
 * does at load): every matrix's values in one arena, every block scale in another. */
static wset wset_quantised(wset s, cg_dtype to)
{
    size_t vbytes = 0, nscale = 0;
    for (int i = 0; i < s.count; i++) {
        size_t ns;
        vbytes += cg_matmul_quant_bytes(to, s.w[i].rows, s.w[i].cols, &ns);
        nscale += ns;
    }
    wset q = {cg_malloc((size_t)s.count * sizeof(cg_weight)),
              s.count,
              cg_malloc(vbytes),
              NULL,
              cg_malloc(nscale * sizeof(uint16_t)),
              vbytes + nscale * sizeof(uint16_t)};
    char *v = q.arena;
    uint16_t *sc = q.bscales;
    for (int i = 0; i < s.count; i++) {
        size_t ns;
        const size_t nb = cg_matmul_quant_bytes(to, s.w[i].rows, s.w[i].cols, &ns);
        if (cg_matmul_quantize(&s.w[i], to, v, sc, &q.w[i]) != CG_OK) abort();
        v += nb;
        sc += ns;
    }
    return q;
}

static void wset_free(wset *s)
{
    free(s->w);
    free(s->arena);
    free(s->scales);
    free(s->bscales);
}

/* ---- prefill ---- */

/* The prefill's block-quantised columns: qdts in the active variant, then in avx512 (the
 * weights widened to f32 panels for sgemm) where the active one is above it. */
#define NQP 4

static void bench_prefill(int reps, cg_matmul_scratch *scr)
{
    /* v = 0: the sgemm baseline, v = 1 + d: cg_matmul_prefill on dts[d], then the NQP blocks */
    enum { NV = NDT + 1 + NQP };
    const cg_matmul_isa active = cg_matmul_isa_active();
    const cg_matmul_isa widen = CG_MIN(active, CG_MATMUL_ISA_AVX512);
    printf("\nprefill: n = %d rows per product; GFLOP/s = 2*n*rows*cols / median time; ratio = "
           "sgemm time / time, same rep (median); q8 is the int8 option; q8_0 / q4_0 the blocks "
           "of --quant q8 / q4 in %s, 'sg' in %s\n",
           PREFILL_N, cg_matmul_isa_name(active), cg_matmul_isa_name(widen));
    printf("%-10s %5s %5s | %8s |", "projection", "out", "in", "sgemm");
    for (int d = 0; d < NDT; d++)
        printf(" %8s %5s |", dt_names[d], "ratio");
    for (int d = 0; d < NQP; d++) {
        char name[16];
        snprintf(name, sizeof name, "%s%s", qnames[d % 2], d >= 2 ? " sg" : "");
        printf(" %8s %5s |", name, "ratio");
    }
    printf("\n");
    float *x = cg_malloc((size_t)PREFILL_N * INTER * sizeof(float));
    float *y = cg_malloc((size_t)PREFILL_N * INTER * sizeof(float));
    fill_x(x, (size_t)PREFILL_N * INTER, 5);
    double tot[NV] = {0};
    for (int p = 0; p < NPROJ; p++) {
        const proj *pr = &projs[p];
        size_t cnt = (size_t)pr->rows * pr->cols;
        void *w[NDT];
        float *sc[NDT];
        cg_weight cw[NDT];
        for (int d = 0; d < NDT; d++)
            cw[d] = weights_new(dts[d], pr->rows, pr->cols, 10 + (uint64_t)p, &w[d], &sc[d]);
        wset qw[2];
        for (int d = 0; d < 2; d++)
            qw[d] = wset_quantised((wset){.w = &cw[2], .count = 1}, qdts[d]);
        /* each rep times the baseline and the variants back to back; a variant's ratio is the
         * median over reps of baseline time / variant time within one rep */
        double *t[NV], *q[NV];
        for (int v = 0; v < NV; v++) {
            t[v] = cg_malloc((size_t)reps * sizeof(double));
            q[v] = cg_malloc((size_t)reps * sizeof(double));
        }
        /* small products repeat within one timing so that each lasts about 5 ms or more */
        const double flops = 2.0 * PREFILL_N * (double)cnt;
        const int inner = CG_MAX(1, (int)(0.5e9 / flops));
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
            for (int v = 0; v < NV; v++) {
                const int qi = v - 1 - NDT; /* >= 0: a block column */
                if (qi >= 2 && cg_matmul_set_isa(widen) != CG_OK) abort();
                double t0 = now_s();
                for (int i = 0; i < inner; i++) {
                    if (v == 0)
                        sgemm_baseline(x, PREFILL_N, w[0], pr->rows, pr->cols, y);
                    else if (qi >= 0)
                        cg_matmul_prefill(qw[qi % 2].w, x, PREFILL_N, y, scr);
                    else
                        cg_matmul_prefill(&cw[v - 1], x, PREFILL_N, y, scr);
                }
                if (r >= 0) t[v][r] = (now_s() - t0) / inner;
                if (qi >= 2 && cg_matmul_set_isa(active) != CG_OK) abort();
            }
            if (r >= 0)
                for (int v = 1; v < NV; v++)
                    q[v][r] = t[0][r] / t[v][r];
        }
        printf("%-10s %5d %5d |", pr->name, pr->rows, pr->cols);
        for (int v = 0; v < NV; v++) {
            double m = median(t[v], reps);
            tot[v] += m;
            if (v)
                printf(" %8.1f %5.2f |", flops / m * 1e-9, median(q[v], reps));
            else
                printf(" %8.1f |", flops / m * 1e-9);
            free(t[v]);
            free(q[v]);
        }
        printf("\n");
        for (int d = 0; d < NDT; d++) {
            free(w[d]);
            free(sc[d]);
        }
        for (int d = 0; d < 2; d++)
            wset_free(&qw[d]);
    }
    printf("%-22s | %8s |", "whole layer", "");
    for (int v = 1; v < NV; v++)
        printf(" %8s %5.2f |", "", tot[0] / tot[v]);
    printf(" (time ratio, sum of medians)\n");
    free(x);
    free(y);
}

/* ---- decode ---- */

static wset wset_layers(cg_dtype dt, int layers)
{
    wset s = {
        cg_malloc((size_t)layers * NPROJ * sizeof(cg_weight)), layers * NPROJ, NULL, NULL, NULL, 0};
    const size_t es = cg_dtype_size(dt);
    size_t all_rows = 0;
    for (int p = 0; p < NPROJ; p++) {
        s.bytes += (size_t)projs[p].rows * projs[p].cols * es * (size_t)layers;
        all_rows += (size_t)projs[p].rows * (size_t)layers;
    }
    s.arena = cg_malloc(s.bytes);
    fill_weights(s.arena, dt, s.bytes / es, 3);
    s.scales = cg_malloc(all_rows * sizeof(float));
    for (size_t r = 0; r < all_rows; r++)
        s.scales[r] = 0.5f / 127.0f;
    char *q = s.arena;
    float *sc = s.scales;
    for (int l = 0; l < layers; l++)
        for (int p = 0; p < NPROJ; p++) {
            s.w[l * NPROJ + p] = (cg_weight){.data = q,
                                             .dtype = dt,
                                             .rows = projs[p].rows,
                                             .cols = projs[p].cols,
                                             .scale = dt == CG_DTYPE_Q8 ? sc : NULL};
            q += (size_t)projs[p].rows * projs[p].cols * es;
            sc += projs[p].rows;
        }
    return s;
}

static wset wset_lm_head(cg_dtype dt)
{
    wset s = {cg_malloc(sizeof(cg_weight)), 1, NULL, NULL, NULL, 0};
    s.w[0] = weights_new(dt, VOCAB, HIDDEN, 4, &s.arena, &s.scales);
    s.bytes = (size_t)VOCAB * HIDDEN * cg_dtype_size(dt);
    return s;
}

static void read_set(const wset *s)
{
    for (int i = 0; i < s->count; i++) {
        const cg_weight *w = &s->w[i];
        size_t ns = 0;
        if (w->bscale) {
            read_2threads(w->data, cg_matmul_quant_bytes(w->dtype, w->rows, w->cols, &ns));
            read_2threads(w->bscale, ns * sizeof(uint16_t));
        } else {
            read_2threads(w->data, (size_t)w->rows * w->cols * cg_dtype_size(w->dtype));
        }
    }
}

static void decode_set(const wset *s, const float *x, int n, float *y)
{
    for (int i = 0; i < s->count; i++)
        cg_matmul_decode(&s->w[i], x, n, y);
}

/* Each rep times, for every n, the read baseline and the kernel back to back (one OpenMP
 * region per matrix in both); ratios are medians over reps of the pair's time ratio. */
static void bench_decode_set(const char *label, const wset *s, int reps, const float *x, float *y)
{
    static const int ns[] = {1, 2, 4, 8, 16};
    enum { NN = (int)CG_ARRAY_LEN(ns) };
    double *tr[NN], *tk[NN], *q[NN], *q8 = cg_malloc((size_t)reps * sizeof(double));
    for (int v = 0; v < NN; v++) {
        tr[v] = cg_malloc((size_t)reps * sizeof(double));
        tk[v] = cg_malloc((size_t)reps * sizeof(double));
        q[v] = cg_malloc((size_t)reps * sizeof(double));
    }
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        for (int v = 0; v < NN; v++) {
            double t0 = now_s();
            read_set(s);
            double t1 = now_s();
            decode_set(s, x, ns[v], y);
            double t2 = now_s();
            if (r < 0) continue;
            tr[v][r] = t1 - t0;
            tk[v][r] = t2 - t1;
            q[v][r] = tr[v][r] / tk[v][r];
        }
        if (r >= 0) q8[r] = tk[3][r] / tk[0][r];
    }
    double gb = (double)s->bytes * 1e-9, all_reads = 0;
    for (int v = 0; v < NN; v++)
        for (int r = 0; r < reps; r++)
            all_reads += tr[v][r];
    printf("%-16s %7.1f | %6.1f |", label, (double)s->bytes / (1 << 20),
           gb * NN * reps / all_reads);
    const double ms1 = median(tk[0], reps) * 1e3;
    for (int v = 0; v < NN; v++) {
        printf(" %6.1f %4.2f |", gb / median(tk[v], reps), median(q[v], reps));
        free(tr[v]);
        free(tk[v]);
        free(q[v]);
    }
    printf(" %5.2f | %7.2f\n", median(q8, reps), ms1);
    free(q8);
}

static void bench_decode(int reps, int layers)
{
    printf("\ndecode: GB/s of weight bytes (median time); ratio = read time / kernel time, same "
           "rep (median); read = mean GB/s of the plain 2-thread read; 8/1 = time(n=8) / "
           "time(n=1), same rep (median); ms n=1 = median time of one pass at n=1; q8 is the "
           "int8-per-row option, q8_0 / q4_0 the block types of --quant q8 / q4 (values and "
           "block scales read)\n");
    printf("%-16s %7s | %6s | %11s | %11s | %11s | %11s | %11s | %5s | %7s\n", "weights", "MiB",
           "read", "n=1  ratio", "n=2  ratio", "n=4  ratio", "n=8  ratio", "n=16 ratio", "8/1",
           "ms n=1");
    float *x = cg_malloc((size_t)16 * INTER * sizeof(float));
    float *y = cg_malloc((size_t)16 * VOCAB * sizeof(float));
    fill_x(x, (size_t)16 * INTER, 9);
    char label[64];
    for (int d = 0; d < NDT; d++) {
        wset s = wset_layers(dts[d], layers);
        snprintf(label, sizeof label, "%s %d layers", dt_names[d], layers);
        bench_decode_set(label, &s, reps, x, y);
        wset_free(&s);
    }
    for (int d = 0; d < NDT; d++) {
        wset s = wset_lm_head(dts[d]);
        snprintf(label, sizeof label, "%s lm_head", dt_names[d]);
        bench_decode_set(label, &s, reps, x, y);
        wset_free(&s);
    }
    /* the block types of --quant q8 / q4, quantised from the f16 sets */
    for (int lm = 0; lm < 2; lm++)
        for (int d = 0; d < 2; d++) {
            wset f = lm ? wset_lm_head(CG_DTYPE_F16) : wset_layers(CG_DTYPE_F16, layers);
            wset s = wset_quantised(f, qdts[d]);
            wset_free(&f);
            if (lm)
                snprintf(label, sizeof label, "%s lm_head", qnames[d]);
            else
                snprintf(label, sizeof label, "%s %d layers", qnames[d], layers);
            bench_decode_set(label, &s, reps, x, y);
            wset_free(&s);
        }
    free(x);
    free(y);
}

/* The plain 2-thread read of a fresh buffer of mib MiB (touched first), reps times. */
static void bench_read_only(int reps, size_t mib)
{
    const size_t bytes = mib << 20;
    char *p = cg_malloc(bytes);
    memset(p, 1, bytes);
    double *t = cg_calloc((size_t)reps, sizeof *t), best = 0;
    read_2threads(p, bytes);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        read_2threads(p, bytes);
        t[r] = now_s() - t0;
        if (best == 0 || t[r] < best) best = t[r];
    }
    printf("read %zu MiB: %.2f GB/s median, %.2f GB/s best (%d reps)\n", mib,
           (double)bytes / median(t, reps) / 1e9, (double)bytes / best / 1e9, reps);
    free(t);
    free(p);
}

int main(int argc, char **argv)
{
    th_omp_passive(argv);
    int reps = 7, layers = 4, prefill = 1, decode = 1, read_mib = 0;
    const char *isa = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc)
            isa = argv[++i];
        else if (!strcmp(argv[i], "--skip-prefill"))
            prefill = 0;
        else if (!strcmp(argv[i], "--skip-decode"))
            decode = 0;
        else if (!strcmp(argv[i], "--read-only") && i + 1 < argc)
            read_mib = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_matmul [--reps N] [--layers L] "
                            "[--isa generic|avx2|avx512] [--skip-prefill] [--skip-decode] "
                            "[--read-only MiB]\n");
            return 2;
        }
    }
    if (reps <= 0 || layers <= 0 || read_mib < 0) {
        fprintf(stderr, "bench_matmul: --reps, --layers and --read-only must be positive\n");
        return 2;
    }
    if (read_mib) {
        bench_read_only(reps, (size_t)read_mib);
        return 0;
    }
    if (isa) {
        int found = -1;
        for (int i = 0; i < CG_MATMUL_ISA_COUNT; i++)
            if (!strcmp(isa, cg_matmul_isa_name((cg_matmul_isa)i))) found = i;
        if (found < 0 || cg_matmul_set_isa((cg_matmul_isa)found) != CG_OK) {
            fprintf(stderr, "bench_matmul: variant %s is not available here\n", isa);
            return 2;
        }
    }
    cg_matmul_scratch *scr = cg_matmul_scratch_new(); /* also OpenBLAS at one thread */
    printf("bench_matmul: variant %s; OpenMP threads %d; OMP_WAIT_POLICY=%s; OpenBLAS %s "
           "(OPENBLAS_CORETYPE=%s); %d reps, medians\n",
           cg_matmul_isa_name(cg_matmul_isa_active()), omp_get_max_threads(),
           getenv("OMP_WAIT_POLICY"), openblas_get_corename(),
           getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset", reps);
    if (prefill) bench_prefill(reps, scr);
    if (decode) bench_decode(reps, layers);
    cg_matmul_scratch_free(&scr);
    return 0;
}
