/* Route handlers of chunkgate-worker: request parsing and validation (every bad input gets
 * the OpenAI error shape), the engine calls, OpenAI-shaped replies and SSE streams, the
 * inventory and metrics. The contract is openapi/worker.yaml. */
#include "worker/serve/worker_api.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "worker/serve/kvpull.h"
#include "kv/kvwire.h"
#include "base/metrics.h"

#define P "chunkgate_worker_"
#define LIST_LIMIT_DEFAULT 1000
#define LIST_LIMIT_MAX 100000
#define STREAM_BUFFER (256u << 10)
/* Most top_logprobs entries per token (vLLM's default limit is 20). */
#define LOGPROBS_MAX 20

struct cg_worker_api {
    cg_worker_api_params p;
    cg_engine *e;
    cg_metrics *metrics;
    char instance_id[33]; /* random per process: a gateway sees a restart by it */
    int64_t started_ms;   /* wall clock at start */
    int pulls;            /* KV pulls in flight (atomic) */
};

cg_worker_api_params cg_worker_api_default_params(void)
{
    return (cg_worker_api_params){
        .engine = NULL,
        .separator = CG_SPLIT_DEFAULT_SEPARATOR,
        .max_segments = 256,
        .default_max_tokens = 16,
        .kv_source = NULL,
        .kv_request_source = 0,
        .tp = 1,
        .kv_timeout_ms = 5000,
        .kv_max_pulls = 4,
    };
}

static void random_hex(char *out, size_t n_bytes);

cg_worker_api *cg_worker_api_new(cg_worker_api_params p)
{
    cg_worker_api *a = cg_calloc(1, sizeof *a);
    a->p = p;
    if (!a->p.separator || !a->p.separator[0]) a->p.separator = CG_SPLIT_DEFAULT_SEPARATOR;
    if (a->p.kv_source && !a->p.kv_source[0]) a->p.kv_source = NULL;
    if (a->p.tp < 1) a->p.tp = 1;
    if (a->p.kv_timeout_ms <= 0) a->p.kv_timeout_ms = 5000;
    if (a->p.kv_max_pulls < 1) a->p.kv_max_pulls = 1;
    a->e = p.engine;
    a->metrics = cg_metrics_new();
    random_hex(a->instance_id, 16);
    a->started_ms = (int64_t)cg_wall_ms();
    return a;
}

void cg_worker_api_free(cg_worker_api **ap)
{
    cg_worker_api *a = *ap;
    if (!a) return;
    *ap = NULL;
    cg_metrics_free(&a->metrics);
    free(a);
}

static const cg_model_config *cfg_of(cg_worker_api *a)
{
    return cg_model_cfg(cg_engine_model(a->e));
}

/* ---- UTF-8 ---- */

/* Length of the sequence a lead byte starts (0: invalid lead). */
static size_t utf8_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* 1 if s[0..n) (n < the full length) can still become a valid sequence. */
static int utf8_prefix_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        unsigned char lo = 0x80, hi = 0xBF;
        if (i == 1) {
            if (s[0] == 0xE0)
                lo = 0xA0;
            else if (s[0] == 0xED)
                hi = 0x9F;
            else if (s[0] == 0xF0)
                lo = 0x90;
            else if (s[0] == 0xF4)
                hi = 0x8F;
        }
        if (s[i] < lo || s[i] > hi) return 0;
    }
    return 1;
}

size_t cg_utf8_sanitize(const char *in, size_t n, int final, cg_buf *out)
{
    static const char repl[] = "\xEF\xBF\xBD";
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0;
    cg_status st = CG_OK;
    while (i < n) {
        size_t len = utf8_len(s[i]);
        if (len == 1 && s[i] != 0) {
            st = cg_buf_append(out, s + i, 1);
            i++;
            continue;
        }
        if (len == 1) {
            /* NUL would be "\u0000", which C clients (jansson by default) refuse; it is
             * never part of a text answer. */
        } else if (len && i + len > n) {
            if (!final && utf8_prefix_ok(s + i, n - i)) break; /* wait for more bytes */
        } else if (len && cg_utf8_valid(in + i, len)) {
            st = cg_buf_append(out, s + i, len);
            i += len;
            continue;
        }
        st = cg_buf_append(out, repl, 3);
        i++;
    }
    (void)st; /* out is unlimited */
    return i;
}

static json_t *json_text(const char *s, size_t n)
{
    cg_buf b;
    cg_buf_init(&b, 0);
    cg_utf8_sanitize(s, n, 1, &b);
    json_t *j = json_stringn(b.data ? b.data : "", b.len);
    cg_buf_free(&b);
    return j;
}

static void random_hex(char *out, size_t n_bytes)
{
    uint8_t b[32];
    if (n_bytes > sizeof b) n_bytes = sizeof b;
    if (getrandom(b, n_bytes, 0) != (ssize_t)n_bytes) {
        uint64_t s = cg_now_ns();
        for (size_t i = 0; i < n_bytes; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            b[i] = (uint8_t)(s >> 56);
        }
    }
    cg_hex_encode(b, n_bytes, out);
}

/* ---- small handlers ---- */

static void h_health(cg_http_req *req, void *app)
{
    (void)app;
    cg_http_reply_json(req, 200, json_pack("{s:s}", "status", "ok"));
}

static void h_info(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const cg_model_config *c = cfg_of(a);
    cg_pool_stats ps = cg_pool_get_stats(cg_engine_pool(a->e));
    cg_engine_params ep = cg_engine_get_params(a->e);
    json_t *j = json_object();
#define SET(k, v) json_object_set_new(j, k, v)
    SET("object", json_string("worker.info"));
    SET("model", json_string(c->model_id));
    SET("n_layers", json_integer(c->n_layers));
    SET("n_heads", json_integer(c->n_heads));
    SET("n_kv_heads", json_integer(c->n_kv_heads));
    SET("head_dim", json_integer(c->head_dim));
    SET("hidden_size", json_integer(c->dim));
    SET("intermediate_size", json_integer(c->hidden_dim));
    SET("vocab_size", json_integer(c->vocab_size));
    SET("bos_token_id", json_integer(c->bos_id));
    SET("eos_token_id", json_integer(c->eos_id));
    SET("dtype", json_string("f32")); /* compute and KV dtype */
    SET("weights_dtype", json_string(c->dtype));
    SET("rope_style", json_string(cg_rope_style_name(c->rope_style)));
    SET("rope_theta", json_real(c->rope_theta));
    SET("max_positions", json_integer(c->max_pos));
    SET("isolation_modes", json_pack("[s,s]", "strict", "sys"));
    SET("key_version", json_string(CG_KEY_VERSION));
    SET("key_hash", json_string(cg_key_hash_name(cg_key_get_hash())));
    SET("instance_id", json_string(a->instance_id));
    SET("started_ms", json_integer((json_int_t)a->started_ms));
    SET("separator", json_string(a->p.separator));
    SET("block_tokens", json_integer(ep.block_tokens));
    SET("block_bytes", json_integer((json_int_t)ps.block_bytes));
    SET("pool_capacity_bytes", json_integer((json_int_t)ps.capacity_bytes));
    SET("pool_used_bytes", json_integer((json_int_t)ps.bytes_used));
    SET("chunks", json_integer((json_int_t)ps.chunks));
    cg_disk *d = cg_engine_disk(a->e);
    if (d) {
        cg_disk_stats ds = cg_disk_get_stats(d);
        SET("disk_capacity_bytes", json_integer((json_int_t)ds.capacity_bytes));
        SET("disk_used_bytes", json_integer((json_int_t)ds.used_bytes));
        SET("disk_chunks", json_integer((json_int_t)ds.chunks));
    } else {
        SET("disk_capacity_bytes", json_integer(0));
        SET("disk_used_bytes", json_integer(0));
        SET("disk_chunks", json_integer(0));
    }
    SET("tiers", d ? json_pack("[s,s]", "ram", "disk") : json_pack("[s]", "ram"));
    SET("tp", json_integer(a->p.tp));
    SET("kv_source", a->p.kv_source ? json_string(a->p.kv_source) : json_null());
    SET("assemblies_live", json_integer((json_int_t)cg_engine_live_assemblies(a->e, cg_now_ms())));
    SET("assembly_ttl_ms", json_integer((json_int_t)ep.assembly_ttl_ms));
    SET("kv_format", json_string("CGKV1"));
    SET("kv_layout", json_string("per head, per layer: K then V, each [tokens][head_dim] "
                                 "little-endian f32"));
#undef SET
    cg_http_reply_json(req, 200, j);
}

static void h_models(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const cg_model_config *c = cfg_of(a);
    json_t *j = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data", "id",
                          c->model_id, "object", "model", "created", (json_int_t)0, "owned_by",
                          "chunkgate-worker", "max_model_len", c->max_pos);
    cg_http_reply_json(req, 200, j);
}

static void set_counter(cg_metrics *m, const char *name, const char *help, uint64_t v)
{
    cg_metric_set(cg_metrics_counter(m, name, help, NULL), (double)v);
}

static void set_gauge(cg_metrics *m, const char *name, const char *help, double v)
{
    cg_metric_set(cg_metrics_gauge(m, name, help, NULL), v);
}

static void h_metrics(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    cg_metrics *m = a->metrics;
    cg_pool_stats ps = cg_pool_get_stats(cg_engine_pool(a->e));
    cg_engine_stats es = cg_engine_get_stats(a->e);
    size_t live = cg_engine_live_assemblies(a->e, cg_now_ms());
    /* The engine and the pool keep the counts; a scrape copies them into the registry. */
    set_gauge(m, P "pool_capacity_bytes", "KV pool capacity in bytes", (double)ps.capacity_bytes);
    set_gauge(m, P "pool_used_bytes", "KV pool bytes held by chunks", (double)ps.bytes_used);
    set_gauge(m, P "pool_chunks", "Chunks in the KV pool", (double)ps.chunks);
    set_gauge(m, P "pool_referenced_chunks", "Pool chunks referenced by live assemblies",
              (double)ps.referenced_chunks);
    set_gauge(m, P "assemblies_live", "Assemblies built and not yet consumed or released",
              (double)live);
    set_gauge(m, P "kv_pulls_in_flight", "KV pulls from a source worker in progress",
              (double)__atomic_load_n(&a->pulls, __ATOMIC_ACQUIRE));
    set_counter(m, P "chunk_hits_total", "Cacheable segments found in the pool", es.chunk_hits);
    set_counter(m, P "chunk_misses_total", "Cacheable segments computed", es.chunk_misses);
    set_counter(m, P "evictions_total", "Chunks evicted from the pool", es.evictions);
    set_counter(m, P "tokens_reused_total", "Prompt tokens taken from the pool", es.tokens_reused);
    set_counter(m, P "tokens_computed_total", "Prompt tokens not taken from the pool",
                es.tokens_computed);
    set_counter(m, P "prefill_tokens_total", "Tokens run through the model during prefill",
                es.prefill_tokens);
    set_counter(m, P "decode_tokens_total", "Tokens generated", es.decode_tokens);
    set_counter(m, P "assemblies_total", "Assemblies built", es.assemblies_created);
    set_counter(m, P "assemblies_expired_total", "Assemblies released by their ttl",
                es.assemblies_expired);
    set_counter(m, P "assemblies_adopted_total", "Assemblies made from KV pulled from a worker",
                es.assemblies_adopted);
    /* Tiers: what each holds now, and the traffic between them. */
    cg_disk *d = cg_engine_disk(a->e);
    cg_disk_stats ds = d ? cg_disk_get_stats(d) : (cg_disk_stats){0};
    static const char *tb = "Bytes held per KV tier (RAM: pool blocks; disk: slots)";
    static const char *tc = "Chunks per KV tier (a chunk restored from disk is in both)";
    static const char *tcap = "Capacity per KV tier in bytes";
    cg_metric_set(cg_metrics_gauge(m, P "tier_bytes", tb, "tier=\"ram\""), (double)ps.bytes_used);
    cg_metric_set(cg_metrics_gauge(m, P "tier_bytes", tb, "tier=\"disk\""), (double)ds.used_bytes);
    cg_metric_set(cg_metrics_gauge(m, P "tier_chunks", tc, "tier=\"ram\""), (double)ps.chunks);
    cg_metric_set(cg_metrics_gauge(m, P "tier_chunks", tc, "tier=\"disk\""), (double)ds.chunks);
    cg_metric_set(cg_metrics_gauge(m, P "tier_capacity_bytes", tcap, "tier=\"ram\""),
                  (double)ps.capacity_bytes);
    cg_metric_set(cg_metrics_gauge(m, P "tier_capacity_bytes", tcap, "tier=\"disk\""),
                  (double)ds.capacity_bytes);
    set_counter(m, P "disk_hits_total", "Cacheable segments served from the disk tier",
                es.disk_hits);
    set_counter(m, P "spills_total", "Chunks evicted from RAM and written to disk", es.spills);
    set_counter(m, P "spill_failures_total",
                "Chunks evicted from RAM that the disk tier did not take (dropped)",
                es.spill_failures);
    set_counter(m, P "restores_total", "Chunks read back from disk and verified", es.restores);
    set_counter(m, P "restore_failures_total",
                "Disk records that failed verification or reading (recomputed)",
                es.restore_failures);
    set_counter(m, P "disk_drops_total", "Chunks dropped from the disk tier to make room (LRU)",
                ds.drops);
    set_counter(m, P "checksum_failures_total",
                "Disk records whose XXH3-128 checksum did not match (never served)",
                ds.checksum_failures);
    set_counter(m, P "disk_io_errors_total", "Disk tier read, write or inventory errors",
                ds.io_errors);
    set_counter(m, P "disk_written_bytes_total", "Bytes written by spills", ds.bytes_written);
    set_counter(m, P "disk_read_bytes_total", "Bytes read back by restores", ds.bytes_read);
    set_counter(m, P "disk_open_dropped_total",
                "Inventory rows dropped at start (out of range, overlapping or invalid)",
                ds.open_dropped);
    cg_buf out;
    cg_buf_init(&out, 0);
    cg_metrics_render(m, &out);
    cg_http_reply_raw(req, 200, "text/plain; version=0.0.4; charset=utf-8",
                      out.data ? out.data : "", out.len);
    cg_buf_free(&out);
}

void cg_worker_api_done(void *app, const char *route, int status, double seconds)
{
    cg_worker_api *a = app;
    char labels[160];
    snprintf(labels, sizeof labels, "route=\"%s\",code=\"%d\"", route, status);
    cg_metrics_inc(a->metrics, P "requests_total", "HTTP requests by route and status", labels, 1);
    snprintf(labels, sizeof labels, "route=\"%s\"", route);
    cg_metric_observe(cg_metrics_histogram(a->metrics, P "request_duration_seconds",
                                           "HTTP request duration by route", labels,
                                           cg_metrics_latency_buckets, cg_metrics_latency_n),
                      seconds);
}

/* ---- request parsing helpers ---- */

/* Replies 404 when the request names another model. Returns 0 when it replied. */
static int model_ok(cg_worker_api *a, cg_http_req *req, json_t *body)
{
    const char *model = NULL;
    cg_status st = cg_json_get_string(body, "model", 0, &model);
    if (st != CG_OK) {
        cg_http_reply_error(req, st, "model", "model must be a string");
        return 0;
    }
    if (model && strcmp(model, cfg_of(a)->model_id) != 0) {
        char msg[320];
        snprintf(msg, sizeof msg, "model '%.128s' is not served here; this worker serves '%s'",
                 model, cfg_of(a)->model_id);
        cg_http_reply_error(req, CG_E_MODEL, "model", msg);
        return 0;
    }
    return 1;
}

/* Replies with a field error naming the field. */
static void field_error(cg_http_req *req, cg_status st, const char *field, const char *what)
{
    char msg[256];
    if (st == CG_E_MISSING)
        snprintf(msg, sizeof msg, "%s is required", field);
    else if (st == CG_E_TYPE)
        snprintf(msg, sizeof msg, "%s must be %s", field, what);
    else
        snprintf(msg, sizeof msg, "%s is out of range (%s)", field, what);
    cg_http_reply_error(req, st, field, msg);
}

/* Parses the assemble options shared by /v1/assemble and /v1/completions. */
typedef struct opts {
    cg_mode mode;
    const char *salt;
    size_t salt_len;
    long long recompute;
    long long reserve;
} opts;

static int parse_opts(cg_worker_api *a, cg_http_req *req, json_t *body, const char *mode_field,
                      opts *o)
{
    cg_status st;
    const char *mode = NULL;
    json_t *salt = NULL;
    o->mode = CG_MODE_STRICT;
    if ((st = cg_json_get_string(body, mode_field, 0, &mode)) != CG_OK) {
        field_error(req, st, mode_field, "a string");
        return 0;
    }
    if (mode && cg_mode_parse(mode, &o->mode) != 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must be \"strict\" or \"sys\"", mode_field);
        cg_http_reply_error(req, CG_E_VALUE, mode_field, msg);
        return 0;
    }
    if ((st = cg_json_get(body, "cache_salt", JSON_STRING, 0, &salt)) != CG_OK) {
        field_error(req, st, "cache_salt", "a string");
        return 0;
    }
    o->salt = salt ? json_string_value(salt) : NULL;
    o->salt_len = salt ? json_string_length(salt) : 0;
    long long maxpos = cfg_of(a)->max_pos;
    if ((st = cg_json_get_int(body, "recompute_prefix_tokens", 0, 0, INT32_MAX, &o->recompute)) !=
        CG_OK) {
        field_error(req, st, "recompute_prefix_tokens", "an integer >= 0");
        return 0;
    }
    if ((st = cg_json_get_int(body, "reserve_tokens", -1, 0, maxpos, &o->reserve)) != CG_OK) {
        field_error(req, st, "reserve_tokens", "an integer >= 0");
        return 0;
    }
    return 1;
}

static const char *role_parse(const char *s, cg_role *out)
{
    static const cg_role roles[] = {CG_ROLE_SYSTEM, CG_ROLE_CHUNK, CG_ROLE_QUESTION};
    for (size_t i = 0; i < CG_ARRAY_LEN(roles); i++)
        if (s && !strcmp(s, cg_role_name(roles[i]))) {
            *out = roles[i];
            return s;
        }
    return NULL;
}

static json_t *assembly_json(cg_worker_api *a, const cg_assembly_info *info)
{
    json_t *segs = json_array(), *ev = json_array(), *sp = json_array();
    char hex[CG_KEY_HEX_LEN + 1];
    for (size_t i = 0; i < info->n_segs; i++) {
        const cg_engine_seg_result *s = &info->segs[i];
        cg_key_hex(&s->key, hex);
        json_array_append_new(segs, json_pack("{s:s, s:s, s:i, s:i, s:b, s:s, s:b}", "key", hex,
                                              "role", cg_role_name(s->role), "offset",
                                              (int)s->offset, "n_tokens", (int)s->n_tokens, "hit",
                                              s->hit, "tier", s->tier, "stored", s->stored));
    }
    for (size_t i = 0; i < info->n_evicted; i++) {
        cg_key_hex(&info->evicted[i], hex);
        json_array_append_new(ev, json_string(hex));
    }
    for (size_t i = 0; i < info->n_spilled; i++) {
        cg_key_hex(&info->spilled[i], hex);
        json_array_append_new(sp, json_string(hex));
    }
    return json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:o, s:o, s:o, s:I}", "object", "assembly",
                     "assembly_id", info->id, "model", cfg_of(a)->model_id, "n_tokens",
                     (int)info->n_tokens, "cached_tokens", (int)info->cached_tokens,
                     "computed_tokens", (int)info->computed_tokens, "segments", segs, "evicted", ev,
                     "spilled", sp, "ttl_ms", (json_int_t)info->ttl_ms);
}

static void reply_engine_error(cg_http_req *req, cg_status st, const char *param, const char *err)
{
    cg_http_reply_error(req, st, param, err && err[0] ? err : NULL);
}

/* ---- POST /v1/assemble ---- */

static void h_assemble(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    json_t *body = cg_http_req_json(req);
    cg_engine_seg *segs = NULL;
    cg_key *keys = NULL;
    cg_assembly_info info = {0};
    char err[512], field[64];
    if (!body) return;
    if (!model_ok(a, req, body)) goto out;
    opts o;
    if (!parse_opts(a, req, body, "mode", &o)) goto out;
    json_t *arr = NULL;
    cg_status st = cg_json_get(body, "segments", JSON_ARRAY, 1, &arr);
    if (st != CG_OK) {
        field_error(req, st, "segments", "an array of {role, text, key?}");
        goto out;
    }
    size_t n = json_array_size(arr);
    if (n == 0) {
        cg_http_reply_error(req, CG_E_VALUE, "segments", "segments must not be empty");
        goto out;
    }
    if (n > a->p.max_segments) {
        char msg[128];
        snprintf(msg, sizeof msg, "%zu segments; at most %zu are allowed", n, a->p.max_segments);
        cg_http_reply_error(req, CG_E_SEGMENTS, "segments", msg);
        goto out;
    }
    segs = cg_calloc(n, sizeof *segs);
    keys = cg_calloc(n, sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(arr, i), *text = NULL;
        const char *role = NULL, *key = NULL;
        if (!json_is_object(s)) {
            snprintf(field, sizeof field, "segments[%zu]", i);
            field_error(req, CG_E_TYPE, field, "an object {role, text, key?}");
            goto out;
        }
        snprintf(field, sizeof field, "segments[%zu].role", i);
        if ((st = cg_json_get_string(s, "role", 1, &role)) != CG_OK) {
            field_error(req, st, field, "a string");
            goto out;
        }
        if (!role_parse(role, &segs[i].role)) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s '%.32s' is unknown; use system, chunk or question", field,
                     role);
            cg_http_reply_error(req, CG_E_VALUE, field, msg);
            goto out;
        }
        snprintf(field, sizeof field, "segments[%zu].text", i);
        if ((st = cg_json_get(s, "text", JSON_STRING, 1, &text)) != CG_OK) {
            field_error(req, st, field, "a string");
            goto out;
        }
        segs[i].text = json_string_value(text);
        segs[i].len = json_string_length(text);
        snprintf(field, sizeof field, "segments[%zu].key", i);
        if ((st = cg_json_get_string(s, "key", 0, &key)) != CG_OK) {
            field_error(req, st, field, "a string of 32 hex characters");
            goto out;
        }
        if (key) {
            if (cg_key_parse(key, &keys[i]) != 0) {
                char msg[128];
                snprintf(msg, sizeof msg, "%s must be 32 hex characters", field);
                cg_http_reply_error(req, CG_E_VALUE, field, msg);
                goto out;
            }
            segs[i].key = &keys[i];
        }
    }
    cg_assemble_req ar = {.segs = segs,
                          .n_segs = n,
                          .mode = o.mode,
                          .salt = o.salt,
                          .salt_len = o.salt_len,
                          .recompute_prefix_tokens = (uint32_t)o.recompute,
                          .reserve_tokens = o.reserve,
                          .path = CG_PATH_CACHED};
    st = cg_engine_assemble(a->e, &ar, cg_now_ms(), &info, err, sizeof err);
    if (st != CG_OK) {
        reply_engine_error(req, st, st == CG_E_KEY_MISMATCH || st == CG_E_VALUE ? "segments" : NULL,
                           err);
        goto out;
    }
    cg_log(CG_LOG_INFO, "assembly %s: %u tokens, %u cached, %zu segments, %zu evicted", info.id,
           info.n_tokens, info.cached_tokens, info.n_segs, info.n_evicted);
    cg_http_reply_json(req, 200, assembly_json(a, &info));
out:
    cg_assembly_info_free(&info);
    free(segs);
    free(keys);
    json_decref(body);
}

static void h_assembly_delete(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const char *id = cg_http_req_param(req, 0);
    if (cg_engine_release(a->e, id, cg_now_ms()) != CG_OK) {
        char msg[160];
        snprintf(msg, sizeof msg, "assembly '%.64s' is unknown, expired or consumed", id);
        cg_http_reply_error(req, CG_E_NOT_FOUND, "assembly_id", msg);
        return;
    }
    cg_http_reply_json(req, 200,
                       json_pack("{s:s, s:s, s:b}", "id", id, "object", "assembly", "deleted", 1));
}

/* ---- POST /v1/completions ---- */

typedef struct gen {
    cg_worker_api *a;
    cg_http_req *req;
    int stream;
    cg_stream *s; /* created at the first streamed token */
    char id[48];
    json_int_t created;
    char pend[8]; /* bytes of an incomplete UTF-8 sequence */
    size_t n_pend;
    /* logprobs (OpenAI legacy completions shape): -1 = not asked; else top entries per token */
    long long logprobs;
    float *lg; /* the logits the next token is sampled from (copy) */
    int vocab;
    double lse; /* log-sum-exp of lg */
    int32_t top_ids[LOGPROBS_MAX];
    int n_top;
    size_t text_bytes;                                            /* generated bytes so far */
    json_t *lp_tokens, *lp_values, *lp_top, *lp_offsets, *lp_ids; /* entries not yet sent */
} gen;

static void logprobs_reset(gen *g)
{
    g->lp_tokens = json_array();
    g->lp_values = json_array();
    g->lp_top = json_array();
    g->lp_offsets = json_array();
    g->lp_ids = json_array();
}

static void logprobs_free(gen *g)
{
    json_decref(g->lp_tokens);
    json_decref(g->lp_values);
    json_decref(g->lp_top);
    json_decref(g->lp_offsets);
    json_decref(g->lp_ids);
    g->lp_tokens = g->lp_values = g->lp_top = g->lp_offsets = g->lp_ids = NULL;
    cg_free(&g->lg);
}

/* The logprobs object of the tokens since the last call (null when not asked): the legacy
 * completions shape plus token_ids (an extension: byte tokens have no unique text). */
static json_t *logprobs_take(gen *g)
{
    if (g->logprobs < 0) return json_null();
    json_t *j = json_pack("{s:o, s:o, s:o, s:o, s:o}", "tokens", g->lp_tokens, "token_logprobs",
                          g->lp_values, "top_logprobs", g->lp_top, "text_offset", g->lp_offsets,
                          "token_ids", g->lp_ids);
    logprobs_reset(g);
    return j;
}

/* Keeps the distribution the next token is drawn from: its log-normalizer and top entries. */
static void on_logits(void *ud, const float *logits, int vocab)
{
    gen *g = ud;
    if (!g->lg) g->lg = cg_malloc((size_t)vocab * sizeof(float));
    memcpy(g->lg, logits, (size_t)vocab * sizeof(float));
    g->vocab = vocab;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - mx);
    g->lse = mx + log(sum);
    /* top entries by selection: k is at most LOGPROBS_MAX */
    g->n_top = 0;
    for (int k = 0; k < (int)g->logprobs && k < vocab; k++) {
        int best = -1;
        for (int i = 0; i < vocab; i++) {
            int taken = 0;
            for (int t = 0; t < g->n_top && !taken; t++)
                taken = g->top_ids[t] == i;
            if (!taken && (best < 0 || logits[i] > logits[best])) best = i;
        }
        g->top_ids[g->n_top++] = best;
    }
}

static json_t *token_text(gen *g, int32_t tok)
{
    char b[4];
    size_t n = cg_tok_decode(cg_engine_model(g->a->e), tok, b);
    return json_text(b, n);
}

/* Records the logprob entry of a sampled token. */
static void logprobs_add(gen *g, int32_t tok, size_t n_bytes)
{
    if (g->logprobs < 0 || !g->lg || tok < 0 || tok >= g->vocab) return;
    json_array_append_new(g->lp_tokens, token_text(g, tok));
    json_array_append_new(g->lp_values, json_real((double)g->lg[tok] - g->lse));
    json_t *top = json_object();
    for (int t = 0; t < g->n_top; t++) {
        json_t *txt = token_text(g, g->top_ids[t]);
        /* several byte tokens can render as U+FFFD: the first (most likely) one stays */
        if (!json_object_get(top, json_string_value(txt)))
            json_object_set_new(top, json_string_value(txt),
                                json_real((double)g->lg[g->top_ids[t]] - g->lse));
        json_decref(txt);
    }
    json_array_append_new(g->lp_top, top);
    json_array_append_new(g->lp_offsets, json_integer((json_int_t)g->text_bytes));
    json_array_append_new(g->lp_ids, json_integer(tok));
    g->text_bytes += n_bytes;
}

static int push_event(gen *g, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    cg_buf b;
    cg_buf_init(&b, 0);
    cg_status st = cg_buf_printf(&b, "data: %s\n\n", text);
    (void)st;
    int rc = cg_stream_push(g->s, b.data, b.len);
    cg_buf_free(&b);
    free(text);
    return rc;
}

static json_t *chunk_json(gen *g, const char *text, size_t len, const char *finish)
{
    json_t *choice =
        json_pack("{s:o, s:i, s:o, s:o}", "text", json_text(text, len), "index", 0, "logprobs",
                  logprobs_take(g), "finish_reason", finish ? json_string(finish) : json_null());
    return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", g->id, "object", "text_completion",
                     "created", g->created, "model", cfg_of(g->a)->model_id, "choices", choice);
}

static void stream_start(gen *g)
{
    if (g->s) return;
    g->s = cg_stream_new(STREAM_BUFFER, ": keep-alive\n\n");
    cg_http_reply_stream(g->req, 200, "text/event-stream", g->s);
    g->req = NULL; /* replied: the request is the server's now */
}

/* Streams one token's bytes as a text_completion chunk, holding back an incomplete UTF-8
 * sequence. Returns non-zero to stop decoding (the client left). */
static int on_token(void *ud, int32_t tok, const char *bytes, size_t len)
{
    gen *g = ud;
    logprobs_add(g, tok, len);
    if (!g->stream) return 0;
    stream_start(g);
    if (len && g->n_pend + len <= sizeof g->pend) {
        memcpy(g->pend + g->n_pend, bytes, len);
        g->n_pend += len;
    }
    cg_buf b;
    cg_buf_init(&b, 0);
    size_t used = cg_utf8_sanitize(g->pend, g->n_pend, 0, &b);
    memmove(g->pend, g->pend + used, g->n_pend - used);
    g->n_pend -= used;
    int rc = 0;
    if (b.len) rc = push_event(g, chunk_json(g, b.data, b.len, NULL));
    cg_buf_free(&b);
    return rc != 0 || cg_stream_cancelled(g->s);
}

static json_t *usage_json(const cg_complete_result *r)
{
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", (int)r->prompt_tokens,
                     "completion_tokens", (int)r->completion_tokens, "total_tokens",
                     (int)(r->prompt_tokens + r->completion_tokens), "prompt_tokens_details",
                     "cached_tokens", (int)r->cached_tokens);
}

static void h_completions(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    json_t *body = cg_http_req_json(req);
    cg_split_result sr = {0};
    cg_engine_seg *segs = NULL;
    cg_assembly_info info = {0};
    cg_complete_result res = {0};
    cg_kvpull_result pulled = {0};
    gen g = {0};
    char err[512];
    cg_status st;
    if (!body) return;
    g.a = a;
    g.req = req;
    g.logprobs = -1;
    if (!model_ok(a, req, body)) goto out;

    /* sampling and length */
    long long max_tokens, seed, n_choices;
    double temperature, top_p;
    int stream;
    long long maxpos = cfg_of(a)->max_pos;
    if ((st = cg_json_get_int(body, "max_tokens", a->p.default_max_tokens, 0, maxpos,
                              &max_tokens)) != CG_OK) {
        field_error(req, st, "max_tokens", "an integer between 0 and the context length");
        goto out;
    }
    if ((st = cg_json_get_number(body, "temperature", 1.0, 0.0, 2.0, &temperature)) != CG_OK) {
        field_error(req, st, "temperature", "a number in [0, 2]");
        goto out;
    }
    if ((st = cg_json_get_number(body, "top_p", 1.0, 0.0, 1.0, &top_p)) != CG_OK || top_p <= 0.0) {
        field_error(req, st == CG_OK ? CG_E_VALUE : st, "top_p", "a number in (0, 1]");
        goto out;
    }
    uint64_t rnd;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = cg_now_ns();
    if ((st = cg_json_get_int(body, "seed", (long long)(rnd >> 2), -(1LL << 62), 1LL << 62,
                              &seed)) != CG_OK) {
        field_error(req, st, "seed", "an integer");
        goto out;
    }
    if ((st = cg_json_get_bool(body, "stream", 0, &stream)) != CG_OK) {
        field_error(req, st, "stream", "a boolean");
        goto out;
    }
    if ((st = cg_json_get_int(body, "n", 1, 1, 1, &n_choices)) != CG_OK) {
        field_error(req, st, "n", "1 (one choice per request)");
        goto out;
    }
    json_t *lp = json_object_get(body, "logprobs");
    if (lp && !json_is_null(lp) &&
        (st = cg_json_get_int(body, "logprobs", -1, 0, LOGPROBS_MAX, &g.logprobs)) != CG_OK) {
        field_error(req, st, "logprobs", "an integer in [0, 20] or null");
        goto out;
    }
    if (g.logprobs >= 0) logprobs_reset(&g);
    json_t *stop = json_object_get(body, "stop");
    if (stop && !json_is_null(stop) && !(json_is_array(stop) && json_array_size(stop) == 0)) {
        cg_http_reply_error(req, CG_E_UNSUPPORTED, "stop",
                            "stop sequences are not supported by the reference worker");
        goto out;
    }

    /* where the KV comes from: an assembly, a "# #" prompt, or a plain prompt */
    json_t *ktp = NULL;
    const char *assembly_id = NULL, *worker = NULL;
    if ((st = cg_json_get(body, "kv_transfer_params", JSON_OBJECT, 0, &ktp)) != CG_OK) {
        field_error(req, st, "kv_transfer_params", "an object {assembly_id, worker?}");
        goto out;
    }
    if (ktp && (st = cg_json_get_string(ktp, "assembly_id", 1, &assembly_id)) != CG_OK) {
        field_error(req, st, "kv_transfer_params.assembly_id", "a string");
        goto out;
    }
    if (ktp && (st = cg_json_get_string(ktp, "worker", 0, &worker)) != CG_OK) {
        field_error(req, st, "kv_transfer_params.worker", "a string (the worker's base URL)");
        goto out;
    }
    if (worker && !a->p.kv_request_source) {
        cg_http_reply_error(req, CG_E_FORBIDDEN, "kv_transfer_params.worker",
                            "this worker pulls KV only from its configured --kv-source; "
                            "kv_transfer_params.worker is refused");
        goto out;
    }
    if (worker && !cg_kvpull_url_ok(worker)) {
        cg_http_reply_error(req, CG_E_VALUE, "kv_transfer_params.worker",
                            "kv_transfer_params.worker must be an http:// or https:// base URL");
        goto out;
    }
    opts o; /* checked even when unused, so a typo is never silently ignored */
    if (!parse_opts(a, req, body, "chunk_mode", &o)) goto out;
    json_t *prompt = json_object_get(body, "prompt");
    if (json_is_array(prompt) && json_array_size(prompt) == 1) prompt = json_array_get(prompt, 0);
    if (!assembly_id) {
        if (!prompt || json_is_null(prompt)) {
            field_error(req, CG_E_MISSING, "prompt", "a string");
            goto out;
        }
        if (!json_is_string(prompt)) {
            field_error(req, CG_E_TYPE, "prompt", "a string (or an array of one string)");
            goto out;
        }
    }
    cg_complete_req cr = {.temperature = (float)temperature,
                          .top_p = (float)top_p,
                          .seed = (uint64_t)seed,
                          .max_tokens = (uint32_t)max_tokens,
                          .on_token = on_token,
                          .on_logits = g.logprobs >= 0 ? on_logits : NULL,
                          .ud = &g};
    if (assembly_id) {
        cr.assembly_id = assembly_id;
        /* Backend role: an assembly this worker does not hold lives on the worker that built
         * it; pull its KV here. Ids are 128 random bits, so a local id is never a remote one. */
        const char *src = worker ? worker : a->p.kv_source;
        if (src && !cg_engine_has_assembly(a->e, assembly_id, cg_now_ms())) {
            /* A pull holds a job thread for up to its timeout: bound how many can. */
            if (__atomic_add_fetch(&a->pulls, 1, __ATOMIC_ACQ_REL) > a->p.kv_max_pulls) {
                __atomic_sub_fetch(&a->pulls, 1, __ATOMIC_ACQ_REL);
                cg_metrics_inc(a->metrics, P "kv_pulls_total",
                               "Assemblies pulled from a worker (backend role), by result",
                               "result=\"busy\"", 1);
                cg_http_add_header(req, "Retry-After", "1");
                cg_http_reply_error(req, CG_E_UNAVAILABLE, "kv_transfer_params",
                                    "too many KV pulls in flight; retry shortly");
                goto out;
            }
            cg_kvpull_params pp = cg_kvpull_default_params();
            pp.worker = src;
            pp.assembly_id = assembly_id;
            pp.tp = a->p.tp;
            pp.timeout_ms = a->p.kv_timeout_ms;
            st = cg_kvpull_assembly(a->e, &pp, cg_now_ms(), &pulled, err, sizeof err);
            __atomic_sub_fetch(&a->pulls, 1, __ATOMIC_ACQ_REL);
            cg_metrics_inc(a->metrics, P "kv_pulls_total",
                           "Assemblies pulled from a worker (backend role), by result",
                           st == CG_OK ? "result=\"ok\"" : "result=\"error\"", 1);
            cg_metrics_inc(a->metrics, P "kv_pull_requests_total",
                           "KV requests made by tensor-parallel ranks", NULL, pulled.kv_requests);
            cg_metrics_inc(a->metrics, P "kv_pull_bytes_total", "KV bytes pulled from workers",
                           NULL, (double)pulled.kv_bytes);
            if (st != CG_OK) {
                cg_log(CG_LOG_WARN, "kv pull of assembly %.64s from %s failed: %s", assembly_id,
                       src, err);
                reply_engine_error(req, st,
                                   st == CG_E_NOT_FOUND ? "kv_transfer_params.assembly_id"
                                                        : "kv_transfer_params",
                                   err);
                goto out;
            }
            cg_metric_observe(cg_metrics_histogram(
                                  a->metrics, P "kv_pull_seconds", "Time to pull an assembly's KV",
                                  NULL, cg_metrics_latency_buckets, cg_metrics_latency_n),
                              pulled.seconds);
            cr.assembly_id = pulled.id;
        }
    } else {
        const char *text = json_string_value(prompt), *sep = NULL;
        size_t len = json_string_length(prompt);
        if ((st = cg_json_get_string(body, "chunk_separator", 0, &sep)) != CG_OK ||
            (sep && !sep[0])) {
            field_error(req, st == CG_OK ? CG_E_VALUE : st, "chunk_separator",
                        "a non-empty string");
            goto out;
        }
        cg_split_params sp = cg_split_default_params();
        sp.separator = sep ? sep : a->p.separator;
        sp.max_segments = a->p.max_segments;
        st = cg_split_prompt(text, len, &sp, &sr);
        if (st != CG_OK) {
            reply_engine_error(req, st, "prompt", NULL);
            goto out;
        }
        if (sr.passthrough) {
            cr.prompt = text;
            cr.prompt_len = len;
        } else {
            segs = cg_calloc(sr.n, sizeof *segs);
            for (size_t i = 0; i < sr.n; i++)
                segs[i] =
                    (cg_engine_seg){sr.segs[i].role, text + sr.segs[i].off, sr.segs[i].len, NULL};
            cg_assemble_req ar = {.segs = segs,
                                  .n_segs = sr.n,
                                  .mode = o.mode,
                                  .salt = o.salt,
                                  .salt_len = o.salt_len,
                                  .recompute_prefix_tokens = (uint32_t)o.recompute,
                                  .reserve_tokens = o.reserve,
                                  .path = CG_PATH_CACHED};
            st = cg_engine_assemble(a->e, &ar, cg_now_ms(), &info, err, sizeof err);
            if (st != CG_OK) {
                reply_engine_error(req, st, "prompt", err);
                goto out;
            }
            cr.assembly_id = info.id;
        }
    }
    snprintf(g.id, sizeof g.id, "cmpl-");
    random_hex(g.id + 5, 12);
    g.created = (json_int_t)(cg_wall_ms() / 1000);
    g.stream = stream;

    st = cg_engine_complete(a->e, &cr, cg_now_ms(), &res, err, sizeof err);
    if (st != CG_OK) {
        if (!g.s) {
            reply_engine_error(req, st,
                               st == CG_E_NOT_FOUND ? "kv_transfer_params.assembly_id" : NULL, err);
        } else {
            /* Too late for a status code: the error goes out as an event. */
            int rc = push_event(&g, cg_http_error_json(st, NULL, err[0] ? err : NULL));
            rc |= cg_stream_push(g.s, "data: [DONE]\n\n", 14);
            (void)rc;
        }
        goto out;
    }
    if (res.cancelled)
        cg_log(CG_LOG_INFO, "client left; decoding stopped after %zu tokens", res.n_tokens);
    if (stream) {
        stream_start(&g);
        int rc = 0;
        if (g.n_pend) { /* an incomplete sequence at the end becomes U+FFFD */
            cg_buf b;
            cg_buf_init(&b, 0);
            cg_utf8_sanitize(g.pend, g.n_pend, 1, &b);
            rc |= push_event(&g, chunk_json(&g, b.data, b.len, NULL));
            cg_buf_free(&b);
        }
        json_t *last = chunk_json(&g, "", 0, res.finish_reason);
        json_object_set_new(last, "usage", usage_json(&res));
        rc |= push_event(&g, last);
        rc |= cg_stream_push(g.s, "data: [DONE]\n\n", 14);
        (void)rc;
    } else {
        json_t *choice =
            json_pack("{s:o, s:i, s:o, s:s}", "text", json_text(res.text, res.text_len), "index", 0,
                      "logprobs", logprobs_take(&g), "finish_reason", res.finish_reason);
        json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", g.id, "object",
                              "text_completion", "created", g.created, "model", cfg_of(a)->model_id,
                              "choices", choice, "usage", usage_json(&res));
        cg_http_reply_json(req, 200, j);
    }
out:
    if (g.s) {
        cg_stream_close(g.s);
        cg_stream_unref(&g.s);
    }
    cg_complete_result_free(&res);
    cg_assembly_info_free(&info);
    cg_split_result_free(&sr);
    logprobs_free(&g);
    free(segs);
    json_decref(body);
}

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
    if (c->ram) json_array_append_new(tiers, json_string("ram"));
    if (c->disk) json_array_append_new(tiers, json_string("disk"));
    return json_pack(
        "{s:s, s:s, s:i, s:I, s:s, s:o, s:I, s:I, s:i}", "object", "chunk", "key", hex, "tokens",
        (int)c->tokens, "bytes", (json_int_t)(c->ram ? c->ram_bytes : c->disk_bytes), "tier",
        c->ram ? "ram" : "disk", "tiers", tiers, "disk_bytes", (json_int_t)c->disk_bytes,
        "last_used", (json_int_t)c->last_used, "refs", (int)c->refs);
}

static void h_chunks(cg_http_req *req, void *app)
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

static void h_chunk_get(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const cg_model_config *c = cfg_of(a);
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
        if (cg_kvwire_head_key(c->model_id, (uint32_t)h, hex, hk, sizeof hk) == CG_OK)
            json_array_append_new(heads, json_string(hk));
    json_object_set_new(j, "n_kv_heads", json_integer(c->n_kv_heads));
    json_object_set_new(j, "head_keys", heads);
    cg_http_reply_json(req, 200, j);
}

static void h_chunk_delete(cg_http_req *req, void *app)
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
    uint32_t n = (uint32_t)cfg_of(a)->n_kv_heads, start = 0, count = 0;
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
    const cg_model_config *c = cfg_of(a);
    cg_kvwire_header h = {.n_layers = (uint32_t)c->n_layers,
                          .head_dim = (uint32_t)c->head_dim,
                          .dtype = CG_KVWIRE_DTYPE_F32,
                          .n_tokens = tokens,
                          .head_start = (uint32_t)h0,
                          .n_heads = (uint32_t)(h1 - h0 + 1),
                          .total_kv_heads = (uint32_t)c->n_kv_heads};
    snprintf(h.model, sizeof h.model, "%s", c->model_id);
    uint8_t head[CG_KVWIRE_FIXED_BYTES + CG_KVWIRE_MODEL_MAX + CG_KVWIRE_ALIGN];
    size_t hb = 0, want = 0;
    if (cg_kvwire_header_encode(&h, head, sizeof head, &hb) != CG_OK ||
        cg_kvwire_payload_bytes(&h, &want) != CG_OK || want != len) {
        cg_http_reply_error(req, CG_E_INTERNAL, NULL, "cannot encode the KV export");
        return;
    }
    cg_buf body;
    cg_buf_init(&body, 0);
    cg_status st = cg_buf_append(&body, head, hb);
    if (st == CG_OK) st = cg_buf_append(&body, payload, len);
    (void)st; /* unlimited buffer */
    char v[64];
    cg_http_add_header(req, "X-KV-Format", "CGKV1");
    snprintf(v, sizeof v, "%u", tokens);
    cg_http_add_header(req, "X-KV-Tokens", v);
    snprintf(v, sizeof v, "%d-%d", h0, h1);
    cg_http_add_header(req, "X-KV-Heads", v);
    cg_http_reply_raw(req, 200, "application/octet-stream", body.data, body.len);
    cg_buf_free(&body);
}

static void h_chunk_kv(cg_http_req *req, void *app)
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

static void h_assembly_kv(cg_http_req *req, void *app)
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
static void h_assembly_logits(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const cg_model_config *c = cfg_of(a);
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
    cg_http_add_header(req, "X-Model", c->model_id);
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

/* ---- routes ---- */

static const cg_http_route routes[] = {
    {"GET", "/healthz", h_health, CG_ROUTE_INLINE, "healthz"},
    {"GET", "/metrics", h_metrics, CG_ROUTE_INLINE, "metrics"},
    {"GET", "/v1/info", h_info, CG_ROUTE_INLINE, "info"},
    {"GET", "/v1/models", h_models, CG_ROUTE_INLINE, "models"},
    {"POST", "/v1/assemble", h_assemble, 0, "assemble"},
    {"DELETE", "/v1/assemblies/*", h_assembly_delete, CG_ROUTE_INLINE, "assembly_delete"},
    {"GET", "/v1/assemblies/*/kv", h_assembly_kv, 0, "assembly_kv"},
    {"GET", "/v1/assemblies/*/logits", h_assembly_logits, 0, "assembly_logits"},
    {"POST", "/v1/completions", h_completions, 0, "completions"},
    {"GET", "/v1/chunks", h_chunks, CG_ROUTE_INLINE, "chunks"},
    {"GET", "/v1/chunks/*", h_chunk_get, CG_ROUTE_INLINE, "chunk_get"},
    {"DELETE", "/v1/chunks/*", h_chunk_delete, CG_ROUTE_INLINE, "chunk_delete"},
    {"GET", "/v1/chunks/*/kv", h_chunk_kv, 0, "chunk_kv"},
};

const cg_http_route *cg_worker_api_routes(size_t *n_routes)
{
    *n_routes = CG_ARRAY_LEN(routes);
    return routes;
}
