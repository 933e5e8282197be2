/* Time to first token, cold vs warm, on a RAG workload (issue 3): system 256 B, four documents
 * of 2 KiB, question 64 B. Cold: empty pool. Warm: the same documents REORDERED under a
 * CHANGED system prompt, so only the system segment and the question are computed and the
 * documents are remapped from the pool. Both are measured in the same run against a baseline
 * that caches nothing (one causal forward over the whole prompt). Also prefill and decode
 * tokens per second. The engine runs in-process.
 *
 * usage: bench_ttft [--model DIR] [--reps N (default 3)] [--decode N (default 128)]
 *        (without --model a tiny model is generated into a temporary directory) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/serve/engine.h"
#include "base/base.h"
#include "tests/harness/harness.h"

#define SYS_BYTES TH_RAG_SYS_BYTES
#define DOC_BYTES TH_RAG_DOC_BYTES
#define Q_BYTES TH_RAG_Q_BYTES
#define N_DOCS TH_RAG_DOCS

static uint64_t rng_state;

static void die(const char *what, cg_status st, const char *err)
{
    fprintf(stderr, "bench_ttft: %s: %s %s\n", what, cg_status_name(st), err ? err : "");
    exit(1);
}

/* Assemble + the first decoded token; returns seconds. */
static double ttft(cg_engine *e, const cg_engine_seg *segs, size_t n, cg_engine_path path,
                   cg_assembly_info *info_out)
{
    char err[512];
    cg_assemble_req ar = {
        .segs = segs, .n_segs = n, .mode = CG_MODE_STRICT, .reserve_tokens = -1, .path = path};
    cg_assembly_info info;
    cg_complete_result res;
    uint64_t t0 = cg_now_ns();
    cg_status st = cg_engine_assemble(e, &ar, cg_now_ms(), &info, err, sizeof err);
    if (st != CG_OK) die("assemble", st, err);
    cg_complete_req cr = {.assembly_id = info.id, .max_tokens = 1};
    st = cg_engine_complete(e, &cr, cg_now_ms(), &res, err, sizeof err);
    if (st != CG_OK) die("complete", st, err);
    uint64_t t1 = cg_now_ns();
    cg_complete_result_free(&res);
    if (info_out)
        *info_out = info;
    else
        cg_assembly_info_free(&info);
    return (double)(t1 - t0) / 1e9;
}

int main(int argc, char **argv)
{
    th_omp_passive(argv);
    const char *model_dir = NULL;
    int reps = 3, n_decode = 128;
    const th_opt opts[] = {{"--model", TH_OPT_STR, &model_dir},
                           {"--reps", TH_OPT_INT, &reps},
                           {"--decode", TH_OPT_INT, &n_decode}};
    if (th_parse_opts(argc, argv, opts, CG_ARRAY_LEN(opts)) != 0) {
        fprintf(stderr, "usage: bench_ttft [--model DIR] [--reps N] [--decode N]\n");
        return 2;
    }
    if (reps < 1) reps = 1;
    cg_log_init("bench_ttft", CG_LOG_WARN);
    char tmp[TH_MODEL_TMP], err[512];
    cg_model *m = th_bench_model("bench_ttft", model_dir, tmp);
    printf("workload: system %d B, %d documents of %d B, question %d B; %d reps (median)\n\n",
           SYS_BYTES, N_DOCS, DOC_BYTES, Q_BYTES, reps);

    double *cold = cg_calloc((size_t)reps, sizeof(double));
    double *warm = cg_calloc((size_t)reps, sizeof(double));
    double *base = cg_calloc((size_t)reps, sizeof(double));
    double *prefill = cg_calloc((size_t)reps, sizeof(double));
    uint32_t n_tok_cold = 0, n_tok_warm = 0, cached_warm = 0, computed_warm = 0;
    for (int r = 0; r < reps; r++) {
        rng_state = 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1);
        char tag[16];
        snprintf(tag, sizeof tag, "%d", r);
        th_rag_work w;
        th_rag_make(&w, tag, &rng_state);
        const cg_engine_seg *s_cold = w.cold, *s_warm = w.warm;

        cg_engine *e = NULL;
        cg_status st = cg_engine_open(m, cg_engine_default_params(), &e);
        if (st != CG_OK) die("engine", st, NULL);
        /* baseline: no cache at all, one causal forward over the whole prompt */
        base[r] = ttft(e, s_warm, N_DOCS + 2, CG_PATH_CAUSAL, NULL);
        cg_assembly_info info;
        cold[r] = ttft(e, s_cold, N_DOCS + 2, CG_PATH_CACHED, &info);
        n_tok_cold = info.n_tokens;
        prefill[r] = (double)info.computed_tokens / cold[r];
        for (size_t i = 1; i <= N_DOCS; i++)
            if (info.segs[i].hit) die("cold run had a hit", CG_E_INTERNAL, NULL);
        cg_assembly_info_free(&info);
        warm[r] = ttft(e, s_warm, N_DOCS + 2, CG_PATH_CACHED, &info);
        n_tok_warm = info.n_tokens;
        cached_warm = info.cached_tokens;
        computed_warm = info.computed_tokens;
        for (size_t i = 1; i <= N_DOCS; i++)
            if (!info.segs[i].hit) die("warm run had a miss", CG_E_INTERNAL, NULL);
        cg_assembly_info_free(&info);
        cg_engine_close(&e);
        th_rag_free(&w);
    }
    double tc = th_median(cold, reps), tw = th_median(warm, reps), tb = th_median(base, reps);
    printf("| run | prompt tokens | computed | TTFT (ms) |\n|---|---|---|---|\n");
    printf("| baseline: no cache, one causal forward | %u | %u | %.1f |\n", n_tok_warm, n_tok_warm,
           tb * 1e3);
    printf("| cold: empty pool (chunks computed alone + stored) | %u | %u | %.1f |\n", n_tok_cold,
           n_tok_cold, tc * 1e3);
    printf("| warm: docs reordered, system changed | %u | %u (%u reused) | %.1f |\n\n", n_tok_warm,
           computed_warm, cached_warm, tw * 1e3);
    printf("TTFT cold / warm = %.1fx (target >= 10x); baseline / warm = %.1fx\n", tc / tw, tb / tw);
    printf("prefill (cold run, tokens computed / s): %.0f tok/s\n", th_median(prefill, reps));

    /* decode: tokens from an assembly of the workload's size, and from a short prompt */
    static const size_t ctx_bytes[] = {N_DOCS * DOC_BYTES, 0};
    for (size_t t = 0; t < CG_ARRAY_LEN(ctx_bytes); t++) {
        cg_engine *e = NULL;
        cg_status st = cg_engine_open(m, cg_engine_default_params(), &e);
        if (st != CG_OK) die("engine", st, NULL);
        rng_state = 12345;
        char *sys = th_words(SYS_BYTES, "System: ", &rng_state);
        char *doc = ctx_bytes[t] ? th_words(ctx_bytes[t], "Documents: ", &rng_state)
                                 : cg_strdup("Question?");
        cg_engine_seg s[2] = {{CG_ROLE_SYSTEM, sys, SYS_BYTES, NULL},
                              {CG_ROLE_QUESTION, doc, strlen(doc), NULL}};
        cg_assemble_req ar = {.segs = s, .n_segs = 2, .mode = CG_MODE_STRICT, .reserve_tokens = -1};
        cg_assembly_info info;
        uint64_t t0 = cg_now_ns();
        st = cg_engine_assemble(e, &ar, cg_now_ms(), &info, err, sizeof err);
        uint64_t t1 = cg_now_ns();
        if (st != CG_OK) die("assemble", st, err);
        if (ctx_bytes[t])
            printf("prefill (one causal forward of %u tokens): %.0f tok/s\n", info.n_tokens,
                   info.n_tokens / ((double)(t1 - t0) / 1e9));
        /* a temperature keeps EOS from ending the run early; the cost per token is the same */
        cg_complete_req cr = {.assembly_id = info.id,
                              .max_tokens = (uint32_t)n_decode,
                              .temperature = 1.0f,
                              .seed = 7};
        cg_complete_result res;
        t0 = cg_now_ns();
        st = cg_engine_complete(e, &cr, cg_now_ms(), &res, err, sizeof err);
        t1 = cg_now_ns();
        if (st != CG_OK) die("complete", st, err);
        /* the first token comes from the prefill logits; the others cost one forward each */
        double secs = (double)(t1 - t0) / 1e9;
        printf("decode (context %u tokens): %zu tokens in %.1f ms = %.0f tok/s\n", info.n_tokens,
               res.n_tokens, secs * 1e3, res.n_tokens > 1 ? (res.n_tokens - 1) / secs : 0.0);
        cg_complete_result_free(&res);
        cg_assembly_info_free(&info);
        free(sys);
        free(doc);
        cg_engine_close(&e);
    }
    free(cold);
    free(warm);
    free(base);
    free(prefill);
    th_bench_model_close(&m, tmp);
    return 0;
}
