/* Remote tier throughput against plain hiredis in the same run: a chunk read with cg_remote_get
 * (its KV heads in one pipelined batch) against a raw hiredis GET loop of the same keys
 * (redis-benchmark style: one blocking GET at a time) and a raw pipelined GET (append both,
 * then read both), plus cg_remote_get one head per call; a chunk write with cg_remote_set against
 * raw SET. MB/s of value bytes and the ratio to the baselines, per chunk size: each mode runs in
 * its own process (so one mode's malloc/free pattern does not change another's page faults), the
 * read modes, then the write modes, take turns in short slices in a rotated order each round, and
 * the median slice is reported (the build machines are shared and Redis takes most of the time).
 *
 * Geometry: a small model's per-head KV (Qwen2.5-0.5B: 24 layers, 2 KV heads, head_dim 64,
 * f32 K and V = 12 KiB per head per token), 2 heads a chunk: chunks of 4 tokens (48 KiB per
 * head: below the in-place threshold, parsed by hiredis), 256 and 1024 tokens (3 and 12 MiB).
 *
 * usage: bench_remote [--url redis://host:port] [--rounds R (9)] [--ms M (120 per mode and round)]
 *                     [--modes MASK (bit per mode, default all)]
 *                     [--tokens 4|256|1024 (default all)] [--mallopt]
 * --mallopt sets M_MMAP_THRESHOLD 32 MiB and M_TRIM_THRESHOLD 512 MiB in every mode's process,
 * so freed value buffers are reused instead of trimmed and faulted in again.
 * Without --url it starts redis-server on a free loopback port (--save '' --appendonly no). */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <malloc.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"
#include "kv/kvwire.h"
#include "base/remote.h"

#define LAYERS 24
#define KV_HEADS 2
#define HEAD_DIM 64
#define PER_TOKEN ((size_t)LAYERS * 2 * HEAD_DIM * 4) /* bytes of one head, one token */
#define CHUNKS 3                                      /* distinct chunks, read round-robin */

typedef struct ctx {
    cg_remote *r;
    redisContext *raw;
    char keys[CHUNKS][KV_HEADS][CG_REMOTE_KEY_MAX];
    char *vals[KV_HEADS];
    size_t len; /* bytes per head value */
} ctx;

typedef enum { M_RAW_GET, M_RAW_PIPE, M_CG_GET, M_CG_GET1, M_RAW_SET, M_CG_SET, M_COUNT } mode;
static const char *mode_name[M_COUNT] = {"raw GET loop",    "raw pipelined GET", "cg_remote_get",
                                         "  one head/call", "raw SET loop",      "cg_remote_set"};

static void die(const char *what)
{
    fprintf(stderr, "bench_remote: %s\n", what);
    exit(1);
}

/* One chunk (KV_HEADS values) through mode m; returns the value bytes moved. */
static size_t one_chunk(ctx *c, mode m, unsigned chunk)
{
    const char *kp[KV_HEADS];
    for (int h = 0; h < KV_HEADS; h++)
        kp[h] = c->keys[chunk][h];
    size_t bytes = 0;
    switch (m) {
    case M_RAW_GET:
        for (int h = 0; h < KV_HEADS; h++) {
            redisReply *rep = redisCommand(c->raw, "GET %s", kp[h]);
            if (!rep || rep->type != REDIS_REPLY_STRING || rep->len != c->len) die("raw GET");
            bytes += rep->len;
            freeReplyObject(rep);
        }
        break;
    case M_RAW_PIPE:
        for (int h = 0; h < KV_HEADS; h++)
            redisAppendCommand(c->raw, "GET %s", kp[h]);
        for (int h = 0; h < KV_HEADS; h++) {
            redisReply *rep = NULL;
            if (redisGetReply(c->raw, (void **)&rep) != REDIS_OK || rep->type != REDIS_REPLY_STRING)
                die("raw pipelined GET");
            bytes += rep->len;
            freeReplyObject(rep);
        }
        break;
    case M_CG_GET: {
        cg_remote_value out[KV_HEADS];
        if (cg_remote_get(c->r, KV_HEADS, kp, out, NULL) != CG_OK) die("cg_remote_get");
        for (int h = 0; h < KV_HEADS; h++)
            bytes += out[h].len;
        cg_remote_values_free(c->r, out, KV_HEADS);
        break;
    }
    case M_CG_GET1:
        for (int h = 0; h < KV_HEADS; h++) {
            cg_remote_value out[1];
            if (cg_remote_get(c->r, 1, &kp[h], out, NULL) != CG_OK) die("cg_remote_get");
            bytes += out[0].len;
            cg_remote_values_free(c->r, out, 1);
        }
        break;
    case M_RAW_SET:
        for (int h = 0; h < KV_HEADS; h++) {
            redisReply *rep = redisCommand(c->raw, "SET %s %b", kp[h], c->vals[h], c->len);
            if (!rep || rep->type != REDIS_REPLY_STATUS) die("raw SET");
            freeReplyObject(rep);
            bytes += c->len;
        }
        break;
    case M_CG_SET: {
        size_t lens[KV_HEADS];
        for (int h = 0; h < KV_HEADS; h++)
            lens[h] = c->len;
        if (cg_remote_set(c->r, KV_HEADS, kp, (const void *const *)c->vals, lens) != CG_OK)
            die("cg_remote_set");
        bytes += KV_HEADS * c->len;
        break;
    }
    default:
        break;
    }
    return bytes;
}

/* MB/s of mode m for about ms milliseconds (at least 3 chunks). */
static double run_mode(ctx *c, mode m, int ms)
{
    uint64_t t0 = cg_now_ns(), end = t0 + (uint64_t)ms * 1000000ull;
    size_t bytes = 0;
    unsigned i = 0;
    do {
        bytes += one_chunk(c, m, i++ % CHUNKS);
    } while (cg_now_ns() < end || i < 3);
    double s = (double)(cg_now_ns() - t0) / 1e9;
    return (double)bytes / 1e6 / s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const char *url = NULL;
    int rounds = 9, ms = 120;
    int modes = (1 << M_COUNT) - 1, tokens_only = 0, tune_malloc = 0;
    const th_opt opts[] = {{"--url", TH_OPT_STR, &url},
                           {"--rounds", TH_OPT_INT, &rounds},
                           {"--ms", TH_OPT_INT, &ms},
                           {"--modes", TH_OPT_INT, &modes},
                           {"--tokens", TH_OPT_INT, &tokens_only},
                           {"--mallopt", TH_OPT_FLAG, &tune_malloc}};
    if (th_parse_opts(argc, argv, opts, CG_ARRAY_LEN(opts)) != 0) {
        fprintf(stderr, "usage: %s [--url redis://host:port] [--rounds R] [--ms M]\n", argv[0]);
        return 2;
    }
    const unsigned mode_mask = (unsigned)modes, only_tokens = (unsigned)tokens_only;
    if (rounds < 1 || rounds > 50 || ms < 10 || ms > 10000) die("--rounds 1..50, --ms 10..10000");
    char urlbuf[64], dir[] = "/tmp/cg_bench_remote_XXXXXX";
    pid_t pid = -1;
    if (!url) {
        char bin[512];
        if (!th_which("redis-server", bin, sizeof bin)) {
            printf("SKIP: redis-server not found (apt-get install redis-server)\n");
            return 0;
        }
        if (!mkdtemp(dir)) die("mkdtemp");
        int port = th_free_port();
        pid = th_redis_start(port, dir);
        if (pid < 0) die("redis-server did not start");
        snprintf(urlbuf, sizeof urlbuf, "redis://127.0.0.1:%d", port);
        url = urlbuf;
    }
    cg_remote_url u;
    char err[256];
    if (cg_remote_parse_url(url, &u, err, sizeof err) != CG_OK || u.cluster || u.db)
        die("--url must be redis://host:port (one node, db 0: the raw baseline talks to it)");

    cg_remote_params p = cg_remote_default_params();
    p.url = url;
    p.timeout_ms = 10000;
    ctx c = {0};
    printf("bench_remote: %s%s; per-head KV of a 24-layer, head_dim 64 model (%zu B/token/head), "
           "%d heads a chunk; %d rounds x %d ms per mode; MB/s of value bytes (median round)\n",
           url, tune_malloc ? " (--mallopt)" : "", PER_TOKEN, KV_HEADS, rounds, ms);
    static const unsigned tokens[] = {4, 256, 1024};
    for (size_t t = 0; t < CG_ARRAY_LEN(tokens); t++) {
        if (only_tokens && tokens[t] != only_tokens) continue;
        c.len = PER_TOKEN * tokens[t];
        for (int h = 0; h < KV_HEADS; h++) {
            c.vals[h] = cg_malloc(c.len);
            for (size_t i = 0; i < c.len; i++)
                c.vals[h][i] = (char)(i * 31 + (size_t)h);
        }
        for (unsigned k = 0; k < CHUNKS; k++)
            for (int h = 0; h < KV_HEADS; h++) {
                char hex[33];
                snprintf(hex, sizeof hex, "%016x%016x", k + 1, tokens[t]);
                if (cg_kvwire_head_key("qwen2.5-0.5b", (uint32_t)h, hex, c.keys[k][h],
                                       CG_REMOTE_KEY_MAX))
                    die("key");
            }
        if (cg_remote_open(p, &c.r, err, sizeof err) != CG_OK) die(err);
        for (unsigned k = 0; k < CHUNKS; k++)
            one_chunk(&c, M_CG_SET, k); /* preload */
        cg_remote_close(&c.r);          /* no thread may run across the fork below */

        /* One process per mode: each keeps its own allocator state (a value-sized malloc/free
         * pattern in one mode changes page faults in another), the slices interleave in time. */
        int cmd_fd[M_COUNT], res_fd[M_COUNT];
        pid_t kid[M_COUNT];
        for (int m = 0; m < M_COUNT; m++) {
            int a[2], b[2];
            if (pipe(a) || pipe(b)) die("pipe");
            kid[m] = fork();
            if (kid[m] < 0) die("fork");
            if (kid[m] == 0) {
                close(a[1]);
                close(b[0]);
                if (tune_malloc) {
                    /* Keep freed value buffers in the heap instead of trimming and faulting them
                     * in again on every read (glibc's dynamic thresholds otherwise decide). */
                    mallopt(M_MMAP_THRESHOLD, 32 << 20);
                    mallopt(M_TRIM_THRESHOLD, 512 << 20);
                }
                if (m == M_CG_GET || m == M_CG_GET1 || m == M_CG_SET) {
                    if (cg_remote_open(p, &c.r, err, sizeof err) != CG_OK) die(err);
                } else {
                    struct timeval tv = {10, 0};
                    c.raw = redisConnectWithTimeout(u.host, u.port, tv);
                    if (!c.raw || c.raw->err) die("raw connect");
                    redisSetTimeout(c.raw, tv);
                }
                char cmd;
                while (read(a[0], &cmd, 1) == 1 && cmd == 'g') {
                    double v = run_mode(&c, (mode)m, ms);
                    if (write(b[1], &v, sizeof v) != sizeof v) break;
                }
                if (c.r) cg_remote_close(&c.r);
                if (c.raw) redisFree(c.raw);
                _exit(0);
            }
            close(a[0]);
            close(b[1]);
            cmd_fd[m] = a[1];
            res_fd[m] = b[0];
        }
        double mbs[M_COUNT][50];
        /* Reads, then writes (overwrites churn Redis's memory; kept apart from the reads). */
        static const int phase_first[2] = {M_RAW_GET, M_RAW_SET}, phase_n[2] = {4, 2};
        for (int ph = 0; ph < 2; ph++)
            for (int r = 0; r < rounds; r++)
                for (int k = 0; k < phase_n[ph]; k++) { /* rotated order: drift hits all */
                    int m = phase_first[ph] + (k + r) % phase_n[ph];
                    mbs[m][r] = 1;
                    if (!(mode_mask & (1u << m))) continue;
                    if (write(cmd_fd[m], "g", 1) != 1 ||
                        read(res_fd[m], &mbs[m][r], sizeof(double)) != sizeof(double))
                        die("a mode's process failed");
                }
        for (int m = 0; m < M_COUNT; m++) {
            if (write(cmd_fd[m], "q", 1) != 1) die("stop");
            close(cmd_fd[m]);
            close(res_fd[m]);
            waitpid(kid[m], NULL, 0);
        }
        double med[M_COUNT];
        for (int m = 0; m < M_COUNT; m++) {
            qsort(mbs[m], (size_t)rounds, sizeof(double), cmp_double);
            med[m] = mbs[m][rounds / 2];
        }
        printf("\n%u tokens: %.2f MiB per head, %.2f MiB a chunk\n", tokens[t],
               (double)c.len / (1 << 20), (double)c.len * KV_HEADS / (1 << 20));
        for (int m = 0; m < M_COUNT; m++)
            printf("  %-18s %8.0f MB/s  (rounds %.0f..%.0f)\n", mode_name[m], med[m], mbs[m][0],
                   mbs[m][rounds - 1]);
        printf("  read:  cg_remote_get / raw GET loop = %.2f, / raw pipelined GET = %.2f\n",
               med[M_CG_GET] / med[M_RAW_GET], med[M_CG_GET] / med[M_RAW_PIPE]);
        printf("  write: cg_remote_set / raw SET loop = %.2f\n", med[M_CG_SET] / med[M_RAW_SET]);
        for (int h = 0; h < KV_HEADS; h++)
            free(c.vals[h]);
    }
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        th_rmrf(dir);
    }
    return 0;
}
