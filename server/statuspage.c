/* The status page: GET / serves one self-contained HTML page (inline CSS and JS, no external
 * resources: gateways often run without internet) that polls GET /v1/stats, a JSON view of
 * the gateway's live totals, its workers, the workers' reuse-quality canaries and a ring of
 * the last requests with their segment hits. The ring holds metadata only: keys (32 hex),
 * roles, tokens, hits, quality figures; never prompt text or credentials. */
#include "server/statuspage.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "server/gwstate.h"

/* Segments kept per recorded request: a request may have thousands, the page shows a few. */
#define SEGS_KEPT 64

/* One recorded request. Its JSON is built when /v1/stats asks, not on the request path:
 * chunk_cache is kept by reference (it never changes once the answer has it, and holds no
 * prompt text). */
typedef struct entry {
    uint64_t time_ms;
    const char *route; /* static */
    char model[128];
    int has_model, status;
    long long cached_tokens;
    double ttft_ms;
    json_t *cc; /* NULL = empty slot or none */
    int used;
} entry;

struct cg_recent_ring {
    pthread_mutex_t mu;
    entry slot[CG_STATUS_RECENT];
    size_t next; /* slot the next request goes to */
    uint64_t requests, errors;
    uint64_t started_ms; /* wall clock at creation */
};

cg_recent_ring *cg_recent_ring_new(void)
{
    cg_recent_ring *r = cg_calloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    r->started_ms = cg_wall_ms();
    return r;
}

void cg_recent_ring_free(cg_recent_ring **rp)
{
    cg_recent_ring *r = *rp;
    if (!r) return;
    *rp = NULL;
    for (size_t i = 0; i < CG_STATUS_RECENT; i++)
        json_decref(r->slot[i].cc);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* A string field of o, or NULL. */
static const char *str_of(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

/* The page's form of one request: only what it shows. */
static json_t *entry_json(const entry *rec)
{
    json_t *cc = rec->cc;
    json_t *segs = json_array();
    size_t n = 0, hits = 0, all = 0;
    json_t *s;
    json_array_foreach(json_object_get(cc, "segments"), all, s)
    {
        int hit = json_is_true(json_object_get(s, "hit"));
        hits += hit;
        if (n++ >= SEGS_KEPT) continue;
        json_t *tok = json_object_get(s, "tokens");
        json_array_append_new(segs, json_pack("{s:s?, s:s?, s:b, s:O?, s:s?}", "key",
                                              str_of(s, "key"), "role", str_of(s, "role"), "hit",
                                              hit, "tokens", json_is_integer(tok) ? tok : NULL,
                                              "tier", str_of(s, "tier")));
    }
    json_t *e = json_pack(
        "{s:I, s:s, s:s?, s:i, s:o, s:I, s:I, s:o}", "time_ms", (json_int_t)rec->time_ms, "route",
        rec->route ? rec->route : "", "model", rec->has_model ? rec->model : NULL, "status",
        rec->status, "segments", segs, "segments_total", (json_int_t)n, "hits", (json_int_t)hits,
        "ttft_ms", rec->ttft_ms >= 0 ? json_real(round(rec->ttft_ms * 10) / 10) : json_null());
    json_object_set_new(e, "cached_tokens",
                        rec->cached_tokens >= 0 ? json_integer(rec->cached_tokens) : json_null());
    /* worker is a URL on the main path, null for a fallback (chunk_cache says so). */
    json_object_set_new(e, "worker",
                        str_of(cc, "worker") ? json_string(str_of(cc, "worker")) : json_null());
    json_object_set_new(e, "fallback", json_boolean(json_is_true(json_object_get(cc, "fallback"))));
    json_object_set_new(e, "passthrough",
                        json_boolean(json_is_true(json_object_get(cc, "passthrough"))));
    json_object_set_new(e, "fallback_reason",
                        str_of(cc, "fallback_reason") ? json_string(str_of(cc, "fallback_reason"))
                                                      : json_null());
    json_object_set_new(e, "routing",
                        str_of(cc, "routing") ? json_string(str_of(cc, "routing")) : json_null());
    json_t *rt = json_object_get(cc, "recomputed_tokens"), *q = json_object_get(cc, "quality");
    json_object_set_new(e, "recomputed_tokens", json_is_integer(rt) ? json_copy(rt) : json_null());
    json_object_set_new(e, "quality",
                        json_is_object(q)
                            ? json_pack("{s:O?, s:O?, s:O?}", "kl", json_object_get(q, "kl"),
                                        "top1_agree", json_object_get(q, "top1_agree"),
                                        "tokens_compared", json_object_get(q, "tokens_compared"))
                            : json_null());
    return e;
}

void cg_recent_ring_add(cg_recent_ring *r, const cg_recent_rec *rec)
{
    if (!r) return;
    entry e = {.time_ms = cg_wall_ms(),
               .route = rec->route,
               .has_model = rec->model != NULL,
               .status = rec->status,
               .cached_tokens = rec->cached_tokens,
               .ttft_ms = rec->ttft_ms,
               .cc = json_incref(rec->chunk_cache),
               .used = 1};
    if (rec->model) snprintf(e.model, sizeof e.model, "%s", rec->model);
    json_t *old;
    pthread_mutex_lock(&r->mu);
    old = r->slot[r->next].cc;
    r->slot[r->next] = e;
    r->next = (r->next + 1) % CG_STATUS_RECENT;
    r->requests++;
    r->errors += rec->status >= 400;
    pthread_mutex_unlock(&r->mu);
    json_decref(old);
}

void cg_recent_ring_totals(cg_recent_ring *r, uint64_t *requests, uint64_t *errors)
{
    pthread_mutex_lock(&r->mu);
    *requests = r->requests;
    *errors = r->errors;
    pthread_mutex_unlock(&r->mu);
}

json_t *cg_recent_ring_json(cg_recent_ring *r)
{
    json_t *out = json_array();
    pthread_mutex_lock(&r->mu);
    for (size_t i = 1; i <= CG_STATUS_RECENT; i++) {
        const entry *e = &r->slot[(r->next + CG_STATUS_RECENT - i) % CG_STATUS_RECENT];
        if (e->used) json_array_append_new(out, entry_json(e));
    }
    pthread_mutex_unlock(&r->mu);
    return out;
}

/* ---------------------------------------------------------------- GET /v1/stats */

/* One setting's figures summed over the workers. */
typedef struct qrow {
    const char *mode, *ratio, *prefix, *select; /* borrowed from the worker list */
    double requests, tokens, agreed, kl_sum;
} qrow;

/* The workers' canaries (each /healthz summary) added up per setting: requests and positions
 * summed, agreement weighted by positions, mean KL by requests. */
static json_t *quality_json(json_t *workers)
{
    qrow rows[512];
    size_t n = 0, i, k;
    double req = 0, tok = 0, agr = 0, kl = 0, dropped = 0, failed = 0;
    json_t *w, *st;
    json_array_foreach(workers, i, w)
    {
        json_t *c = json_object_get(w, "canary");
        if (!json_is_object(c)) continue;
        dropped += json_number_value(json_object_get(c, "dropped"));
        failed += json_number_value(json_object_get(c, "failed"));
        json_array_foreach(json_object_get(c, "settings"), k, st)
        {
            const char *mode = str_of(st, "mode"), *ratio = str_of(st, "recompute_ratio");
            const char *prefix = str_of(st, "recompute_prefix_tokens");
            const char *select = str_of(st, "recompute_select");
            if (!mode || !ratio || !prefix) continue;
            if (!select) select = "deviation"; /* a worker from before the field */
            double rq = json_number_value(json_object_get(st, "requests"));
            double tk = json_number_value(json_object_get(st, "tokens_compared"));
            double ag = json_number_value(json_object_get(st, "top1_agreement")) * tk;
            double ks = json_number_value(json_object_get(st, "kl_mean")) * rq;
            req += rq, tok += tk, agr += ag, kl += ks;
            size_t j = 0;
            while (j < n && (strcmp(rows[j].mode, mode) || strcmp(rows[j].ratio, ratio) ||
                             strcmp(rows[j].prefix, prefix) || strcmp(rows[j].select, select)))
                j++;
            if (j == n) {
                if (n == CG_ARRAY_LEN(rows)) continue;
                rows[n++] = (qrow){mode, ratio, prefix, select, 0, 0, 0, 0};
            }
            rows[j].requests += rq, rows[j].tokens += tk, rows[j].agreed += ag;
            rows[j].kl_sum += ks;
        }
    }
    json_t *settings = json_array();
    for (size_t j = 0; j < n; j++)
        json_array_append_new(
            settings,
            json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:o, s:o}", "mode", rows[j].mode,
                      "recompute_ratio", rows[j].ratio, "recompute_prefix_tokens", rows[j].prefix,
                      "recompute_select", rows[j].select, "requests", (json_int_t)rows[j].requests,
                      "tokens_compared", (json_int_t)rows[j].tokens, "top1_agreement",
                      rows[j].tokens > 0 ? json_real(rows[j].agreed / rows[j].tokens) : json_null(),
                      "kl_mean",
                      rows[j].requests > 0 ? json_real(rows[j].kl_sum / rows[j].requests)
                                           : json_null()));
    return json_pack("{s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "requests", (json_int_t)req,
                     "tokens_compared", (json_int_t)tok, "dropped", (json_int_t)dropped, "failed",
                     (json_int_t)failed, "top1_agreement",
                     tok > 0 ? json_real(agr / tok) : json_null(), "kl_mean",
                     req > 0 ? json_real(kl / req) : json_null(), "settings", settings);
}

/* A ratio as a percentage rounded to one decimal, so the page and its readers print the same
 * digits (no half-way cases left for two rounding rules to disagree on). */
static double pct(double part, double whole)
{
    return whole > 0 ? round(part / whole * 1000) / 10 : 0;
}

void cg_gw_status_stats(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    uint64_t requests = 0, errors = 0;
    cg_recent_ring_totals(g->recent, &requests, &errors);
    double hits = cg_metric_value(g->m_hits), misses = cg_metric_value(g->m_misses);
    double reused = cg_metric_value(g->m_reused), computed = cg_metric_value(g->m_computed);
    json_t *index = json_null();
    cg_index_stats is;
    if (cg_index_stats_get(g->index, &is) == CG_OK)
        index = json_pack("{s:I, s:I, s:I, s:I}", "chunks", (json_int_t)is.chunks, "placements",
                          (json_int_t)is.placements, "bytes", (json_int_t)is.bytes, "queue_depth",
                          (json_int_t)is.queue_depth);
    json_t *wl = cg_workers_list_json(g->workers);
    json_t *workers = json_pack(
        "{s:I, s:I, s:O}", "registered", (json_int_t)cg_workers_count(g->workers), "healthy",
        (json_int_t)cg_workers_healthy(g->workers), "data", json_object_get(wl, "data"));
    json_t *quality = quality_json(json_object_get(wl, "data"));
    json_decref(wl);
    uint64_t now = cg_wall_ms();
    json_t *out = json_pack(
        "{s:s, s:I, s:I, s:{s:I, s:I}, s:{s:I, s:I, s:f}, s:{s:I, s:I, s:f}, s:{s:I, s:I}, "
        "s:o, s:o, s:o, s:o}",
        "object", "stats", "time_ms", (json_int_t)now, "uptime_s",
        (json_int_t)((now - g->recent->started_ms) / 1000), "requests", "total",
        (json_int_t)requests, "errors", (json_int_t)errors, "segments", "hits", (json_int_t)hits,
        "misses", (json_int_t)misses, "hit_rate_pct", pct(hits, hits + misses), "tokens", "reused",
        (json_int_t)reused, "computed", (json_int_t)computed, "reused_pct",
        pct(reused, reused + computed), "fallbacks", "total",
        (json_int_t)cg_metric_value(g->m_fallbacks), "passthrough",
        (json_int_t)cg_metric_value(g->m_passthrough), "index", index, "workers", workers,
        "quality", quality, "recent", cg_recent_ring_json(g->recent));
    cg_http_add_header(req, "Cache-Control", "no-store");
    cg_http_reply_json(req, 200, out);
}

/* ---------------------------------------------------------------- GET / */

/* The page. Every value is written with textContent (never innerHTML): model names and
 * worker errors come from clients and workers. With --admin-token the page reads the token
 * from the URL fragment (#token=...), which browsers never send to the server or in
 * Referer, and presents it as a bearer header. */
static const char PAGE[] =
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n"
    "<title>chunkgate status</title>\n<style>\n"
    "body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1c1e21}\n"
    "header{background:#1f2937;color:#fff;padding:10px 20px;display:flex;gap:16px;"
    "align-items:baseline}\nheader h1{font-size:18px;margin:0}\n#err{color:#fca5a5}\n"
    "main{padding:16px 20px}\n.cards{display:flex;flex-wrap:wrap;gap:12px}\n"
    ".card{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:10px 14px;"
    "min-width:150px}\n.card .v{font-size:26px;font-weight:600}\n.card .l{color:#6b7280}\n"
    "h2{font-size:15px;margin:20px 0 6px}\ntable{border-collapse:collapse;background:#fff;"
    "width:100%}\nth,td{border:1px solid #e5e7eb;padding:4px 8px;text-align:left;"
    "vertical-align:top}\nth{background:#f3f4f6}\n.ok{color:#047857}.bad{color:#b91c1c}\n"
    ".seg{display:inline-block;margin:1px;padding:0 4px;border-radius:3px;font-size:12px;"
    "background:#fee2e2}\n.seg.hit{background:#d1fae5}\n.seg.question{background:#e5e7eb}\n"
    "</style></head><body>\n"
    "<header><h1>chunkgate</h1><span id=\"updated\">loading</span><span id=\"err\"></span>"
    "</header>\n<main>\n<div class=\"cards\">\n"
    "<div class=\"card\"><div class=\"v\" id=\"hit-rate\">-</div><div class=\"l\">chunk hit "
    "rate (<span id=\"hits\">-</span> hits, <span id=\"misses\">-</span> misses)</div></div>\n"
    "<div class=\"card\"><div class=\"v\" id=\"tokens-reused\">-</div><div class=\"l\">tokens "
    "saved (KV reused; <span id=\"reused-pct\">-</span> of <span id=\"tokens-total\">-</span> "
    "prompt tokens)</div></div>\n"
    "<div class=\"card\"><div class=\"v\" id=\"chunks\">-</div><div class=\"l\">chunks indexed "
    "(<span id=\"placements\">-</span> placements)</div></div>\n"
    "<div class=\"card\"><div class=\"v\" id=\"requests\">-</div><div class=\"l\">requests "
    "(<span id=\"errors\">-</span> errors, <span id=\"fallbacks\">-</span> fallbacks)</div>"
    "</div>\n"
    "<div class=\"card\"><div class=\"v\" id=\"workers-healthy\">-</div><div class=\"l\">"
    "workers healthy</div></div>\n"
    "<div class=\"card\"><div class=\"v\" id=\"q-agree\">-</div><div class=\"l\">top-1 "
    "agreement of reuse with a full forward (canary: <span id=\"q-requests\">-</span> "
    "requests, mean KL <span id=\"q-kl\">-</span>)</div></div>\n</div>\n"
    "<h2>Workers</h2>\n<table><thead><tr><th>url</th><th>state</th><th>in flight</th>"
    "<th>routed</th><th>errors</th><th>chunks</th><th>last error</th></tr></thead>"
    "<tbody id=\"workers\"></tbody></table>\n"
    "<h2>Reuse quality (canary: reused KV vs a full causal forward of the same tokens)</h2>\n"
    "<table><thead><tr><th>mode</th><th>recompute ratio</th><th>recompute prefix tokens</th>"
    "<th>recompute select</th><th>requests</th><th>positions compared</th><th>top-1 "
    "agreement</th><th>mean KL (nats)"
    "</th></tr></thead><tbody id=\"quality\"></tbody></table>\n"
    "<h2>Recent requests</h2>\n<table><thead><tr><th>time</th><th>route</th><th>model</th>"
    "<th>status</th><th>worker</th><th>routing</th><th>cached tokens</th><th>recomputed</th>"
    "<th>ttft ms</th><th>quality (KL / top-1)</th>"
    "<th>segments (role tokens, green = hit)</th></tr></thead><tbody id=\"recent\"></tbody>"
    "</table>\n</main>\n<script>\n"
    "'use strict';\n"
    "var m=/(?:^#|&)token=([^&]*)/.exec(location.hash),tok=m?decodeURIComponent(m[1]):'';\n"
    "function $(id){return document.getElementById(id)}\n"
    "function set(id,v){$(id).textContent=String(v)}\n"
    "function cell(tr,v,cls){var td=document.createElement('td');td.textContent="
    "v===null||v===undefined?'-':String(v);if(cls)td.className=cls;tr.appendChild(td);"
    "return td}\n"
    "function fill(id,rows,f){var tb=$(id);while(tb.firstChild)tb.removeChild(tb.firstChild);"
    "rows.forEach(function(r){var tr=document.createElement('tr');f(tr,r);tb.appendChild(tr)})}"
    "\n"
    "function render(s){\n"
    " set('hit-rate',s.segments.hit_rate_pct.toFixed(1)+'%');set('hits',s.segments.hits);"
    "set('misses',s.segments.misses);\n"
    " set('tokens-reused',s.tokens.reused);set('reused-pct',s.tokens.reused_pct.toFixed(1)+'%');"
    "set('tokens-total',s.tokens.reused+s.tokens.computed);\n"
    " set('chunks',s.index?s.index.chunks:'-');set('placements',s.index?s.index.placements:'-');"
    "\n"
    " set('requests',s.requests.total);set('errors',s.requests.errors);"
    "set('fallbacks',s.fallbacks.total);\n"
    " set('workers-healthy',s.workers.healthy+' / '+s.workers.registered);\n"
    " var Q=s.quality;set('q-agree',Q.top1_agreement==null?'-':(Q.top1_agreement*100).toFixed(1)"
    "+'%');set('q-requests',Q.requests);set('q-kl',Q.kl_mean==null?'-':Q.kl_mean.toPrecision(3));"
    "\n"
    " fill('quality',Q.settings,function(tr,x){cell(tr,x.mode);cell(tr,x.recompute_ratio);"
    "cell(tr,x.recompute_prefix_tokens);cell(tr,x.recompute_select);cell(tr,x.requests);cell(tr,x."
    "tokens_compared);"
    "cell(tr,x.top1_agreement==null?null:(x.top1_agreement*100).toFixed(1)+'%');"
    "cell(tr,x.kl_mean==null?null:x.kl_mean.toPrecision(3))});\n"
    " fill('workers',s.workers.data,function(tr,w){cell(tr,w.url);"
    "cell(tr,w.state,w.healthy?'ok':'bad');cell(tr,w.in_flight);cell(tr,w.routed);"
    "cell(tr,w.errors);cell(tr,w.synced_chunks);cell(tr,w.last_error)});\n"
    " fill('recent',s.recent,function(tr,q){cell(tr,new Date(q.time_ms).toLocaleTimeString());"
    "cell(tr,q.route);cell(tr,q.model);cell(tr,q.status,q.status<400?'ok':'bad');"
    "cell(tr,q.worker);cell(tr,q.fallback?'fallback: '+(q.fallback_reason||'-'):"
    "q.passthrough?'passthrough':q.routing);cell(tr,q.cached_tokens);"
    "cell(tr,q.recomputed_tokens);cell(tr,q.ttft_ms);"
    "cell(tr,q.quality?q.quality.kl.toPrecision(3)+' / '+(q.quality.top1_agree*100).toFixed(0)"
    "+'%':null);\n"
    "  var td=cell(tr,q.hits+'/'+q.segments_total+' hit ');q.segments.forEach(function(g){"
    "var sp=document.createElement('span');sp.className='seg '+g.role+(g.hit?' hit':'');"
    "sp.title=g.key||'';sp.textContent=g.role+' '+(g.tokens==null?'?':g.tokens);"
    "td.appendChild(sp)})});\n"
    " set('updated','updated '+new Date(s.time_ms).toLocaleTimeString()+', up '+s.uptime_s+' s');"
    "set('err','');\n}\n"
    "function load(){var h=tok?{Authorization:'Bearer '+tok}:{};\n"
    " fetch('/v1/stats',{headers:h,cache:'no-store'}).then(function(r){if(!r.ok)throw new "
    "Error('GET /v1/stats: HTTP '+r.status+(r.status===401?' (open this page as /#token=ADMIN_"
    "TOKEN)':''));return r.json()}).then(render).catch(function(e){set('err',e.message)})}\n"
    "load();setInterval(load,2000);\n</script></body></html>\n";

void cg_gw_status_page(cg_http_req *req, void *app)
{
    (void)app;
    cg_http_add_header(req, "Cache-Control", "no-store");
    /* Inline script and style only; nothing is fetched from anywhere but this origin. */
    cg_http_add_header(req, "Content-Security-Policy",
                       "default-src 'none'; script-src 'unsafe-inline'; style-src "
                       "'unsafe-inline'; connect-src 'self'");
    cg_http_reply_raw(req, 200, "text/html; charset=utf-8", PAGE, sizeof PAGE - 1);
}
