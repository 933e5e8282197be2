/* Integration suite for the worker's KV tiers, with real chunkgate-worker processes on loopback:
 * spill to disk and restore (tier "disk", answers equal to recomputation, KV bytes unchanged),
 * restart after SIGTERM (RAM flushed to disk) and after kill -9 (the disk's chunks are hits),
 * kill -9 in the middle of spills (no torn record is ever served), bytes flipped in kv.blocks
 * while the worker is stopped (detected, counted, recomputed, never served), a full disk tier
 * (LRU drops, keeps serving), inventory of both tiers and DELETE from both. */
#include <check.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "worker/serve/engine.h"
#include "worker/serve/worker_api.h"
#include "worker/store/tiers.h"
#include "base/base.h"
#include "kv/kvwire.h"
#include "tests/harness/harness.h"

#define ERRLEN 512
#define MAX_TOKENS 8

static char model_dir[300];
static cg_model *model;

static const char *SYS = TH_SYSTEM;
static const char *DOC[8] = {
    TH_DOC_A,
    TH_DOC_B,
    TH_DOC_C,
    TH_DOC_D,
    TH_DOC_E,
    TH_DOC_F,
    "Document G. The school canteen switched suppliers in 2024 and now serves a vegetarian "
    "dish every day; complaints fell by half.",
    "Document H. Street lighting was replaced with LED lamps on all main roads, cutting the "
    "electricity bill of the town by 38 percent.",
};
static const char *QUESTION = TH_QUESTION;

/* ---- processes ---- */

/* Starts `chunkgate-worker serve` with the given data dir and tier sizes; asserts it listens. */
static th_proc start_worker(const char *name, const char *data_dir, const char *pool_mb,
                            const char *disk_mb)
{
    th_proc w;
    const char *extra[] = {"--data-dir", data_dir, "--pool-mb",         pool_mb,
                           "--disk-mb",  disk_mb,  "--assembly-ttl-ms", "60000",
                           NULL};
    ck_assert_msg(th_start_worker(&w, WORKER_BIN, model_dir, 0, name, extra) == 0,
                  "worker %s did not start; log %s", name, w.log);
    return w;
}

static void stop_worker(th_proc *w, int sig)
{
    if (w->pid <= 0) return;
    int rc = th_stop(w, sig);
    if (sig == SIGTERM)
        ck_assert_msg(rc == 0, "worker did not exit cleanly on SIGTERM (status %d); log %s", rc,
                      w->log);
}

/* ---- HTTP ---- */

/* A request to w; status -1 when no answer came (the worker was killed). */
static th_resp http(const th_proc *w, const char *method, const char *path, const char *body)
{
    th_resp r;
    th_http(&r, w->port, method, path, body, NULL, NULL);
    if (r.rc != CURLE_OK) r.status = -1;
    return r;
}

static json_t *call(const th_proc *w, const char *method, const char *path, json_t *body, long want)
{
    return th_call(w->port, method, path, body, NULL, want);
}

/* One sample of a Prometheus series (exact text before the value); -1 when absent. */
static double metric(const th_proc *w, const char *series)
{
    return th_metric(w->port, series);
}

/* ---- prompts and answers ---- */

/* Prompt i: the system prompt, documents 2i and 2i+1 (mod 8), the question. */
static json_t *segs_of(int i)
{
    return th_segments(SYS, DOC[(2 * i) % 8], DOC[(2 * i + 1) % 8], QUESTION);
}

/* The answer of recomputation: an in-process engine on the same model, every segment
 * computed (no cache), greedy. */
static char *recomputed_text(int i)
{
    static char *memo[4];
    if (!memo[i])
        memo[i] = th_engine_answer(model, SYS, DOC[(2 * i) % 8], DOC[(2 * i + 1) % 8], QUESTION,
                                   MAX_TOKENS, CG_PATH_BYPASS);
    return cg_strdup(memo[i]);
}

/* The KV export body (CGKV header + payload, all heads) of one of the prompts' chunks as an
 * in-process engine computes it; key_hex names it. Borrowed: lives until the process ends. */
static const uint8_t *local_chunk_kv(const char *key_hex, size_t *len)
{
    static cg_engine *e;
    static cg_buf bodies[9];
    static cg_key keys[9];
    const cg_model_config *c = cg_model_cfg(model);
    if (!e) {
        ck_assert_int_eq(cg_engine_open(model, cg_engine_default_params(), &e), CG_OK);
        for (int i = 0; i < 4; i++) {
            cg_assembly_info info;
            th_engine_assemble(e, SYS, DOC[(2 * i) % 8], DOC[(2 * i + 1) % 8], QUESTION,
                               CG_PATH_CACHED, &info);
            ck_assert_int_eq(cg_engine_release(e, info.id, 1), CG_OK);
            cg_assembly_info_free(&info);
        }
        for (int k = 0; k < 9; k++) {
            const char *t = k == 0 ? SYS : DOC[k - 1];
            keys[k] = cg_key_compute(c->model_id, strlen(c->model_id), CG_MODE_STRICT, NULL, 0,
                                     NULL, t, strlen(t));
            void *payload = NULL;
            size_t n = 0;
            uint32_t tokens = 0;
            ck_assert_int_eq(
                cg_engine_chunk_kv(e, &keys[k], 0, c->n_kv_heads - 1, &payload, &n, &tokens),
                CG_OK);
            cg_kvwire_header h = {.n_layers = (uint32_t)c->n_layers,
                                  .head_dim = (uint32_t)c->head_dim,
                                  .dtype = CG_KVWIRE_DTYPE_F32,
                                  .n_tokens = tokens,
                                  .head_start = 0,
                                  .n_heads = (uint32_t)c->n_kv_heads,
                                  .total_kv_heads = (uint32_t)c->n_kv_heads};
            snprintf(h.model, sizeof h.model, "%s", c->kv_model);
            uint8_t hdr[512];
            size_t hb = 0;
            ck_assert_int_eq(cg_kvwire_header_encode(&h, hdr, sizeof hdr, &hb), CG_OK);
            cg_buf_init_unbounded(&bodies[k]);
            ck_assert_int_eq(cg_buf_append(&bodies[k], hdr, hb), CG_OK);
            ck_assert_int_eq(cg_buf_append(&bodies[k], payload, n), CG_OK);
            free(payload);
        }
    }
    cg_key k;
    ck_assert_int_eq(cg_key_parse(key_hex, &k), 0);
    for (int i = 0; i < 9; i++)
        if (cg_key_equal(&keys[i], &k)) {
            *len = bodies[i].len;
            return (const uint8_t *)bodies[i].data;
        }
    ck_abort_msg("chunk %s is none of the prompts' chunks", key_hex);
    return NULL;
}

typedef struct outcome {
    int tier_ram, tier_disk, tier_miss; /* over the 3 cacheable segments */
    int n_spilled, n_evicted;
    char keys[3][CG_KEY_HEX_LEN + 1];
    char tiers[3][8];
} outcome;

/* Assembles prompt i, decodes it (greedy, consuming the assembly) and checks the answer
 * against recomputation. */
static outcome ask(const th_proc *w, int i)
{
    outcome o = {0};
    json_t *a = call(w, "POST", "/v1/assemble", json_pack("{s:o}", "segments", segs_of(i)), 200);
    json_t *segs = json_object_get(a, "segments");
    for (int s = 0; s < 3; s++) {
        json_t *sg = json_array_get(segs, (size_t)s);
        const char *t = th_sget(sg, "tier");
        snprintf(o.keys[s], sizeof o.keys[s], "%s", th_sget(sg, "key"));
        snprintf(o.tiers[s], sizeof o.tiers[s], "%s", t);
        o.tier_ram += !strcmp(t, "ram");
        o.tier_disk += !strcmp(t, "disk");
        o.tier_miss += !strcmp(t, "miss");
        ck_assert(json_is_boolean(json_object_get(sg, "hit")));
        ck_assert_int_eq(json_is_true(json_object_get(sg, "hit")), strcmp(t, "miss") != 0);
    }
    o.n_spilled = (int)json_array_size(json_object_get(a, "spilled"));
    o.n_evicted = (int)json_array_size(json_object_get(a, "evicted"));
    json_t *r =
        call(w, "POST", "/v1/completions",
             json_pack("{s:{s:s}, s:i, s:f}", "kv_transfer_params", "assembly_id",
                       th_sget(a, "assembly_id"), "max_tokens", MAX_TOKENS, "temperature", 0.0),
             200);
    const char *text = th_sget(json_array_get(json_object_get(r, "choices"), 0), "text");
    char *want = recomputed_text(i);
    ck_assert_msg(!strcmp(text, want), "prompt %d: answer '%s' != recomputed '%s' (tiers %s %s %s)",
                  i, text, want, o.tiers[0], o.tiers[1], o.tiers[2]);
    free(want);
    json_decref(r);
    json_decref(a);
    return o;
}

static void chunk_kv(const th_proc *w, const char *key, cg_buf *out)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/chunks/%s/kv", key);
    th_resp r = http(w, "GET", path, NULL);
    ck_assert_msg(r.status == 200, "GET %s: %ld", path, r.status);
    *out = r.body; /* taken over; the rest is freed */
    cg_buf_free(&r.head);
}

/* The tier the inventory reports for key, "" when absent. */
static void chunk_tier(const th_proc *w, const char *key, char out[8], int *on_disk)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/chunks/%s", key);
    th_resp r = http(w, "GET", path, NULL);
    out[0] = '\0';
    *on_disk = 0;
    if (r.status == 200) {
        json_t *j = json_loadb(r.body.data, r.body.len, 0, NULL);
        snprintf(out, 8, "%s", th_sget(j, "tier"));
        json_t *t = json_object_get(j, "tiers");
        for (size_t i = 0; i < json_array_size(t); i++)
            *on_disk |= !strcmp(json_string_value(json_array_get(t, i)), "disk");
        json_decref(j);
    } else {
        ck_assert_int_eq(r.status, 404);
    }
    th_resp_free(&r);
}

/* ---- tests ---- */

/* Spill, restore, restart after SIGTERM, corruption, restart after kill -9: one data dir. */
START_TEST(test_spill_restore_restart)
{
    char data[160];
    th_path(data, sizeof data, "data-main");
    /* 2 MiB of RAM = 32 blocks of 16 tokens; the four prompts need 4 + 8 x 8 = 68 blocks */
    th_proc w = start_worker("main", data, "2", "64");

    /* round 1: everything computed, the RAM tier overflows into the disk tier */
    int spilled = 0;
    outcome first[4];
    for (int i = 0; i < 4; i++) {
        first[i] = ask(&w, i);
        spilled += first[i].n_spilled;
        ck_assert_int_eq(first[i].n_evicted, 0); /* the disk has room: nothing is lost */
    }
    ck_assert_int_eq(first[0].tier_miss, 3);
    ck_assert_int_gt(spilled, 0);
    ck_assert_double_gt(metric(&w, "chunkgate_worker_spills_total"), 0);
    ck_assert_double_gt(metric(&w, "chunkgate_worker_tier_chunks{tier=\"disk\"}"), 0);
    ck_assert_double_gt(metric(&w, "chunkgate_worker_tier_bytes{tier=\"disk\"}"), 0);

    /* prompt 0's documents left RAM: they are on disk only, and their KV is kept byte for byte */
    char tier[8];
    int on_disk;
    chunk_tier(&w, first[0].keys[1], tier, &on_disk);
    ck_assert_str_eq(tier, "disk");
    cg_buf kv_before;
    chunk_kv(&w, first[0].keys[1], &kv_before); /* read back from disk into RAM */
    chunk_tier(&w, first[0].keys[1], tier, &on_disk);
    ck_assert_str_eq(tier, "ram");
    ck_assert(on_disk); /* a restored chunk keeps its disk copy */
    ck_assert_double_gt(metric(&w, "chunkgate_worker_restores_total"), 0);

    /* round 2: hits from both tiers, the same answers */
    int disk_hits = 0;
    for (int i = 0; i < 4; i++) {
        outcome o = ask(&w, i);
        ck_assert_int_eq(o.tier_miss, 0);
        disk_hits += o.tier_disk;
    }
    ck_assert_int_gt(disk_hits, 0);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_disk_hits_total"), disk_hits);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_checksum_failures_total"), 0);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_chunk_misses_total"), 9); /* round 1 */

    /* the inventory lists both tiers, every chunk once */
    json_t *l = call(&w, "GET", "/v1/chunks", NULL, 200);
    json_t *data_arr = json_object_get(l, "data");
    ck_assert_int_eq(json_array_size(data_arr), 9); /* the system prompt and 8 documents */
    int n_ram = 0, n_disk = 0;
    for (size_t i = 0; i < json_array_size(data_arr); i++) {
        json_t *c = json_array_get(data_arr, i);
        n_ram += !strcmp(th_sget(c, "tier"), "ram");
        n_disk += !strcmp(th_sget(c, "tier"), "disk");
    }
    ck_assert_int_eq(n_ram + n_disk, 9);
    ck_assert_int_gt(n_disk, 0);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_tier_chunks{tier=\"ram\"}"), n_ram);
    json_decref(l);
    json_t *info = call(&w, "GET", "/v1/info", NULL, 200);
    ck_assert_int_eq(th_iget(info, "disk_capacity_bytes"), 64 << 20);
    ck_assert_int_gt(th_iget(info, "disk_used_bytes"), 0);
    json_decref(info);

    /* restart after SIGTERM: RAM is flushed to disk, so every chunk is a disk hit */
    stop_worker(&w, SIGTERM);
    ck_assert(th_file_has(w.log, "RAM chunks to the disk tier"));
    w = start_worker("main", data, "2", "64");
    for (int i = 0; i < 4; i++) {
        outcome o = ask(&w, i);
        ck_assert_int_eq(o.tier_miss, 0);
        if (i == 0) ck_assert_int_eq(o.tier_disk, 3); /* RAM starts empty */
    }
    cg_buf kv_after;
    chunk_kv(&w, first[0].keys[1], &kv_after);
    ck_assert_uint_eq(kv_after.len, kv_before.len);
    ck_assert(memcmp(kv_after.data, kv_before.data, kv_before.len) == 0);
    cg_buf_free(&kv_after);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_checksum_failures_total"), 0);

    /* corruption at rest, while the worker is stopped: in every 64 KiB slot of kv.blocks, flip
     * the high byte (sign, exponent) of one float in 128, enough to change the answers if the
     * KV were used */
    stop_worker(&w, SIGTERM);
    char path[600], kvdir[512];
    ck_assert_int_eq(cg_tiers_disk_dir(cg_model_cfg(model), data, kvdir, sizeof kvdir), 0);
    snprintf(path, sizeof path, "%s/kv.blocks", kvdir);
    ck_assert_int_gt(th_flip_bytes(path, 64 * 1024, 3, 512, 64 * 1024, 0x41), 0);
    w = start_worker("main", data, "2", "64");
    outcome o = ask(&w, 0); /* the answer equals recomputation: corrupt KV is never served */
    ck_assert_int_eq(o.tier_miss, 3);
    ck_assert_double_ge(metric(&w, "chunkgate_worker_checksum_failures_total"), 3);
    ck_assert_double_ge(metric(&w, "chunkgate_worker_restore_failures_total"), 3);
    ck_assert(th_file_has(w.log, "checksum mismatch"));
    /* the recomputed chunk has the KV it had before */
    chunk_kv(&w, first[0].keys[1], &kv_after);
    ck_assert_uint_eq(kv_after.len, kv_before.len);
    ck_assert(memcmp(kv_after.data, kv_before.data, kv_before.len) == 0);
    cg_buf_free(&kv_after);
    cg_buf_free(&kv_before);

    /* restart after kill -9: what was on disk at the kill is a hit again */
    for (int i = 1; i < 4; i++)
        (void)ask(&w, i); /* recomputes, stores, spills */
    char disk_keys[9][CG_KEY_HEX_LEN + 1];
    int n_on_disk = 0;
    l = call(&w, "GET", "/v1/chunks", NULL, 200);
    data_arr = json_object_get(l, "data");
    for (size_t i = 0; i < json_array_size(data_arr); i++) {
        json_t *c = json_array_get(data_arr, i);
        json_t *t = json_object_get(c, "tiers");
        for (size_t k = 0; k < json_array_size(t); k++)
            if (!strcmp(json_string_value(json_array_get(t, k)), "disk"))
                snprintf(disk_keys[n_on_disk++], CG_KEY_HEX_LEN + 1, "%s", th_sget(c, "key"));
    }
    json_decref(l);
    ck_assert_int_gt(n_on_disk, 0);
    stop_worker(&w, SIGKILL);
    w = start_worker("main", data, "2", "64");
    for (int k = 0; k < n_on_disk; k++) {
        chunk_tier(&w, disk_keys[k], tier, &on_disk);
        ck_assert_str_eq(tier, "disk");
    }
    int hits_after_kill = 0;
    for (int i = 0; i < 4; i++) {
        outcome a = ask(&w, i);
        for (int s = 0; s < 3; s++)
            for (int k = 0; k < n_on_disk; k++)
                if (!strcmp(a.keys[s], disk_keys[k]) && strcmp(a.tiers[s], "miss") != 0)
                    hits_after_kill++;
    }
    ck_assert_int_gt(hits_after_kill, 0);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_checksum_failures_total"), 0);

    /* DELETE removes a chunk from both tiers */
    char p2[128];
    snprintf(p2, sizeof p2, "/v1/chunks/%s", first[3].keys[2]);
    json_decref(call(&w, "DELETE", p2, NULL, 200));
    chunk_tier(&w, first[3].keys[2], tier, &on_disk);
    ck_assert_str_eq(tier, "");
    json_decref(call(&w, "DELETE", p2, NULL, 404));
    stop_worker(&w, SIGTERM);
}
END_TEST

/* A tiny disk tier: records are dropped LRU, chunks leave the worker (reported as evicted),
 * every answer is still right. */
START_TEST(test_full_disk)
{
    char data[160];
    th_path(data, sizeof data, "data-full");
    th_proc w = start_worker("full", data, "2", "1"); /* 1 MiB = 16 slots: two documents */
    int evicted = 0;
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 4; i++)
            evicted += ask(&w, i).n_evicted;
    ck_assert_int_gt(evicted, 0);
    ck_assert_double_gt(metric(&w, "chunkgate_worker_disk_drops_total"), 0);
    ck_assert_double_le(metric(&w, "chunkgate_worker_tier_bytes{tier=\"disk\"}"), 1 << 20);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_checksum_failures_total"), 0);
    stop_worker(&w, SIGTERM);
}
END_TEST

typedef struct load {
    th_proc *w;
    volatile int stop;
    int done;
} load;

static void *load_main(void *arg)
{
    load *l = arg;
    for (int i = 0; !l->stop; i++) {
        json_t *b = json_pack("{s:o}", "segments", segs_of(i % 4));
        char *s = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        th_resp r = http(l->w, "POST", "/v1/assemble", s);
        free(s);
        if (r.status == 200) {
            json_t *j = json_loadb(r.body.data, r.body.len, 0, NULL);
            char p[128];
            snprintf(p, sizeof p, "/v1/assemblies/%s", th_sget(j, "assembly_id"));
            th_resp d = http(l->w, "DELETE", p, NULL);
            th_resp_free(&d);
            json_decref(j);
            l->done++;
        }
        th_resp_free(&r);
        if (r.status < 0) break; /* killed */
    }
    return NULL;
}

/* Chunks that RAM cannot keep still reach the disk tier: one assembly of
 * four documents of about 0.9 MB of KV each on a 2 MiB pool, where the pool keeps at most two
 * (the assembly references them), and a disk tier with room for all. Every computed chunk is
 * queued by the write-behind; after kill -9 and a restart every document is a hit from disk. */
START_TEST(test_unpooled_chunks_reach_disk)
{
    char data[160];
    th_path(data, sizeof data, "data-unpooled");
    th_proc w = start_worker("unpooled", data, "2", "64");
    char *docs[4];
    uint64_t seed = 19;
    json_t *segs = json_pack("[{s:s,s:s}]", "role", "system", "text", SYS);
    for (int i = 0; i < 4; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "Document %d.", i);
        docs[i] = th_words(900, prefix, &seed);
        json_array_append_new(segs, json_pack("{s:s,s:s}", "role", "chunk", "text", docs[i]));
    }
    json_array_append_new(segs, json_pack("{s:s,s:s}", "role", "question", "text", QUESTION));
    json_t *body = json_pack("{s:o}", "segments", segs);
    char *body_text = th_dumps(body);
    json_t *a = th_call_text(w.port, "POST", "/v1/assemble", body_text, NULL, 200);
    json_t *sg = json_object_get(a, "segments");
    int missed = 0;
    for (size_t i = 1; i <= 4; i++)
        missed += !strcmp(th_sget(json_array_get(sg, i), "tier"), "miss");
    ck_assert_int_eq(missed, 4);
    char path[96];
    snprintf(path, sizeof path, "/v1/assemblies/%s", th_sget(a, "assembly_id"));
    th_expect(w.port, "DELETE", path, NULL, NULL, 200);
    json_decref(a);
    /* every computed chunk was queued (system + 4 documents), none dropped, all written */
    for (int t = 0; t < 200 && metric(&w, "chunkgate_worker_disk_write_behind_written_total") < 5;
         t++)
        th_sleep_ms(50);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_disk_write_behind_total"), 5);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_disk_write_behind_drops_total"), 0);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_disk_write_behind_written_total"), 5);
    stop_worker(&w, SIGKILL);

    w = start_worker("unpooled2", data, "2", "64");
    a = th_call_text(w.port, "POST", "/v1/assemble", body_text, NULL, 200);
    sg = json_object_get(a, "segments");
    for (size_t i = 0; i <= 4; i++)
        ck_assert_msg(!strcmp(th_sget(json_array_get(sg, i), "tier"), "disk"),
                      "segment %zu after kill -9: tier %s", i,
                      th_sget(json_array_get(sg, i), "tier"));
    snprintf(path, sizeof path, "/v1/assemblies/%s", th_sget(a, "assembly_id"));
    th_expect(w.port, "DELETE", path, NULL, NULL, 200);
    json_decref(a);
    stop_worker(&w, SIGTERM);
    free(body_text);
    for (int i = 0; i < 4; i++)
        free(docs[i]);
}
END_TEST

/* kill -9 while chunks are being spilled, several times: after each restart every record on
 * disk verifies (no checksum failure: a crash never leaves a torn record behind) and every
 * answer equals recomputation. */
START_TEST(test_kill9_during_spills)
{
    char data[160];
    th_path(data, sizeof data, "data-kill");
    srand((unsigned)time(NULL));
    for (int round = 0; round < 4; round++) {
        char name[32];
        snprintf(name, sizeof name, "kill%d", round);
        th_proc w = start_worker(name, data, "2", "2");
        if (round > 0) {
            for (int i = 0; i < 4; i++)
                (void)ask(&w, i);
            ck_assert_double_eq(metric(&w, "chunkgate_worker_checksum_failures_total"), 0);
            ck_assert_double_eq(metric(&w, "chunkgate_worker_disk_open_dropped_total"), 0);
        }
        load l = {.w = &w};
        pthread_t th;
        pthread_create(&th, NULL, load_main, &l);
        /* kill once spills are going on, at a random moment among them */
        for (int t = 0; t < 600 && metric(&w, "chunkgate_worker_spills_total") < 2; t++)
            th_sleep_ms(50);
        ck_assert_double_ge(metric(&w, "chunkgate_worker_spills_total"), 2);
        th_sleep_ms(rand() % 300);
        stop_worker(&w, SIGKILL);
        l.stop = 1;
        pthread_join(th, NULL);
    }
    th_proc w = start_worker("kill-final", data, "2", "2");
    json_t *l = call(&w, "GET", "/v1/chunks", NULL, 200);
    json_t *arr = json_object_get(l, "data");
    ck_assert_int_gt(json_array_size(arr), 0); /* the disk survived */
    /* every record left by the kills reads back exactly as a fresh computation of its chunk
     * (reading one back may spill and drop another from this small tier: those are skipped) */
    int verified = 0;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const char *key = th_sget(json_array_get(arr, i), "key");
        ck_assert_str_eq(th_sget(json_array_get(arr, i), "tier"), "disk"); /* RAM starts empty */
        char path[128];
        snprintf(path, sizeof path, "/v1/chunks/%s/kv", key);
        th_resp r = http(&w, "GET", path, NULL);
        if (r.status == 200) {
            size_t n = 0;
            const uint8_t *want = local_chunk_kv(key, &n);
            ck_assert_msg(r.body.len == n && memcmp(r.body.data, want, n) == 0,
                          "chunk %s read back from disk differs from its computation", key);
            verified++;
        } else {
            ck_assert_int_eq(r.status, 404);
        }
        th_resp_free(&r);
    }
    json_decref(l);
    ck_assert_int_gt(verified, 0);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_restores_total"), verified);
    for (int i = 0; i < 4; i++)
        (void)ask(&w, i);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_checksum_failures_total"), 0);
    stop_worker(&w, SIGTERM);
}
END_TEST

/* A second worker on the same data dir is refused (the disk tier is locked). */
START_TEST(test_data_dir_locked)
{
    char data[160];
    th_path(data, sizeof data, "data-lock");
    th_proc w = start_worker("lock1", data, "2", "4");
    th_proc w2;
    const char *args[] = {"serve",      "--model", model_dir,   "--listen", "127.0.0.1:0",
                          "--data-dir", data,      "--disk-mb", "4",        NULL};
    ck_assert_int_eq(th_spawn(&w2, WORKER_BIN, args, NULL, "lock2.log", NULL, 0), 0);
    ck_assert_int_ge(th_wait_exit(&w2, 60000), 0);
    ck_assert(WIFEXITED(w2.wstatus) && WEXITSTATUS(w2.wstatus) != 0);
    ck_assert(th_file_has(w2.log, "in use by another process"));
    stop_worker(&w, SIGTERM);
}
END_TEST

/* Other weights on the same data dir (another seed under the same model id): the worker starts
 * with an empty tier of its own beside the first one's, which stays; files of the layout
 * before the KV model named the directory are kept and named in the log. */
START_TEST(test_other_weights_same_data_dir)
{
    char data[160], other[160], legacy[400];
    th_path(data, sizeof data, "data-switch");
    th_path(other, sizeof other, "model-seed9");
    const char *seed[] = {"--seed", "9", NULL};
    cg_model *m2 = th_model_gen_open(WORKER_BIN, other, seed);
    ck_assert_ptr_nonnull(m2);
    ck_assert_str_eq(cg_model_cfg(m2)->model_id, cg_model_cfg(model)->model_id);
    ck_assert_str_ne(cg_model_cfg(m2)->kv_model, cg_model_cfg(model)->kv_model);
    th_proc w = start_worker("switch1", data, "2", "4");
    (void)ask(&w, 0);
    stop_worker(&w, SIGTERM);
    snprintf(legacy, sizeof legacy, "%s/kv.blocks", data);
    ck_assert_int_eq(th_write_file(legacy, "old"), 0);
    th_proc w2;
    const char *extra[] = {"--data-dir", data, "--pool-mb", "2", "--disk-mb", "4", NULL};
    ck_assert_msg(th_start_worker(&w2, WORKER_BIN, other, 0, "switch2", extra) == 0,
                  "a worker of other weights did not start on the data dir; log %s", w2.log);
    ck_assert(th_file_has(w2.log, "earlier layout"));
    ck_assert(th_file_has(w2.log, "the tier of another model or weights"));
    stop_worker(&w2, SIGTERM);
    char d1[512], d2[512];
    struct stat sb;
    ck_assert_int_eq(cg_tiers_disk_dir(cg_model_cfg(model), data, d1, sizeof d1), 0);
    ck_assert_int_eq(cg_tiers_disk_dir(cg_model_cfg(m2), data, d2, sizeof d2), 0);
    ck_assert_int_eq(stat(d1, &sb), 0);
    ck_assert_int_eq(stat(d2, &sb), 0);
    ck_assert_int_eq(stat(legacy, &sb), 0);
    /* back to the first weights: their tier is there, with what the first run kept (the
     * answer is checked against recomputation) */
    w = start_worker("switch3", data, "2", "4");
    outcome o3 = ask(&w, 0);
    ck_assert_int_gt(o3.tier_disk, 0);
    stop_worker(&w, SIGTERM);
    cg_model_close(&m2);
}
END_TEST

int main(void)
{
    cg_log_init("test_tiers_e2e", CG_LOG_WARN);
    th_init("test_tiers", &(th_params){.http_timeout_s = 300});
    th_path(model_dir, sizeof model_dir, "model");
    const char *seed[] = {"--seed", "3", NULL};
    if (!(model = th_model_gen_open(WORKER_BIN, model_dir, seed))) return EXIT_FAILURE;
    int failed = th_run_tests("tiers_e2e", "processes", 300,
                              TH_TESTS(test_spill_restore_restart, test_full_disk,
                                       test_unpooled_chunks_reach_disk, test_kill9_during_spills,
                                       test_data_dir_locked, test_other_weights_same_data_dir));
    cg_model_close(&model);
    th_cleanup(failed);
    curl_global_cleanup();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
