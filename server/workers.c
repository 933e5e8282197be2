/* Worker registry: registration checks, health checks, inventory sync and routing. */
#include "server/workers.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "backends/worker_client.h"
#include "base/base.h"

typedef enum { W_UNKNOWN, W_HEALTHY, W_DOWN, W_REFUSED } wstate;
static const char *const state_names[] = {"unknown", "healthy", "down", "refused"};

struct cg_worker {
    int64_t id;
    char *url;
    /* Guarded by the registry's mu. */
    unsigned refs;
    int removed;
    wstate state;
    int64_t in_flight;
    int64_t running, queued; /* its own load report (GET /healthz), 0 until one */
    int64_t probe_peak;      /* the most requests in flight from here while a probe ran */
    int64_t others;          /* running + queued beyond probe_peak: other gateways' load */
    uint64_t next_check_ms;  /* monotonic */
    uint64_t retry_ms;       /* probe period while down: 100 ms doubling to 500 ms; 0 = up */
    int missed;              /* a healthy worker's last probe timed out: one more and it is down */
    uint64_t last_sync_ms;   /* monotonic; 0 = never */
    int64_t last_ok_wall, last_sync_wall, synced_chunks;
    int want_sync;
    int syncing; /* a sync runs (health thread or admin add) */
    int have_info;
    cg_wc_info info;
    char error[256];
    uint64_t routed, errors;
    int64_t tier_row; /* index row of its shared remote tier (info.remote_tier), or -1 */
    cg_metric *g_in_flight, *g_healthy;
    json_t *canary; /* owned: its quality canary summary from the last /healthz, or NULL */
};

struct cg_workers {
    cg_workers_params p;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* wakes the health thread; CLOCK_MONOTONIC */
    cg_worker **v;
    size_t n, cap;
    cg_wc_info pool; /* the accepted geometry; have_pool */
    int have_pool;
    cg_chat_model *chat; /* the pool's chat template, compiled; NULL when it has none */
    pthread_t thread;
    int started, stop;
    cg_metric *m_errors[CG_FAILKIND_COUNT]; /* NULL for a kind no worker call fails with */
    cg_metric *m_route[CG_ROUTE_KINDS];
    cg_metric *m_syncs, *m_sync_fail, *m_stale;
};

cg_workers_params cg_workers_default_params(void)
{
    cg_workers_params p;
    memset(&p, 0, sizeof p);
    p.health_interval_ms = 2000;
    p.health_timeout_ms = 1000;
    p.sync_interval_ms = 60000;
    p.load_penalty_tokens = 256;
    p.remote_hit_percent = 50;
    return p;
}

const char *cg_route_kind_name(cg_route_kind k)
{
    static const char *names[] = {"hit", "least_loaded", "pinned", "remote"};
    return (unsigned)k < CG_ARRAY_LEN(names) ? names[k] : "unknown";
}

/* ---------------------------------------------------------------- routing rule */

int64_t cg_route_load(const cg_route_cand *c)
{
    return c->in_flight + c->others;
}

int cg_route_pick(const cg_route_cand *c, size_t n, long long penalty, int remote_pct, uint64_t tie,
                  cg_route_kind *kind)
{
    if (!n) return -1;
    int any_pinned = 0;
    for (size_t i = 0; i < n; i++)
        any_pinned |= c[i].pinned;
    size_t start = (size_t)(tie % n);
    int best = -1, least = -1;
    long long best_score = 0;
    for (size_t k = 0; k < n; k++) {
        size_t i = (start + k) % n;
        if (any_pinned && !c[i].pinned) continue;
        long long load = cg_route_load(&c[i]);
        long long score =
            (long long)c[i].cached + (long long)c[i].remote * remote_pct / 100 - load * penalty;
        /* Strictly better only: the first in rotation order keeps a tie. */
        if (best < 0 || score > best_score ||
            (score == best_score && load < cg_route_load(&c[best]))) {
            best = (int)i;
            best_score = score;
        }
        if (least < 0 || load < cg_route_load(&c[least])) least = (int)i;
    }
    if (c[best].cached > 0 || (c[best].remote > 0 && remote_pct > 0)) {
        *kind = any_pinned ? CG_ROUTE_PINNED : c[best].cached > 0 ? CG_ROUTE_HIT : CG_ROUTE_REMOTE;
        return best;
    }
    /* Nothing cached where the score points: spread by load, then by the request's key. */
    *kind = any_pinned ? CG_ROUTE_PINNED : CG_ROUTE_LEAST_LOADED;
    return least;
}

/* ---------------------------------------------------------------- worker objects */

static void label_escape(const char *in, char *out, size_t n)
{
    size_t j = 0;
    for (; *in && j + 2 < n; in++) {
        if (*in == '"' || *in == '\\') out[j++] = '\\';
        out[j++] = *in == '\n' ? ' ' : *in;
    }
    out[j] = '\0';
}

static cg_worker *worker_new(cg_workers *r, int64_t id, const char *url)
{
    cg_worker *w = cg_calloc(1, sizeof *w);
    w->id = id;
    w->url = cg_strdup(url);
    w->refs = 1;
    w->state = W_UNKNOWN;
    w->tier_row = -1;
    char esc[600], labels[700];
    label_escape(url, esc, sizeof esc);
    snprintf(labels, sizeof labels, "worker=\"%s\"", esc);
    w->g_in_flight = cg_metrics_gauge(r->p.metrics, "chunkgate_worker_in_flight",
                                      "Requests routed to a worker and not finished.", labels);
    w->g_healthy =
        cg_metrics_gauge(r->p.metrics, "chunkgate_worker_healthy",
                         "1 while a worker passes its health checks and is used.", labels);
    cg_metric_set(w->g_in_flight, 0);
    cg_metric_set(w->g_healthy, 0);
    return w;
}

/* Drops one reference; the caller holds r->mu. Returns the worker when it must be freed
 * (outside the lock). */
static cg_worker *unref_locked(cg_worker *w)
{
    return --w->refs == 0 ? w : NULL;
}

static void worker_free(cg_worker *w)
{
    if (!w) return;
    cg_wc_info_clear(&w->info);
    json_decref(w->canary);
    free(w->url);
    free(w);
}

/* Stores the last error message (truncated to fit); the caller holds r->mu. */
static void set_error(cg_worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(cg_worker *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
}

/* Sets the state and its gauge; the caller holds r->mu. */
static void set_state_locked(cg_worker *w, wstate s)
{
    w->state = s;
    cg_metric_set(w->g_healthy, s == W_HEALTHY ? 1 : 0);
}

static json_t *worker_json_locked(const cg_worker *w)
{
    return json_pack("{s:I, s:s, s:s, s:o, s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:I, s:o}",
                     "id", (json_int_t)w->id, "object", "worker", "url", w->url, "model",
                     w->have_info ? json_string(w->info.model) : json_null(), "healthy",
                     w->state == W_HEALTHY, "state", state_names[w->state], "in_flight",
                     (json_int_t)w->in_flight, "running", (json_int_t)w->running, "queued",
                     (json_int_t)w->queued, "routed", (json_int_t)w->routed, "errors",
                     (json_int_t)w->errors, "last_ok_ms",
                     w->last_ok_wall ? json_integer(w->last_ok_wall) : json_null(), "last_sync_ms",
                     w->last_sync_wall ? json_integer(w->last_sync_wall) : json_null(),
                     "synced_chunks", (json_int_t)w->synced_chunks, "last_error",
                     w->error[0] ? json_string(w->error) : json_null());
}

/* Adds "info" to a worker JSON built under the lock (kept apart for readability). */
static json_t *worker_json_full_locked(const cg_worker *w)
{
    json_t *j = worker_json_locked(w);
    /* a copy: the stored summary is replaced by the health thread */
    json_object_set_new(j, "canary", w->canary ? json_deep_copy(w->canary) : json_null());
    if (w->have_info)
        json_object_set_new(
            j, "info",
            json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:o}", "model", w->info.model,
                      "dtype", w->info.dtype, "rope_style", w->info.rope_style, "key_version",
                      w->info.key_version, "n_layers", (json_int_t)w->info.n_layers, "n_kv_heads",
                      (json_int_t)w->info.n_kv_heads, "head_dim", (json_int_t)w->info.head_dim,
                      "max_positions", (json_int_t)w->info.max_positions, "key_hash",
                      w->info.key_hash ? w->info.key_hash : "xxhash", "instance",
                      w->info.instance ? json_string(w->info.instance) : json_null()));
    else
        json_object_set_new(j, "info", json_null());
    /* workers with the same remote tier share it (DESIGN §16) */
    json_object_set_new(j, "remote_tier",
                        w->have_info && w->info.remote_tier ? json_string(w->info.remote_tier)
                                                            : json_null());
    return j;
}

/* ---------------------------------------------------------------- registry */

cg_status cg_workers_open(const cg_workers_params *p, cg_workers **out)
{
    cg_workers *r = cg_calloc(1, sizeof *r);
    r->p = *p;
    cg_workers_params d = cg_workers_default_params();
    if (r->p.health_interval_ms <= 0) r->p.health_interval_ms = d.health_interval_ms;
    if (r->p.health_timeout_ms <= 0) r->p.health_timeout_ms = d.health_timeout_ms;
    if (r->p.sync_interval_ms < 0) r->p.sync_interval_ms = 0;
    if (r->p.load_penalty_tokens < 0) r->p.load_penalty_tokens = 0;
    if (r->p.remote_hit_percent < 1 || r->p.remote_hit_percent > 99)
        r->p.remote_hit_percent = d.remote_hit_percent;
    pthread_mutex_init(&r->mu, NULL);
    cg_cond_init_monotonic(&r->cv);
    cg_metrics *m = p->metrics;
    for (int k = 0; k < CG_FAILKIND_COUNT; k++) {
        if (!cg_failkind_of_worker((cg_failkind)k)) continue;
        char labels[64];
        snprintf(labels, sizeof labels, "kind=\"%s\"", cg_failkind_name((cg_failkind)k));
        r->m_errors[k] = cg_metrics_counter(
            m, "chunkgate_worker_errors_total",
            "KV worker failures: connect, timeout, status (an error answer), invalid (an answer "
            "that is not a valid assembly), stream (failed while decoding).",
            labels);
    }
    for (int k = 0; k < CG_ROUTE_KINDS; k++) {
        char labels[64];
        snprintf(labels, sizeof labels, "kind=\"%s\"", cg_route_kind_name((cg_route_kind)k));
        r->m_route[k] = cg_metrics_counter(
            m, "chunkgate_routing_decisions_total",
            "Requests routed to a worker: hit (most cached tokens), least_loaded (nothing "
            "cached), pinned (a worker holding a pinned chunk), remote (a worker that reads the "
            "request's chunks from its shared remote tier).",
            labels);
    }
    r->m_syncs =
        cg_metrics_counter(m, "chunkgate_worker_syncs_total",
                           "Full inventory syncs of a worker into the index.", "result=\"ok\"");
    r->m_sync_fail =
        cg_metrics_counter(m, "chunkgate_worker_syncs_total",
                           "Full inventory syncs of a worker into the index.", "result=\"error\"");
    r->m_stale = cg_metrics_counter(
        m, "chunkgate_stale_placements_total",
        "Chunks the index placed on a worker that the worker reported as a miss.", NULL);
    *out = r;
    return CG_OK;
}

static void *health_main(void *arg);

cg_status cg_workers_health_start(cg_workers *r)
{
    if (r->started) return CG_OK;
    if (pthread_create(&r->thread, NULL, health_main, r) != 0) {
        cg_log(CG_LOG_ERROR, "cannot start the worker health thread: %s", strerror(errno));
        return CG_E_INTERNAL;
    }
    r->started = 1;
    return CG_OK;
}

void cg_workers_health_stop(cg_workers *r)
{
    if (!r || !r->started) return;
    cg_thread_stop(r->thread, &r->mu, &r->cv, &r->stop);
    r->started = 0;
}

void cg_workers_close(cg_workers **rp)
{
    cg_workers *r = *rp;
    if (!r) return;
    *rp = NULL;
    cg_workers_health_stop(r);
    for (size_t i = 0; i < r->n; i++) {
        cg_worker *w = r->v[i];
        if (--w->refs == 0)
            worker_free(w);
        else
            cg_log(CG_LOG_WARN, "worker %s still referenced at shutdown", w->url);
    }
    free(r->v);
    cg_wc_info_clear(&r->pool);
    cg_chat_model_unref(&r->chat);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

static cg_worker *find_url_locked(cg_workers *r, const char *url)
{
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->v[i]->url, url)) return r->v[i];
    return NULL;
}

size_t cg_workers_count(cg_workers *r)
{
    pthread_mutex_lock(&r->mu);
    size_t n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

size_t cg_workers_healthy(cg_workers *r)
{
    size_t k = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n; i++)
        k += r->v[i]->state == W_HEALTHY;
    pthread_mutex_unlock(&r->mu);
    return k;
}

/* Compiles the accepted pool's chat template. A worker refuses to load a template it cannot
 * render, and it renders with this same code, so a failure here means a worker of another
 * implementation: its chats fall back to the plain rendering, said once in the log. */
static void pool_chat_locked(cg_workers *r)
{
    if (!r->pool.chat_template) return;
    char err[256];
    cg_status st = cg_chat_model_new(r->pool.chat_template, r->pool.bos_token, r->pool.eos_token,
                                     &r->chat, err, sizeof err);
    if (st != CG_OK)
        cg_log(CG_LOG_WARN,
               "the workers' chat template cannot be rendered here (%s); chat "
               "requests use the plain rendering",
               err);
}

cg_chat_model *cg_workers_chat_model(cg_workers *r)
{
    if (!r) return NULL;
    pthread_mutex_lock(&r->mu);
    cg_chat_model *m = cg_chat_model_ref(r->chat);
    pthread_mutex_unlock(&r->mu);
    return m;
}

int64_t cg_workers_max_positions(cg_workers *r)
{
    pthread_mutex_lock(&r->mu);
    int64_t n = r->have_pool ? r->pool.max_positions : 0;
    pthread_mutex_unlock(&r->mu);
    return n;
}

int cg_workers_model(cg_workers *r, char *buf, size_t n)
{
    int ok = 0;
    pthread_mutex_lock(&r->mu);
    const char *m = r->p.model ? r->p.model : r->have_pool ? r->pool.model : NULL;
    if (m) {
        snprintf(buf, n, "%s", m);
        ok = 1;
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

json_t *cg_workers_list_json(cg_workers *r)
{
    json_t *data = json_array();
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n; i++)
        json_array_append_new(data, worker_json_full_locked(r->v[i]));
    pthread_mutex_unlock(&r->mu);
    return json_pack("{s:s, s:o}", "object", "list", "data", data);
}

json_t *cg_workers_get_json(cg_workers *r, int64_t id)
{
    json_t *j = NULL;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n && !j; i++)
        if (r->v[i]->id == id) j = worker_json_full_locked(r->v[i]);
    pthread_mutex_unlock(&r->mu);
    return j;
}

/* Checks info against --model and the accepted pool geometry; the caller holds r->mu.
 * Returns 1 when compatible, else 0 with a message. */
static int compatible_locked(cg_workers *r, const char *url, const cg_wc_info *info, char *msg,
                             size_t n)
{
    char why[320];
    /* One key hash for the gateway and every worker, or the worker refuses every key the
     * gateway sends (and hits would be impossible). */
    const char *kh = cg_key_hash_name(cg_key_get_hash());
    if (strcmp(info->key_hash ? info->key_hash : "xxhash", kh) != 0) {
        snprintf(msg, n,
                 "worker %s hashes chunk keys with key_hash '%s' but the gateway uses "
                 "--key-hash '%s'",
                 url, info->key_hash ? info->key_hash : "xxhash", kh);
        return 0;
    }
    /* The same goes for the key's encoding: a worker of another key version recomputes every
     * key another way, so it refuses each assemble or, worse, serves keys computed otherwise. */
    if (strcmp(info->key_version, CG_KEY_VERSION) != 0) {
        snprintf(msg, n,
                 "worker %s computes chunk keys with key_version '%s' but the gateway uses '%s'",
                 url, info->key_version, CG_KEY_VERSION);
        return 0;
    }
    if (r->p.model && strcmp(r->p.model, info->model) != 0) {
        snprintf(msg, n,
                 "worker %s serves model '%s' but the gateway is configured with --model '%s'", url,
                 info->model, r->p.model);
        return 0;
    }
    if (r->have_pool && !cg_wc_info_compatible(info, &r->pool, why, sizeof why)) {
        snprintf(msg, n,
                 "worker %s does not match the registered workers: %s (every worker behind one "
                 "gateway must serve the same model with the same dtype, RoPE style, key version "
                 "and KV geometry)",
                 url, why);
        return 0;
    }
    return 1;
}

/* GET {url}/v1/info. */
static cg_status fetch_info(cg_workers *r, const char *url, cg_wc_info *out, char *err,
                            size_t errlen)
{
    long http = 0;
    json_t *j = NULL;
    char detail[256];
    memset(out, 0, sizeof *out);
    cg_status st = cg_wc_call_sync(r->p.client, url, "GET", "/v1/info", NULL, 0,
                                   r->p.health_timeout_ms * 3, &http, &j, detail, sizeof detail);
    if (st != CG_OK) {
        snprintf(err, errlen, "cannot reach %s/v1/info: %s", url, detail);
        json_decref(j);
        return st == CG_E_TIMEOUT ? CG_E_TIMEOUT : CG_E_UNAVAILABLE;
    }
    if (http != 200) {
        snprintf(err, errlen, "%s/v1/info answered HTTP %ld", url, http);
        json_decref(j);
        return CG_E_BAD_GATEWAY;
    }
    st = cg_wc_info_parse(j, out, detail, sizeof detail);
    json_decref(j);
    if (st != CG_OK) {
        snprintf(err, errlen, "%s: %s", url, detail);
        return CG_E_BAD_GATEWAY;
    }
    return CG_OK;
}

/* Replaces the worker's placements in the index with its inventory (blocking). */
static cg_status sync_inventory(cg_workers *r, cg_worker *w, char *err, size_t errlen)
{
    cg_wc_chunk *rows = NULL;
    size_t n = 0;
    cg_status st = cg_wc_inventory(r->p.client, w->url, CG_MAX(r->p.health_timeout_ms * 5, 5000L),
                                   &rows, &n, err, errlen);
    if (st != CG_OK) {
        cg_metric_add(r->m_sync_fail, 1);
        return st;
    }
    cg_key *keys = cg_calloc(n ? n : 1, sizeof *keys);
    cg_tier *tiers = cg_calloc(n ? n : 1, sizeof *tiers);
    int64_t *tokens = cg_calloc(n ? n : 1, sizeof *tokens);
    for (size_t i = 0; i < n; i++) {
        keys[i] = rows[i].key;
        tiers[i] = rows[i].disk ? CG_TIER_DISK : CG_TIER_RAM;
        tokens[i] = rows[i].tokens >= 0 ? rows[i].tokens : 0;
    }
    cg_index_worker_placements_replace(r->p.index, w->id, keys, tiers, tokens, n,
                                       (int64_t)cg_wall_ms());
    free(keys);
    free(tiers);
    free(tokens);
    free(rows);
    pthread_mutex_lock(&r->mu);
    w->synced_chunks = (int64_t)n;
    pthread_mutex_unlock(&r->mu);
    cg_metric_add(r->m_syncs, 1);
    cg_log(CG_LOG_INFO, "worker %s: inventory synced, %zu chunks", w->url, n);
    return CG_OK;
}

/* Brings a reachable worker in: /v1/info, compatibility, restart detection, inventory sync.
 * The caller owns w->syncing. Returns 1 when the worker is healthy afterwards. */
static int sync_worker(cg_workers *r, cg_worker *w, uint64_t now)
{
    char err[512];
    cg_wc_info info;
    cg_status st = fetch_info(r, w->url, &info, err, sizeof err);
    pthread_mutex_lock(&r->mu);
    if (st != CG_OK) {
        if (w->state != W_DOWN) cg_log(CG_LOG_WARN, "worker %s is down: %s", w->url, err);
        set_state_locked(w, W_DOWN);
        set_error(w, "%s", err);
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    if (!compatible_locked(r, w->url, &info, err, sizeof err)) {
        int was = w->state == W_REFUSED;
        if (!was) cg_log(CG_LOG_ERROR, "%s; it is not used", err);
        set_state_locked(w, W_REFUSED);
        set_error(w, "%s", err);
        pthread_mutex_unlock(&r->mu);
        cg_wc_info_clear(&info);
        /* Whatever it holds was computed by another model: route nothing there. */
        if (!was)
            cg_index_worker_placements_replace(r->p.index, w->id, NULL, NULL, NULL, 0,
                                               (int64_t)cg_wall_ms());
        return 0;
    }
    if (!r->have_pool) {
        cg_wc_info_copy(&r->pool, &info);
        r->have_pool = 1;
        pool_chat_locked(r);
    }
    if (w->have_info && info.instance && w->info.instance &&
        strcmp(info.instance, w->info.instance) != 0)
        cg_log(CG_LOG_INFO, "worker %s restarted (instance %s -> %s)", w->url, w->info.instance,
               info.instance);
    cg_wc_info_clear(&w->info);
    w->info = info;
    w->have_info = 1;
    w->want_sync = 0;
    char tier_url[600];
    tier_url[0] = '\0';
    if (info.remote_tier) cg_index_tier_row_url(info.remote_tier, tier_url, sizeof tier_url);
    pthread_mutex_unlock(&r->mu);

    /* Its shared remote tier's row (the same for every worker naming that tier). */
    int64_t tier_row = -1;
    if (tier_url[0] && cg_index_worker_add(r->p.index, tier_url, info.model, (int64_t)cg_wall_ms(),
                                           &tier_row) != CG_OK) {
        cg_log(CG_LOG_WARN, "worker %s: the index could not record its remote tier", w->url);
        tier_row = -1;
    }
    pthread_mutex_lock(&r->mu);
    if (w->tier_row != tier_row)
        cg_log(CG_LOG_INFO, "worker %s shares remote tier %s", w->url,
               tier_url[0] ? tier_url + strlen(CG_INDEX_TIER_ROW_PREFIX) : "(none)");
    w->tier_row = tier_row;
    pthread_mutex_unlock(&r->mu);

    st = sync_inventory(r, w, err, sizeof err);
    pthread_mutex_lock(&r->mu);
    if (st != CG_OK) {
        cg_log(CG_LOG_WARN, "worker %s: inventory sync failed: %s", w->url, err);
        set_state_locked(w, W_DOWN);
        set_error(w, "inventory sync failed: %s", err);
        w->want_sync = 1;
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    if (w->state != W_HEALTHY) cg_log(CG_LOG_INFO, "worker %s is healthy", w->url);
    set_state_locked(w, W_HEALTHY);
    w->error[0] = '\0';
    w->last_sync_ms = now;
    w->last_sync_wall = w->last_ok_wall = (int64_t)cg_wall_ms();
    pthread_mutex_unlock(&r->mu);
    cg_status hst = cg_index_worker_set_health(r->p.index, w->id, 1, (int64_t)cg_wall_ms());
    (void)hst; /* the registry, not the index row, decides routing */
    return 1;
}

cg_status cg_workers_add(cg_workers *r, const char *url_in, int must_reach, int *created,
                         json_t **out_json, char *err, size_t errlen)
{
    *created = 0;
    if (out_json) *out_json = NULL;
    if (!url_in || (strncmp(url_in, "http://", 7) && strncmp(url_in, "https://", 8)) ||
        strlen(url_in) > 512) {
        snprintf(err, errlen,
                 "a worker url is an http:// or https:// base URL (at most 512 bytes)");
        return CG_E_VALUE;
    }
    /* A worker's URL is shown in /metrics labels, /v1/workers, /v1/stats and the logs:
     * credentials in it (user:password@) would be shown too. */
    const char *auth = strstr(url_in, "://") + 3;
    size_t auth_len = strcspn(auth, "/?#");
    if (memchr(auth, '@', auth_len)) {
        snprintf(err, errlen,
                 "a worker url must not hold credentials (user:password@): it is shown in "
                 "/metrics, /v1/workers and the logs");
        return CG_E_VALUE;
    }
    char *url = cg_upstream_base_normalise(url_in);
    cg_status st = CG_OK;
    cg_wc_info info;
    memset(&info, 0, sizeof info);
    int have_info = 0;

    pthread_mutex_lock(&r->mu);
    cg_worker *w = find_url_locked(r, url);
    if (w) {
        if (out_json) *out_json = worker_json_full_locked(w);
        pthread_mutex_unlock(&r->mu);
        goto out;
    }
    pthread_mutex_unlock(&r->mu);

    st = fetch_info(r, url, &info, err, errlen);
    if (st == CG_OK) {
        have_info = 1;
    } else if (must_reach || st == CG_E_BAD_GATEWAY) {
        goto out;
    } else {
        cg_log(CG_LOG_WARN, "%s; registered as down, used once it answers", err);
        st = CG_OK;
    }
    pthread_mutex_lock(&r->mu);
    if (have_info && !compatible_locked(r, url, &info, err, errlen)) {
        pthread_mutex_unlock(&r->mu);
        cg_log(CG_LOG_WARN, "%s; its registration is refused", err);
        st = CG_E_CONFLICT;
        goto out;
    }
    pthread_mutex_unlock(&r->mu);

    int64_t id = -1;
    const char *model = have_info ? info.model : r->p.model ? r->p.model : "";
    if (cg_index_worker_add(r->p.index, url, model, (int64_t)cg_wall_ms(), &id) != CG_OK) {
        snprintf(err, errlen, "the index could not record the worker");
        st = CG_E_IO;
        goto out;
    }
    pthread_mutex_lock(&r->mu);
    w = find_url_locked(r, url);
    if (w) { /* registered meanwhile by a concurrent add */
        if (out_json) *out_json = worker_json_full_locked(w);
        pthread_mutex_unlock(&r->mu);
        goto out;
    }
    w = worker_new(r, id, url);
    set_state_locked(w, have_info ? W_UNKNOWN : W_DOWN);
    if (!have_info) set_error(w, "%s", err);
    w->want_sync = 1;
    w->syncing = have_info; /* synced below, outside the lock */
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 8;
        r->v = cg_realloc(r->v, r->cap * sizeof *r->v);
    }
    r->v[r->n++] = w;
    w->refs++; /* ours until the end of this call */
    *created = 1;
    pthread_mutex_unlock(&r->mu);
    cg_log(CG_LOG_INFO, "worker %s registered (id %lld)", url, (long long)id);

    if (have_info) {
        int ok = sync_worker(r, w, cg_now_ms());
        pthread_mutex_lock(&r->mu);
        w->syncing = 0;
        w->next_check_ms = cg_now_ms() + (uint64_t)r->p.health_interval_ms;
        if (!ok && w->state == W_REFUSED) { /* lost a race with an incompatible worker */
            snprintf(err, errlen, "%s", w->error);
            st = CG_E_CONFLICT;
        }
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_lock(&r->mu);
    if (out_json) *out_json = worker_json_full_locked(w);
    cg_worker *dead = unref_locked(w);
    pthread_cond_broadcast(&r->cv); /* the health thread picks up the new worker */
    pthread_mutex_unlock(&r->mu);
    worker_free(dead);
out:
    if (have_info) cg_wc_info_clear(&info);
    free(url);
    return st;
}

cg_status cg_workers_remove(cg_workers *r, int64_t id, const char *url_in, json_t **out_json)
{
    char *url = url_in ? cg_upstream_base_normalise(url_in) : NULL;
    cg_worker *w = NULL, *dead = NULL;
    if (out_json) *out_json = NULL;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n; i++) {
        cg_worker *x = r->v[i];
        if ((id >= 0 && x->id == id) || (url && !strcmp(x->url, url))) {
            w = x;
            memmove(&r->v[i], &r->v[i + 1], (r->n - i - 1) * sizeof *r->v);
            r->n--;
            break;
        }
    }
    if (w) {
        w->removed = 1;
        set_state_locked(w, W_DOWN);
        cg_metric_set(w->g_in_flight, 0);
        if (out_json) *out_json = worker_json_full_locked(w);
        id = w->id;
        if (r->n == 0 && r->have_pool) { /* an empty pool accepts any model again */
            cg_wc_info_clear(&r->pool);
            cg_chat_model_unref(&r->chat);
            r->have_pool = 0;
        }
        dead = unref_locked(w);
    }
    pthread_mutex_unlock(&r->mu);
    free(url);
    if (!w) return CG_E_NOT_FOUND;
    cg_log(CG_LOG_INFO, "worker %lld removed", (long long)id);
    worker_free(dead);
    cg_status st = cg_index_worker_delete(r->p.index, id);
    return st == CG_E_NOT_FOUND ? CG_OK : st;
}

cg_status cg_workers_sync(cg_workers *r, int64_t id, json_t **out_json, char *err, size_t errlen)
{
    if (out_json) *out_json = NULL;
    cg_worker *w = NULL;
    /* A probe of the health thread may hold the worker for a moment: wait for it. */
    for (int tries = 0; tries < 2000; tries++) {
        pthread_mutex_lock(&r->mu);
        w = NULL;
        for (size_t i = 0; i < r->n; i++)
            if (r->v[i]->id == id) w = r->v[i];
        if (w && !w->syncing) {
            w->syncing = 1;
            w->refs++;
            pthread_mutex_unlock(&r->mu);
            break;
        }
        pthread_mutex_unlock(&r->mu);
        if (!w) return CG_E_NOT_FOUND;
        w = NULL;
        struct timespec ts = {0, 5 * 1000000};
        nanosleep(&ts, NULL);
    }
    if (!w) {
        snprintf(err, errlen, "the worker is busy syncing; try again");
        return CG_E_CONFLICT;
    }
    int ok = sync_worker(r, w, cg_now_ms());
    pthread_mutex_lock(&r->mu);
    w->syncing = 0;
    if (!ok) snprintf(err, errlen, "%s", w->error);
    if (out_json) *out_json = worker_json_full_locked(w);
    cg_worker *dead = unref_locked(w);
    pthread_mutex_unlock(&r->mu);
    worker_free(dead);
    return ok ? CG_OK : CG_E_UNAVAILABLE;
}

/* ---------------------------------------------------------------- routing */

const char *cg_worker_url(const cg_worker *w)
{
    return w->url;
}

int64_t cg_worker_id(const cg_worker *w)
{
    return w->id;
}

int64_t cg_workers_tier_row(cg_workers *r, const cg_worker *w)
{
    pthread_mutex_lock(&r->mu);
    int64_t t = w->tier_row;
    pthread_mutex_unlock(&r->mu);
    return t;
}

/* Takes a reference and counts w in flight; the caller holds r->mu. */
static cg_worker *take_locked(cg_worker *w)
{
    w->refs++;
    w->in_flight++;
    w->probe_peak = CG_MAX(w->probe_peak, w->in_flight);
    w->routed++;
    cg_metric_set(w->g_in_flight, (double)w->in_flight);
    return w;
}

#define MAX_ROUTE 64

cg_worker *cg_workers_route(cg_workers *r, const cg_index_entry *ent, const unsigned char *steer,
                            size_t n_keys, const cg_key *keys, uint64_t tie, cg_route_kind *kind,
                            int64_t *cached)
{
    cg_route_cand cand[MAX_ROUTE];
    cg_worker *ws[MAX_ROUTE];
    size_t n = 0;
    *cached = 0;
    *kind = CG_ROUTE_LEAST_LOADED;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n && n < MAX_ROUTE; i++) {
        cg_worker *w = r->v[i];
        if (w->state != W_HEALTHY) continue;
        cg_route_cand c = {0, w->in_flight, 0, 0, w->others};
        for (size_t k = 0; k < n_keys; k++) {
            if (steer && !steer[k]) continue;
            const cg_index_entry *e = ent ? &ent[k] : NULL;
            int64_t t = cg_index_entry_tokens_on(e, w->id);
            if (t <= 0) {
                /* not held here: readable from the tier it shares? */
                if (w->tier_row >= 0)
                    c.remote += CG_MAX(cg_index_entry_tokens_on(e, w->tier_row), 0);
                continue;
            }
            c.cached += t;
            c.pinned |= ent && ent[k].pinned;
        }
        ws[n] = w;
        cand[n++] = c;
    }
    int i = cg_route_pick(cand, n, r->p.load_penalty_tokens, r->p.remote_hit_percent, tie, kind);
    cg_worker *w = NULL;
    if (i >= 0) {
        w = take_locked(ws[i]);
        *cached = cand[i].cached;
        cg_metric_add(r->m_route[*kind], 1);
    }
    pthread_mutex_unlock(&r->mu);
    return w;
}

cg_worker *cg_workers_pick_any(cg_workers *r, const int64_t *skip, size_t n_skip)
{
    cg_worker *best = NULL;
    int64_t best_load = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n; i++) {
        cg_worker *w = r->v[i];
        if (w->state != W_HEALTHY) continue;
        size_t k = 0;
        while (k < n_skip && skip[k] != w->id)
            k++;
        if (k < n_skip) continue;
        cg_route_cand c = {0, w->in_flight, 0, 0, w->others};
        if (!best || cg_route_load(&c) < best_load) {
            best = w;
            best_load = cg_route_load(&c);
        }
    }
    if (best) take_locked(best);
    pthread_mutex_unlock(&r->mu);
    return best;
}

void cg_workers_release(cg_workers *r, cg_worker **wp)
{
    cg_worker *w = *wp;
    if (!w) return;
    *wp = NULL;
    pthread_mutex_lock(&r->mu);
    w->in_flight--;
    if (!w->removed) cg_metric_set(w->g_in_flight, (double)w->in_flight);
    cg_worker *dead = unref_locked(w);
    pthread_mutex_unlock(&r->mu);
    worker_free(dead);
}

void cg_workers_error(cg_workers *r, cg_worker *w, cg_failkind kind, const char *detail)
{
    /* a kind no worker call fails with is counted with the last one, as stream */
    cg_failkind k = cg_failkind_of_worker(kind) ? kind : CG_FAIL_STREAM;
    cg_metric_add(r->m_errors[k], 1);
    const char *name = cg_failkind_name(kind);
    pthread_mutex_lock(&r->mu);
    w->errors++;
    set_error(w, "%s: %s", name, detail);
    if (cg_failkind_marks_down(kind) && w->state == W_HEALTHY && !w->removed) {
        /* Out of routing until a probe answers; the next probe runs at once. */
        cg_log(CG_LOG_WARN, "worker %s marked down after a %s error: %s", w->url, name, detail);
        set_state_locked(w, W_DOWN);
        w->next_check_ms = 0;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

int cg_workers_find_instance(cg_workers *r, const char *instance, int64_t *id, int64_t *tier_row)
{
    int found = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n && !found; i++) {
        cg_worker *w = r->v[i];
        if (w->removed || !w->have_info || !w->info.instance || strcmp(w->info.instance, instance))
            continue;
        *id = w->id;
        *tier_row = w->tier_row;
        found = 1;
    }
    pthread_mutex_unlock(&r->mu);
    return found;
}

int cg_workers_resync(cg_workers *r, int64_t id)
{
    int found = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n; i++) {
        cg_worker *w = r->v[i];
        if (w->removed || (id >= 0 && w->id != id)) continue;
        found = 1;
        if (!w->want_sync) {
            w->want_sync = 1;
            w->next_check_ms = 0;
        }
    }
    if (found) pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return found;
}

void cg_workers_stale(cg_workers *r, cg_worker *w)
{
    cg_metric_add(r->m_stale, 1);
    pthread_mutex_lock(&r->mu);
    if (!w->want_sync) {
        w->want_sync = 1;
        w->next_check_ms = 0;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

/* ---------------------------------------------------------------- health */

/* A load count of a health answer: a non-negative integer, capped so that a broken worker
 * cannot overflow the score; 0 when absent or malformed. */
static int64_t reported_count(json_t *health, const char *name)
{
    json_t *v = json_object_get(health, name);
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    return CG_MIN((int64_t)json_integer_value(v), (int64_t)1 << 20);
}

/* Probes one worker and syncs it when needed; the caller owns w->syncing. */
static void check_one(cg_workers *r, cg_worker *w, uint64_t now)
{
    long http = 0;
    json_t *j = NULL;
    char detail[256];
    /* The report will count our own requests that the worker holds while it answers: at most
     * the most we have in flight from now until the answer is read (take_locked raises it). */
    pthread_mutex_lock(&r->mu);
    w->probe_peak = w->in_flight;
    pthread_mutex_unlock(&r->mu);
    cg_status st = cg_wc_call_sync(r->p.client, w->url, "GET", "/healthz", NULL, 0,
                                   r->p.health_timeout_ms, &http, &j, detail, sizeof detail);
    int ok = st == CG_OK && http == 200;
    /* A worker's health answer carries its quality canary's summary (DESIGN §15) and its load
     * (DESIGN §18): the sequences it runs and queues for every gateway, not only this one. What
     * exceeds our own requests is the other replicas' load. A worker of another implementation
     * may report no load: then only in_flight counts. */
    json_t *canary = NULL;
    if (ok && json_is_object(json_object_get(j, "canary")))
        canary = json_deep_copy(json_object_get(j, "canary"));
    int64_t running = ok ? reported_count(j, "running") : 0;
    int64_t queued = ok ? reported_count(j, "queued") : 0;
    json_decref(j);
    int need_sync = 0, went_down = 0;
    pthread_mutex_lock(&r->mu);
    if (canary) {
        json_decref(w->canary);
        w->canary = canary;
    }
    w->running = running;
    w->queued = queued;
    w->others = CG_MAX(running + queued - w->probe_peak, 0);
    /* A healthy worker whose probe only timed out (a loaded machine, a pause) stays in routing
     * until a second probe in a row does, as a load balancer's unhealthy threshold; one that
     * refuses the connection or answers an error leaves at once. */
    int grace = !ok && st == CG_E_TIMEOUT && w->state == W_HEALTHY && !w->missed;
    w->missed = grace;
    if (grace) {
        cg_log(CG_LOG_WARN,
               "worker %s missed a health check (%s); it leaves routing if the next "
               "one fails too",
               w->url, detail);
        set_error(w, "GET /healthz: %s", detail);
    } else if (!ok) {
        went_down = w->state == W_HEALTHY || w->state == W_UNKNOWN;
        if (w->state != W_DOWN)
            cg_log(CG_LOG_WARN, "worker %s failed its health check: %s", w->url,
                   st == CG_OK ? "bad status" : detail);
        set_state_locked(w, W_DOWN);
        if (st == CG_OK)
            set_error(w, "GET /healthz answered HTTP %ld", http);
        else
            set_error(w, "GET /healthz: %s", detail);
    } else {
        w->last_ok_wall = (int64_t)cg_wall_ms();
        /* (Re)appearing, refused before (it may have been fixed), asked for, or due. */
        need_sync =
            w->state != W_HEALTHY || w->want_sync ||
            (r->p.sync_interval_ms > 0 && now - w->last_sync_ms >= (uint64_t)r->p.sync_interval_ms);
    }
    /* A worker that reports an instance id may have restarted between two probes, too fast
     * to be seen down: compare its id (one more small GET, only for such workers). */
    char *instance =
        !need_sync && ok && w->have_info && w->info.instance ? cg_strdup(w->info.instance) : NULL;
    pthread_mutex_unlock(&r->mu);
    if (instance) {
        cg_wc_info now_info;
        char err[256];
        if (fetch_info(r, w->url, &now_info, err, sizeof err) == CG_OK) {
            if (!now_info.instance || strcmp(now_info.instance, instance) != 0) need_sync = 1;
            cg_wc_info_clear(&now_info);
        }
        free(instance);
    }
    if (went_down) {
        cg_status hst = cg_index_worker_set_health(r->p.index, w->id, 0, (int64_t)cg_wall_ms());
        (void)hst;
    }
    if (need_sync) (void)sync_worker(r, w, now);
}

#define DOWN_RETRY_MAX_MS 500u

void cg_workers_tick(cg_workers *r, uint64_t now)
{
    cg_worker *due[MAX_ROUTE];
    size_t n = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n && n < MAX_ROUTE; i++) {
        cg_worker *w = r->v[i];
        if (w->syncing || w->next_check_ms > now) continue;
        w->syncing = 1;
        w->refs++;
        w->next_check_ms = now + (uint64_t)r->p.health_interval_ms;
        due[n++] = w;
    }
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < n; i++) {
        check_one(r, due[i], now);
        pthread_mutex_lock(&r->mu);
        /* A worker that is down (not started yet, restarting) is probed again soon: from
         * 100 ms, doubling to 500 ms (or the interval when shorter). One that comes up serves
         * within half a second, not a whole --health-interval-ms later (/v1/models and
         * completions failed meanwhile); a refused connect twice a second costs nothing. */
        cg_worker *w = due[i];
        uint64_t cap = CG_MIN(DOWN_RETRY_MAX_MS, (uint64_t)r->p.health_interval_ms);
        if (w->missed) {
            /* the second probe goes soon: a worker that is really gone leaves routing fast */
            w->next_check_ms = cg_now_ms() + CG_MIN(100u, cap);
        } else if (w->state == W_DOWN) {
            w->retry_ms = w->retry_ms ? CG_MIN(w->retry_ms * 2, cap) : CG_MIN(100u, cap);
            w->next_check_ms = cg_now_ms() + w->retry_ms;
        } else {
            w->retry_ms = 0;
        }
        due[i]->syncing = 0;
        cg_worker *dead = unref_locked(due[i]);
        pthread_mutex_unlock(&r->mu);
        worker_free(dead);
    }
}

static void *health_main(void *arg)
{
    cg_workers *r = arg;
    cg_log_set_request_id("health");
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        pthread_mutex_unlock(&r->mu);
        cg_workers_tick(r, cg_now_ms());
        if (r->p.tick) r->p.tick(r->p.tick_ud, cg_now_ms());
        pthread_mutex_lock(&r->mu);
        if (r->stop) break;
        /* Sleep until the earliest check is due (or a wakeup: new worker, error, stale). */
        uint64_t now = cg_now_ms(), wake = now + (uint64_t)r->p.health_interval_ms;
        for (size_t i = 0; i < r->n; i++) {
            cg_worker *w = r->v[i];
            if (w->syncing) continue;
            if (w->next_check_ms < wake) wake = w->next_check_ms;
        }
        if (wake <= now) continue;
        struct timespec ts = cg_deadline_after_ms(wake - now);
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}
