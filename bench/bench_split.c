/* Benchmark of the splitter and the chunk keys on a large RAG prompt, against memchr and memcpy
 * over the same buffer in the same run. Usage: bench_split [MiB=64] [reps=7] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/key.h"
#include "cache/split.h"

#define DOC_BYTES 2048

static volatile size_t sink; /* keeps results alive so nothing is optimised away */

/* ~2 KiB documents of English-like ASCII with a markdown heading ('#') and a few UTF-8
 * characters each, separated by " # # ". */
static char *build_prompt(size_t target, size_t *len_out, int cjk)
{
    static const char *words[] = {"the",    "model",     "cache",    "chunk", "of",
                                  "and",    "retrieval", "document", "2024",  "query",
                                  "answer", "position",  "layer"};
    static const char *utf8[] = {"\xC3\xA9", "\xC3\xBC", "\xE2\x82\xAC", "\xE4\xB8\x96",
                                 "\xF0\x9F\x98\x80"};
    static const char *han[] = {"\xE6\x96\x87", "\xE6\x9B\xB8", "\xE8\xB3\xAA",
                                "\xE5\x95\x8F", "\xE4\xB8\x96", "\xE7\x95\x8C"};
    char *buf = cg_malloc(target + 4 * DOC_BYTES);
    size_t n = 0;
    uint64_t x = 12345;
    n += (size_t)sprintf(buf, "You are a careful assistant. Answer from the documents.");
    while (n < target) {
        memcpy(buf + n, " # # ", 5);
        n += 5;
        size_t doc_end = n + DOC_BYTES;
        n += (size_t)sprintf(buf + n, "## Section %zu\n", n);
        while (n < doc_end) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const char *w;
            if (cjk)
                w = han[(x >> 33) % 6];
            else if ((x >> 40) % 64 == 0)
                w = utf8[(x >> 20) % 5];
            else
                w = words[(x >> 33) % 13];
            size_t wl = strlen(w);
            memcpy(buf + n, w, wl);
            n += wl;
            if (!cjk) buf[n++] = (x >> 50) % 16 == 0 ? '\n' : ' ';
        }
    }
    n += (size_t)sprintf(buf + n, " # # What changed in 2024?");
    *len_out = n;
    return buf;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct rate {
    double best, median; /* GB/s (1e9 bytes per second) */
} rate;

#define MAX_REPS 64

/* Runs the body reps times (after one warm-up) and returns best and median throughput. */
#define MEASURE(out, reps, bytes, ...)                                                             \
    do {                                                                                           \
        double gbs_[MAX_REPS];                                                                     \
        for (int r_ = -1; r_ < (reps); r_++) {                                                     \
            uint64_t t0_ = cg_now_ns();                                                            \
            __VA_ARGS__;                                                                           \
            uint64_t t1_ = cg_now_ns();                                                            \
            if (r_ >= 0) gbs_[r_] = (double)(bytes) / (double)(t1_ - t0_);                         \
        }                                                                                          \
        qsort(gbs_, (size_t)(reps), sizeof gbs_[0], cmp_double);                                   \
        (out).best = gbs_[(reps)-1];                                                               \
        (out).median = gbs_[(reps) / 2];                                                           \
    } while (0)

static void row(const char *name, rate s, rate memchr_s, rate memcpy_s)
{
    printf("%-34s %8.2f %8.2f %10.2f %10.2f\n", name, s.median, s.best, s.median / memchr_s.median,
           s.median / memcpy_s.median);
}

static void run(size_t mib, int reps, int cjk)
{
    size_t len;
    char *text = build_prompt(mib << 20, &len, cjk);
    char *copy = cg_malloc(len);
    memset(copy, 0, len);
    cg_split_params p = cg_split_default_params();
    p.max_segments = 0;
    cg_split_result res = {0};
    cg_status st = cg_split_prompt(text, len, &p, &res);
    if (st != CG_OK || res.n < 3) {
        fprintf(stderr, "split failed: %s\n", cg_status_name(st));
        exit(1);
    }
    size_t n_seg = res.n;

    rate s_memcpy, s_memchr, s_memchr_absent, s_split, s_split_noutf8, s_utf8, s_key1, s_keys;
    MEASURE(s_memcpy, reps, len, {
        memcpy(copy, text, len);
        sink += (size_t)copy[len / 2];
    });
    MEASURE(s_memchr, reps, len, {
        size_t hits = 0;
        const char *q = text, *end = text + len;
        while ((q = memchr(q, '#', (size_t)(end - q)))) {
            hits++;
            q++;
        }
        sink += hits;
    });
    MEASURE(s_memchr_absent, reps, len, { sink += (size_t)(memchr(text, '\x01', len) != NULL); });
    MEASURE(s_split, reps, len, {
        if (cg_split_prompt(text, len, &p, &res) != CG_OK) exit(1);
        sink += res.n;
    });
    p.check_utf8 = 0;
    MEASURE(s_split_noutf8, reps, len, {
        if (cg_split_prompt(text, len, &p, &res) != CG_OK) exit(1);
        sink += res.n;
    });
    MEASURE(s_utf8, reps, len, { sink += (size_t)cg_utf8_valid(text, len); });
    MEASURE(s_key1, reps, len, {
        cg_key k = cg_key_compute("tiny-llama", 10, CG_MODE_STRICT, NULL, 0, NULL, text, len);
        sink += k.b[0];
    });
    /* Per segment, as the gateway does: one key per ~2 KiB chunk. */
    size_t seg_bytes = 0;
    for (size_t i = 0; i < res.n; i++)
        seg_bytes += res.segs[i].len;
    MEASURE(s_keys, reps, seg_bytes, {
        for (size_t i = 0; i < res.n; i++) {
            cg_key k = cg_key_compute("tiny-llama", 10, CG_MODE_STRICT, NULL, 0, NULL,
                                      text + res.segs[i].off, res.segs[i].len);
            sink += k.b[0];
        }
    });

    size_t hashes = 0;
    for (size_t i = 0; i < len; i++)
        hashes += text[i] == '#';
    printf("\nprompt: %.1f MiB (%s), %zu segments, %zu '#' bytes, %d reps (+1 warm-up)\n",
           (double)len / (1 << 20), cjk ? "all CJK, 3-byte UTF-8" : "ASCII + some UTF-8", n_seg,
           hashes, reps);
    printf("%-34s %8s %8s %10s %10s\n", "operation", "GB/s med", "GB/s max", "/memchr#", "/memcpy");
    row("memcpy", s_memcpy, s_memchr, s_memcpy);
    row("memchr '#' (count all)", s_memchr, s_memchr, s_memcpy);
    row("memchr absent byte (one pass)", s_memchr_absent, s_memchr, s_memcpy);
    row("cg_split_prompt (UTF-8 check)", s_split, s_memchr, s_memcpy);
    row("cg_split_prompt (no UTF-8 check)", s_split_noutf8, s_memchr, s_memcpy);
    row("cg_utf8_valid", s_utf8, s_memchr, s_memcpy);
    row("cg_key_compute (one key, all)", s_key1, s_memchr, s_memcpy);
    row("cg_key_compute (per segment)", s_keys, s_memchr, s_memcpy);
    printf("per segment keys: %.0f ns per ~2 KiB segment\n",
           1.0 / s_keys.median * (double)seg_bytes / (double)res.n);

    cg_split_result_free(&res);
    free(copy);
    free(text);
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 64;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (mib < 1) mib = 1;
    if (reps < 1) reps = 1;
    if (reps > MAX_REPS) reps = MAX_REPS;
    run(mib, reps, 0);
    run(mib / 4 ? mib / 4 : 1, reps, 1);
    return 0;
}
