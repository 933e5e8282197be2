/* Next-token log-probabilities of a checkpoint at --quant none, q8 and q4 on the same token ids,
 * for bench/quant_kl.py (KL of each setting against the 16-bit one, and against llama.cpp's
 * Q8_0 / Q4_0 on the same weights).
 *
 *   bench_quant MODEL_DIR IDS.json POSITIONS OUT_PREFIX [none,q8,q4]
 *
 * IDS.json: a JSON array of token ids; POSITIONS: comma-separated rows. For each setting,
 * OUT_PREFIX.<setting>.f32 receives one log-softmax row of vocab_size floats per position
 * (the distribution of the token after it), teacher-forced over all ids with one plain causal
 * forward in pieces of 256 rows (the worker's prefill pieces; CG_BENCH_PIECE=N sets another
 * size), on the prefill kernels. Prints
 * one JSON line per setting: load seconds, weight bytes, kernel variant. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "worker/model/matmul.h"
#include "worker/model/model.h"

/* rows per forward call: the worker's --prefill-chunk default; CG_BENCH_PIECE overrides it
 * (above the decode kernel's row limit, pieces take the prefill path: f32 activations) */
static uint32_t PIECE = 256;

static int run(const char *dir, cg_quant q, const int32_t *ids, uint32_t n, const uint32_t *pos,
               size_t npos, const char *prefix)
{
    char err[512] = "";
    cg_model *m = NULL;
    uint64_t t0 = cg_now_ns();
    if (cg_model_open_quant(dir, q, &m, err, sizeof err) != CG_OK) {
        fprintf(stderr, "bench_quant: %s: %s\n", cg_quant_name(q), err);
        return -1;
    }
    double load_s = (double)(cg_now_ns() - t0) / 1e9;
    const int V = cg_model_cfg(m)->vocab_size;
    cg_kv *kv = cg_kv_new(m, n);
    float *lg = cg_malloc((size_t)PIECE * (size_t)V * sizeof(float));
    char path[4096];
    snprintf(path, sizeof path, "%s.%s.f32", prefix, cg_quant_name(q));
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return -1;
    }
    cg_fwd_scratch *s = cg_fwd_scratch_new();
    size_t next = 0;
    t0 = cg_now_ns();
    for (uint32_t r0 = 0; r0 < n; r0 += PIECE) {
        const uint32_t len = CG_MIN(PIECE, n - r0);
        cg_attn_span sp = {r0, len, 0, 0};
        cg_fwd_seq sq = {.kv = kv,
                         .tokens = ids + r0,
                         .n = len,
                         .slot0 = r0,
                         .pos0 = r0,
                         .spans = &sp,
                         .n_spans = 1,
                         .row_logits = lg,
                         .row_off = 0,
                         .row_logits_from = 0};
        if (cg_model_forward_batch(m, &sq, 1, CG_FWD_PREFILL, s) != CG_OK) {
            fprintf(stderr, "bench_quant: forward failed\n");
            return -1;
        }
        for (; next < npos && pos[next] < r0 + len; next++) {
            float *row = lg + (size_t)(pos[next] - r0) * (size_t)V;
            double mx = -INFINITY, z = 0;
            for (int i = 0; i < V; i++)
                mx = fmax(mx, row[i]);
            for (int i = 0; i < V; i++)
                z += exp(row[i] - mx);
            const double lse = mx + log(z);
            for (int i = 0; i < V; i++)
                row[i] = (float)(row[i] - lse);
            if (fwrite(row, sizeof(float), (size_t)V, f) != (size_t)V) abort();
        }
    }
    double fwd_s = (double)(cg_now_ns() - t0) / 1e9;
    fclose(f);
    printf(
        "{\"quant\": \"%s\", \"weights_dtype\": \"%s\", \"weight_bytes\": %zu, \"load_s\": %.2f, "
        "\"forward_s\": %.2f, \"piece\": %u, \"isa\": \"%s\"}\n",
        cg_quant_name(q), cg_model_cfg(m)->dtype, cg_model_weight_bytes(m), load_s, fwd_s, PIECE,
        cg_matmul_isa_name(cg_matmul_isa_active()));
    fflush(stdout);
    cg_fwd_scratch_free(&s);
    free(lg);
    cg_kv_free(&kv);
    cg_model_close(&m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) {
        fprintf(stderr,
                "usage: bench_quant MODEL_DIR IDS.json POSITIONS OUT_PREFIX [none,q8,q4]\n");
        return 2;
    }
    json_error_t je;
    json_t *arr = json_load_file(argv[2], 0, &je);
    if (!json_is_array(arr) || !json_array_size(arr)) {
        fprintf(stderr, "bench_quant: %s: not a JSON array of ids\n", argv[2]);
        return 2;
    }
    const uint32_t n = (uint32_t)json_array_size(arr);
    int32_t *ids = cg_malloc(n * sizeof *ids);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    json_decref(arr);
    uint32_t *pos = cg_malloc((n + 1) * sizeof *pos);
    size_t npos = 0;
    for (char *p = argv[3]; *p;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v >= n || (npos && v <= pos[npos - 1])) {
            fprintf(stderr, "bench_quant: positions must rise and lie below %u\n", n);
            return 2;
        }
        pos[npos++] = (uint32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    const char *which = argc == 6 ? argv[5] : "none,q8,q4";
    if (getenv("CG_BENCH_PIECE")) PIECE = (uint32_t)CG_MAX(1, atoi(getenv("CG_BENCH_PIECE")));
    for (int q = 0; q < CG_QUANT_COUNT; q++)
        if (strstr(which, cg_quant_names[q]) &&
            run(argv[1], (cg_quant)q, ids, n, pos, npos, argv[4]))
            return 1;
    free(ids);
    free(pos);
    return 0;
}
