/* The pass-through fast path (server/fastpath.h). */
#include "server/fastpath.h"

#include <emmintrin.h>
#include <stdio.h>
#include <string.h>
#include "cache/split.h"
#include "server/fields.h"
#include "server/gwstate.h"
#include "server/orchestrate.h"
#include "server/relay.h"

/* Largest body the fast path looks at: it runs on an HTTP thread, which must stay quick. */
#define FAST_MAX_BODY (256u << 10)
#define FAST_MAX_MEMBERS 64

/* ---------------------------------------------------------------- the scan */

typedef struct scan {
    const char *p, *e;
    size_t values;
    const cg_json_limits *l;
} scan;

static void ws(scan *s)
{
    while (s->p < s->e && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int hex4(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d > 15) return 0;
        *v = *v << 4 | d;
    }
    return 1;
}

/* The first byte at or after p (before e) that is '"', '\\' or a control byte, or e: 16 bytes
 * at a time (SSE2), as a prompt is most of a body. */
static const char *string_stop(const char *p, const char *e)
{
    const __m128i quote = _mm_set1_epi8('"'), bs = _mm_set1_epi8('\\'), ctl = _mm_set1_epi8(0x1f);
    while (e - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bs)),
                                   _mm_cmpeq_epi8(_mm_max_epu8(v, ctl), ctl)); /* v <= 0x1f */
        int m = _mm_movemask_epi8(hit);
        if (m) return p + __builtin_ctz((unsigned)m);
        p += 16;
    }
    while (p < e && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
        p++;
    return p;
}

/* A string at s->p (on its opening quote). *escaped: it holds an escape. */
static int str(scan *s, int *escaped)
{
    *escaped = 0;
    const char *b = ++s->p;
    for (;;) {
        const char *q = string_stop(s->p, s->e);
        if (q >= s->e || (unsigned char)*q < 0x20) return 0;
        if (*q == '"') {
            s->p = q + 1;
            break;
        }
        /* an escape */
        *escaped = 1;
        if (q + 1 >= s->e) return 0;
        char c = q[1];
        if (c == 'u') {
            unsigned v;
            /* \u0000 and surrogates are jansson's to judge (NUL, pairing) */
            if (q + 6 > s->e || !hex4(q + 2, &v) || v == 0 || (v >= 0xD800 && v <= 0xDFFF))
                return 0;
            s->p = q + 6;
        } else if (strchr("\"\\/bfnrt", c) && c) {
            s->p = q + 2;
        } else {
            return 0;
        }
    }
    return cg_utf8_valid(b, (size_t)(s->p - 1 - b));
}

/* A number: -?(0|[1-9]d*)(.d+)?, at most 24 characters, no exponent. */
static int num(scan *s)
{
    const char *b = s->p;
    if (s->p < s->e && *s->p == '-') s->p++;
    if (s->p >= s->e) return 0;
    if (*s->p == '0')
        s->p++;
    else if (*s->p >= '1' && *s->p <= '9')
        while (s->p < s->e && *s->p >= '0' && *s->p <= '9')
            s->p++;
    else
        return 0;
    int frac = 0;
    if (s->p < s->e && *s->p == '.') {
        frac = 1;
        s->p++;
        const char *d = s->p;
        while (s->p < s->e && *s->p >= '0' && *s->p <= '9')
            s->p++;
        if (s->p == d) return 0;
    }
    if (s->p < s->e && (*s->p == 'e' || *s->p == 'E')) return 0;
    size_t n = (size_t)(s->p - b);
    /* integers of 18 digits or fewer fit json_int_t; a longer one would be "too big" */
    return n <= 24 && (frac || n - (*b == '-') <= 18);
}

static int lit(scan *s, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(s->e - s->p) < n || memcmp(s->p, w, n) != 0) return 0;
    s->p += n;
    return 1;
}

/* A scalar value; *type and *escaped are set. */
static int scalar(scan *s, char *type, int *escaped)
{
    *escaped = 0;
    if (s->p >= s->e) return 0;
    switch (*s->p) {
    case '"':
        *type = 's';
        return str(s, escaped);
    case 't':
        *type = 't';
        return lit(s, "true");
    case 'f':
        *type = 'f';
        return lit(s, "false");
    case 'n':
        *type = 'z';
        return lit(s, "null");
    default:
        *type = 'n';
        return num(s);
    }
}

static int count(scan *s)
{
    return ++s->values <= s->l->max_values;
}

/* After an item of an array or object: a comma (counted, blanks after it skipped) -> 1, the
 * closing character close -> 0, anything else -> -1. */
static int after_item(scan *s, char close)
{
    ws(s);
    if (s->p < s->e && *s->p == ',') {
        if (!count(s)) return -1;
        s->p++;
        ws(s);
        return 1;
    }
    if (s->p < s->e && *s->p == close) {
        s->p++;
        return 0;
    }
    return -1;
}

int cg_gw_fast_scan(const char *text, size_t len, const cg_json_limits *l, cg_fast_member *m,
                    size_t max_members, size_t *n)
{
    /* counted as cg_json_check_limits counts: 1 + arrays and objects + commas */
    scan s = {text, text + len, 1, l};
    *n = 0;
    if (l->max_depth < 2) return 0;
    ws(&s);
    if (s.p >= s.e || *s.p != '{' || !count(&s)) return 0;
    s.p++;
    ws(&s);
    if (s.p < s.e && *s.p == '}') {
        s.p++;
        goto end;
    }
    for (;;) {
        if (s.p >= s.e || *s.p != '"' || *n == max_members) return 0;
        cg_fast_member *mm = &m[*n];
        int esc;
        mm->key = s.p + 1;
        if (!str(&s, &esc) || esc) return 0;
        mm->key_len = (size_t)(s.p - 1 - mm->key);
        for (size_t i = 0; i < *n; i++)
            if (m[i].key_len == mm->key_len && !memcmp(m[i].key, mm->key, mm->key_len)) return 0;
        ws(&s);
        if (s.p >= s.e || *s.p != ':') return 0;
        s.p++;
        ws(&s);
        mm->val = s.p;
        mm->escaped = 0;
        if (s.p < s.e && *s.p == '[') {
            mm->type = 'a';
            if (!count(&s)) return 0;
            s.p++;
            ws(&s);
            if (s.p < s.e && *s.p == ']') {
                s.p++;
            } else {
                for (;;) {
                    char t;
                    int e;
                    if (!scalar(&s, &t, &e)) return 0;
                    mm->escaped |= e;
                    int more = after_item(&s, ']');
                    if (more < 0) return 0;
                    if (!more) break;
                }
            }
        } else if (!scalar(&s, &mm->type, &mm->escaped)) {
            return 0;
        }
        mm->val_len = (size_t)(s.p - mm->val);
        (*n)++;
        int more = after_item(&s, '}');
        if (more < 0) return 0;
        if (!more) break;
    }
end:
    ws(&s);
    return s.p == s.e;
}

/* ---------------------------------------------------------------- the fast path */

static const cg_fast_member *find(const cg_fast_member *m, size_t n, const char *key)
{
    size_t kl = strlen(key);
    for (size_t i = 0; i < n; i++)
        if (m[i].key_len == kl && !memcmp(m[i].key, key, kl)) return &m[i];
    return NULL;
}

int cg_gw_completions_fast(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    size_t len;
    const char *body = cg_http_req_body(req, &len);
    if (!g->has_backend || len > FAST_MAX_BODY) return 0;
    cg_json_limits lim = {g->cfg->max_json_values, (unsigned)g->cfg->max_json_depth};
    cg_fast_member m[FAST_MAX_MEMBERS];
    size_t n;
    if (!cg_gw_fast_scan(body, len, &lim, m, FAST_MAX_MEMBERS, &n)) return 0;
    /* The gateway's own fields (the field table's, which the gateway reads, checks or refuses,
     * and never forwards to --backend) and stream_options (it changes what is forwarded) send
     * the request the ordinary way. */
    for (size_t i = 0; i < n; i++)
        if (cg_gw_field_rulen(m[i].key, m[i].key_len, 0) == CG_FIELD_GATEWAY) return 0;
    if (find(m, n, "stream_options")) return 0;
    /* model: a non-empty string */
    const cg_fast_member *f = find(m, n, "model");
    if (!f || f->type != 's' || f->val_len < 3) return 0;
    char model[128];
    if (f->escaped || f->val_len - 2 >= sizeof model) return 0;
    memcpy(model, f->val + 1, f->val_len - 2);
    model[f->val_len - 2] = '\0';
    /* stream: absent, null or false (a stream's usage is asked for upstream: a rewrite) */
    f = find(m, n, "stream");
    if (f && f->type != 'z' && f->type != 'f') return 0;
    /* add_special_tokens: absent, null or a boolean (another type is refused by name) */
    f = find(m, n, "add_special_tokens");
    if (f && f->type != 'z' && f->type != 'f' && f->type != 't') return 0;
    /* max_tokens: absent, null or an integer in [0, 2^31] */
    f = find(m, n, "max_tokens");
    if (f && f->type != 'z') {
        if (f->type != 'n' || memchr(f->val, '.', f->val_len) || f->val[0] == '-' ||
            f->val_len > 10 || strtoll(f->val, NULL, 10) > (1LL << 31))
            return 0;
    }
    /* prompt: a string without escapes (its bytes are its value) and without the separator;
     * an array of one such string */
    f = find(m, n, "prompt");
    if (!f || f->escaped) return 0;
    const char *pt;
    size_t pl;
    if (f->type == 's') {
        pt = f->val + 1;
        pl = f->val_len - 2;
    } else if (f->type == 'a') {
        const char *a = f->val + 1, *e = f->val + f->val_len - 1;
        while (a < e && (*a == ' ' || *a == '\t' || *a == '\n' || *a == '\r'))
            a++;
        while (e > a && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
            e--;
        if (a >= e || *a != '"' || e[-1] != '"' || e - a < 2) return 0;
        pt = a + 1;
        pl = (size_t)(e - a) - 2;
        if (memchr(pt, '"', pl)) return 0; /* more than one element */
    } else {
        return 0;
    }
    /* the separator anywhere in the prompt: the splitter would cut there */
    if (memmem(pt, pl, g->cfg->separator, strlen(g->cfg->separator))) return 0;

    /* What the ordinary path does for a pass-through prompt, without building the request. */
    cg_metric_add(g->m_passthrough, 1);
    cg_metric_add(g->m_fast_path, 1);
    cg_gw_segments none; /* a pass-through: no segments, the gateway's default mode */
    cg_gw_segments_init(&none);
    none.mode = g->default_mode;
    none.split.passthrough = 1;
    json_t *cc = cg_gw_chunk_cache_plain(&none, NULL, CG_FALLBACK_NONE);
    cg_gw_target t = {.route = "completions",
                      .model = model,
                      .path = "/v1/completions",
                      .cached_tokens = -1,
                      .count_usage = 1};
    char *raw = cg_http_req_take_body(req, &len);
    cg_gw_relay_to(g, req, &t, raw, len, 0, cc);
    return 1;
}
