/* Chat templates at render time: values (arrays, insertion-ordered mappings, functions), the
 * render context (errors, step, memory and output limits, scopes), JSON in and out (from_json,
 * tojson), how values print, truthiness, equality, ordering and sorting. */
#include "cache/chat_template_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                      */
/* ------------------------------------------------------------------------------------------ */

const char *cgt_type_name(val v)
{
    switch (v.t) {
    case V_UNDEF:
        return "UndefinedValue";
    case V_NULL:
        return "NullValue";
    case V_BOOL:
        return "BooleanValue";
    case V_INT:
        return "IntegerValue";
    case V_FLOAT:
        return "FloatValue";
    case V_STR:
        return "StringValue";
    case V_ARR:
        return v.sub == SUB_TUPLE ? "TupleValue" : "ArrayValue";
    case V_OBJ:
        return v.sub == SUB_KWARGS ? "KeywordArgumentsValue" : "ObjectValue";
    case V_NS:
        return "NamespaceValue";
    default:
        return "FunctionValue";
    }
}

jarr *cgt_arr_new(arena *a, size_t n)
{
    jarr *r = cgt_arena_alloc(a, sizeof(jarr));
    r->n = n;
    r->v = n ? cgt_arena_alloc(a, n * sizeof(val)) : NULL;
    return r;
}

jobj *cgt_obj_new(arena *a)
{
    return cgt_arena_zalloc(a, sizeof(jobj));
}

static uint32_t str_hash(const char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h;
}

static void obj_reindex(arena *a, jobj *o)
{
    o->idxcap = 16;
    while (o->idxcap < o->n * 2)
        o->idxcap *= 2;
    o->idx = cgt_arena_zalloc(a, o->idxcap * sizeof(uint32_t));
    for (size_t i = 0; i < o->n; i++) {
        size_t s = str_hash(o->k[i]->p, o->k[i]->len) & (o->idxcap - 1);
        while (o->idx[s])
            s = (s + 1) & (o->idxcap - 1);
        o->idx[s] = (uint32_t)(i + 1);
    }
}

long cgt_obj_find(const jobj *o, const char *p, size_t n)
{
    if (o->idx) {
        size_t s = str_hash(p, n) & (o->idxcap - 1);
        while (o->idx[s]) {
            const jstr *k = o->k[o->idx[s] - 1];
            if (k->len == n && memcmp(k->p, p, n) == 0) return (long)o->idx[s] - 1;
            s = (s + 1) & (o->idxcap - 1);
        }
        return -1;
    }
    for (size_t i = 0; i < o->n; i++)
        if (o->k[i]->len == n && (n == 0 || memcmp(o->k[i]->p, p, n) == 0)) return (long)i;
    return -1;
}

bool cgt_obj_get(const jobj *o, const char *p, size_t n, val *out)
{
    long i = cgt_obj_find(o, p, n);
    if (i < 0) return false;
    *out = o->v[i];
    return true;
}

/* Room for one more entry in the parallel arrays *k and *v, which hold n of *cap: full, they
 * move to arrays twice as long (first long when there were none); the arena keeps the old. */
static void pairs_reserve(arena *a, const jstr ***k, val **v, size_t n, size_t *cap, size_t first)
{
    if (n < *cap) return;
    size_t nc = *cap ? *cap * 2 : first;
    const jstr **nk = cgt_arena_alloc(a, nc * sizeof(*nk));
    val *nv = cgt_arena_alloc(a, nc * sizeof(val));
    if (n) {
        memcpy(nk, *k, n * sizeof(*nk));
        memcpy(nv, *v, n * sizeof(val));
    }
    *k = nk;
    *v = nv;
    *cap = nc;
}

void cgt_obj_set(arena *a, jobj *o, const jstr *k, val v)
{
    long i = cgt_obj_find(o, k->p, k->len);
    if (i >= 0) {
        o->v[i] = v;
        return;
    }
    pairs_reserve(a, &o->k, &o->v, o->n, &o->cap, 8);
    o->k[o->n] = k;
    o->v[o->n] = v;
    o->n++;
    if (o->n > 8 && (!o->idx || o->n * 2 > o->idxcap))
        obj_reindex(a, o);
    else if (o->idx) {
        size_t s = str_hash(k->p, k->len) & (o->idxcap - 1);
        while (o->idx[s])
            s = (s + 1) & (o->idxcap - 1);
        o->idx[s] = (uint32_t)o->n;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Render context, errors and limits                                                           */
/* ------------------------------------------------------------------------------------------ */

int cgt_rerr(ctx *c, const node *at, cg_status st, const char *fmt, ...)
{
    if (c->st != CG_OK) return RC_ERR;
    c->st = st;
    size_t off = 0;
    if (at) {
        unsigned line, col;
        cgt_src_linecol(c->t->src, c->t->len, at->pos, &line, &col);
        off = (size_t)snprintf(c->msg, sizeof c->msg, "%u:%u: ", line, col);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg + off, sizeof c->msg - off, fmt, ap);
    va_end(ap);
    cgt_utf8_clip(c->msg);
    return RC_ERR;
}

/* Values and text buffers both count, cumulatively: a render allocates at most max_memory. */
static int check_memory(ctx *c, const node *at)
{
    if (c->ar.total + c->buf_alloc > c->lim->max_memory)
        return cgt_rerr(c, at, CG_E_TOO_LARGE, "template evaluation exceeds %zu bytes of memory",
                        c->lim->max_memory);
    return RC_OK;
}

int cgt_step(ctx *c, const node *at, uint64_t k)
{
    c->steps += k;
    if (c->steps > c->lim->max_steps)
        return cgt_rerr(c, at, CG_E_TOO_LARGE, "template evaluation exceeds %llu steps",
                        (unsigned long long)c->lim->max_steps);
    return check_memory(c, at);
}

int cgt_work(ctx *c, const node *at, size_t bytes)
{
    return cgt_step(c, at, 1 + bytes / 64);
}

int cgt_cput(ctx *c, const node *at, sbuf *b, const void *p, size_t n)
{
    if (n > c->lim->max_output || b->len > c->lim->max_output - n)
        return cgt_rerr(c, at, CG_E_TOO_LARGE, "rendered text exceeds %zu bytes",
                        c->lim->max_output);
    size_t cap = b->cap;
    cgt_sbuf_put(b, p, n);
    if (b->cap != cap) {
        c->buf_alloc += b->cap - cap;
        return check_memory(c, at);
    }
    return RC_OK;
}

int cgt_cputs(ctx *c, const node *at, sbuf *b, const char *s)
{
    return cgt_cput(c, at, b, s, strlen(s));
}

int cgt_str_val(ctx *c, const node *at, const char *p, size_t n, val *out)
{
    if (n > c->lim->max_output)
        return cgt_rerr(c, at, CG_E_TOO_LARGE, "a string exceeds %zu bytes", c->lim->max_output);
    TRY(cgt_work(c, at, n));
    *out = vstr(cgt_jstr_copy(&c->ar, p, n));
    return RC_OK;
}

int cgt_sbuf_val(ctx *c, const node *at, sbuf *b, val *out)
{
    int r = cgt_str_val(c, at, b->p ? b->p : "", b->len, out);
    cgt_sbuf_free(b);
    return r;
}

int cgt_sbuf_done(ctx *c, const node *at, sbuf *b, int r, val *out)
{
    if (r) {
        cgt_sbuf_free(b);
        return r;
    }
    return cgt_sbuf_val(c, at, b, out);
}

env *cgt_env_new(ctx *c, env *parent)
{
    env *e = cgt_arena_zalloc(&c->ar, sizeof(env));
    e->parent = parent;
    return e;
}

void cgt_env_set(ctx *c, env *e, const jstr *name, val v)
{
    cgt_obj_set(&c->ar, &e->vars, name, v);
}

static bool env_own(const env *e, const jstr *name, val *out)
{
    return cgt_obj_get(&e->vars, name->p, name->len, out);
}

val cgt_fn_val(ctx *c, int kind)
{
    jfunc *f = cgt_arena_zalloc(&c->ar, sizeof(jfunc));
    f->kind = (uint8_t)kind;
    return (val){.t = V_FUNC, .u.f = f};
}

val cgt_env_lookup(ctx *c, const env *e, const jstr *name)
{
    val v;
    if (jstr_eqc(name, "namespace")) {
        if (env_own(e, name, &v)) return v;
        return cgt_fn_val(c, FN_NAMESPACE);
    }
    for (; e; e = e->parent)
        if (env_own(e, name, &v)) return v;
    return UNDEF;
}

const jstr *cgt_cname(ctx *c, const char *s)
{
    return cgt_jstr_borrow(&c->ar, s, strlen(s));
}

/* ------------------------------------------------------------------------------------------ */
/* Conversions: JSON in, text out                                                              */
/* ------------------------------------------------------------------------------------------ */

/* A canonical array index ("0", "17"; below 2^32 - 1): JavaScript objects list these first. */
static bool index_key(const char *k, size_t n, double *v)
{
    if (n == 0 || n > 10 || (n > 1 && k[0] == '0')) return false;
    double x = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit(k[i])) return false;
        x = x * 10 + (k[i] - '0');
    }
    if (x > 4294967294.0) return false;
    *v = x;
    return true;
}

typedef struct ikey {
    double v;
    const char *k;
    json_t *val;
} ikey;

static int ikey_cmp(const void *a, const void *b)
{
    double x = ((const ikey *)a)->v, y = ((const ikey *)b)->v;
    return x < y ? -1 : x > y;
}

int cgt_from_json(ctx *c, const json_t *j, val *out, unsigned depth)
{
    if (depth > c->lim->max_depth)
        return cgt_rerr(c, NULL, CG_E_TOO_LARGE, "variables nest deeper than %u",
                        c->lim->max_depth);
    TRY(cgt_step(c, NULL, 1));
    switch (json_typeof(j)) {
    case JSON_NULL:
        *out = VNULL;
        return RC_OK;
    case JSON_TRUE:
        *out = vbool(true);
        return RC_OK;
    case JSON_FALSE:
        *out = vbool(false);
        return RC_OK;
    case JSON_INTEGER:
        *out = vint((double)json_integer_value(j));
        return RC_OK;
    case JSON_REAL: {
        double d = json_real_value(j);
        *out = (isfinite(d) && floor(d) == d) ? vint(d) : vfloat(d);
        return RC_OK;
    }
    case JSON_STRING:
        *out = vstr(cgt_jstr_borrow(&c->ar, json_string_value(j), json_string_length(j)));
        return cgt_step(c, NULL, json_string_length(j) / 64);
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jarr *a = cgt_arr_new(&c->ar, n);
        for (size_t i = 0; i < n; i++)
            TRY(cgt_from_json(c, json_array_get(j, i), &a->v[i], depth + 1));
        *out = varr(a, 0);
        return RC_OK;
    }
    case JSON_OBJECT: {
        jobj *o = cgt_obj_new(&c->ar);
        size_t n = json_object_size(j), ni = 0;
        ikey *ik = n ? cgt_arena_alloc(&c->ar, n * sizeof(ikey)) : NULL;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v)
        {
            double x;
            if (index_key(k, strlen(k), &x)) ik[ni++] = (ikey){x, k, v};
        }
        if (ni > 1) qsort(ik, ni, sizeof(ikey), ikey_cmp);
        for (size_t i = 0; i < ni; i++) {
            val x;
            TRY(cgt_from_json(c, ik[i].val, &x, depth + 1));
            cgt_obj_set(&c->ar, o, cgt_jstr_borrow(&c->ar, ik[i].k, strlen(ik[i].k)), x);
        }
        json_object_foreach((json_t *)j, k, v)
        {
            double d;
            if (index_key(k, strlen(k), &d)) continue;
            val x;
            TRY(cgt_from_json(c, v, &x, depth + 1));
            cgt_obj_set(&c->ar, o, cgt_jstr_borrow(&c->ar, k, strlen(k)), x);
        }
        *out = vobj(o, 0);
        return RC_OK;
    }
    }
    return TERR(c, NULL, "unsupported JSON value");
}

/* JSON.stringify's two-character escapes, by byte; other control bytes take \u00XX. */
static const char *const short_escape[] = {
    ['"'] = "\\\"", ['\\'] = "\\\\", ['\b'] = "\\b", ['\f'] = "\\f",
    ['\n'] = "\\n", ['\r'] = "\\r",  ['\t'] = "\\t",
};

/* JSON.stringify of a string, then @huggingface/jinja's ensure_ascii rewrite. */
static int json_str(ctx *c, const node *at, sbuf *b, const char *p, size_t n, bool ascii)
{
    TRY(cgt_work(c, at, n));
    TRY(cgt_cput(c, at, b, "\"", 1));
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)p[i];
        const char *esc = NULL;
        char tmp[16];
        size_t l = 1;
        if (ch < CG_ARRAY_LEN(short_escape) && short_escape[ch])
            esc = short_escape[ch];
        else if (ch < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", ch);
            esc = tmp;
        } else if (ascii && ch >= 0x7F) {
            uint32_t cp =
                ch == 0x7F ? 0x7F : cgt_u8_decode((const unsigned char *)p + i, n - i, &l);
            if (cp >= 0x10000)
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10),
                         0xDC00 + ((cp - 0x10000) & 0x3FF));
            else
                snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            esc = tmp;
        }
        if (!esc) {
            run++;
            i++;
            continue;
        }
        TRY(cgt_cput(c, at, b, p + i - run, run));
        run = 0;
        TRY(cgt_cputs(c, at, b, esc));
        i += l;
    }
    TRY(cgt_cput(c, at, b, p + n - run, run));
    return cgt_cput(c, at, b, "\"", 1);
}

static int put_indent(ctx *c, const node *at, sbuf *b, double indent, int depth)
{
    TRY(cgt_cput(c, at, b, "\n", 1));
    for (int d = 0; d < depth; d++)
        for (double i = 0; i < indent; i++)
            TRY(cgt_cput(c, at, b, " ", 1));
    return RC_OK;
}

static int utf16_cmp(const jstr *a, const jstr *b);

/* Before item i of a list or mapping at depth: the separator after the item before (the
 * separators option, else ", ", or "," when indenting), then the new line's indent. */
static int json_item_start(ctx *c, const node *at, sbuf *b, const jopts *o, size_t i, int depth)
{
    if (i && o->item_sep)
        TRY(cgt_cput(c, at, b, o->item_sep->p, o->item_sep->len));
    else if (i)
        TRY(cgt_cputs(c, at, b, o->indent ? "," : ", "));
    return o->indent ? put_indent(c, at, b, o->indent, depth + 1) : RC_OK;
}

/* tojson(sort_keys=true): *order (in the arena) lists ob's entries by key. */
static int json_key_order(ctx *c, const node *at, const jobj *ob, size_t **order)
{
    /* localeCompare is ICU collation; only keys that compare the same by code units and by
     * collation are safe: lower-case ASCII letters, digits and '_' runs of equal class.
     * Anything else is refused rather than ordered differently. */
    for (size_t i = 0; i < ob->n; i++)
        for (size_t k = 0; k < ob->k[i]->len; k++) {
            char ch = ob->k[i]->p[k];
            if (!((ch >= 'a' && ch <= 'z') || is_digit(ch)))
                return TERR(c, at, "tojson(sort_keys=true) supports keys of a-z and 0-9 only");
        }
    size_t *ord = cgt_arena_alloc(&c->ar, ob->n * sizeof(size_t));
    for (size_t i = 0; i < ob->n; i++)
        ord[i] = i;
    for (size_t i = 1; i < ob->n; i++) /* insertion sort: stable, few keys */
        for (size_t k = i; k > 0 && utf16_cmp(ob->k[ord[k - 1]], ob->k[ord[k]]) > 0; k--) {
            size_t t = ord[k];
            ord[k] = ord[k - 1];
            ord[k - 1] = t;
        }
    *order = ord;
    return RC_OK;
}

int cgt_to_json(ctx *c, const node *at, sbuf *b, val v, const jopts *o, int depth, bool undef_null)
{
    char num[32];
    if ((unsigned)depth > c->lim->max_depth)
        return cgt_rerr(c, at, CG_E_TOO_LARGE, "value nests deeper than %u", c->lim->max_depth);
    TRY(cgt_step(c, at, 1));
    switch (v.t) {
    case V_NULL:
        return cgt_cputs(c, at, b, "null");
    case V_UNDEF:
        return cgt_cputs(c, at, b, undef_null ? "null" : "undefined");
    case V_BOOL:
        return cgt_cputs(c, at, b, v.u.b ? "true" : "false");
    case V_INT:
    case V_FLOAT:
        if (!isfinite(v.u.n)) return cgt_cputs(c, at, b, "null");
        cgt_js_num(v.u.n, num);
        return cgt_cputs(c, at, b, num);
    case V_STR:
        return json_str(c, at, b, v.u.s->p, v.u.s->len, o->ensure_ascii);
    case V_ARR:
        if (v.sub == SUB_TUPLE) break;
        TRY(cgt_cput(c, at, b, "[", 1));
        for (size_t i = 0; i < v.u.a->n; i++) {
            TRY(json_item_start(c, at, b, o, i, depth));
            TRY(cgt_to_json(c, at, b, v.u.a->v[i], o, depth + 1, undef_null));
        }
        if (o->indent && v.u.a->n) TRY(put_indent(c, at, b, o->indent, depth));
        return cgt_cput(c, at, b, "]", 1);
    case V_OBJ:
    case V_NS: {
        if (v.t == V_OBJ && v.sub == SUB_KWARGS) break;
        const jobj *ob = v.u.o;
        size_t *order = NULL;
        if (o->sort_keys && ob->n > 1) TRY(json_key_order(c, at, ob, &order));
        TRY(cgt_cput(c, at, b, "{", 1));
        for (size_t i = 0; i < ob->n; i++) {
            size_t e = order ? order[i] : i;
            TRY(json_item_start(c, at, b, o, i, depth));
            TRY(json_str(c, at, b, ob->k[e]->p, ob->k[e]->len, o->ensure_ascii));
            if (o->key_sep)
                TRY(cgt_cput(c, at, b, o->key_sep->p, o->key_sep->len));
            else
                TRY(cgt_cputs(c, at, b, ": "));
            TRY(cgt_to_json(c, at, b, ob->v[e], o, depth + 1, undef_null));
        }
        if (o->indent && ob->n) TRY(put_indent(c, at, b, o->indent, depth));
        return cgt_cput(c, at, b, "}", 1);
    }
    default:
        break;
    }
    return TERR(c, at, "cannot convert to JSON: %s", cgt_type_name(v));
}

int cgt_emit(ctx *c, const node *at, sbuf *b, val v)
{
    char num[40];
    switch (v.t) {
    case V_UNDEF:
        return cgt_cputs(c, at, b, "undefined");
    case V_NULL:
        return cgt_cputs(c, at, b, "null");
    case V_BOOL:
        return cgt_cputs(c, at, b, v.u.b ? "true" : "false");
    case V_INT:
        cgt_js_num(v.u.n, num);
        return cgt_cputs(c, at, b, num);
    case V_FLOAT:
        cgt_js_float_str(v.u.n, num, sizeof num);
        return cgt_cputs(c, at, b, num);
    case V_STR:
        TRY(cgt_work(c, at, v.u.s->len));
        return cgt_cput(c, at, b, v.u.s->p, v.u.s->len);
    case V_ARR:
    case V_OBJ:
    case V_NS:
        return cgt_to_json(c, at, b, v, &JSON_DEFAULT, 0, false);
    default:
        return TERR(c, at, "cannot print a function");
    }
}

int cgt_raw_str(ctx *c, const node *at, sbuf *b, val v, unsigned depth)
{
    char num[32];
    if (depth > c->lim->max_depth)
        return cgt_rerr(c, at, CG_E_TOO_LARGE, "value nests deeper than %u", c->lim->max_depth);
    switch (v.t) {
    case V_INT:
    case V_FLOAT:
        cgt_js_num(v.u.n, num);
        return cgt_cputs(c, at, b, num);
    case V_ARR:
        for (size_t i = 0; i < v.u.a->n; i++) {
            if (i) TRY(cgt_cput(c, at, b, ",", 1));
            TRY(cgt_emit(c, at, b, v.u.a->v[i]));
        }
        return RC_OK;
    case V_OBJ:
    case V_NS:
        return cgt_cputs(c, at, b, "[object Map]");
    case V_FUNC:
        return TERR(c, at, "cannot convert a function to a string");
    default:
        return cgt_emit(c, at, b, v);
    }
}

bool cgt_truthy(val v)
{
    switch (v.t) {
    case V_UNDEF:
    case V_NULL:
        return false;
    case V_BOOL:
        return v.u.b;
    case V_INT:
    case V_FLOAT:
        return v.u.n != 0 && !isnan(v.u.n);
    case V_STR:
        return v.u.s->len > 0;
    case V_ARR:
        return v.u.a->n > 0;
    case V_OBJ:
        return v.u.o->n > 0;
    default:
        return true;
    }
}

bool cgt_raw_truthy(val v)
{
    if (v.t == V_ARR || v.t == V_OBJ) return true;
    return cgt_truthy(v);
}

/* ------------------------------------------------------------------------------------------ */
/* Equality and ordering                                                                       */
/* ------------------------------------------------------------------------------------------ */

static bool same_object(val a, val b)
{
    if (a.t != b.t) return false;
    switch (a.t) {
    case V_ARR:
        return a.u.a == b.u.a;
    case V_OBJ:
    case V_NS:
        return a.u.o == b.u.o;
    case V_FUNC:
        return a.u.f == b.u.f;
    default:
        return false;
    }
}

static bool is_object(val v)
{
    return v.t == V_ARR || v.t == V_OBJ || v.t == V_NS || v.t == V_FUNC;
}

bool cgt_strict_eq(val a, val b)
{
    if (is_num(a) && is_num(b)) return a.u.n == b.u.n;
    if (is_object(a) || is_object(b)) return same_object(a, b);
    if (a.t != b.t) return false;
    switch (a.t) {
    case V_UNDEF:
    case V_NULL:
        return true;
    case V_BOOL:
        return a.u.b == b.u.b;
    case V_STR:
        return jstr_eq(a.u.s, b.u.s);
    default:
        return false;
    }
}

bool cgt_same_value_zero(val a, val b)
{
    if (is_num(a) && is_num(b) && isnan(a.u.n) && isnan(b.u.n)) return true;
    return cgt_strict_eq(a, b);
}

int cgt_loose_eq(ctx *c, const node *at, val a, val b, bool *res)
{
    for (int round = 0; round < 4; round++) {
        bool an = is_num(a), bn = is_num(b);
        bool anil = a.t == V_UNDEF || a.t == V_NULL, bnil = b.t == V_UNDEF || b.t == V_NULL;
        if (an && bn) {
            *res = a.u.n == b.u.n;
            return RC_OK;
        }
        if (is_object(a) && is_object(b)) {
            *res = same_object(a, b);
            return RC_OK;
        }
        if (a.t == b.t && !an) {
            *res = cgt_strict_eq(a, b);
            return RC_OK;
        }
        if (anil || bnil) {
            *res = anil && bnil;
            return RC_OK;
        }
        if (an && b.t == V_STR) {
            *res = a.u.n == cgt_js_str_to_num(b.u.s->p, b.u.s->len);
            return RC_OK;
        }
        if (a.t == V_STR && bn) {
            *res = cgt_js_str_to_num(a.u.s->p, a.u.s->len) == b.u.n;
            return RC_OK;
        }
        if (a.t == V_BOOL) {
            a = vint(a.u.b);
            continue;
        }
        if (b.t == V_BOOL) {
            b = vint(b.u.b);
            continue;
        }
        /* an object against a number or a string: compare its primitive (a string) */
        val *obj = is_object(a) ? &a : &b;
        if (obj->t == V_FUNC) {
            *res = false;
            return RC_OK;
        }
        sbuf s = {0};
        int r = cgt_raw_str(c, at, &s, *obj, 0);
        if (!r) r = cgt_sbuf_val(c, at, &s, obj);
        cgt_sbuf_free(&s);
        if (r) return r;
    }
    *res = false;
    return RC_OK;
}

/* The next UTF-16 code unit of s from byte *i on (first the low surrogate *pend keeps from the
 * code point before), UINT32_MAX at the end. */
static uint32_t next_u16(const jstr *s, size_t *i, uint32_t *pend)
{
    if (*pend) {
        uint32_t u = *pend;
        *pend = 0;
        return u;
    }
    if (*i >= s->len) return UINT32_MAX;
    size_t l;
    uint32_t cp = cgt_u8_decode((const unsigned char *)s->p + *i, s->len - *i, &l);
    *i += l;
    if (cp < 0x10000) return cp;
    *pend = 0xDC00 + ((cp - 0x10000) & 0x3FF);
    return 0xD800 + ((cp - 0x10000) >> 10);
}

/* Compares two strings by UTF-16 code units, as JavaScript's < does. */
static int utf16_cmp(const jstr *a, const jstr *b)
{
    size_t i = 0, j = 0;
    uint32_t pend_a = 0, pend_b = 0;
    for (;;) {
        uint32_t ua = next_u16(a, &i, &pend_a), ub = next_u16(b, &j, &pend_b);
        if (ua == UINT32_MAX && ub == UINT32_MAX) return 0;
        if (ua == UINT32_MAX) return -1;
        if (ub == UINT32_MAX) return 1;
        if (ua != ub) return ua < ub ? -1 : 1;
    }
}

/* compareRuntimeValues of @huggingface/jinja (sort, dictsort). */
static int compare_values(ctx *c, const node *at, val a, val b, bool case_sensitive, int *res)
{
    TRY(cgt_step(c, at, 1));
    if (a.t == V_NULL && b.t == V_NULL) return *res = 0, RC_OK;
    if (a.t == V_NULL || b.t == V_NULL || a.t == V_UNDEF || b.t == V_UNDEF) {
        if (a.t == V_UNDEF && b.t == V_UNDEF) return *res = 0, RC_OK;
        return TERR(c, at, "cannot compare %s with %s", cgt_type_name(a), cgt_type_name(b));
    }
    bool an = is_num(a) || a.t == V_BOOL, bn = is_num(b) || b.t == V_BOOL;
    if (an && bn) {
        double x = a.t == V_BOOL ? a.u.b : a.u.n, y = b.t == V_BOOL ? b.u.b : b.u.n;
        *res = x < y ? -1 : x > y ? 1 : 0;
        return RC_OK;
    }
    if (strcmp(cgt_type_name(a), cgt_type_name(b)) != 0)
        return TERR(c, at, "cannot compare different types: %s and %s", cgt_type_name(a),
                    cgt_type_name(b));
    if (a.t != V_STR) return TERR(c, at, "cannot compare type: %s", cgt_type_name(a));
    if (case_sensitive) {
        *res = utf16_cmp(a.u.s, b.u.s);
        return RC_OK;
    }
    val la, lb;
    TRY(cgt_case_val(c, at, a.u.s, false, &la));
    TRY(cgt_case_val(c, at, b.u.s, false, &lb));
    *res = utf16_cmp(la.u.s, lb.u.s);
    return RC_OK;
}

static int sort_cmp(sortctx *s, val a, val b, int *res)
{
    if (s->attr) {
        a = cgt_attr_path(s->c, a, s->attr);
        b = cgt_attr_path(s->c, b, s->attr);
    }
    TRY(compare_values(s->c, s->at, a, b, s->case_sensitive, res));
    if (s->reverse) *res = -*res;
    return RC_OK;
}

int cgt_merge_sort(sortctx *s, val *v, size_t n)
{
    if (n < 2) return RC_OK;
    val *tmp = cgt_arena_alloc(&s->c->ar, n * sizeof(val));
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int r = 0;
                TRY(sort_cmp(s, v[i], v[j], &r));
                tmp[k++] = r <= 0 ? v[i++] : v[j++];
            }
            while (i < mid)
                tmp[k++] = v[i++];
            while (j < hi)
                tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof(val));
    }
    return RC_OK;
}

val cgt_attr_path(ctx *c, val item, const jstr *path)
{
    (void)c;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < path->len && path->p[j] != '.')
            j++;
        if (is_container(item)) {
            if (!cgt_obj_get(item.u.o, path->p + i, j - i, &item)) return UNDEF;
        } else if (item.t == V_ARR) {
            double idx = cgt_js_parse_int(path->p + i, j - i);
            if (isnan(idx) || idx < 0 || idx >= (double)item.u.a->n) return UNDEF;
            item = item.u.a->v[(size_t)idx];
        } else {
            return UNDEF;
        }
        if (j >= path->len) return item;
        i = j + 1;
    }
}
