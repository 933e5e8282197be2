/* The request dispatcher and the main path (DESIGN §2): route a "# #" request to the worker
 * holding most of its chunks, POST {worker}/v1/assemble, record what the worker reported in
 * the index, then complete with kv_transfer_params.assembly_id on the backend (the worker
 * itself unless --backend is set). Requests that cannot take the main path are forwarded with
 * the plain prompt: pass-through (no separator) or fallback (no usable worker, worker failure,
 * another model), DESIGN §11.
 *
 * Threads: the handler (a job thread) routes and submits the assemble; its answer arrives on
 * the curl thread, which records it and submits the completion. Nothing waits. */
#include "server/orchestrate.h"

#include <stdio.h>
#include <string.h>
#include "backends/worker_client.h"
#include "cache/chat.h"
#include "cache/chatreq.h"
#include "server/fields.h"
#include "server/relay.h"

/* The most workers one request is sent to: its route, then the retries after a 429 or a
 * failure. */
#define CG_GW_MAX_TRIES 8

/* One request on its way through the dispatcher. */
typedef struct gw_call {
    cg_gateway *g;
    cg_http_req *req;
    json_t *body; /* owned reference: the request */
    cg_gw_segments segs;
    cg_index_entry *ent; /* owned; the one lookup, segs.n_keys entries, may be NULL */
    int chat, stream;
    char rid[72];
    cg_worker *w; /* routed worker (reference, in flight) */
    cg_route_kind kind;
    cg_fallback fallback; /* set once the request falls back */
    uint64_t t0;
    /* The workers this request was sent to (index ids): a retry after a 429 or a failure goes
     * to one it has not tried yet, so every worker is asked at most once. */
    int64_t tried[CG_GW_MAX_TRIES];
    size_t n_tried;
    int client_gone; /* the client left while the assemble ran: it was cancelled */
} gw_call;

/* Notes that c was sent to w; returns w. */
static cg_worker *tried(gw_call *c, cg_worker *w)
{
    if (w && c->n_tried < CG_GW_MAX_TRIES) c->tried[c->n_tried++] = cg_worker_id(w);
    return w;
}

/* The least-loaded healthy worker c has not tried yet (in flight, noted as tried), or NULL. */
static cg_worker *pick_untried(gw_call *c)
{
    if (c->n_tried >= CG_GW_MAX_TRIES) return NULL;
    return tried(c, cg_workers_pick_any(c->g->workers, c->tried, c->n_tried));
}

static void call_free(gw_call *c)
{
    cg_workers_release(c->g->workers, &c->w);
    json_decref(c->body);
    cg_gw_segments_free(&c->segs);
    free(c->ent);
    free(c);
}

static const char *route_name(const gw_call *c)
{
    return c->chat ? "chat_completions" : "completions";
}

/* ---------------------------------------------------------------- bodies */

/* A stream's upstream always reports usage (the gateway counts the tokens it computed); the
 * client gets it only when it asked with stream_options.include_usage, as OpenAI sends it.
 * Sets include_usage in body when stream; returns 1 when the relay must drop the usage. */
static int ask_usage(json_t *body, int stream)
{
    if (!stream) return 0;
    json_t *so = json_object_get(body, "stream_options");
    if (json_is_object(so) && json_is_true(json_object_get(so, "include_usage"))) return 0;
    json_t *o = json_is_object(so) ? json_copy(so) : json_object();
    json_object_set_new(o, "include_usage", json_true());
    json_object_set_new(body, "stream_options", o);
    return 1;
}

/* The body for --backend: the client's bytes unchanged when it used no extension field, else
 * the request re-serialised without them. Chat documents must still reach the model, so they
 * move into one system message placed after the leading system/developer messages (the same
 * place the rendering gives them), joined by blank lines. Returns a new buffer. */
static char *forward_body(cg_http_req *req, json_t *body, int chat, int stream, int *strip_usage,
                          size_t *len)
{
    int has_ext = cg_gw_has_ext_fields(body);
    *strip_usage = ask_usage(body, stream);
    if (!has_ext && !*strip_usage) return cg_http_req_take_body(req, len); /* no copy */
    cg_http_req_drop_body(req);
    json_t *docs = json_object_get(body, "documents");
    if (chat && json_is_array(docs) && json_array_size(docs)) {
        cg_buf joined;
        cg_buf_init_unbounded(&joined); /* documents of a body the server capped */
        size_t i;
        json_t *d;
        json_array_foreach(docs, i, d)
        {
            cg_status st = CG_OK;
            if (i) st = cg_buf_append(&joined, "\n\n", 2);
            if (st == CG_OK)
                st = cg_buf_append(&joined, json_string_value(d), json_string_length(d));
            (void)st;
        }
        json_t *msgs = json_object_get(body, "messages");
        size_t at = 0;
        while (at < json_array_size(msgs)) {
            json_t *role = json_object_get(json_array_get(msgs, at), "role");
            if (!cg_chat_is_system_role(json_string_value(role))) break;
            at++;
        }
        json_array_insert_new(msgs, at,
                              json_pack("{s:s, s:s%}", "role", "system", "content",
                                        joined.data ? joined.data : "", joined.len));
        cg_buf_free(&joined);
    }
    cg_gw_del_ext_fields(body);
    char *out = json_dumps(body, JSON_COMPACT);
    *len = strlen(out);
    return out;
}

/* The recompute options in a worker body: the request's, else the model's defaults (the
 * worker's own --recompute-select for recompute_select). */
static void set_recompute(json_t *o, const cg_gw_segments *s)
{
    json_object_del(o, "recompute_prefix_tokens");
    json_object_del(o, "recompute_ratio");
    json_object_del(o, "recompute_select");
    if (s->recompute_select)
        json_object_set_new(o, "recompute_select", json_string(s->recompute_select));
    if (s->recompute >= 0)
        json_object_set_new(o, "recompute_prefix_tokens", json_integer(s->recompute));
    if (s->recompute_ratio >= 0)
        json_object_set_new(o, "recompute_ratio", json_real(s->recompute_ratio));
}

/* The body for a worker's /v1/completions, or /v1/chat/completions for a chat: the fields
 * the worker reads (server/fields.h; unknown ones stay here). The worker splits a "# #"
 * prompt and renders a chat itself, exactly as the gateway did (the same template, the same
 * rule), so the tenant salt, mode and the separator in use go along: a fallback never mixes
 * tenants in the worker's pool. */
static char *worker_plain_body(gw_call *c, int *strip_usage, size_t *len)
{
    json_t *o = c->chat ? cg_gw_worker_chat_fields(c->body) : cg_gw_worker_fields(c->body);
    set_recompute(o, &c->segs);
    if (c->segs.quality_probe) json_object_set_new(o, "quality_probe", json_true());
    *strip_usage = ask_usage(o, c->stream);
    json_object_set_new(o, "chunk_separator", json_string(c->segs.separator));
    json_object_set_new(o, "chunk_mode", json_string(cg_mode_name(c->segs.mode)));
    if (c->segs.no_bos) json_object_set_new(o, "add_special_tokens", json_false());
    /* The salt the keys were made with (a tenant's salt is not the client's cache_salt). */
    if (c->segs.salt) json_object_set_new(o, "cache_salt", json_string(c->segs.salt));
    char *out = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    *len = strlen(out);
    return out;
}

/* ---------------------------------------------------------------- chunk_cache */

static json_t *seg_json(const cg_gw_segments *s, size_t k, json_t *tokens, int hit, json_t *tier)
{
    const cg_segment *seg = &s->split.segs[s->key_seg[k]];
    char hex[CG_KEY_HEX_LEN + 1];
    cg_key_hex(&s->keys[k], hex);
    return json_pack("{s:s, s:s, s:o, s:I, s:b, s:o}", "key", hex, "role", cg_role_name(seg->role),
                     "tokens", tokens, "bytes", (json_int_t)seg->len, "hit", hit, "tier", tier);
}

json_t *cg_gw_chunk_cache_plain(const cg_gw_segments *s, const cg_index_entry *ent,
                                cg_fallback reason)
{
    json_t *segs = json_array();
    for (size_t k = 0; k < s->n_keys; k++) {
        json_t *tokens =
            ent && ent[k].found && ent[k].tokens >= 0 ? json_integer(ent[k].tokens) : json_null();
        json_array_append_new(segs, seg_json(s, k, tokens, 0, json_null()));
    }
    json_t *cc =
        json_pack("{s:o, s:s, s:n, s:b, s:b, s:I, s:n, s:o, s:n}", "segments", segs, "mode",
                  cg_mode_name(s->mode), "worker", "fallback", s->n_keys > 0, "passthrough",
                  s->split.passthrough, "empty_segments", (json_int_t)s->split.empty_skipped,
                  "routing", "fallback_reason",
                  cg_fallback_name(reason) ? json_string(cg_fallback_name(reason)) : json_null(),
                  "recomputed_tokens");
    /* filled by the relay from a worker's answer (a worker assembles the prompt itself) */
    if (s->quality_probe) json_object_set_new(cc, "quality", json_null());
    return cc;
}

static json_t *chunk_cache_main(const gw_call *c, const cg_wc_assembly *a)
{
    const cg_gw_segments *s = &c->segs;
    json_t *segs = json_array();
    for (size_t k = 0; k < s->n_keys; k++) {
        const cg_wc_seg *r = &a->segs[s->key_seg[k]];
        json_array_append_new(segs, seg_json(s, k, json_integer((json_int_t)r->n_tokens), r->hit,
                                             json_string(cg_tier_seg_name(r->hit, r->tier))));
    }
    /* After a worker failed, the request was assembled on another one: fallback, and the
     * segments are what that worker reported, so they agree with cached_tokens. */
    json_t *cc = json_pack(
        "{s:o, s:s, s:s, s:b, s:b, s:I, s:s, s:o, s:o}", "segments", segs, "mode",
        cg_mode_name(s->mode), "worker", cg_worker_url(c->w), "fallback",
        c->fallback != CG_FALLBACK_NONE, "passthrough", 0, "empty_segments",
        (json_int_t)s->split.empty_skipped, "routing", cg_route_kind_name(c->kind),
        "fallback_reason",
        cg_fallback_name(c->fallback) ? json_string(cg_fallback_name(c->fallback)) : json_null(),
        "recomputed_tokens",
        a->recomputed_tokens >= 0 ? json_integer(a->recomputed_tokens) : json_null());
    /* null until the relay finds the worker's comparison in its answer (never with an external
     * --backend, which decodes without the worker) */
    if (s->quality_probe) json_object_set_new(cc, "quality", json_null());
    return cc;
}

/* ---------------------------------------------------------------- plain forwarding */

/* Counts a request's fallback once, however many steps it takes (reason: not NONE). */
static void count_fallback(cg_gateway *g, gw_call *c, cg_fallback reason)
{
    if (c->fallback != CG_FALLBACK_NONE || reason == CG_FALLBACK_NONE) return;
    c->fallback = reason;
    cg_metric_add(g->m_fallbacks, 1);
    if ((unsigned)reason < CG_FALLBACK_COUNT) cg_metric_add(g->m_fallback[reason], 1);
}

/* Forwards the plain prompt: to --backend, else to the least-loaded healthy worker the request
 * has not been sent to yet. reason: CG_FALLBACK_NONE for pass-through, else the fallback
 * reason; why: what failed (for the error message). Frees c. */
static void forward_plain(gw_call *c, cg_fallback reason, const char *why)
{
    cg_gateway *g = c->g;
    if (reason != CG_FALLBACK_NONE) {
        count_fallback(g, c, reason);
        cg_metric_add(g->m_misses, (double)c->segs.n_keys); /* nothing of it was looked at */
    }
    cg_gw_target t = {.route = route_name(c),
                      .model = json_string_value(json_object_get(c->body, "model")),
                      .path = c->chat ? "/v1/chat/completions" : "/v1/completions",
                      .cached_tokens = -1,
                      .count_usage = 1};
    char *body;
    size_t len = 0;
    int backend_kind =
        g->has_backend ? __atomic_load_n(&g->backend_is_worker, __ATOMIC_ACQUIRE) : 0;
    if (backend_kind < 0 && c->segs.salt && c->segs.n_keys) {
        /* Not known yet whether --backend splits the prompt itself: without the salt a
         * chunkgate-worker there would mix the tenants, and a salt may not go to a server
         * that refuses unknown fields. Refused, rather than sent either way (a prompt without
         * separators has nothing to mix and goes on). */
        cg_http_reply_error(c->req, CG_E_UNAVAILABLE, NULL,
                            "the backend has not answered GET /healthz yet, so a salted request "
                            "cannot fall back to it; retry shortly");
        call_free(c);
        return;
    }
    if (g->has_backend && backend_kind != 1) {
        body = forward_body(c->req, c->body, c->chat, c->stream, &t.strip_usage, &len);
    } else {
        if (!g->has_backend) {
            cg_worker *w = pick_untried(c);
            if (!w) {
                char msg[768];
                snprintf(msg, sizeof msg, "no backend is configured and %s%s%s%s",
                         c->n_tried ? "no healthy worker is left to try" : "no worker is healthy",
                         why ? " (" : "", why ? why : "", why ? ")" : "");
                cg_http_reply_error(c->req, CG_E_UNAVAILABLE, NULL, msg);
                call_free(c);
                return;
            }
            t.base = cg_worker_url(w);
            t.to_worker = 1;
            t.worker = w;
            t.backend_is_worker = 1;
        }
        /* A worker answers, or a chunkgate-worker as --backend: it splits the prompt itself,
         * so the tenant's salt goes along, or it would mix the tenants in its pool. */
        body = worker_plain_body(c, &t.strip_usage, &len);
        cg_http_req_drop_body(c->req);
    }
    json_t *cc = cg_gw_chunk_cache_plain(&c->segs, c->ent, reason);
    cg_gw_relay_to(g, c->req, &t, body, len, c->stream, cc);
    call_free(c);
}

/* ---------------------------------------------------------------- main path */

/* The worker's assembly must describe exactly the segments we sent, keys included. */
static int assembly_matches(const gw_call *c, const cg_wc_assembly *a, char *why, size_t n)
{
    const cg_gw_segments *s = &c->segs;
    if (a->n_segs != s->split.n) {
        snprintf(why, n, "the assembly has %zu segments, %zu were sent", a->n_segs, s->split.n);
        return 0;
    }
    for (size_t i = 0; i < a->n_segs; i++)
        if (a->segs[i].role != s->split.segs[i].role) {
            snprintf(why, n, "assembly segment %zu has another role", i);
            return 0;
        }
    for (size_t k = 0; k < s->n_keys; k++)
        if (!cg_key_equal(&a->segs[s->key_seg[k]].key, &s->keys[k])) {
            snprintf(why, n, "assembly segment %zu has another key", s->key_seg[k]);
            return 0;
        }
    return 1;
}

/* The worker is the source of truth: every assemble answer updates the index at once (hits
 * refresh their placement, stored misses become placements, unstored ones and evicted keys
 * are removed), and a miss where the index expected a hit schedules a full resync. With a
 * shared remote tier, a chunk read from it or stored (and so queued for it) is recorded under
 * the tier's row; a miss of a chunk the index placed there corrects it. */
static void record(gw_call *c, const cg_wc_assembly *a)
{
    cg_gateway *g = c->g;
    cg_index *ix = g->index;
    int64_t wid = cg_worker_id(c->w), now = (int64_t)cg_wall_ms();
    int64_t tier = cg_workers_tier_row(g->workers, c->w);
    size_t hits = 0, stale = 0;
    for (size_t k = 0; k < c->segs.n_keys; k++) {
        const cg_wc_seg *s = &a->segs[c->segs.key_seg[k]];
        const cg_key *key = &c->segs.keys[k];
        const cg_index_entry *e = c->ent ? &c->ent[k] : NULL;
        if (!s->hit && cg_index_entry_tokens_on(e, wid) > 0) stale++;
        if (s->hit) {
            hits++;
            cg_index_chunk_hit(ix, key, now);
            cg_index_placement_set(ix, key, wid, CG_TIER_RAM, s->n_tokens, now);
            if (tier >= 0 && s->tier == CG_TIER_REMOTE)
                cg_index_placement_set(ix, key, tier, CG_TIER_REMOTE, s->n_tokens, now);
        } else if (s->stored) {
            cg_index_placement_set(ix, key, wid, CG_TIER_RAM, s->n_tokens, now);
            if (tier >= 0) cg_index_placement_set(ix, key, tier, CG_TIER_REMOTE, s->n_tokens, now);
        } else {
            cg_index_placement_del(ix, key, wid); /* computed but not kept (pool full) */
            if (tier >= 0 && cg_index_entry_tokens_on(e, tier) > 0)
                cg_index_placement_del(ix, key, tier); /* the shared tier lost it */
        }
    }
    for (size_t i = 0; i < a->n_evicted; i++) {
        int ours = 0;
        for (size_t k = 0; k < c->segs.n_keys && !ours; k++)
            ours = cg_key_equal(&a->evicted[i], &c->segs.keys[k]);
        if (ours) continue;
        cg_index_placement_del(ix, &a->evicted[i], wid);
    }
    cg_metric_add(g->m_hits, (double)hits);
    cg_metric_add(g->m_misses, (double)(c->segs.n_keys - hits));
    cg_metric_add(g->m_reused, (double)a->cached_tokens);
    cg_metric_add(g->m_computed, (double)a->computed_tokens);
    if (stale) {
        cg_log(CG_LOG_INFO,
               "worker %s no longer holds %zu chunk(s) the index placed there; "
               "resyncing its inventory",
               cg_worker_url(c->w), stale);
        cg_workers_stale(g->workers, c->w);
    }
}

/* Completes the request from the assembly on the backend (the worker without --backend).
 * Frees c. */
static void complete_assembled(gw_call *c, const cg_wc_assembly *a)
{
    cg_gateway *g = c->g;
    json_t *cb;
    if (c->chat) {
        cb = cg_gw_chat_as_completion(c->body, c->segs.text, c->segs.rendered.len, !g->has_backend);
    } else if (!g->has_backend) {
        cb = cg_gw_worker_fields(c->body); /* the worker answers: only what it reads */
    } else {
        cb = json_copy(c->body); /* shallow: top-level edits only; unknown fields go along */
        cg_gw_del_ext_fields(cb);
    }
    /* --backend naming the worker itself is the same as no --backend: it consumes the
     * assembly, so there is nothing to release after a good answer. */
    int same = g->has_backend && !strcmp(cg_upstream_base_url(g->client), cg_worker_url(c->w));
    json_t *ktp = json_pack("{s:s}", "assembly_id", a->id);
    /* A decoding backend that pulls from several KV workers learns which one assembled (its
     * --kv-source allow-list decides whether it may pull from there). */
    if (g->has_backend && !same)
        json_object_set_new(ktp, "worker", json_string(cg_worker_url(c->w)));
    json_object_set_new(cb, "kv_transfer_params", ktp);
    /* A chat without a limit decodes until EOS or the end of the context, as a chat does on
     * the worker itself (a completion's default limit is much smaller). */
    int64_t max_pos = cg_workers_max_positions(g->workers);
    if (c->chat && !json_object_get(cb, "max_tokens") && max_pos > a->n_tokens)
        json_object_set_new(cb, "max_tokens", json_integer(max_pos - a->n_tokens));
    int strip = ask_usage(cb, c->stream);
    /* The comparison runs where the decoding does: only a worker can do it. */
    json_object_del(cb, "quality_probe");
    if (c->segs.quality_probe && (!g->has_backend || same))
        json_object_set_new(cb, "quality_probe", json_true());
    char *text = json_dumps(cb, JSON_COMPACT);
    json_decref(cb);
    json_t *cc = chunk_cache_main(c, a);
    cg_gw_target t = {.route = route_name(c),
                      .model = json_string_value(json_object_get(c->body, "model")),
                      .base = g->has_backend ? NULL : cg_worker_url(c->w),
                      .path = "/v1/completions",
                      .to_worker = !g->has_backend,
                      .to_chat = c->chat,
                      .cached_tokens = a->cached_tokens,
                      .count_usage = 0,
                      .worker = c->w,
                      .assembly_id = a->id,
                      .backend_is_worker = !g->has_backend || same,
                      .strip_usage = strip};
    c->w = NULL; /* the relay owns it now */
    cg_gw_relay_to(g, c->req, &t, text, strlen(text), c->stream, cc);
    call_free(c);
}

static void on_assembled(void *arg, cg_status st, long http, json_t *j, const char *detail);

/* Polled while the assemble runs: a client that left cancels it, and with it the prompt's
 * computing on the worker, which stops before its next forward when its caller goes. */
static int assemble_gone(void *arg)
{
    gw_call *c = arg;
    if (!c->client_gone) c->client_gone = cg_http_req_gone(c->req);
    return c->client_gone;
}
static json_t *assemble_body(const gw_call *c);

/* POST {worker}/v1/assemble for c on c->w; the answer comes to on_assembled. */
static void submit_assemble(gw_call *c)
{
    cg_gateway *g = c->g;
    json_t *ab = assemble_body(c);
    char *text = json_dumps(ab, JSON_COMPACT);
    json_decref(ab);
    cg_log(CG_LOG_DEBUG, "routed to %s (%s)", cg_worker_url(c->w), cg_route_kind_name(c->kind));
    c->t0 = cg_now_ns();
    /* The answer may arrive (on the curl thread) before cg_wc_call returns: c is not ours
     * once the call is submitted. */
    char url[600];
    snprintf(url, sizeof url, "%s", cg_worker_url(c->w));
    cg_http_req *req = c->req;
    if (cg_wc_call(g->client, url, "POST", "/v1/assemble", text, strlen(text), c->rid,
                   (long)g->cfg->worker_timeout_ms, on_assembled, assemble_gone, c,
                   NULL) != CG_OK) {
        cg_http_reply_error(req, CG_E_UNAVAILABLE, NULL, "the gateway is stopping");
        call_free(c);
    }
}

/* A worker answered 429 (at --max-running + --max-queue): it is busy, not broken. The request
 * goes to a healthy worker it has not tried yet; when there is none left, the client gets the
 * 429 with Retry-After. Returns 1 when it took over c. */
static int on_busy(gw_call *c, json_t **body)
{
    cg_gateway *g = c->g;
    cg_metric_add(g->m_busy, 1);
    cg_worker *other = pick_untried(c);
    if (other) {
        cg_log(CG_LOG_INFO, "worker %s is busy (429); trying %s", cg_worker_url(c->w),
               cg_worker_url(other));
        cg_workers_release(g->workers, &c->w);
        c->w = other;
        c->kind = CG_ROUTE_LEAST_LOADED;
        submit_assemble(c);
        return 1;
    }
    cg_http_add_header(c->req, "Retry-After", "1");
    /* A worker or a proxy in front of it may answer 429 with a body that is not the OpenAI
     * error shape (text/plain, HTML): the client gets the gateway's own rate-limit error. */
    if (*body && json_is_object(json_object_get(*body, "error")))
        cg_http_reply_json(c->req, 429, *body);
    else {
        json_decref(*body);
        cg_http_reply_error(c->req, CG_E_RATE_LIMIT, NULL, "every worker is busy; retry later");
    }
    *body = NULL;
    call_free(c);
    return 1;
}

static void on_assembled(void *arg, cg_status st, long http, json_t *j, const char *detail)
{
    gw_call *c = arg;
    cg_gateway *g = c->g;
    cg_wc_assembly a;
    memset(&a, 0, sizeof a);
    char why[768];
    cg_log_set_request_id(c->rid);
    cg_metric_observe(g->m_assemble, (double)(cg_now_ns() - c->t0) / 1e9);
    const char *url = cg_worker_url(c->w);
    if (c->client_gone) {
        /* no fault of the worker's: nobody waits for this answer (an assembly made just before
         * the cancel is given back) */
        char perr[256];
        if (st == CG_OK && http == 200 && cg_wc_assembly_parse(j, &a, perr, sizeof perr) == CG_OK &&
            a.id[0]) {
            /* what the worker now holds is true all the same */
            if (assembly_matches(c, &a, perr, sizeof perr)) record(c, &a);
            cg_wc_release(g->client, url, a.id, c->rid);
            cg_metric_add(g->m_releases, 1);
        }
        cg_metric_add(g->m_disconnects, 1);
        cg_log(CG_LOG_INFO, "client left during the assemble on %s; it was cancelled", url);
        cg_http_reply_error_status(c->req, CG_HTTP_CLIENT_GONE, CG_E_UNAVAILABLE, NULL,
                                   "the client left; assemble cancelled");
        call_free(c);
        goto out;
    }
    if (st != CG_OK) {
        snprintf(why, sizeof why, "assemble on %s: %s", url, detail);
        cg_workers_error(g->workers, c->w, cg_failkind_of(st, CG_FAIL_INVALID), why);
        goto fallback;
    }
    if (http == 429) {
        on_busy(c, &j);
        goto out;
    }
    if (http != 200) {
        json_t *err = json_object_get(j, "error");
        const char *code = json_string_value(json_object_get(err, "code"));
        const char *param = json_string_value(json_object_get(err, "param"));
        /* The prompt does not fit the model, or a field the client sent has a value the worker
         * refuses: the client's error, as the worker put it, and no fault of the worker's. */
        if (http == 400 && ((code && !strcmp(code, "context_length_exceeded")) ||
                            (param && json_object_get(c->body, param)))) {
            cg_http_reply_json(c->req, 400, j);
            j = NULL;
            call_free(c);
            goto out;
        }
        const char *m = cg_wc_error_message(j);
        snprintf(why, sizeof why, "assemble on %s answered HTTP %ld: %s", url, http,
                 m ? m : "no error message");
        cg_workers_error(g->workers, c->w, CG_FAIL_STATUS, why);
        goto fallback;
    }
    char perr[256];
    if (cg_wc_assembly_parse(j, &a, perr, sizeof perr) != CG_OK ||
        !assembly_matches(c, &a, perr, sizeof perr)) {
        snprintf(why, sizeof why, "assemble on %s: %s", url, perr);
        if (a.id[0]) cg_wc_release(g->client, url, a.id, c->rid);
        cg_workers_error(g->workers, c->w, CG_FAIL_INVALID, why);
        goto fallback;
    }
    record(c, &a);
    complete_assembled(c, &a);
    goto out;
fallback : {
    cg_worker *failed = c->w;
    c->w = NULL;
    /* Without --backend the plain prompt would go to another worker, which would split and
     * assemble it anyway, out of the index's sight and with a chunk_cache that cannot say
     * what it reused: assemble there instead, once. */
    cg_worker *next = !g->has_backend && c->fallback == CG_FALLBACK_NONE ? pick_untried(c) : NULL;
    if (next) {
        cg_log(CG_LOG_WARN, "assembling on %s instead: %s", cg_worker_url(next), why);
        count_fallback(g, c, CG_FALLBACK_WORKER_ERROR);
        c->w = next;
        c->kind = CG_ROUTE_LEAST_LOADED;
        cg_workers_release(g->workers, &failed);
        submit_assemble(c);
        goto out;
    }
    cg_log(CG_LOG_WARN, "falling back to the plain prompt: %s", why);
    forward_plain(c, CG_FALLBACK_WORKER_ERROR, why);
    cg_workers_release(g->workers, &failed);
}
out:
    json_decref(j);
    cg_wc_assembly_free(&a);
    cg_log_set_request_id(NULL);
}

static json_t *assemble_body(const gw_call *c)
{
    const cg_gw_segments *s = &c->segs;
    json_t *segs = json_array();
    size_t k = 0;
    for (size_t i = 0; i < s->split.n; i++) {
        const cg_segment *seg = &s->split.segs[i];
        json_t *o = json_pack("{s:s, s:s%}", "role", cg_role_name(seg->role), "text",
                              s->text + seg->off, seg->len);
        if (k < s->n_keys && s->key_seg[k] == i) {
            char hex[CG_KEY_HEX_LEN + 1];
            cg_key_hex(&s->keys[k++], hex);
            json_object_set_new(o, "key", json_string(hex));
        }
        json_array_append_new(segs, o);
    }
    json_t *ab = json_pack("{s:O, s:s, s:o}", "model", json_object_get(c->body, "model"), "mode",
                           cg_mode_name(s->mode), "segments", segs);
    if (s->salt) json_object_set_new(ab, "cache_salt", json_string(s->salt));
    set_recompute(ab, s);
    if (s->no_bos) json_object_set_new(ab, "add_special_tokens", json_false());
    /* the worker tokenizes the segments: it honours (and checks) the client's choice */
    json_t *sst = json_object_get(c->body, "split_special_tokens");
    if (sst) json_object_set(ab, "split_special_tokens", sst);
    return ab;
}

/* Routing tie-break: the request's first document chunk (else its system segment), so equal
 * cold requests spread over the workers by content and a document set seen for the first
 * time by two gateways' requests at once still lands on one worker. */
static uint64_t tie_hash(const cg_gw_segments *s)
{
    size_t pick = 0;
    for (size_t k = 0; k < s->n_keys; k++)
        if (s->split.segs[s->key_seg[k]].role == CG_ROLE_CHUNK) {
            pick = k;
            break;
        }
    uint64_t h = 0;
    for (int i = 0; i < 8; i++)
        h = h << 8 | s->keys[pick].b[i];
    return h;
}

static void count_roles(cg_gateway *g, const cg_gw_segments *s)
{
    size_t by_role[3] = {0, 0, 0};
    for (size_t i = 0; i < s->split.n; i++)
        by_role[s->split.segs[i].role]++;
    cg_metric_add(g->m_seg_system, (double)by_role[CG_ROLE_SYSTEM]);
    cg_metric_add(g->m_seg_chunk, (double)by_role[CG_ROLE_CHUNK]);
    cg_metric_add(g->m_seg_question, (double)by_role[CG_ROLE_QUESTION]);
    cg_metric_add(g->m_empty, (double)s->split.empty_skipped);
}

void cg_gw_orchestrate(cg_gateway *g, cg_http_req *req, json_t *body, cg_gw_segments *segs,
                       cg_index_entry *ent, int chat, int stream)
{
    gw_call *c = cg_calloc(1, sizeof *c);
    c->g = g;
    c->req = req;
    c->body = body;
    c->segs = *segs;
    cg_gw_segments_init(segs); /* moved */
    c->ent = ent;
    c->chat = chat;
    c->stream = stream;
    snprintf(c->rid, sizeof c->rid, "%s", cg_http_req_id(req));
    count_roles(g, &c->segs);

    if (c->segs.split.passthrough || !c->segs.n_keys) {
        if (c->segs.split.passthrough) cg_metric_add(g->m_passthrough, 1);
        forward_plain(c, CG_FALLBACK_NONE, NULL);
        return;
    }
    char pool_model[256];
    const char *model = json_string_value(json_object_get(body, "model"));
    if (!cg_workers_count(g->workers) ||
        !cg_workers_model(g->workers, pool_model, sizeof pool_model)) {
        forward_plain(c, CG_FALLBACK_NO_WORKER, NULL);
        return;
    }
    if (strcmp(pool_model, model) != 0) {
        /* Keys include the model id: a worker of another model cannot serve these chunks. */
        char why[400];
        snprintf(why, sizeof why, "the workers serve '%.128s', the request names '%.128s'",
                 pool_model, model);
        forward_plain(c, CG_FALLBACK_MODEL, why);
        return;
    }
    int64_t expect = 0;
    unsigned char *steer = cg_calloc(c->segs.n_keys, 1);
    for (size_t k = 0; k < c->segs.n_keys; k++)
        steer[k] = c->segs.split.segs[c->segs.key_seg[k]].role == CG_ROLE_CHUNK;
    c->w = tried(c, cg_workers_route(g->workers, c->ent, steer, c->segs.n_keys, c->segs.keys,
                                     tie_hash(&c->segs), &c->kind, &expect));
    free(steer);
    if (!c->w) {
        forward_plain(c, CG_FALLBACK_NO_WORKER, NULL);
        return;
    }
    /* Parsed: only a fallback to --backend may still forward the raw bytes. */
    if (!g->has_backend) cg_http_req_drop_body(req);
    cg_log(CG_LOG_DEBUG, "%lld cached tokens expected", (long long)expect);
    submit_assemble(c);
}
