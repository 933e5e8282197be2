/* Worker API client: JSON calls over the shared curl event loop, and answer parsers. */
#include "backends/worker_client.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "base/base.h"

#define INVENTORY_PAGE 10000

/* ---------------------------------------------------------------- asynchronous calls */

typedef struct call {
    cg_buf body;
    long status;
    cg_wc_done_fn fn;
    int (*gone)(void *arg);
    void *arg;
} call;

static int on_body(void *arg, const char *data, size_t len)
{
    call *k = arg;
    return cg_buf_append(&k->body, data, len) == CG_OK ? CG_UPSTREAM_CONTINUE : CG_UPSTREAM_ABORT;
}

static int on_head(void *arg, long status, const char *ct)
{
    call *k = arg;
    k->status = status;
    return CG_UPSTREAM_CONTINUE;
}

static void on_done(void *arg, cg_status st, long http, const char *detail)
{
    call *k = arg;
    json_t *j = NULL;
    if (st == CG_OK) j = json_loadb(k->body.data ? k->body.data : "", k->body.len, 0, NULL);
    k->fn(k->arg, st, http ? http : k->status, j, detail);
    cg_buf_free(&k->body);
    free(k);
}

static int on_gone(void *arg)
{
    call *k = arg;
    return k->gone && k->gone(k->arg);
}

static const cg_upstream_handlers HANDLERS = {on_head, on_body, on_done, on_gone};

cg_status cg_wc_call(cg_upstream *c, const char *base, const char *method, const char *path,
                     char *body, size_t body_len, const char *rid, long timeout_ms,
                     cg_wc_done_fn fn, int (*gone)(void *arg), void *arg, cg_upstream_xfer **ref)
{
    call *k = cg_calloc(1, sizeof *k);
    cg_buf_init(&k->body, CG_WC_MAX_BYTES);
    k->fn = fn;
    k->gone = gone;
    k->arg = arg;
    cg_upstream_req r = {.base = base,
                         .method = method,
                         .path = path,
                         .body = body,
                         .body_len = body_len,
                         .request_id = rid,
                         .idle_timeout_ms = timeout_ms,
                         .to_worker = 1};
    cg_status st = cg_upstream_submit_req(c, &r, &HANDLERS, k, ref);
    if (st != CG_OK) {
        cg_buf_free(&k->body);
        free(k);
    }
    return st;
}

/* ---------------------------------------------------------------- blocking calls */

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    cg_status st;
    long http;
    json_t *body;
    char detail[256];
} waiter;

static void wake_waiter(void *arg, cg_status st, long http, json_t *body, const char *detail)
{
    waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    w->st = st;
    w->http = http;
    w->body = body;
    snprintf(w->detail, sizeof w->detail, "%s", detail);
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

cg_status cg_wc_call_sync(cg_upstream *c, const char *base, const char *method, const char *path,
                          char *body, size_t body_len, long timeout_ms, long *http, json_t **out,
                          char *err, size_t errlen)
{
    waiter w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    *http = 0;
    *out = NULL;
    cg_status st = cg_wc_call(c, base, method, path, body, body_len, NULL, timeout_ms, wake_waiter,
                              NULL, &w, NULL);
    if (st != CG_OK) {
        snprintf(err, errlen, "the gateway is stopping");
    } else {
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        st = w.st;
        *http = w.http;
        *out = w.body;
        snprintf(err, errlen, "%s", w.detail);
    }
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return st;
}

static void release_done(void *arg, cg_status st, long http, json_t *body, const char *detail)
{
    json_decref(body);
}

void cg_wc_release(cg_upstream *c, const char *base, const char *assembly_id, const char *rid)
{
    char path[96];
    snprintf(path, sizeof path, "/v1/assemblies/%.32s", assembly_id);
    cg_status st =
        cg_wc_call(c, base, "DELETE", path, NULL, 0, rid, 5000, release_done, NULL, NULL, NULL);
    (void)st; /* stopping: the worker's ttl releases it */
}

const char *cg_wc_error_message(json_t *j)
{
    return json_string_value(json_object_get(json_object_get(j, "error"), "message"));
}

/* ---------------------------------------------------------------- info */

static char *dup_field(json_t *j, const char *k)
{
    const char *s = json_string_value(json_object_get(j, k));
    return s ? cg_strdup(s) : NULL;
}

cg_status cg_wc_info_parse(json_t *j, cg_wc_info *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!json_is_object(j)) {
        snprintf(err, errlen, "/v1/info is not a JSON object");
        return CG_E_VALUE;
    }
    out->model = dup_field(j, "model");
    out->dtype = dup_field(j, "dtype");
    out->rope_style = dup_field(j, "rope_style");
    out->key_version = dup_field(j, "key_version");
    /* Workers from before --key-hash existed hash with XXH3-128. */
    out->key_hash = dup_field(j, "key_hash");
    if (!out->key_hash) out->key_hash = cg_strdup("xxhash");
    out->n_layers = json_integer_value(json_object_get(j, "n_layers"));
    out->n_kv_heads = json_integer_value(json_object_get(j, "n_kv_heads"));
    out->head_dim = json_integer_value(json_object_get(j, "head_dim"));
    out->max_positions = json_integer_value(json_object_get(j, "max_positions"));
    out->chat_template = dup_field(j, "chat_template");
    out->bos_token = dup_field(j, "bos_token");
    out->eos_token = dup_field(j, "eos_token");
    /* A restart marker, when the worker has one: a new value means a new process whose cache
     * may differ from what the index knows. */
    const char *names[] = {"instance_id", "started_ms", "start_time"};
    for (size_t i = 0; i < CG_ARRAY_LEN(names) && !out->instance; i++) {
        json_t *v = json_object_get(j, names[i]);
        char buf[64];
        if (json_is_string(v)) {
            out->instance = cg_strdup(json_string_value(v));
        } else if (json_is_integer(v)) {
            snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
            out->instance = cg_strdup(buf);
        }
    }
    json_t *rt = json_object_get(j, "remote_tier");
    const char *rid = json_string_value(json_object_get(rt, "id"));
    if (rid && rid[0]) out->remote_tier = cg_strndup(rid, strnlen(rid, 512));
    const char *missing = !out->model         ? "model"
                          : !out->dtype       ? "dtype"
                          : !out->rope_style  ? "rope_style"
                          : !out->key_version ? "key_version"
                                              : NULL;
    if (missing) {
        snprintf(err, errlen, "/v1/info has no string field '%s'", missing);
        cg_wc_info_clear(out);
        return CG_E_VALUE;
    }
    return CG_OK;
}

void cg_wc_info_clear(cg_wc_info *i)
{
    if (!i) return;
    free(i->model);
    free(i->dtype);
    free(i->rope_style);
    free(i->key_version);
    free(i->key_hash);
    free(i->instance);
    free(i->chat_template);
    free(i->bos_token);
    free(i->eos_token);
    free(i->remote_tier);
    memset(i, 0, sizeof *i);
}

static char *dup_or_null(const char *s)
{
    return s ? cg_strdup(s) : NULL;
}

void cg_wc_info_copy(cg_wc_info *dst, const cg_wc_info *src)
{
    *dst = *src;
    dst->model = dup_or_null(src->model);
    dst->dtype = dup_or_null(src->dtype);
    dst->rope_style = dup_or_null(src->rope_style);
    dst->key_version = dup_or_null(src->key_version);
    dst->key_hash = dup_or_null(src->key_hash);
    dst->instance = dup_or_null(src->instance);
    dst->chat_template = dup_or_null(src->chat_template);
    dst->bos_token = dup_or_null(src->bos_token);
    dst->eos_token = dup_or_null(src->eos_token);
    dst->remote_tier = dup_or_null(src->remote_tier);
}

int cg_wc_info_compatible(const cg_wc_info *a, const cg_wc_info *b, char *msg, size_t msglen)
{
    const struct {
        const char *name, *x, *y;
    } s[] = {{"model", a->model, b->model},
             {"dtype", a->dtype, b->dtype},
             {"rope_style", a->rope_style, b->rope_style},
             {"key_version", a->key_version, b->key_version},
             {"key_hash", a->key_hash, b->key_hash}};
    for (size_t i = 0; i < CG_ARRAY_LEN(s); i++)
        if (strcmp(s[i].x ? s[i].x : "", s[i].y ? s[i].y : "") != 0) {
            snprintf(msg, msglen, "%s '%s' differs from '%s'", s[i].name, s[i].x ? s[i].x : "",
                     s[i].y ? s[i].y : "");
            return 0;
        }
    /* the gateway renders chats with the pool's template: a worker rendering another would
     * key the same chat differently */
    if (strcmp(a->chat_template ? a->chat_template : "",
               b->chat_template ? b->chat_template : "")) {
        snprintf(msg, msglen,
                 "chat_template differs from the other workers' (give every worker "
                 "the same --chat-template)");
        return 0;
    }
    const struct {
        const char *name;
        int64_t x, y;
    } n[] = {{"n_layers", a->n_layers, b->n_layers},
             {"n_kv_heads", a->n_kv_heads, b->n_kv_heads},
             {"head_dim", a->head_dim, b->head_dim}};
    for (size_t i = 0; i < CG_ARRAY_LEN(n); i++)
        if (n[i].x != n[i].y) {
            snprintf(msg, msglen, "%s %lld differs from %lld", n[i].name, (long long)n[i].x,
                     (long long)n[i].y);
            return 0;
        }
    return 1;
}

/* ---------------------------------------------------------------- assembly */

static int parse_role(const char *s, cg_role *out)
{
    const cg_role roles[] = {CG_ROLE_SYSTEM, CG_ROLE_CHUNK, CG_ROLE_QUESTION};
    for (size_t i = 0; s && i < CG_ARRAY_LEN(roles); i++)
        if (!strcmp(s, cg_role_name(roles[i]))) {
            *out = roles[i];
            return 0;
        }
    return -1;
}

cg_status cg_wc_assembly_parse(json_t *j, cg_wc_assembly *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const char *id = json_string_value(json_object_get(j, "assembly_id"));
    json_t *segs = json_object_get(j, "segments"), *ev = json_object_get(j, "evicted");
    if (!id || strlen(id) != 32 || !json_is_array(segs)) {
        snprintf(err, errlen, "the assembly has no assembly_id or segments");
        return CG_E_VALUE;
    }
    memcpy(out->id, id, 33);
    out->n_tokens = json_integer_value(json_object_get(j, "n_tokens"));
    out->cached_tokens = json_integer_value(json_object_get(j, "cached_tokens"));
    out->computed_tokens = json_integer_value(json_object_get(j, "computed_tokens"));
    json_t *rec = json_object_get(j, "recomputed_tokens");
    out->recomputed_tokens = json_is_integer(rec) ? json_integer_value(rec) : -1;
    out->ttl_ms = json_integer_value(json_object_get(j, "ttl_ms"));
    out->n_segs = json_array_size(segs);
    out->segs = cg_calloc(out->n_segs ? out->n_segs : 1, sizeof *out->segs);
    for (size_t i = 0; i < out->n_segs; i++) {
        json_t *s = json_array_get(segs, i);
        cg_wc_seg *r = &out->segs[i];
        const char *key = json_string_value(json_object_get(s, "key"));
        const char *tier = json_string_value(json_object_get(s, "tier"));
        if (!key || cg_key_parse(key, &r->key) != 0 ||
            parse_role(json_string_value(json_object_get(s, "role")), &r->role) != 0 ||
            !json_is_integer(json_object_get(s, "n_tokens"))) {
            snprintf(err, errlen, "assembly segment %zu is malformed", i);
            cg_wc_assembly_free(out);
            return CG_E_VALUE;
        }
        r->offset = json_integer_value(json_object_get(s, "offset"));
        r->n_tokens = json_integer_value(json_object_get(s, "n_tokens"));
        r->hit = json_is_true(json_object_get(s, "hit"));
        r->stored = json_is_true(json_object_get(s, "stored"));
        r->tier = CG_TIER_RAM; /* a hit whose tier is absent or unknown */
        if (r->hit) cg_tier_parse(tier, &r->tier);
    }
    out->n_evicted = json_array_size(ev);
    out->evicted = cg_calloc(out->n_evicted ? out->n_evicted : 1, sizeof *out->evicted);
    size_t k = 0;
    for (size_t i = 0; i < out->n_evicted; i++) {
        const char *key = json_string_value(json_array_get(ev, i));
        if (key && cg_key_parse(key, &out->evicted[k]) == 0) k++;
    }
    out->n_evicted = k;
    return CG_OK;
}

void cg_wc_assembly_free(cg_wc_assembly *a)
{
    if (!a) return;
    cg_free(&a->segs);
    cg_free(&a->evicted);
    a->n_segs = a->n_evicted = 0;
}

/* ---------------------------------------------------------------- inventory */

cg_status cg_wc_inventory(cg_upstream *c, const char *base, long timeout_ms, cg_wc_chunk **out,
                          size_t *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    char after[CG_KEY_HEX_LEN + 1] = "";
    cg_status st = CG_OK;
    for (;;) {
        char path[160];
        snprintf(path, sizeof path, "/v1/chunks?limit=%d%s%s", INVENTORY_PAGE,
                 after[0] ? "&after=" : "", after);
        long http = 0;
        json_t *j = NULL;
        st = cg_wc_call_sync(c, base, "GET", path, NULL, 0, timeout_ms, &http, &j, err, errlen);
        if (st == CG_OK && (http != 200 || !json_is_array(json_object_get(j, "data")))) {
            snprintf(err, errlen, "GET /v1/chunks answered HTTP %ld without a chunk list", http);
            st = CG_E_BAD_GATEWAY;
        }
        if (st != CG_OK) {
            json_decref(j);
            break;
        }
        json_t *data = json_object_get(j, "data");
        size_t i;
        json_t *row;
        json_array_foreach(data, i, row)
        {
            const char *key = json_string_value(json_object_get(row, "key"));
            cg_wc_chunk ch = {0};
            if (!key || cg_key_parse(key, &ch.key) != 0) continue;
            ch.tokens = json_integer_value(json_object_get(row, "tokens"));
            const char *tier = json_string_value(json_object_get(row, "tier"));
            cg_tier t;
            ch.disk = cg_tier_parse(tier, &t) == 0 && t == CG_TIER_DISK;
            if (*n == cap) {
                cap = cap ? cap * 2 : 256;
                *out = cg_realloc(*out, cap * sizeof **out);
            }
            (*out)[(*n)++] = ch;
        }
        const char *last = json_string_value(json_object_get(j, "last_key"));
        int more = json_is_true(json_object_get(j, "has_more")) && last &&
                   strlen(last) == CG_KEY_HEX_LEN && strcmp(last, after) != 0;
        if (more) snprintf(after, sizeof after, "%s", last);
        json_decref(j);
        if (!more) break;
    }
    if (st != CG_OK) {
        cg_free(out);
        *n = 0;
    }
    return st;
}
