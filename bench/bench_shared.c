/* The shared KV tier on Redis (DESIGN §16), measured in one run against its baselines:
 *
 *  1. remote restore: a chunk missing from RAM read back from Redis by the worker's tiers
 *     (cg_tiers_lookup: one pipelined GET of every head, seal and header checks, copy into a
 *     new pool chunk), against a plain GET of the same bytes: cg_remote_get of the same keys,
 *     and raw hiredis pipelined GETs on one connection. The three take turns, chunk by chunk.
 *  2. time to first token on the bench_ttft workload (system 256 B, four documents of 2 KiB,
 *     question 64 B): cold (empty pool, empty Redis), warm from RAM (same worker, documents
 *     reordered under a new system prompt), warm from the remote tier (another worker sharing
 *     the Redis, in steady state: other documents filled its pool first, so its pages and
 *     buffers are as warm as the first worker's; the same reordering under another new system
 *     prompt). The pools hold about twice the workload's chunks. Warm samples alternate
 *     between the two, SAMPLES per rep.
 *
 * usage: bench_shared [--reps N (3)] [--tokens T (256: tokens per chunk in part 1)]
 *                     [--chunks C (16)] [--layers L --dim D --heads H --kv-heads K]
 *                     [--skip-ttft]
 * It generates a model of that geometry (default: the tiny model) and starts redis-server on a
 * free loopback port (--save '' --appendonly no). */
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"
#include "kv/kvwire.h"
#include "worker/serve/engine.h"
#include "worker/store/tiers.h"
#include "base/remote.h"

#define SYS_BYTES TH_RAG_SYS_BYTES
#define DOC_BYTES TH_RAG_DOC_BYTES
#define N_DOCS TH_RAG_DOCS

static void die(const char *what, cg_status st, const char *err)
{
    fprintf(stderr, "bench_shared: %s: %s %s\n", what, cg_status_name(st), err ? err : "");
    exit(1);
}

/* ---- redis-server ---- */

static void redis_flushall(redisContext *c)
{
    redisReply *r = redisCommand(c, "FLUSHALL");
    if (!r || r->type == REDIS_REPLY_ERROR) die("FLUSHALL", CG_E_IO, NULL);
    freeReplyObject(r);
}

/* ---- helpers ---- */

static uint64_t rng_state;
static uint32_t rnd(void)
{
    return th_lcg32(&rng_state);
}

static cg_remote *open_remote(int port)
{
    char url[64], err[256];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    cg_remote_params rp = cg_remote_default_params();
    rp.url = url;
    rp.timeout_ms = 10000;
    rp.queue_max_items = 4096;
    rp.queue_max_bytes = (size_t)2 << 30;
    cg_remote *r = NULL;
    cg_status st = cg_remote_open(rp, &r, err, sizeof err);
    if (st != CG_OK) die("cg_remote_open", st, err);
    return r;
}

/* ---- 1. restore vs GET ---- */

typedef enum { M_RESTORE, M_CG_GET, M_RAW_PIPE, M_COUNT } mode;
static const char *mode_name[M_COUNT] = {"remote restore (cg_tiers_lookup)", "cg_remote_get",
                                         "raw hiredis pipelined GET"};

static void restore_bench(const cg_model *m, int port, uint32_t tokens, int n_chunks, int reps)
{
    const cg_model_config *cfg = cg_model_cfg(m);
    const int H = cfg->n_kv_heads;
    cg_remote *r = open_remote(port);
    /* write n_chunks chunks of pseudo-random KV through the tiers (write-behind), then wait */
    cg_tiers_params tp = {.pool_bytes = (size_t)256 << 20, .block_tokens = 16, .remote = r};
    cg_tiers *w = NULL;
    cg_status st = cg_tiers_open(m, &tp, &w);
    if (st != CG_OK) die("cg_tiers_open", st, NULL);
    cg_kv *kv = cg_kv_new(m, tokens);
    rng_state = 99;
    for (int l = 0; l < cfg->n_layers; l++)
        for (int h = 0; h < H; h++)
            for (size_t i = 0; i < (size_t)tokens * (size_t)cfg->head_dim; i++) {
                cg_kv_k(kv, l, h)[i] = (float)(rnd() % 20000) / 1000.0f - 10.0f;
                cg_kv_v(kv, l, h)[i] = (float)(rnd() % 20000) / 1000.0f - 10.0f;
            }
    cg_key *keys = cg_calloc((size_t)n_chunks, sizeof *keys);
    for (int c = 0; c < n_chunks; c++) {
        for (int b = 0; b < 16; b++)
            keys[c].b[b] = (uint8_t)rnd();
        cg_pool_evictions ev = {0};
        cg_pool_chunk *pc = NULL;
        st = cg_tiers_store(w, &keys[c], kv, 0, tokens, 1, &ev, &pc);
        if (st != CG_OK) die("cg_tiers_store", st, NULL);
        cg_pool_release(cg_tiers_pool(w), &pc, 1);
        cg_pool_evictions_free(&ev);
        if (cg_tiers_wait_writes(w, 60000) != CG_OK) die("write-behind", CG_E_TIMEOUT, NULL);
    }
    cg_tiers_close(&w);
    cg_kv_free(&kv);
    cg_remote_stats rs;
    cg_remote_stats_get(r, &rs);
    if (rs.sets != (uint64_t)n_chunks * (uint64_t)H)
        die("not every value was written", CG_E_IO, NULL);

    /* the reader: a pool of four chunks, no disk */
    size_t chunk_bytes = (size_t)cfg->n_layers * (size_t)H * 2 * ((tokens + 15) / 16 * 16) *
                         (size_t)cfg->head_dim * sizeof(float);
    tp.pool_bytes = 4 * chunk_bytes + (1 << 20);
    cg_tiers *t = NULL;
    st = cg_tiers_open(m, &tp, &t);
    if (st != CG_OK) die("cg_tiers_open (reader)", st, NULL);
    struct timeval tv = {10, 0};
    redisContext *raw = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!raw || raw->err) die("hiredis connect", CG_E_IO, NULL);
    /* per-head key strings of each chunk */
    char(*names)[CG_REMOTE_KEY_MAX] = cg_calloc((size_t)n_chunks * (size_t)H, CG_REMOTE_KEY_MAX);
    for (int c = 0; c < n_chunks; c++) {
        char hex[CG_KEY_HEX_LEN + 1];
        cg_key_hex(&keys[c], hex);
        for (int h = 0; h < H; h++)
            if (cg_kvwire_head_key(cfg->kv_model, (uint32_t)h, hex, names[c * H + h],
                                   CG_REMOTE_KEY_MAX) != CG_OK)
                die("head key", CG_E_VALUE, NULL);
    }
    double *gbps[M_COUNT];
    for (int k = 0; k < M_COUNT; k++)
        gbps[k] = cg_calloc((size_t)reps * (size_t)n_chunks, sizeof(double));
    size_t value_bytes = 0;
    int n_samples = 0;
    const char **kp = cg_calloc((size_t)H, sizeof *kp);
    cg_remote_value *vals = cg_calloc((size_t)H, sizeof *vals);
    for (int rep = 0; rep < reps; rep++)
        for (int c = 0; c < n_chunks; c++, n_samples++) {
            for (int h = 0; h < H; h++)
                kp[h] = names[c * H + h];
            for (int k0 = 0; k0 < M_COUNT; k0++) {
                mode md = (mode)((k0 + n_samples) % M_COUNT); /* rotate who goes first */
                size_t bytes = 0;
                uint64_t t0 = cg_now_ns();
                if (md == M_RESTORE) {
                    cg_cached hit;
                    cg_pool_evictions ev = {0};
                    st = cg_tiers_lookup(t, &keys[c], 0, cg_now_ms(), &ev, NULL, &hit);
                    if (st != CG_OK || hit.tier != CG_TIER_REMOTE)
                        die("restore was not a remote hit", st, NULL);
                    cg_tiers_drop(t, &hit, cg_now_ms());
                    cg_pool_evictions_free(&ev);
                    cg_tiers_stats ts = cg_tiers_get_stats(t);
                    static uint64_t last;
                    bytes = ts.remote_bytes_read - last;
                    last = ts.remote_bytes_read;
                } else if (md == M_CG_GET) {
                    st = cg_remote_get(r, (size_t)H, kp, vals, NULL);
                    if (st != CG_OK) die("cg_remote_get", st, NULL);
                    for (int h = 0; h < H; h++)
                        bytes += vals[h].len;
                    cg_remote_values_free(r, vals, (size_t)H);
                } else {
                    for (int h = 0; h < H; h++)
                        redisAppendCommand(raw, "GET %s", kp[h]);
                    for (int h = 0; h < H; h++) {
                        redisReply *rep1 = NULL;
                        if (redisGetReply(raw, (void **)&rep1) != REDIS_OK ||
                            rep1->type != REDIS_REPLY_STRING)
                            die("raw GET", CG_E_IO, NULL);
                        bytes += rep1->len;
                        freeReplyObject(rep1);
                    }
                }
                double secs = (double)(cg_now_ns() - t0) / 1e9;
                gbps[md][n_samples] = (double)bytes / secs / 1e9;
                if (md == M_CG_GET) value_bytes = bytes;
                if (md == M_RESTORE) {
                    int deferred = 0; /* out of RAM again for the next round */
                    if (cg_pool_remove(cg_tiers_pool(t), &keys[c], &deferred) != CG_OK)
                        die("pool remove", CG_E_INTERNAL, NULL);
                }
            }
        }
    printf("### Remote restore vs GET: %u-token chunks, %d KV heads, %.2f MiB per chunk "
           "(%.0f KiB per head value)\n\n",
           tokens, H, (double)value_bytes / (1 << 20), (double)value_bytes / H / 1024);
    printf("| read of one chunk | GB/s (median of %d) | vs cg_remote_get | vs raw pipelined GET |\n"
           "|---|---|---|---|\n",
           n_samples);
    double med[M_COUNT];
    for (int k = 0; k < M_COUNT; k++)
        med[k] = th_median(gbps[k], n_samples);
    for (int k = 0; k < M_COUNT; k++)
        printf("| %s | %.2f | %.2f | %.2f |\n", mode_name[k], med[k], med[k] / med[M_CG_GET],
               med[k] / med[M_RAW_PIPE]);
    printf("\nper chunk: restore %.0f us, cg_remote_get %.0f us, raw GET %.0f us\n\n",
           (double)value_bytes / med[M_RESTORE] / 1e3, (double)value_bytes / med[M_CG_GET] / 1e3,
           (double)value_bytes / med[M_RAW_PIPE] / 1e3);
    for (int k = 0; k < M_COUNT; k++)
        free(gbps[k]);
    free(vals);
    free(kp);
    free(names);
    free(keys);
    redisFree(raw);
    cg_tiers_close(&t);
    cg_remote_close(&r);
}

/* ---- 2. TTFT ---- */

static double ttft(cg_engine *e, const cg_engine_seg *segs, size_t n, cg_assembly_info *info)
{
    char err[512];
    cg_assemble_req ar = {.segs = segs, .n_segs = n, .mode = CG_MODE_STRICT, .reserve_tokens = -1};
    cg_complete_result res;
    uint64_t t0 = cg_now_ns();
    cg_status st = cg_engine_assemble(e, &ar, cg_now_ms(), info, err, sizeof err);
    if (st != CG_OK) die("assemble", st, err);
    cg_complete_req cr = {.assembly_id = info->id, .max_tokens = 1};
    st = cg_engine_complete(e, &cr, cg_now_ms(), &res, err, sizeof err);
    if (st != CG_OK) die("complete", st, err);
    uint64_t t1 = cg_now_ns();
    cg_complete_result_free(&res);
    return (double)(t1 - t0) / 1e9;
}

/* Every document was a hit from tier (hit 1) or computed (hit 0). */
static void expect_tier(const cg_assembly_info *info, int hit, cg_tier tier, const char *run)
{
    for (size_t i = 1; i <= N_DOCS; i++) {
        const cg_engine_seg_result *s = &info->segs[i];
        if (s->hit != hit || (hit && s->tier != tier)) {
            fprintf(stderr, "bench_shared: %s: document %zu came from %s, not %s\n", run, i,
                    cg_tier_seg_name(s->hit, s->tier), cg_tier_seg_name(hit, tier));
            exit(1);
        }
    }
}

/* Warm samples per rep: each a new system prompt over the same reordered documents. */
#define SAMPLES 4

static void ttft_bench(const cg_model *m, int port, redisContext *adm, int reps)
{
    const int n_samples = reps * SAMPLES;
    double *cold = cg_calloc((size_t)reps, sizeof(double));
    double *ram = cg_calloc((size_t)n_samples, sizeof(double));
    double *remote = cg_calloc((size_t)n_samples, sizeof(double));
    uint32_t n_tok = 0, computed_cold = 0, computed_ram = 0, computed_remote = 0;
    int k = 0;
    for (int r = 0; r < reps; r++) {
        redis_flushall(adm);
        rng_state = 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1);
        char tag[16];
        snprintf(tag, sizeof tag, "%d", r);
        th_rag_work w;
        th_rag_make(&w, tag, &rng_state);
        cg_engine_seg *s_cold = w.cold, *s_warm = w.warm;

        cg_remote *rc = open_remote(port);
        cg_engine_params ep = cg_engine_default_params();
        ep.remote = rc;
        /* room for the cold run's chunks (the generated models' tokenizer is byte-level: a
         * document is about DOC_BYTES tokens), about twice over */
        const cg_model_config *cfg = cg_model_cfg(m);
        size_t per_token = (size_t)cfg->n_layers * (size_t)cfg->n_kv_heads * 2 *
                           (size_t)cfg->head_dim * sizeof(float);
        ep.pool_bytes = (size_t)N_DOCS * DOC_BYTES * per_token * 2 + ((size_t)4 << 20);
        cg_engine *a = NULL, *b = NULL;
        cg_status st = cg_engine_open(m, ep, &a);
        if (st != CG_OK) die("engine", st, NULL);
        st = cg_engine_open(m, ep, &b); /* another worker: the same Redis */
        if (st != CG_OK) die("engine", st, NULL);
        cg_assembly_info info;
        /* B in steady state: two requests of other documents of the same sizes fill its whole
         * pool (every page faulted in, as A's are by its cold run) and its KV buffers; the
         * remote chunks then take the blocks of evicted ones. */
        for (int round = 0; round < 2; round++) {
            char tag_other[32];
            snprintf(tag_other, sizeof tag_other, "other %d-%d", r, round);
            th_rag_work other;
            th_rag_make(&other, tag_other, &rng_state);
            (void)ttft(b, other.cold, N_DOCS + 2, &info);
            cg_assembly_info_free(&info);
            th_rag_free(&other);
        }
        cold[r] = ttft(a, s_cold, N_DOCS + 2, &info);
        expect_tier(&info, 0, CG_TIER_RAM, "cold");
        n_tok = info.n_tokens;
        computed_cold = info.computed_tokens;
        cg_assembly_info_free(&info);
        if (cg_engine_wait_writes(a, 60000) != CG_OK || cg_engine_wait_writes(b, 60000) != CG_OK)
            die("write-behind", CG_E_TIMEOUT, NULL);
        /* warm samples, alternating which goes first: the same documents, reordered, under a
         * new system prompt each time; from A's RAM, and from Redis into B (whose copies are
         * then dropped from its RAM, not from Redis, for the next sample) */
        for (int i = 0; i < SAMPLES; i++, k++) {
            for (int side = 0; side < 2; side++) {
                int use_b = (side + i) % 2;
                char pre[48];
                snprintf(pre, sizeof pre, "System %d-%d-%d: be terse. ", r, i, use_b);
                char *sys = th_words(SYS_BYTES, pre, &rng_state);
                s_warm[0] = (cg_engine_seg){CG_ROLE_SYSTEM, sys, SYS_BYTES, NULL};
                double t = ttft(use_b ? b : a, s_warm, N_DOCS + 2, &info);
                expect_tier(&info, 1, use_b ? CG_TIER_REMOTE : CG_TIER_RAM,
                            use_b ? "warm remote" : "warm RAM");
                if (use_b) {
                    remote[k] = t;
                    computed_remote = info.computed_tokens;
                    for (size_t d = 1; d <= N_DOCS; d++) {
                        int deferred = 0;
                        if (cg_pool_remove(cg_engine_pool(b), &info.segs[d].key, &deferred) !=
                            CG_OK)
                            die("pool remove", CG_E_INTERNAL, NULL);
                    }
                } else {
                    ram[k] = t;
                    computed_ram = info.computed_tokens;
                }
                cg_assembly_info_free(&info);
                free(sys);
            }
        }
        cg_engine_close(&b);
        cg_engine_close(&a);
        cg_remote_close(&rc);
        th_rag_free(&w);
    }
    double tc = th_median(cold, reps), tr = th_median(ram, n_samples),
           tm = th_median(remote, n_samples);
    printf("### Time to first token (bench_ttft workload; cold: median of %d, warm: median of %d)"
           "\n\n",
           reps, n_samples);
    printf("| run | prompt tokens | computed | TTFT (ms) |\n|---|---|---|---|\n");
    printf("| cold: empty pool, empty Redis | %u | %u | %.1f |\n", n_tok, computed_cold, tc * 1e3);
    printf("| warm from RAM: docs reordered, new system prompt | %u | %u | %.1f |\n", n_tok,
           computed_ram, tr * 1e3);
    printf("| warm from the remote tier: another worker, same Redis | %u | %u | %.1f |\n\n", n_tok,
           computed_remote, tm * 1e3);
    printf("TTFT cold / remote = %.1fx; cold / RAM = %.1fx; remote / RAM = %.2fx (remote costs "
           "%.1f ms more)\n\n",
           tc / tm, tc / tr, tm / tr, (tm - tr) * 1e3);
    free(cold);
    free(ram);
    free(remote);
}

int main(int argc, char **argv)
{
    th_omp_passive(argv);
    int reps = 3, n_chunks = 16, skip_ttft = 0;
    uint32_t tokens = 256;
    cg_model_gen_params gp = cg_model_gen_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--skip-ttft")) {
            skip_ttft = 1;
            continue;
        }
        if (!v) goto usage;
        i++;
        if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--tokens"))
            tokens = (uint32_t)atoi(v);
        else if (!strcmp(a, "--chunks"))
            n_chunks = atoi(v);
        else if (!strcmp(a, "--layers"))
            gp.n_layers = atoi(v);
        else if (!strcmp(a, "--dim"))
            gp.dim = atoi(v);
        else if (!strcmp(a, "--heads"))
            gp.n_heads = atoi(v);
        else if (!strcmp(a, "--kv-heads"))
            gp.n_kv_heads = atoi(v);
        else
            goto usage;
    }
    if (reps < 1 || n_chunks < 1 || tokens < 1) goto usage;
    char bin[512];
    if (!th_which("redis-server", bin, sizeof bin)) {
        printf("SKIP: redis-server not found (apt-get install redis-server)\n");
        return 0;
    }
    cg_log_init("bench_shared", CG_LOG_WARN);
    char dir[] = "/tmp/cg_bench_shared_XXXXXX", model_dir[600], err[512];
    if (!mkdtemp(dir)) die("mkdtemp", CG_E_IO, NULL);
    snprintf(model_dir, sizeof model_dir, "%s/model", dir);
    cg_status st = cg_model_generate(model_dir, gp, err, sizeof err);
    if (st != CG_OK) die("generate", st, err);
    cg_model *m = NULL;
    st = cg_model_open(model_dir, &m, err, sizeof err);
    if (st != CG_OK) die("load", st, err);
    const cg_model_config *c = cg_model_cfg(m);
    int port = th_free_port();
    pid_t redis = th_redis_start(port, dir);
    if (redis < 0) die("redis-server did not start", CG_E_IO, NULL);
    struct timeval tv = {10, 0};
    redisContext *adm = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!adm || adm->err) die("hiredis connect", CG_E_IO, NULL);
    printf("model %s: %d layers, dim %d, %d heads, %d kv heads, head_dim %d; KV %zu bytes per "
           "token; redis-server on 127.0.0.1:%d\n\n",
           c->model_id, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim,
           (size_t)c->n_layers * (size_t)c->n_kv_heads * 2 * (size_t)c->head_dim * 4, port);
    restore_bench(m, port, tokens, n_chunks, reps);
    if (!skip_ttft) ttft_bench(m, port, adm, reps);
    redis_flushall(adm);
    redisFree(adm);
    kill(redis, SIGKILL);
    waitpid(redis, NULL, 0);
    cg_model_close(&m);
    th_rmrf(dir);
    FILE *la = fopen("/proc/loadavg", "r");
    char line[128] = "";
    if (la && fgets(line, sizeof line, la)) printf("load average: %s", line);
    if (la) fclose(la);
    return 0;
usage:
    fprintf(stderr, "usage: bench_shared [--reps N] [--tokens T] [--chunks C] [--layers L] "
                    "[--dim D] [--heads H] [--kv-heads K] [--skip-ttft]\n");
    return 2;
}
