/* Quality of reuse against speed (DESIGN §15), in process: on a RAG workload whose documents
 * are pool hits placed in another order than they were first seen, for each isolation mode,
 * recompute_prefix_tokens k and recompute_ratio r, the worker's own quality probe
 * (cg_engine_probe_compare: KL(full || reused) and top-1 agreement of the next-token
 * distributions at the prompt's end and over the first N greedy tokens, teacher-forced) next
 * to the time to first token of the setting (assemble + first token) and of no cache at all
 * (one causal forward), in wall time and in the process's CPU time (both compute threads: on a
 * shared machine the steadier of the two). The reps of every setting are interleaved, so a
 * change of load hits all settings alike. Averages over several prompts.
 *
 * usage: bench_quality [--model DIR] [--prompts P (3)] [--reps R (3)] [--tokens N (16)]
 *        [--docs D (4)] [--doc-bytes B (512)] [--sys-bytes B (256)] [--q-bytes B (64)]
 *        [--modes strict,sys] [--ratios 0,0.05,0.15,0.3,0.5,1] [--prefix 0,16,32]
 *        (without --model the tiny model is generated into a temporary directory) */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"
#include "worker/serve/engine.h"

#define MAX_DOCS 16
#define MAX_LIST 16

static uint64_t rng_state;

static void die(const char *what, cg_status st, const char *err)
{
    fprintf(stderr, "bench_quality: %s: %s %s\n", what, cg_status_name(st), err ? err : "");
    exit(1);
}

/* A comma-separated list of numbers into out (at most MAX_LIST); returns the count. */
static int parse_list(const char *s, double *out)
{
    int n = 0;
    char *end;
    while (*s && n < MAX_LIST) {
        out[n++] = strtod(s, &end);
        if (end == s) return -1;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

typedef struct setting {
    cg_mode mode;
    uint32_t k;
    float r;
} setting;

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double last_cpu; /* CPU seconds of the last run's assemble + first token */

/* Assemble + the first token (wall seconds; last_cpu: CPU seconds); with a probe, also the
 * comparison (not timed). */
static double run(cg_engine *e, const cg_engine_seg *segs, size_t n, setting s, cg_engine_path path,
                  uint32_t probe_tokens, cg_quality *q, cg_assembly_info *info_out)
{
    char err[512];
    cg_assemble_req ar = {.segs = segs,
                          .n_segs = n,
                          .mode = s.mode,
                          .recompute_prefix_tokens = s.k,
                          .recompute_ratio = s.r,
                          .reserve_tokens = -1,
                          .path = path};
    cg_assembly_info info;
    cg_complete_result res;
    double c0 = cpu_now();
    uint64_t t0 = cg_now_ns();
    cg_status st = cg_engine_assemble(e, &ar, cg_now_ms(), &info, err, sizeof err);
    if (st != CG_OK) die("assemble", st, err);
    cg_complete_req cr = {.assembly_id = info.id,
                          .max_tokens = q ? probe_tokens + 1 : 1,
                          .probe = q != NULL,
                          .probe_tokens = probe_tokens};
    st = cg_engine_complete(e, &cr, cg_now_ms(), &res, err, sizeof err);
    if (st != CG_OK) die("complete", st, err);
    uint64_t t1 = cg_now_ns();
    last_cpu = cpu_now() - c0;
    if (q) {
        if (!res.probe) die("no probe", CG_E_INTERNAL, NULL);
        st = cg_engine_probe_compare(e, res.probe, q);
        if (st != CG_OK) die("compare", st, NULL);
    }
    cg_complete_result_free(&res);
    if (info_out)
        *info_out = info;
    else
        cg_assembly_info_free(&info);
    return (double)(t1 - t0) / 1e9;
}

/* What one setting gave, summed over the prompts. */
typedef struct result {
    double kl, kl_first, ttft, cpu, recomputed, chunk_tokens;
    uint64_t agreed, compared;
    double *wall, *cpus; /* this prompt's reps */
} result;

int main(int argc, char **argv)
{
    th_omp_passive(argv);
    const char *model_dir = NULL;
    int prompts = 3, reps = 3, n_docs = 4;
    uint32_t tokens = 16;
    size_t doc_bytes = 512, sys_bytes = 256, q_bytes = 64;
    double ratios[MAX_LIST] = {0, 0.05, 0.15, 0.3, 0.5, 1}, prefix[MAX_LIST] = {0, 16, 32};
    int n_ratios = 6, n_prefix = 3;
    cg_mode modes[2] = {CG_MODE_STRICT, CG_MODE_SYS};
    int n_modes = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (ok && !strcmp(a, "--model"))
            model_dir = v;
        else if (ok && !strcmp(a, "--prompts"))
            prompts = atoi(v);
        else if (ok && !strcmp(a, "--reps"))
            reps = atoi(v);
        else if (ok && !strcmp(a, "--tokens"))
            tokens = (uint32_t)atoi(v);
        else if (ok && !strcmp(a, "--docs"))
            n_docs = atoi(v);
        else if (ok && !strcmp(a, "--doc-bytes"))
            doc_bytes = (size_t)atol(v);
        else if (ok && !strcmp(a, "--sys-bytes"))
            sys_bytes = (size_t)atol(v);
        else if (ok && !strcmp(a, "--q-bytes"))
            q_bytes = (size_t)atol(v);
        else if (ok && !strcmp(a, "--ratios"))
            ok = (n_ratios = parse_list(v, ratios)) > 0;
        else if (ok && !strcmp(a, "--prefix"))
            ok = (n_prefix = parse_list(v, prefix)) > 0;
        else if (ok && !strcmp(a, "--modes")) {
            n_modes = 0;
            if (strstr(v, "strict")) modes[n_modes++] = CG_MODE_STRICT;
            if (strstr(v, "sys")) modes[n_modes++] = CG_MODE_SYS;
            ok = n_modes > 0;
        } else
            ok = 0;
        if (!ok || n_docs < 2 || n_docs > MAX_DOCS || prompts < 1 || reps < 1 || doc_bytes < 32 ||
            sys_bytes < 32 || q_bytes < 16) {
            fprintf(stderr, "usage: bench_quality [--model DIR] [--prompts P] [--reps R] "
                            "[--tokens N] [--docs D] [--doc-bytes B] [--sys-bytes B] "
                            "[--q-bytes B] [--modes strict,sys] [--ratios r,...] "
                            "[--prefix k,...]\n");
            return 2;
        }
        i++;
    }
    cg_log_init("bench_quality", CG_LOG_WARN);
    char tmp[TH_MODEL_TMP];
    cg_model *m = th_bench_model("bench_quality", model_dir, tmp);
    printf("workload: system %zu B, %d documents of %zu B placed in another order than they were "
           "computed in, question %zu B; %d prompts; KL/top-1 over the prompt's end + %u greedy "
           "tokens; TTFT median of %d reps\n\n",
           sys_bytes, n_docs, doc_bytes, q_bytes, prompts, tokens, reps);
    fflush(stdout);

    const int n_set = n_modes * n_prefix * n_ratios;
    result *res = cg_calloc((size_t)n_set, sizeof *res);
    for (int i = 0; i < n_set; i++) {
        res[i].wall = cg_calloc((size_t)reps, sizeof(double));
        res[i].cpus = cg_calloc((size_t)reps, sizeof(double));
    }
    double base = 0, base_cpu = 0, *t = cg_calloc((size_t)reps, sizeof(double));
    double *tc = cg_calloc((size_t)reps, sizeof(double));
    uint32_t n_tokens = 0;
    for (int p = 0; p < prompts; p++) {
        rng_state = 0x9e3779b97f4a7c15ull * (uint64_t)(p + 1);
        char *sys = th_words(sys_bytes, "System: answer from the documents only. ", &rng_state);
        char *q = th_words(q_bytes, "Question: ", &rng_state);
        char *docs[MAX_DOCS];
        cg_engine_seg s1[MAX_DOCS + 2], s2[MAX_DOCS + 2];
        s1[0] = s2[0] = (cg_engine_seg){CG_ROLE_SYSTEM, sys, sys_bytes, NULL};
        for (int d = 0; d < n_docs; d++) {
            char pre[32];
            snprintf(pre, sizeof pre, "Document %d-%d. ", p, d);
            docs[d] = th_words(doc_bytes, pre, &rng_state);
        }
        for (int d = 0; d < n_docs; d++) {
            s1[1 + d] = (cg_engine_seg){CG_ROLE_CHUNK, docs[d], doc_bytes, NULL};
            /* reversed, then rotated by the prompt's number: every document moves */
            int o = (n_docs - 1 - d + p) % n_docs;
            s2[1 + d] = (cg_engine_seg){CG_ROLE_CHUNK, docs[o], doc_bytes, NULL};
        }
        s1[n_docs + 1] = s2[n_docs + 1] = (cg_engine_seg){CG_ROLE_QUESTION, q, q_bytes, NULL};
        const size_t n = (size_t)n_docs + 2;
        for (int mi = 0; mi < n_modes; mi++) {
            cg_engine *e = NULL;
            cg_status st = cg_engine_open(m, cg_engine_default_params(), &e);
            if (st != CG_OK) die("engine", st, NULL);
            setting none = {modes[mi], 0, 0};
            (void)run(e, s1, n, none, CG_PATH_CACHED, 0, NULL, NULL); /* the pool: order 1 */
            if (mi == 0) {
                for (int r = 0; r < reps; r++) {
                    t[r] = run(e, s2, n, none, CG_PATH_CAUSAL, 0, NULL, NULL);
                    tc[r] = last_cpu;
                }
                base += th_median(t, reps) / prompts;
                base_cpu += th_median(tc, reps) / prompts;
            }
            /* timing: rep by rep over every setting of the mode */
            for (int r = 0; r < reps; r++)
                for (int ki = 0; ki < n_prefix; ki++)
                    for (int ri = 0; ri < n_ratios; ri++) {
                        setting s = {modes[mi], (uint32_t)prefix[ki], (float)ratios[ri]};
                        result *x = &res[(mi * n_prefix + ki) * n_ratios + ri];
                        x->wall[r] = run(e, s2, n, s, CG_PATH_CACHED, 0, NULL, NULL);
                        x->cpus[r] = last_cpu;
                    }
            for (int ki = 0; ki < n_prefix; ki++)
                for (int ri = 0; ri < n_ratios; ri++) {
                    setting s = {modes[mi], (uint32_t)prefix[ki], (float)ratios[ri]};
                    result *x = &res[(mi * n_prefix + ki) * n_ratios + ri];
                    cg_assembly_info info;
                    cg_quality qa;
                    (void)run(e, s2, n, s, CG_PATH_CACHED, tokens, &qa, &info);
                    for (size_t i = 1; i <= (size_t)n_docs; i++)
                        if (!info.segs[i].hit) die("a document missed", CG_E_INTERNAL, NULL);
                    uint32_t chunk = 0;
                    for (size_t i = 1; i <= (size_t)n_docs; i++)
                        chunk += info.segs[i].n_tokens;
                    n_tokens = info.n_tokens;
                    double w = th_median(x->wall, reps), cpu = th_median(x->cpus, reps);
                    x->ttft += w / prompts;
                    x->cpu += cpu / prompts;
                    x->kl += qa.kl / prompts;
                    x->kl_first += qa.kl_first / prompts;
                    x->agreed += qa.top1_agreed;
                    x->compared += qa.tokens_compared;
                    x->recomputed += (double)info.recomputed_tokens / prompts;
                    x->chunk_tokens += (double)chunk / prompts;
                    fprintf(stderr,
                            "prompt %d %s k=%u r=%.2f: KL %.3e top-1 %u/%u TTFT %.1f ms (CPU %.1f "
                            "ms)\n",
                            p, cg_mode_name(s.mode), s.k, s.r, qa.kl, qa.top1_agreed,
                            qa.tokens_compared, w * 1e3, cpu * 1e3);
                    cg_assembly_info_free(&info);
                }
            cg_engine_close(&e);
        }
        free(sys);
        free(q);
        for (int d = 0; d < n_docs; d++)
            free(docs[d]);
    }
    printf("prompt tokens %u; no cache (one causal forward): TTFT %.1f ms, CPU %.1f ms\n\n",
           n_tokens, base * 1e3, base_cpu * 1e3);
    printf("| mode | k | r | recomputed tokens (share of chunk tokens) | mean KL (nats) | KL at "
           "prompt end | top-1 agreement | TTFT ms | CPU ms | CPU vs r=0,k=0 | CPU vs no "
           "cache |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int mi = 0; mi < n_modes; mi++) {
        const result *ref = &res[mi * n_prefix * n_ratios];
        for (int ki = 0; ki < n_prefix; ki++)
            for (int ri = 0; ri < n_ratios; ri++) {
                const result *x = &res[(mi * n_prefix + ki) * n_ratios + ri];
                printf("| %s | %g | %g | %.0f (%.1f%%) | %.2e | %.2e | %.1f%% | %.1f | %.1f | "
                       "%.2fx | %.2fx |\n",
                       cg_mode_name(modes[mi]), prefix[ki], ratios[ri], x->recomputed,
                       100 * x->recomputed / x->chunk_tokens, x->kl, x->kl_first,
                       100.0 * (double)x->agreed / (double)x->compared, x->ttft * 1e3, x->cpu * 1e3,
                       x->cpu / ref->cpu, x->cpu / base_cpu);
            }
    }
    for (int i = 0; i < n_set; i++) {
        free(res[i].wall);
        free(res[i].cpus);
    }
    free(res);
    free(t);
    free(tc);
    th_bench_model_close(&m, tmp);
    return 0;
}
