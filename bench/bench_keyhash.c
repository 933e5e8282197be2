/* Chunk key cost, XXH3-128 (default) against SHA-256 (--key-hash sha256), over the same
 * canonical encoding, for segments of 64 B to 1 MiB; the baseline is memcpy of the same bytes
 * in the same run. Also the tenant id (one SHA-256 per authenticated request).
 *
 * usage: bench_keyhash [--seconds S per cell (default 0.3)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/key.h"

static double secs_per_cell = 0.3;
static volatile uint8_t sink;

static double now_s(void)
{
    return (double)cg_now_ns() / 1e9;
}

/* Seconds per call of one cell: repeats until secs_per_cell has passed. */
static double time_key(cg_key_hash h, const char *text, size_t n)
{
    size_t iters = 0, batch = 1;
    double t0 = now_s(), t;
    do {
        for (size_t i = 0; i < batch; i++) {
            cg_key k = cg_key_compute_with(h, "chunkgate-tiny", 14, CG_MODE_STRICT, "tenant", 6,
                                           NULL, text, n);
            sink ^= k.b[0];
        }
        iters += batch;
        batch *= 2;
        t = now_s() - t0;
    } while (t < secs_per_cell);
    return t / (double)iters;
}

static double time_memcpy(char *dst, const char *src, size_t n)
{
    size_t iters = 0, batch = 1;
    double t0 = now_s(), t;
    do {
        for (size_t i = 0; i < batch; i++) {
            memcpy(dst, src, n);
            sink ^= (uint8_t)dst[i % n];
        }
        iters += batch;
        batch *= 2;
        t = now_s() - t0;
    } while (t < secs_per_cell);
    return t / (double)iters;
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--seconds")) secs_per_cell = atof(argv[i + 1]);
    const size_t sizes[] = {64, 1024, 16384, 1 << 20};
    size_t max = sizes[sizeof sizes / sizeof sizes[0] - 1];
    char *text = cg_malloc(max), *dst = cg_malloc(max);
    for (size_t i = 0; i < max; i++)
        text[i] = (char)('a' + (i * 7) % 26);
    printf("chunk key cost per segment (model, mode, salt and the text; one key each)\n");
    printf("%10s %14s %14s %14s %12s %12s %10s\n", "segment", "memcpy", "xxh3-128", "sha256",
           "xxh3/memcpy", "sha/memcpy", "sha/xxh3");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        double m = time_memcpy(dst, text, n);
        double x = time_key(CG_KEY_HASH_XXH3, text, n);
        double h = time_key(CG_KEY_HASH_SHA256, text, n);
        char label[32];
        snprintf(label, sizeof label, n >= 1024 ? "%zu KiB" : "%zu B", n >= 1024 ? n / 1024 : n);
        printf("%10s %11.0f ns %11.0f ns %11.0f ns %11.1fx %11.1fx %9.1fx\n", label, m * 1e9,
               x * 1e9, h * 1e9, x / m, h / m, h / x);
        printf("%10s %11.2f GB/s %8.2f GB/s %8.2f GB/s\n", "", n / m / 1e9, n / x / 1e9,
               n / h / 1e9);
    }
    char id[CG_KEY_HEX_LEN + 1];
    size_t iters = 0;
    double t0 = now_s();
    while (now_s() - t0 < secs_per_cell) {
        cg_key_tenant_id("sk-a-typical-api-key-0123456789", 31, id);
        iters++;
    }
    printf("tenant id (SHA-256 of an API key, once per authenticated request): %.0f ns\n",
           (now_s() - t0) / (double)iters * 1e9);
    free(text);
    free(dst);
    return sink == 0x5a ? 1 : 0;
}
