/* Admin routes: the chunk index (list with limit/after paging, get, delete, lookup by keys or
 * by prompt, pin/unpin) and the worker registry (list, add, get, delete). Index reads flush
 * the writer queue first, so an admin sees every request the gateway answered before. */
#include "server/admin.h"
#include "server/gwstate.h"
#include "server/segments.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIST_DEFAULT 100
#define LIST_MAX 1000
#define LOOKUP_MAX_KEYS 10000

static json_t *placements_json(const cg_index_placement *p, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(
            a, json_pack("{s:I, s:s, s:I, s:I}", "worker_id", (json_int_t)p[i].worker_id, "tier",
                         cg_tier_name(p[i].tier), "tokens", (json_int_t)p[i].tokens, "updated_ms",
                         (json_int_t)p[i].updated));
    return a;
}

static json_t *int_or_null(int64_t v, int64_t null_below)
{
    return v < null_below ? json_null() : json_integer((json_int_t)v);
}

static json_t *chunk_json(const cg_index_chunk *c)
{
    char hex[CG_KEY_HEX_LEN + 1];
    cg_key_hex(&c->key, hex);
    return json_pack(
        "{s:s, s:s, s:o, s:o, s:o, s:o, s:I, s:I, s:I, s:o, s:I, s:I, s:b, s:o}", "id", hex,
        "object", "chunk", "model", c->model ? json_string(c->model) : json_null(), "mode",
        c->mode >= 0 ? json_string(cg_mode_name((cg_mode)c->mode)) : json_null(), "tokens",
        int_or_null(c->tokens, 0), "bytes", int_or_null(c->bytes, 0), "created",
        (json_int_t)(c->first_seen / 1000), "first_seen_ms", (json_int_t)c->first_seen,
        "last_seen_ms", (json_int_t)c->last_seen, "last_hit_ms", int_or_null(c->last_hit, 1),
        "seen_count", (json_int_t)c->seen_count, "hit_count", (json_int_t)c->hit_count, "pinned",
        c->pinned, "placements", placements_json(c->placements, c->n_placements));
}

/* Makes queued writes visible to the reads that follow. */
static void flush(cg_gateway *g)
{
    if (cg_index_flush(g->index) != CG_OK) cg_log(CG_LOG_WARN, "index flush reported errors");
}

/* The {key} path parameter; replies 400 itself when it is not 32 hex characters. */
static int path_key(cg_http_req *req, cg_key *key)
{
    const char *hex = cg_http_req_param(req, 0);
    if (!hex || cg_key_parse(hex, key) != 0) {
        cg_http_reply_error(req, CG_E_VALUE, "key", "a chunk key is 32 hexadecimal characters");
        return 0;
    }
    return 1;
}

void cg_gw_chunks_list(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    long limit = LIST_DEFAULT;
    cg_key after;
    int has_after = 0;
    const char *v = cg_http_req_query(req, "limit");
    if (v) {
        char *end;
        errno = 0;
        limit = strtol(v, &end, 10);
        if (!*v || *end || errno || limit < 1 || limit > LIST_MAX) {
            cg_http_reply_error(req, CG_E_VALUE, "limit", "limit must be an integer in [1, 1000]");
            return;
        }
    }
    v = cg_http_req_query(req, "after");
    if (v && *v) {
        if (cg_key_parse(v, &after) != 0) {
            cg_http_reply_error(req, CG_E_VALUE, "after",
                                "after must be a chunk key (32 hex characters)");
            return;
        }
        has_after = 1;
    }
    flush(g);
    cg_index_chunk *rows = NULL;
    size_t n = 0;
    /* One row more than asked tells whether another page exists. */
    if (cg_index_chunks_list(g->index, has_after ? &after : NULL, (size_t)limit + 1, &rows, &n) !=
        CG_OK) {
        cg_http_reply_error(req, CG_E_IO, NULL, "the chunk index cannot be read");
        return;
    }
    int more = n > (size_t)limit;
    if (more) n = (size_t)limit;
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(data, chunk_json(&rows[i]));
    char first[CG_KEY_HEX_LEN + 1], last[CG_KEY_HEX_LEN + 1];
    if (n) {
        cg_key_hex(&rows[0].key, first);
        cg_key_hex(&rows[n - 1].key, last);
    }
    cg_index_chunks_free(&rows, more ? n + 1 : n);
    cg_http_reply_json(req, 200,
                       json_pack("{s:s, s:o, s:b, s:o, s:o}", "object", "list", "data", data,
                                 "has_more", more, "first_id", n ? json_string(first) : json_null(),
                                 "last_id", n ? json_string(last) : json_null()));
}

/* The chunk named by the {key} path parameter, read into *c (cleared by the caller) after the
 * pending index writes are flushed. Replies itself and returns 0 when there is none: 400 for
 * a bad key, 404 for a key the index does not have, 500 with io_msg when it cannot be read. */
static int path_chunk(cg_http_req *req, cg_gateway *g, cg_key *key, cg_index_chunk *c,
                      const char *io_msg)
{
    if (!path_key(req, key)) return 0;
    flush(g);
    memset(c, 0, sizeof *c);
    cg_status st = cg_index_chunk_get(g->index, key, c);
    if (st == CG_OK) return 1;
    cg_index_chunk_clear(c);
    if (st == CG_E_NOT_FOUND)
        cg_http_reply_error(req, CG_E_NOT_FOUND, "key", "no chunk with this key");
    else
        cg_http_reply_error(req, CG_E_IO, NULL, io_msg);
    return 0;
}

void cg_gw_chunk_get(cg_http_req *req, void *app)
{
    cg_key key;
    cg_index_chunk c;
    if (!path_chunk(req, app, &key, &c, "the chunk index cannot be read")) return;
    cg_http_reply_json(req, 200, chunk_json(&c));
    cg_index_chunk_clear(&c);
}

void cg_gw_chunk_delete(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    cg_key key;
    cg_index_chunk c;
    if (!path_chunk(req, g, &key, &c, "the chunk index cannot be read")) return;
    int pinned = c.pinned;
    cg_index_chunk_clear(&c);
    if (pinned) {
        cg_http_reply_error(req, CG_E_CONFLICT, "key",
                            "the chunk is pinned; unpin it first (POST /v1/chunks/{key}/unpin)");
        return;
    }
    cg_index_chunk_delete(g->index, &key);
    if (cg_index_flush(g->index) != CG_OK) {
        cg_http_reply_error(req, CG_E_IO, NULL, "the chunk index could not be updated");
        return;
    }
    cg_http_reply_json(req, 200,
                       json_pack("{s:s, s:s, s:b}", "id", cg_http_req_param(req, 0), "object",
                                 "chunk.deleted", "deleted", 1));
}

/* POST /v1/chunks/lookup: {"keys":[hex...]} or a request to split ({"model", "prompt"} or
 * {"model", "messages", "documents"?} with the extension fields). Answers per key what the
 * index knows. With an API key instead of the admin token the view is the caller's tenant:
 * only the request form, keyed with the caller's tenant salt, so it can find only chunks that
 * tenant's own requests made; raw keys could probe any tenant's chunks and are refused. */
void cg_gw_chunks_lookup(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    cg_gw_segments segs;
    cg_gw_segments_init(&segs);
    cg_key *keys = NULL;
    cg_index_entry *ent = NULL;
    size_t n = 0;
    int by_keys = 0;
    char msg[256] = "";
    const char *param = NULL;
    json_t *body = cg_http_req_json(req);
    if (!body) goto out;

    json_t *jk = json_object_get(body, "keys");
    if (jk && !json_is_null(jk)) {
        if (cg_http_req_caller(req) == CG_CALLER_API_KEY) {
            cg_http_reply_error(req, CG_E_FORBIDDEN, "keys",
                                "a lookup by keys needs the admin token; with an API key, look "
                                "up a prompt or messages");
            goto out;
        }
        by_keys = 1;
        if (!json_is_array(jk)) {
            cg_http_reply_error(req, CG_E_TYPE, "keys", "keys must be an array of chunk keys");
            goto out;
        }
        n = json_array_size(jk);
        if (n > LOOKUP_MAX_KEYS) {
            snprintf(msg, sizeof msg, "at most %d keys per lookup", LOOKUP_MAX_KEYS);
            cg_http_reply_error(req, CG_E_VALUE, "keys", msg);
            goto out;
        }
        keys = cg_calloc(n ? n : 1, sizeof *keys);
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_array_get(jk, i);
            if (!json_is_string(s) || cg_key_parse(json_string_value(s), &keys[i]) != 0) {
                snprintf(msg, sizeof msg, "keys[%zu] is not a chunk key (32 hex characters)", i);
                cg_http_reply_error(req, CG_E_VALUE, "keys", msg);
                goto out;
            }
        }
    } else {
        const char *model;
        cg_status st = cg_json_get_string(body, "model", 1, &model);
        if (st != CG_OK || !*model) {
            cg_http_reply_error(req, st == CG_OK ? CG_E_VALUE : st, "model",
                                "model (a string) is required with prompt or messages");
            goto out;
        }
        int chat = json_object_get(body, "messages") != NULL;
        if (!chat && !json_object_get(body, "prompt")) {
            cg_http_reply_error(req, CG_E_MISSING, "keys", "give keys, prompt or messages");
            goto out;
        }
        segs.tenant = cg_gw_tenant(g, req);
        st = cg_gw_segment_request(g, body, model, chat, &segs, &param, msg, sizeof msg);
        if (st != CG_OK) {
            cg_gw_reply_error(req, st, param, msg);
            goto out;
        }
        keys = segs.keys;
        n = segs.n_keys;
    }
    flush(g);
    ent = cg_calloc(n ? n : 1, sizeof *ent);
    if (n && cg_index_lookup(g->index, keys, n, ent) != CG_OK) {
        cg_http_reply_error(req, CG_E_IO, NULL, "the chunk index cannot be read");
        goto out;
    }
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++) {
        char hex[CG_KEY_HEX_LEN + 1];
        cg_key_hex(&keys[i], hex);
        json_t *role = by_keys ? json_null()
                               : json_string(cg_role_name(segs.split.segs[segs.key_seg[i]].role));
        json_array_append_new(
            data, json_pack("{s:s, s:o, s:b, s:o, s:o, s:I, s:I, s:b, s:o}", "key", hex, "role",
                            role, "found", ent[i].found, "tokens",
                            ent[i].found ? int_or_null(ent[i].tokens, 0) : json_null(), "bytes",
                            ent[i].found ? int_or_null(ent[i].bytes, 0) : json_null(), "seen_count",
                            (json_int_t)ent[i].seen_count, "hit_count",
                            (json_int_t)ent[i].hit_count, "pinned", ent[i].pinned, "placements",
                            placements_json(ent[i].placements, ent[i].n_placements)));
    }
    json_t *reply = json_pack("{s:s, s:o}", "object", "list", "data", data);
    if (!by_keys) {
        json_object_set_new(reply, "mode", json_string(cg_mode_name(segs.mode)));
        json_object_set_new(reply, "passthrough", json_boolean(segs.split.passthrough));
    }
    cg_http_reply_json(req, 200, reply);
out:
    if (by_keys) free(keys);
    free(ent);
    cg_gw_segments_free(&segs);
    json_decref(body);
}

/* ---------------------------------------------------------------- pins */

/* POST /v1/chunks/{key}/pin and /unpin. */
static void set_pin(cg_http_req *req, cg_gateway *g, int pinned)
{
    cg_key key;
    cg_index_chunk c;
    if (!path_chunk(req, g, &key, &c, "the chunk index could not be updated")) return;
    cg_index_chunk_clear(&c);
    cg_index_chunk_pin(g->index, &key, pinned);
    cg_status st = cg_index_flush(g->index);
    if (st == CG_OK) st = cg_index_chunk_get(g->index, &key, &c);
    if (st != CG_OK) {
        cg_http_reply_error(req, CG_E_IO, NULL, "the chunk index could not be updated");
        return;
    }
    cg_http_reply_json(req, 200, chunk_json(&c));
    cg_index_chunk_clear(&c);
}

void cg_gw_chunk_pin(cg_http_req *req, void *app)
{
    set_pin(req, app, 1);
}

void cg_gw_chunk_unpin(cg_http_req *req, void *app)
{
    set_pin(req, app, 0);
}

/* ---------------------------------------------------------------- workers */

void cg_gw_workers_list(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    cg_http_reply_json(req, 200, cg_workers_list_json(g->workers));
}

/* POST /v1/workers {"url": "http://host:port"}: 201 when registered, 200 when it already
 * was; 400 bad url, 409 incompatible with the registered workers, 502 unreachable or a bad
 * /v1/info. Registration fetches /v1/info and syncs the inventory before answering. */
void cg_gw_workers_add(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    json_t *body = cg_http_req_json(req);
    if (!body) return;
    const char *url = NULL;
    cg_status st = cg_json_get_string(body, "url", 1, &url);
    if (st != CG_OK) {
        cg_http_reply_error(req, st, "url",
                            st == CG_E_MISSING ? "url is required" : "url must be a string");
        json_decref(body);
        return;
    }
    char err[768];
    int created = 0;
    json_t *w = NULL;
    st = cg_workers_add(g->workers, url, 1, &created, &w, err, sizeof err);
    json_decref(body);
    switch (st) {
    case CG_OK:
        cg_http_reply_json(req, created ? 201 : 200, w);
        return;
    case CG_E_VALUE:
        cg_http_reply_error(req, st, "url", err);
        break;
    case CG_E_CONFLICT:
        cg_http_reply_error(req, st, "url", err);
        break;
    case CG_E_UNAVAILABLE:
    case CG_E_TIMEOUT:
    case CG_E_BAD_GATEWAY:
        cg_http_reply_error_status(req, 502, st, "url", err);
        break;
    default:
        cg_http_reply_error(req, st, NULL, err);
        break;
    }
    json_decref(w);
}

static void reply_removed(cg_http_req *req, cg_status st, json_t *w)
{
    if (st == CG_E_NOT_FOUND) {
        cg_http_reply_error(req, st, NULL, "no such worker");
        return;
    }
    if (st != CG_OK) {
        json_decref(w);
        cg_http_reply_error(req, CG_E_IO, NULL, "the index could not forget the worker");
        return;
    }
    json_object_set_new(w, "object", json_string("worker.deleted"));
    json_object_set_new(w, "deleted", json_true());
    cg_http_reply_json(req, 200, w);
}

/* DELETE /v1/workers?url=... */
void cg_gw_workers_delete(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    const char *url = cg_http_req_query(req, "url");
    if (!url || !*url) {
        cg_http_reply_error(req, CG_E_MISSING, "url",
                            "give the worker as ?url=... or use DELETE /v1/workers/{id}");
        return;
    }
    json_t *w = NULL;
    cg_status st = cg_workers_remove(g->workers, -1, url, &w);
    reply_removed(req, st, w);
}

static int path_id(cg_http_req *req, int64_t *id)
{
    const char *s = cg_http_req_param(req, 0);
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : -1;
    if (!s || !*s || *end || errno || v < 0) {
        cg_http_reply_error(req, CG_E_VALUE, "id", "a worker id is a non-negative integer");
        return 0;
    }
    *id = v;
    return 1;
}

void cg_gw_worker_get(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    int64_t id;
    if (!path_id(req, &id)) return;
    json_t *w = cg_workers_get_json(g->workers, id);
    if (!w) {
        cg_http_reply_error(req, CG_E_NOT_FOUND, "id", "no such worker");
        return;
    }
    cg_http_reply_json(req, 200, w);
}

void cg_gw_worker_delete(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    int64_t id;
    if (!path_id(req, &id)) return;
    json_t *w = NULL;
    cg_status st = cg_workers_remove(g->workers, id, NULL, &w);
    reply_removed(req, st, w);
}

/* POST /v1/workers/{id}/sync: reconcile the index with the worker's inventory now. */
void cg_gw_worker_sync(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    int64_t id;
    if (!path_id(req, &id)) return;
    json_t *w = NULL;
    char err[512];
    cg_status st = cg_workers_sync(g->workers, id, &w, err, sizeof err);
    if (st == CG_OK) {
        cg_http_reply_json(req, 200, w);
        return;
    }
    json_decref(w);
    if (st == CG_E_NOT_FOUND)
        cg_http_reply_error(req, st, "id", "no such worker");
    else if (st == CG_E_CONFLICT)
        cg_http_reply_error(req, st, "id", err);
    else
        cg_http_reply_error_status(req, 502, st, "id", err);
}
