/* Pulling a remote assembly's KV with N tensor-parallel rank threads, one libcurl request per
 * rank for exactly its KV heads, checked against the local model, then adopted by the engine. */
#include "worker/serve/kvpull.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"
#include "kv/kvwire.h"

#define URL_MAX 1024
/* Room for a CGKV header before the payload whose size is known in advance. */
#define HEADER_ROOM (CG_KVWIRE_FIXED_BYTES + CG_KVWIRE_MODEL_MAX + CG_KVWIRE_ALIGN)

cg_kvpull_params cg_kvpull_default_params(void)
{
    return (cg_kvpull_params){
        .tp = 1,
        .timeout_ms = 30000,
        .release = 1,
    };
}

cg_status cg_tp_check(int n_kv_heads, int tp)
{
    if (n_kv_heads <= 0 || tp <= 0) return CG_E_VALUE;
    return n_kv_heads % tp == 0 || tp % n_kv_heads == 0 ? CG_OK : CG_E_VALUE;
}

cg_tp_slice cg_tp_slice_of(int n_kv_heads, int tp, int rank)
{
    if (tp <= n_kv_heads) {
        int per = n_kv_heads / tp;
        return (cg_tp_slice){rank * per, per, 1};
    }
    int put_step = tp / n_kv_heads;
    return (cg_tp_slice){rank / put_step, 1, rank % put_step == 0};
}

int cg_kvpull_url_ok(const char *url)
{
    if (!url) return 0;
    size_t n = strlen(url);
    if (n > URL_MAX) return 0;
    size_t scheme = !strncmp(url, "http://", 7) ? 7 : !strncmp(url, "https://", 8) ? 8 : 0;
    if (!scheme || n == scheme) return 0;
    for (size_t i = 0; i < n; i++)
        if (url[i] <= 0x20 || url[i] >= 0x7f) return 0;
    return 1;
}

/* Length of url without a trailing "/", "/v1" or "/v1/". */
static size_t base_len(const char *url)
{
    size_t n = strlen(url);
    if (n && url[n - 1] == '/') n--;
    if (n >= 3 && !memcmp(url + n - 3, "/v1", 3)) n -= 3;
    return n;
}

int cg_kvpull_url_same(const char *a, const char *b)
{
    size_t na = base_len(a), nb = base_len(b);
    return na == nb && !memcmp(a, b, na);
}

static int id_ok(const char *id)
{
    if (!id || strlen(id) != 32) return 0;
    for (int i = 0; i < 32; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f'))) return 0;
    return 1;
}

/* ---- one HTTP exchange ---- */

typedef struct xfer {
    cg_buf body; /* capped: a larger reply is cut off and refused */
    int too_big;
    long status;
    CURLcode rc;
    /* headers of the logits reply */
    char model[CG_KVWIRE_MODEL_MAX + 1];
    long long tokens, cached, vocab;
} xfer;

static size_t on_body(char *p, size_t sz, size_t n, void *ud)
{
    xfer *x = ud;
    if (cg_buf_append(&x->body, p, sz * n) != CG_OK) {
        x->too_big = 1;
        return 0; /* aborts the transfer */
    }
    return sz * n;
}

/* Copies the value of header `name` from line into out when the line is that header. */
static int header_value(const char *line, size_t n, const char *name, char *out, size_t cap)
{
    size_t k = strlen(name);
    if (n <= k + 1 || strncasecmp(line, name, k) != 0 || line[k] != ':') return 0;
    const char *v = line + k + 1;
    size_t len = n - k - 1;
    while (len && (*v == ' ' || *v == '\t'))
        v++, len--;
    while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' '))
        len--;
    if (len >= cap) len = cap - 1;
    memcpy(out, v, len);
    out[len] = '\0';
    return 1;
}

static long long header_int(const char *s)
{
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    return *s && end && *end == '\0' && v >= 0 ? v : -1;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud)
{
    xfer *x = ud;
    size_t len = sz * n;
    char v[CG_KVWIRE_MODEL_MAX + 1];
    if (header_value(p, len, "X-Model", v, sizeof v))
        snprintf(x->model, sizeof x->model, "%s", v);
    else if (header_value(p, len, "X-KV-Tokens", v, sizeof v))
        x->tokens = header_int(v);
    else if (header_value(p, len, "X-Cached-Tokens", v, sizeof v))
        x->cached = header_int(v);
    else if (header_value(p, len, "X-Vocab-Size", v, sizeof v))
        x->vocab = header_int(v);
    return len;
}

/* Performs one request; the reply body lands in x->body (at most cap bytes). */
static void http_do(const char *method, const char *url, const char *api_key, long timeout_ms,
                    size_t cap, xfer *x)
{
    struct curl_slist *h = NULL;
    cg_buf_init(&x->body, cap);
    x->tokens = x->cached = x->vocab = -1;
    CURL *c = curl_easy_init();
    if (!c) {
        x->rc = CURLE_FAILED_INIT;
        return;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    if (api_key && *api_key) {
        size_t n = strlen(api_key) + 32;
        char *line = cg_malloc(n);
        snprintf(line, n, "Authorization: Bearer %s", api_key);
        h = curl_slist_append(h, line);
        explicit_bzero(line, n);
        free(line);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    }
    x->rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &x->status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
}

static void xfer_free(xfer *x)
{
    cg_buf_free(&x->body);
}

/* Maps a failed exchange to a status and a message. */
static cg_status xfer_status(const xfer *x, const char *what, char *err, size_t errlen)
{
    if (x->too_big) {
        cg_seterr(err, errlen, "%s: the reply is larger than expected", what);
        return CG_E_BAD_GATEWAY;
    }
    if (x->rc == CURLE_OPERATION_TIMEDOUT) {
        cg_seterr(err, errlen, "%s: timed out", what);
        return CG_E_TIMEOUT;
    }
    if (x->rc != CURLE_OK) {
        cg_seterr(err, errlen, "%s: %s", what, curl_easy_strerror(x->rc));
        return x->rc == CURLE_COULDNT_CONNECT || x->rc == CURLE_COULDNT_RESOLVE_HOST
                   ? CG_E_UNAVAILABLE
                   : CG_E_BAD_GATEWAY;
    }
    if (x->status == 404) {
        cg_seterr(err, errlen,
                  "%s: the source worker does not know the assembly (expired, "
                  "consumed or never made)",
                  what);
        return CG_E_NOT_FOUND;
    }
    if (x->status != 200) {
        cg_seterr(err, errlen, "%s: the source worker answered HTTP %ld", what, x->status);
        return CG_E_BAD_GATEWAY;
    }
    return CG_OK;
}

/* ---- ranks ---- */

typedef struct pull {
    const cg_model_config *cfg;
    const cg_kvpull_params *p;
    const char *base; /* worker URL without a trailing '/' */
    uint32_t n_tokens;
    cg_kv *kv;
} pull;

typedef struct rank {
    const pull *P;
    int r;
    cg_tp_slice s;
    xfer x;
    const float *payload; /* into x.body after a good decode */
    cg_status st;
    char err[384];
} rank;

static void *rank_main(void *arg)
{
    rank *k = arg;
    const pull *P = k->P;
    const cg_model_config *c = P->cfg;
    char url[URL_MAX + 128];
    int h1 = k->s.head0 + k->s.n_heads - 1;
    snprintf(url, sizeof url, "%s/v1/assemblies/%s/kv?heads=%d-%d", P->base, P->p->assembly_id,
             k->s.head0, h1);
    size_t payload = (size_t)k->s.n_heads * (size_t)c->n_layers * 2 * P->n_tokens *
                     (size_t)c->head_dim * sizeof(float);
    char what[96];
    snprintf(what, sizeof what, "rank %d: KV heads %d-%d", k->r, k->s.head0, h1);
    http_do("GET", url, P->p->api_key, P->p->timeout_ms, HEADER_ROOM + payload, &k->x);
    if ((k->st = xfer_status(&k->x, what, k->err, sizeof k->err)) != CG_OK) return NULL;
    cg_kvwire_header h;
    cg_status st = cg_kvwire_decode(k->x.body.data, k->x.body.len, &h, &k->payload);
    if (st != CG_OK) {
        cg_seterr(k->err, sizeof k->err, "%s: the body is not valid CGKV v1 (%s)", what,
                  cg_status_name(st));
        k->st = CG_E_BAD_GATEWAY;
        return NULL;
    }
    /* The same model and geometry, or the KV would be decoded by the wrong weights. */
    if (strcmp(h.model, c->kv_model) != 0 || h.n_layers != (uint32_t)c->n_layers ||
        h.head_dim != (uint32_t)c->head_dim || h.total_kv_heads != (uint32_t)c->n_kv_heads) {
        cg_seterr(k->err, sizeof k->err,
                  "%s: the source sends KV of model '%s' (%u layers, %u KV heads, head_dim %u) but "
                  "this backend serves '%s' (%d layers, %d KV heads, head_dim %d); refused",
                  what, h.model, h.n_layers, h.total_kv_heads, h.head_dim, c->kv_model, c->n_layers,
                  c->n_kv_heads, c->head_dim);
        k->st = CG_E_BAD_GATEWAY;
        return NULL;
    }
    if (h.n_tokens != P->n_tokens || h.head_start != (uint32_t)k->s.head0 ||
        h.n_heads != (uint32_t)k->s.n_heads) {
        cg_seterr(k->err, sizeof k->err,
                  "%s: the source sent %u tokens of heads %u+%u, expected %u tokens of heads %d+%d",
                  what, h.n_tokens, h.head_start, h.n_heads, P->n_tokens, k->s.head0, k->s.n_heads);
        k->st = CG_E_BAD_GATEWAY;
        return NULL;
    }
    if (k->s.leader) {
        /* Ranks own disjoint heads, and the KV keeps one plane per (layer, head): no two
         * leaders write the same bytes. */
        const size_t plane = (size_t)P->n_tokens * (size_t)c->head_dim * sizeof(float);
        for (uint32_t hr = 0; hr < h.n_heads; hr++)
            for (uint32_t l = 0; l < h.n_layers; l++) {
                int head = k->s.head0 + (int)hr;
                memcpy(cg_kv_k(P->kv, (int)l, head),
                       k->payload + cg_kvwire_rows_offset(&h, hr, l, 0), plane);
                memcpy(cg_kv_v(P->kv, (int)l, head),
                       k->payload + cg_kvwire_rows_offset(&h, hr, l, 1), plane);
            }
    }
    k->st = CG_OK;
    return NULL;
}

/* A rank that shares its head with a leader must have received the same bytes. */
static int same_as_leader(const pull *P, const rank *k)
{
    const cg_model_config *c = P->cfg;
    const size_t plane = (size_t)P->n_tokens * (size_t)c->head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        const float *src = k->payload + (size_t)l * 2 * plane;
        if (memcmp(cg_kv_k(P->kv, l, k->s.head0), src, plane * sizeof(float)) != 0 ||
            memcmp(cg_kv_v(P->kv, l, k->s.head0), src + plane, plane * sizeof(float)) != 0)
            return 0;
    }
    return 1;
}

/* Checks the request before any connection. */
static cg_status check_params(const cg_model_config *c, const cg_kvpull_params *p, char *err,
                              size_t errlen)
{
    if (!cg_kvpull_url_ok(p->worker)) {
        cg_seterr(err, errlen,
                  "the source worker URL must be http:// or https://, printable, at most %d bytes",
                  URL_MAX);
        return CG_E_VALUE;
    }
    if (!id_ok(p->assembly_id)) {
        cg_seterr(err, errlen, "assembly '%.64s' is unknown (an id is 32 lowercase hex characters)",
                  p->assembly_id ? p->assembly_id : "");
        return CG_E_NOT_FOUND;
    }
    if (p->tp < 1 || p->tp > 1024 || cg_tp_check(c->n_kv_heads, p->tp) != CG_OK) {
        cg_seterr(err, errlen, "tp %d cannot split %d KV heads", p->tp, c->n_kv_heads);
        return CG_E_VALUE;
    }
    return CG_OK;
}

/* 1. GET the logits of the last prompt token and the sizes; checks they fit this model. */
static cg_status fetch_logits(const cg_model_config *c, const cg_kvpull_params *p, const char *base,
                              xfer *lx, char *err, size_t errlen)
{
    char url[URL_MAX + 128];
    snprintf(url, sizeof url, "%s/v1/assemblies/%s/logits", base, p->assembly_id);
    const size_t logits_bytes = (size_t)c->vocab_size * sizeof(float);
    http_do("GET", url, p->api_key, p->timeout_ms, logits_bytes, lx);
    cg_status st = xfer_status(lx, "logits", err, errlen);
    if (st != CG_OK) return st;
    if (strcmp(lx->model, c->kv_model) != 0 || lx->vocab != c->vocab_size ||
        lx->body.len != logits_bytes) {
        cg_seterr(err, errlen,
                  "the source serves model '%s' with %lld logits (%zu bytes) but this backend "
                  "serves '%s' with %d: another model or checkpoint (the part after '#' "
                  "fingerprints the weights); refused",
                  lx->model, lx->vocab, lx->body.len, c->kv_model, c->vocab_size);
        return CG_E_BAD_GATEWAY;
    }
    if (lx->tokens < 1 || lx->tokens > c->max_pos || lx->cached < 0 || lx->cached > lx->tokens) {
        cg_seterr(err, errlen,
                  "the source reports %lld prompt tokens (%lld cached); this model holds %d "
                  "positions",
                  lx->tokens, lx->cached, c->max_pos);
        return lx->tokens > c->max_pos ? CG_E_CONTEXT : CG_E_BAD_GATEWAY;
    }
    return CG_OK;
}

/* 2. The ranks, each on its own thread and connection for exactly its heads; the ranks that
 * share a head must agree with its leader. */
static cg_status run_ranks(pull *P, cg_kvpull_result *res, char *err, size_t errlen)
{
    const cg_model_config *c = P->cfg;
    const int tp = P->p->tp;
    rank *ranks = cg_calloc((size_t)tp, sizeof *ranks);
    pthread_t *th = cg_calloc((size_t)tp, sizeof *th);
    int n_started = 0;
    cg_status st = CG_OK;
    for (int r = 0; r < tp; r++) {
        ranks[r] = (rank){.P = P, .r = r, .s = cg_tp_slice_of(c->n_kv_heads, tp, r)};
        if (pthread_create(&th[r], NULL, rank_main, &ranks[r]) != 0) {
            cg_seterr(err, errlen, "cannot start rank thread %d", r);
            st = CG_E_INTERNAL;
            break;
        }
        n_started++;
    }
    for (int r = 0; r < n_started; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; st == CG_OK && r < tp; r++) {
        res->kv_requests++;
        res->kv_bytes += ranks[r].x.body.len;
        if (ranks[r].st != CG_OK) {
            cg_seterr(err, errlen, "%s", ranks[r].err);
            st = ranks[r].st;
        }
    }
    for (int r = 0; st == CG_OK && r < tp; r++) {
        if (!ranks[r].s.leader && !same_as_leader(P, &ranks[r])) {
            cg_seterr(err, errlen, "rank %d received other bytes for KV head %d than rank %d", r,
                      ranks[r].s.head0, r - r % (tp / c->n_kv_heads));
            st = CG_E_BAD_GATEWAY;
        }
    }
    for (int r = 0; r < n_started; r++)
        xfer_free(&ranks[r].x);
    free(ranks);
    free(th);
    return st;
}

/* 3. The source's assembly is no longer needed, whether or not the pull worked: it holds pool
 * references there until released. */
static void release_source(const cg_kvpull_params *p, const char *base, cg_kvpull_result *res)
{
    if (!p->release) return;
    char url[URL_MAX + 128];
    xfer dx = {0};
    snprintf(url, sizeof url, "%s/v1/assemblies/%s", base, p->assembly_id);
    http_do("DELETE", url, p->api_key, p->timeout_ms, 4096, &dx);
    res->released = dx.rc == CURLE_OK && dx.status == 200;
    if (!res->released)
        cg_log(CG_LOG_WARN, "kv pull: DELETE %s: %s, HTTP %ld", url, curl_easy_strerror(dx.rc),
               dx.status);
    xfer_free(&dx);
}

cg_status cg_kvpull_assembly(cg_engine *e, const cg_kvpull_params *p, uint64_t now,
                             cg_kvpull_result *res, char *err, size_t errlen)
{
    const cg_model_config *c = cg_model_cfg(cg_engine_model(e));
    const uint64_t t0 = cg_now_ns();
    char base[URL_MAX + 1];
    xfer lx = {0};
    cg_kv *kv = NULL;
    memset(res, 0, sizeof *res);
    if (err && errlen) err[0] = '\0';
    cg_status st = check_params(c, p, err, errlen);
    if (st != CG_OK) return st;
    snprintf(base, sizeof base, "%s", p->worker);
    for (size_t n = strlen(base); n && base[n - 1] == '/'; n--)
        base[n - 1] = '\0';

    st = fetch_logits(c, p, base, &lx, err, errlen);
    if (st == CG_E_NOT_FOUND) goto out; /* nothing to release */
    if (st == CG_OK && p->decode_tokens &&
        (st = cg_engine_fits(c->max_pos, (uint64_t)lx.tokens, p->decode_tokens, err, errlen)) !=
            CG_OK)
        goto out; /* the source keeps its assembly: the request may come again with fewer */
    if (st == CG_OK) {
        const uint32_t n_tokens = (uint32_t)lx.tokens;
        uint64_t cap = CG_MIN((uint64_t)n_tokens + cg_engine_get_params(e).reserve_tokens,
                              (uint64_t)c->max_pos);
        kv = cg_kv_new(cg_engine_model(e), (uint32_t)CG_MAX(cap, (uint64_t)n_tokens));
        pull P = {.cfg = c, .p = p, .base = base, .n_tokens = n_tokens, .kv = kv};
        st = run_ranks(&P, res, err, errlen);
    }
    release_source(p, base, res);
    if (st != CG_OK) goto out;

    /* 4. a local assembly that complete decodes like one built here */
    res->n_tokens = (uint32_t)lx.tokens;
    res->cached_tokens = (uint32_t)lx.cached;
    st = cg_engine_adopt(e, &kv, res->n_tokens, res->cached_tokens, (const float *)lx.body.data,
                         now, res->id);
    if (st != CG_OK)
        cg_seterr(err, errlen, "cannot keep the pulled assembly here (%s)", cg_status_name(st));
out:
    res->seconds = (double)(cg_now_ns() - t0) / 1e9;
    if (st == CG_OK)
        cg_log(CG_LOG_INFO,
               "kv pull: assembly %s from %s: %u tokens, tp %d, %d KV requests, %llu bytes, "
               "%.1f ms, local %s",
               p->assembly_id, base, res->n_tokens, p->tp, res->kv_requests,
               (unsigned long long)res->kv_bytes, res->seconds * 1e3, res->id);
    cg_kv_free(&kv);
    xfer_free(&lx);
    return st;
}
