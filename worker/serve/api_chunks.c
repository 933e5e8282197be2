/* The worker's inventory and KV export routes: GET /v1/chunks, GET|DELETE /v1/chunks/{key},
 * GET /v1/chunks/{key}/kv, GET /v1/assemblies/{id}/kv and /logits. */
#include "worker/serve/api_chunks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvwire.h"
#include "base/tier.h"
#include "worker/serve/api_common.h"

#define LIST_LIMIT_DEFAULT 1000
#define LIST_LIMIT_MAX 100000

/* ---- inventory ---- */

/* One chunk as the inventory shows it: in RAM, on disk, or both (a chunk read back from disk
 * keeps its disk copy, so a later eviction costs no write). */
typedef struct inv_item {
    cg_key key;
    uint32_t tokens;
    size_t ram_bytes, disk_bytes;
    uint64_t last_used; /* wall-clock ms */
    uint32_t refs;
    uint8_t ram, disk;
} inv_item;

typedef struct inv {
    inv_item *v;
    size_t n, cap;
    uint64_t mono, wall; /* for turning the pool's monotonic times into wall-clock times */
} inv;

static inv_item *inv_push(inv *l)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->v = cg_realloc(l->v, l->cap * sizeof *l->v);
    }
    inv_item *it = &l->v[l->n++];
    memset(it, 0, sizeof *it);
    return it;
}

static void inv_add_ram(void *ud, const cg_pool_chunk_info *info)
{
    inv *l = ud;
    inv_item *it = inv_push(l);
    uint64_t age = l->mono > info->last_used ? l->mono - info->last_used : 0;
    it->key = info->key;
    it->tokens = info->tokens;
    it->ram_bytes = info->bytes;
    it->last_used = l->wall - age;
    it->refs = info->refs;
    it->ram = 1;
}

static void inv_add_disk(void *ud, const cg_disk_chunk_info *info)
{
    inv *l = ud;
    inv_item *it = inv_push(l);
    it->key = info->key;
    it->tokens = info->tokens;
    it->disk_bytes = info->bytes;
    it->last_used = info->last_used; /* the disk keeps wall-clock times */
    it->disk = 1;
}

static int cmp_item(const void *x, const void *y)
{
    const inv_item *a = x, *b = y;
    int c = memcmp(a->key.b, b->key.b, 16);
    return c ? c : (int)b->ram - (int)a->ram; /* the RAM entry of a key first */
}

/* Every chunk of both tiers, in key order, one item per key. Caller frees l->v. */
static void inventory(cg_worker_api *a, inv *l)
{
    memset(l, 0, sizeof *l);
    l->mono = cg_now_ms();
    l->wall = cg_wall_ms();
    cg_pool_foreach(cg_engine_pool(a->e), inv_add_ram, l);
    if (cg_engine_disk(a->e)) cg_disk_foreach(cg_engine_disk(a->e), inv_add_disk, l);
    if (!l->n) return;
    qsort(l->v, l->n, sizeof *l->v, cmp_item);
    size_t w = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (w && cg_key_equal(&l->v[w - 1].key, &l->v[i].key)) {
            /* the same key in RAM and on disk: RAM is the tier it is served from */
            l->v[w - 1].disk = 1;
            l->v[w - 1].disk_bytes = l->v[i].disk_bytes;
            continue;
        }
        l->v[w++] = l->v[i];
    }
    l->n = w;
}

static json_t *chunk_info_json(const inv_item *c)
{
    char hex[CG_KEY_HEX_LEN + 1];
    cg_key_hex(&c->key, hex);
    json_t *tiers = json_array();
    if (c->ram) json_array_append_new(tiers, json_string(cg_tier_name(CG_TIER_RAM)));
    if (c->disk) json_array_append_new(tiers, json_string(cg_tier_name(CG_TIER_DISK)));
    return json_pack(
        "{s:s, s:s, s:i, s:I, s:s, s:o, s:I, s:I, s:i}", "object", "chunk", "key", hex, "tokens",
        (int)c->tokens, "bytes", (json_int_t)(c->ram ? c->ram_bytes : c->disk_bytes), "tier",
        cg_tier_name(c->ram ? CG_TIER_RAM : CG_TIER_DISK), "tiers", tiers, "disk_bytes",
        (json_int_t)c->disk_bytes, "last_used", (json_int_t)c->last_used, "refs", (int)c->refs);
}

void cg_api_chunks(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const char *lim = cg_http_req_query(req, "limit"), *after = cg_http_req_query(req, "after");
    long long limit = LIST_LIMIT_DEFAULT;
    cg_key after_key;
    if (lim) {
        char *end = NULL;
        limit = strtoll(lim, &end, 10);
        if (!*lim || *end || limit < 1 || limit > LIST_LIMIT_MAX) {
            cg_http_reply_error(req, CG_E_VALUE, "limit",
                                "limit must be an integer in [1, 100000]");
            return;
        }
    }
    if (after && cg_key_parse(after, &after_key) != 0) {
        cg_http_reply_error(req, CG_E_VALUE, "after",
                            "after must be a chunk key (32 hex characters)");
        return;
    }
    inv l;
    inventory(a, &l);
    json_t *data = json_array();
    size_t i = 0, taken = 0;
    if (after)
        while (i < l.n && memcmp(l.v[i].key.b, after_key.b, 16) <= 0)
            i++;
    for (; i < l.n && taken < (size_t)limit; i++, taken++)
        json_array_append_new(data, chunk_info_json(&l.v[i]));
    json_t *j = json_pack("{s:s, s:o, s:b}", "object", "list", "data", data, "has_more", i < l.n);
    if (taken) {
        char hex[CG_KEY_HEX_LEN + 1];
        cg_key_hex(&l.v[i - 1].key, hex);
        json_object_set_new(j, "last_key", json_string(hex));
    }
    free(l.v);
    cg_http_reply_json(req, 200, j);
}

/* Parses the {key} path parameter; replies 400 and returns 0 when it is not a key. */
static int path_key(cg_http_req *req, cg_key *k)
{
    if (cg_key_parse(cg_http_req_param(req, 0), k) != 0) {
        cg_http_reply_error(req, CG_E_VALUE, "key", "a chunk key is 32 hex characters");
        return 0;
    }
    return 1;
}

void cg_api_chunk_get(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const cg_model_config *c = cg_api_cfg(a);
    cg_key k;
    cg_pool_chunk_info pi;
    cg_disk_chunk_info di;
    if (!path_key(req, &k)) return;
    inv_item it = {.key = k};
    if (cg_pool_peek(cg_engine_pool(a->e), &k, &pi) == CG_OK) {
        inv l = {.mono = cg_now_ms(), .wall = cg_wall_ms()};
        inv_add_ram(&l, &pi);
        it = l.v[0];
        free(l.v);
    }
    if (cg_engine_disk(a->e) && cg_disk_peek(cg_engine_disk(a->e), &k, &di) == CG_OK) {
        if (!it.ram) {
            it.tokens = di.tokens;
            it.last_used = di.last_used;
        }
        it.disk = 1;
        it.disk_bytes = di.bytes;
    }
    if (!it.ram && !it.disk) {
        cg_http_reply_error(req, CG_E_NOT_FOUND, "key", "no such chunk in this worker");
        return;
    }
    json_t *j = chunk_info_json(&it);
    /* The per-head key strings (DESIGN §8): what a tensor-parallel rank that stores or loads
     * head h of this chunk calls it, whatever the TP degree. */
    char hex[CG_KEY_HEX_LEN + 1], hk[CG_KVWIRE_MODEL_MAX + 64];
    cg_key_hex(&k, hex);
    json_t *heads = json_array();
    for (int h = 0; h < c->n_kv_heads; h++)
        if (cg_kvwire_head_key(c->kv_model, (uint32_t)h, hex, hk, sizeof hk) == CG_OK)
            json_array_append_new(heads, json_string(hk));
    json_object_set_new(j, "n_kv_heads", json_integer(c->n_kv_heads));
    json_object_set_new(j, "head_keys", heads);
    cg_http_reply_json(req, 200, j);
}

void cg_api_chunk_delete(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    cg_key k;
    if (!path_key(req, &k)) return;
    cg_status st = cg_engine_chunk_delete(a->e, &k);
    if (st == CG_E_NOT_FOUND) {
        cg_http_reply_error(req, st, "key", "no such chunk in this worker");
    } else if (st == CG_E_CONFLICT) {
        cg_http_reply_error(req, st, "key",
                            "the chunk is used by a live assembly; release it first");
    } else if (st != CG_OK) {
        cg_http_reply_error(req, st, "key", NULL);
    } else {
        char hex[CG_KEY_HEX_LEN + 1];
        cg_key_hex(&k, hex);
        cg_http_reply_json(
            req, 200, json_pack("{s:s, s:s, s:b}", "key", hex, "object", "chunk", "deleted", 1));
    }
}

/* ---- KV export ---- */

/* Parses ?heads=a-b (or a single head; absent = all). Replies 400 and returns 0 on error. */
static int parse_heads(cg_worker_api *a, cg_http_req *req, int *h0, int *h1)
{
    uint32_t n = (uint32_t)cg_api_cfg(a)->n_kv_heads, start = 0, count = 0;
    if (cg_kvwire_parse_heads(cg_http_req_query(req, "heads"), n, &start, &count) != CG_OK) {
        char msg[128];
        snprintf(msg, sizeof msg, "heads must be a or a-b with 0 <= a <= b < %u", n);
        cg_http_reply_error(req, CG_E_VALUE, "heads", msg);
        return 0;
    }
    *h0 = (int)start;
    *h1 = (int)(start + count - 1);
    return 1;
}

/* Replies with the KV wire format (kv/kvwire.h): its header, then payload, which the
 * engine already lays out per head, per layer, K then V. */
static void reply_kv(cg_worker_api *a, cg_http_req *req, const void *payload, size_t len,
                     uint32_t tokens, int h0, int h1)
{
    const cg_model_config *c = cg_api_cfg(a);
    cg_kvwire_header h = {.n_layers = (uint32_t)c->n_layers,
                          .head_dim = (uint32_t)c->head_dim,
                          .dtype = CG_KVWIRE_DTYPE_F32,
                          .n_tokens = tokens,
                          .head_start = (uint32_t)h0,
                          .n_heads = (uint32_t)(h1 - h0 + 1),
                          .total_kv_heads = (uint32_t)c->n_kv_heads};
    snprintf(h.model, sizeof h.model, "%s", c->kv_model);
    uint8_t head[CG_KVWIRE_FIXED_BYTES + CG_KVWIRE_MODEL_MAX + CG_KVWIRE_ALIGN];
    size_t hb = 0, want = 0;
    if (cg_kvwire_header_encode(&h, head, sizeof head, &hb) != CG_OK ||
        cg_kvwire_payload_bytes(&h, &want) != CG_OK || want != len) {
        cg_http_reply_error(req, CG_E_INTERNAL, NULL, "cannot encode the KV export");
        return;
    }
    cg_buf body;
    cg_buf_init(&body, hb + len); /* the size its wire header gives */
    cg_status st = cg_buf_append(&body, head, hb);
    if (st == CG_OK) st = cg_buf_append(&body, payload, len);
    (void)st; /* the cap is exactly what goes in */
    char v[64];
    cg_http_add_header(req, "X-KV-Format", "CGKV1");
    snprintf(v, sizeof v, "%u", tokens);
    cg_http_add_header(req, "X-KV-Tokens", v);
    snprintf(v, sizeof v, "%d-%d", h0, h1);
    cg_http_add_header(req, "X-KV-Heads", v);
    cg_http_reply_raw(req, 200, "application/octet-stream", body.data, body.len);
    cg_buf_free(&body);
}

void cg_api_chunk_kv(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    cg_key k;
    int h0, h1;
    void *buf = NULL;
    size_t len = 0;
    uint32_t tokens = 0;
    if (!path_key(req, &k) || !parse_heads(a, req, &h0, &h1)) return;
    if (cg_engine_chunk_kv(a->e, &k, h0, h1, &buf, &len, &tokens) != CG_OK) {
        cg_http_reply_error(req, CG_E_NOT_FOUND, "key", "no such chunk in this worker");
        return;
    }
    reply_kv(a, req, buf, len, tokens, h0, h1);
    free(buf);
}

void cg_api_assembly_kv(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    int h0, h1;
    void *buf = NULL;
    size_t len = 0;
    uint32_t tokens = 0;
    if (!parse_heads(a, req, &h0, &h1)) return;
    const char *id = cg_http_req_param(req, 0);
    if (cg_engine_assembly_kv(a->e, id, h0, h1, cg_now_ms(), &buf, &len, &tokens) != CG_OK) {
        cg_http_reply_error(req, CG_E_NOT_FOUND, "assembly_id",
                            "the assembly is unknown, expired or consumed");
        return;
    }
    reply_kv(a, req, buf, len, tokens, h0, h1);
    free(buf);
}

/* The last prompt token's logits of a live assembly (not consumed): what a backend that
 * pulls the assembly's KV samples its first token from. Body: vocab_size f32 LE. */
void cg_api_assembly_logits(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const cg_model_config *c = cg_api_cfg(a);
    const char *id = cg_http_req_param(req, 0);
    float *buf = cg_malloc((size_t)c->vocab_size * sizeof(float));
    uint32_t n_tokens = 0, cached = 0;
    if (cg_engine_assembly_logits(a->e, id, cg_now_ms(), buf, &n_tokens, &cached) != CG_OK) {
        cg_http_reply_error(req, CG_E_NOT_FOUND, "assembly_id",
                            "the assembly is unknown, expired or consumed");
        free(buf);
        return;
    }
    char v[64];
    cg_http_add_header(req, "X-Model", c->kv_model);
    snprintf(v, sizeof v, "%d", c->vocab_size);
    cg_http_add_header(req, "X-Vocab-Size", v);
    snprintf(v, sizeof v, "%u", n_tokens);
    cg_http_add_header(req, "X-KV-Tokens", v);
    snprintf(v, sizeof v, "%u", cached);
    cg_http_add_header(req, "X-Cached-Tokens", v);
    cg_http_reply_raw(req, 200, "application/octet-stream", buf,
                      (size_t)c->vocab_size * sizeof(float));
    free(buf);
}
