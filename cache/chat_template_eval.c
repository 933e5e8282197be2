/* Chat templates, the evaluator: call arguments, the built-in functions (range, strftime_now,
 * namespace, raise_exception), macros and call blocks, operators, member access and the
 * statements (for, set, if, output). */
#include "cache/chat_template_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------------------------ */
/* Evaluator                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static int eval(ctx *c, env *e, const node *x, val *out);
static int call_value(ctx *c, env *e, const node *at, val fn, val *args, size_t n, val *out);

static int enter_depth(ctx *c, const node *at)
{
    if (++c->depth > c->lim->max_depth)
        return cgt_rerr(c, at, CG_E_TOO_LARGE, "template evaluation nests deeper than %u",
                        c->lim->max_depth);
    return RC_OK;
}

/* Runs a block into a fresh buffer and returns what it printed as a string. */
static int capture(ctx *c, env *e, const node *at, const nodelist *body, val *out)
{
    sbuf b = {0}, *saved = c->out;
    c->out = &b;
    int r = cgt_exec_list(c, e, body);
    c->out = saved;
    return cgt_sbuf_done(c, at, &b, r, out);
}

val cgt_kwargs_val(ctx *c, jobj *kw)
{
    (void)c;
    return vobj(kw, SUB_KWARGS);
}

int cgt_eval_args(ctx *c, env *e, const nodelist *args, val **pos, size_t *npos, jobj **kw)
{
    size_t cap = args->n + 1, n = 0;
    val *p = cgt_arena_alloc(&c->ar, cap * sizeof(val));
    for (size_t i = 0; i < args->n; i++) {
        const node *a = args->v[i];
        if (a->kind == N_KWARG || a->kind == N_KWSPREAD) continue;
        val v;
        TRY(eval(c, e, a->kind == N_SPREAD ? a->a : a, &v));
        if (a->kind != N_SPREAD) {
            p[n++] = v;
            continue;
        }
        if (v.t != V_ARR)
            return TERR(c, a, "cannot unpack non-iterable type: %s", cgt_type_name(v));
        if (n + v.u.a->n + args->n >= cap) {
            size_t ncap = n + v.u.a->n + args->n + 1;
            val *np = cgt_arena_alloc(&c->ar, ncap * sizeof(val));
            memcpy(np, p, n * sizeof(val));
            p = np;
            cap = ncap;
        }
        for (size_t k = 0; k < v.u.a->n; k++)
            p[n++] = v.u.a->v[k];
    }
    jobj *o = cgt_obj_new(&c->ar);
    for (size_t i = 0; i < args->n; i++) {
        const node *a = args->v[i];
        if (a->kind == N_KWARG) {
            if (cgt_obj_find(o, a->s->p, a->s->len) >= 0)
                return TERR(c, a, "got multiple values for keyword argument '%.*s'", (int)a->s->len,
                            a->s->p);
            val v;
            TRY(eval(c, e, a->a, &v));
            cgt_obj_set(&c->ar, o, a->s, v);
        } else if (a->kind == N_KWSPREAD) {
            val v;
            TRY(eval(c, e, a->a, &v));
            if (v.t != V_OBJ)
                return TERR(c, a, "argument after ** must be a mapping, not %s", cgt_type_name(v));
            for (size_t k = 0; k < v.u.o->n; k++) {
                if (cgt_obj_find(o, v.u.o->k[k]->p, v.u.o->k[k]->len) >= 0)
                    return TERR(c, a, "got multiple values for keyword argument '%.*s'",
                                (int)v.u.o->k[k]->len, v.u.o->k[k]->p);
                cgt_obj_set(&c->ar, o, v.u.o->k[k], v.u.o->v[k]);
            }
        }
    }
    *pos = p;
    *npos = n;
    *kw = o;
    return RC_OK;
}

bool cgt_kw_get(const jobj *kw, const char *name, val *out)
{
    return cgt_obj_get(kw, name, strlen(name), out);
}

val cgt_arg_or(const val *pos, size_t n, size_t i, const jobj *kw, const char *name, val fallback)
{
    if (i < n) return pos[i];
    val v;
    if (kw && name && cgt_kw_get(kw, name, &v)) return v;
    return fallback;
}

/* ---- calls ---- */

/* range(start, stop, step) of @huggingface/jinja, over JavaScript numbers. */
static int call_range(ctx *c, const node *at, val *args, size_t n, val *out)
{
    double a[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (size_t i = 0; i < n && i < 3; i++) {
        if (args[i].t == V_UNDEF) continue;
        if (!is_num(args[i]) && args[i].t != V_BOOL)
            return TERR(c, at, "range() arguments must be numbers, got %s", cgt_type_name(args[i]));
        a[i] = args[i].t == V_BOOL ? args[i].u.b : args[i].u.n;
        given[i] = true;
    }
    double start = a[0], stop = a[1], stp = a[2];
    if (!given[1]) {
        stop = given[0] ? start : NAN;
        start = 0;
    }
    if (stp == 0) return TERR(c, at, "range() step must not be zero");
    size_t cap = 16, cnt = 0;
    val *v = cgt_arena_alloc(&c->ar, cap * sizeof(val));
    for (double i = start; stp > 0 ? i < stop : i > stop; i += stp) {
        TRY(cgt_step(c, at, 1));
        if (cnt == cap) {
            val *nv = cgt_arena_alloc(&c->ar, cap * 2 * sizeof(val));
            memcpy(nv, v, cnt * sizeof(val));
            v = nv;
            cap *= 2;
        }
        v[cnt++] = (isfinite(i) && floor(i) == i) ? vint(i) : vfloat(i);
    }
    jarr *r = cgt_arr_new(&c->ar, 0);
    r->n = cnt;
    r->v = v;
    *out = varr(r, 0);
    return RC_OK;
}

/* strftime_now: the directives @huggingface/jinja knows (%Y %m %d %b %B %H %M %%), local time;
 * others stay as written. */
/* The text of the directive %d at time tm, in tmp or a constant; NULL for a directive that
 * @huggingface/jinja does not know. */
static const char *strftime_field(char d, const struct tm *tm, char tmp[static 32])
{
    static const char *const months[] = {"January",   "February", "March",    "April",
                                         "May",       "June",     "July",     "August",
                                         "September", "October",  "November", "December"};
    int v;
    switch (d) {
    case 'Y':
        snprintf(tmp, 32, "%d", tm->tm_year + 1900);
        return tmp;
    case 'm':
        v = tm->tm_mon + 1;
        break;
    case 'd':
        v = tm->tm_mday;
        break;
    case 'H':
        v = tm->tm_hour;
        break;
    case 'M':
        v = tm->tm_min;
        break;
    case 'B':
        return months[tm->tm_mon];
    case 'b':
        snprintf(tmp, 32, "%.3s", months[tm->tm_mon]);
        return tmp;
    case '%':
        return "%";
    default:
        return NULL;
    }
    snprintf(tmp, 32, "%02d", v);
    return tmp;
}

static int call_strftime(ctx *c, const node *at, val *args, size_t n, val *out)
{
    if (n < 1 || args[0].t != V_STR) return TERR(c, at, "strftime_now() needs a format string");
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    const jstr *f = args[0].u.s;
    sbuf b = {0};
    int r = cgt_work(c, at, f->len);
    char tmp[32];
    for (size_t i = 0; i < f->len && !r; i++) {
        char d = i + 1 < f->len && f->p[i] == '%' ? f->p[i + 1] : 0;
        const char *s = strftime_field(d, &tm, tmp);
        if (s) {
            r = cgt_cputs(c, at, &b, s);
            i++;
        } else {
            r = cgt_cput(c, at, &b, f->p + i, 1);
        }
    }
    return cgt_sbuf_done(c, at, &b, r, out);
}

/* namespace(mapping or pairs, **kwargs) */
static int call_namespace(ctx *c, const node *at, val *args, size_t n, val *out)
{
    jobj *kw = NULL;
    if (n && args[n - 1].t == V_OBJ && args[n - 1].sub == SUB_KWARGS) kw = args[--n].u.o;
    if (n > 1) return TERR(c, at, "namespace expected at most 1 argument, got %zu", n);
    jobj *o = cgt_obj_new(&c->ar);
    if (n == 1) {
        val src = args[0];
        if (src.t == V_OBJ) {
            for (size_t i = 0; i < src.u.o->n; i++)
                cgt_obj_set(&c->ar, o, src.u.o->k[i], src.u.o->v[i]);
        } else if (src.t == V_ARR) {
            for (size_t i = 0; i < src.u.a->n; i++) {
                val pair = src.u.a->v[i], k, v;
                if (pair.t == V_ARR && pair.u.a->n == 2) {
                    k = pair.u.a->v[0];
                    v = pair.u.a->v[1];
                } else if (pair.t == V_STR && pair.u.s->u16 == 2 && pair.u.s->len == 2) {
                    TRY(cgt_str_val(c, at, pair.u.s->p, 1, &k));
                    TRY(cgt_str_val(c, at, pair.u.s->p + 1, 1, &v));
                } else {
                    return TERR(
                        c, at, "namespace expected an object or an iterable of [key, value] pairs");
                }
                if (k.t != V_STR) return TERR(c, at, "namespace keys must be strings");
                cgt_obj_set(&c->ar, o, k.u.s, v);
            }
        } else {
            return TERR(c, at, "'%s' object is not iterable", cgt_type_name(src));
        }
    }
    if (kw)
        for (size_t i = 0; i < kw->n; i++)
            cgt_obj_set(&c->ar, o, kw->k[i], kw->v[i]);
    *out = (val){.t = V_NS, .u.o = o};
    return RC_OK;
}

/* bindMacroArguments: positional, then keyword, then defaults (evaluated in the new scope). */
static int bind_macro_args(ctx *c, const node *at, const char *display, const nodelist *params,
                           int special, val *args, size_t n, env *scope)
{
    const jobj *kw = NULL;
    if (n && args[n - 1].t == V_OBJ && args[n - 1].sub == SUB_KWARGS) kw = args[--n].u.o;
    bool *used = kw && kw->n ? cgt_arena_zalloc(&c->ar, kw->n * sizeof(bool)) : NULL;
    for (size_t i = 0; i < params->n; i++) {
        const node *p = params->v[i];
        val v = UNDEF;
        bool have = i < n;
        if (have) v = args[i];
        if (!have && kw) {
            long k = cgt_obj_find(kw, p->s->p, p->s->len);
            if (k >= 0) {
                v = kw->v[k];
                used[k] = true;
                have = true;
            }
        }
        cgt_env_set(c, scope, p->s, v);
    }
    size_t left = 0;
    for (size_t k = 0; kw && k < kw->n; k++)
        left += !used[k];
    if (special & 1) {
        jobj *rest = cgt_obj_new(&c->ar);
        for (size_t k = 0; kw && k < kw->n; k++)
            if (!used[k]) cgt_obj_set(&c->ar, rest, kw->k[k], kw->v[k]);
        cgt_env_set(c, scope, cgt_cname(c, "kwargs"), vobj(rest, 0));
    } else if (left) {
        for (size_t k = 0; k < kw->n; k++)
            if (!used[k])
                return TERR(c, at, "macro %s takes no keyword argument '%.*s'", display,
                            (int)kw->k[k]->len, kw->k[k]->p);
    }
    if (special & 2) {
        size_t extra = n > params->n ? n - params->n : 0;
        jarr *va = cgt_arr_new(&c->ar, extra);
        for (size_t i = 0; i < extra; i++)
            va->v[i] = args[params->n + i];
        cgt_env_set(c, scope, cgt_cname(c, "varargs"), varr(va, 0));
    } else if (n > params->n) {
        return TERR(c, at, "macro %s takes not more than %zu argument(s)", display, params->n);
    }
    /* defaults, for the parameters that got nothing */
    for (size_t i = 0; i < params->n; i++) {
        const node *p = params->v[i];
        if (p->kind != N_KWARG || i < n) continue;
        if (kw) {
            long k = cgt_obj_find(kw, p->s->p, p->s->len);
            if (k >= 0) continue;
        }
        val d;
        TRY(eval(c, scope, p->a, &d));
        cgt_env_set(c, scope, p->s, d);
    }
    return RC_OK;
}

static int call_value(ctx *c, env *e, const node *at, val fn, val *args, size_t n, val *out)
{
    if (fn.t != V_FUNC)
        return TERR(c, at, "cannot call something that is not a function: got %s",
                    cgt_type_name(fn));
    const jfunc *f = fn.u.f;
    switch (f->kind) {
    case FN_NAMESPACE:
        return call_namespace(c, at, args, n, out);
    case FN_RANGE:
        return call_range(c, at, args, n, out);
    case FN_STRFTIME:
        return call_strftime(c, at, args, n, out);
    case FN_RAISE: {
        /* new Error(first argument's value): the message reaches the client as is */
        val m = n ? args[0] : UNDEF;
        if (m.t == V_UNDEF)
            m = vstr(cgt_jstr_borrow(&c->ar, "", 0));
        else
            TRY(cgt_raw_val(c, at, m, &m));
        if (c->st == CG_OK) {
            c->st = CG_E_VALUE;
            snprintf(c->msg, sizeof c->msg, "%.*s", (int)m.u.s->len, m.u.s->p);
            cgt_utf8_clip(c->msg);
        }
        return RC_ERR;
    }
    case FN_METHOD:
        return cgt_method_call(c, e, at, f, args, n, out);
    case FN_MACRO:
    case FN_CALLER: {
        const node *def = f->def;
        bool macro = f->kind == FN_MACRO;
        TRY(enter_depth(c, at));
        env *scope = cgt_env_new(c, macro ? e : f->lex);
        char display[80];
        if (macro)
            snprintf(display, sizeof display, "'%.*s'", (int)def->s->len, def->s->p);
        else
            snprintf(display, sizeof display, "None");
        /* a macro and a call block both keep their parameters in l1 and their body in l2 */
        int r = bind_macro_args(c, at, display, &def->l1, def->flag, args, n, scope);
        if (!r) r = capture(c, scope, at, &def->l2, out);
        c->depth--;
        return r;
    }
    }
    return TERR(c, at, "cannot call this value");
}

static int eval_call(ctx *c, env *e, const node *x, val *out)
{
    val *pos, fn;
    size_t np;
    jobj *kw;
    TRY(cgt_eval_args(c, e, &x->l1, &pos, &np, &kw));
    if (kw->n) pos[np++] = cgt_kwargs_val(c, kw);
    TRY(eval(c, e, x->a, &fn));
    return call_value(c, e, x, fn, pos, np, out);
}

/* ---- operators ---- */

static int eval_binary(ctx *c, env *e, const node *x, val *out)
{
    val l, r;
    TRY(eval(c, e, x->a, &l));
    if (x->op == OP_AND) return cgt_truthy(l) ? eval(c, e, x->b, out) : (*out = l, RC_OK);
    if (x->op == OP_OR) return cgt_truthy(l) ? (*out = l, RC_OK) : eval(c, e, x->b, out);
    TRY(eval(c, e, x->b, &r));
    int op = x->op;
    if (op == OP_EQ || op == OP_NE) {
        bool eq;
        TRY(cgt_loose_eq(c, x, l, r, &eq));
        *out = vbool(op == OP_EQ ? eq : !eq);
        return RC_OK;
    }
    static const char *const opname[] = {"or", "and", "not", "==",     "!=", "<", ">",
                                         "<=", ">=",  "in",  "not in", "+",  "-", "~",
                                         "*",  "/",   "//",  "%",      "**"};
    if (l.t == V_UNDEF || r.t == V_UNDEF) {
        if (r.t == V_UNDEF && (op == OP_IN || op == OP_NOTIN))
            return *out = vbool(op == OP_NOTIN), RC_OK;
        return TERR(c, x, "cannot perform operation %s on undefined values", opname[op]);
    }
    if (l.t == V_NULL || r.t == V_NULL)
        return TERR(c, x, "cannot perform operation on null values");
    if (op == OP_CAT) {
        val a, b;
        TRY(cgt_raw_val(c, x, l, &a));
        TRY(cgt_raw_val(c, x, r, &b));
        return cgt_str_concat(c, x, a.u.s, b.u.s, out);
    }
    bool lnum = is_num(l) || l.t == V_BOOL, rnum = is_num(r) || r.t == V_BOOL;
    if (op == OP_POW && lnum && rnum) {
        double a = l.t == V_BOOL ? l.u.b : l.u.n, b = r.t == V_BOOL ? r.u.b : r.u.n;
        if (a == 0 && b < 0) return TERR(c, x, "0.0 cannot be raised to a negative power");
        double res = (isnan(b) || (fabs(a) == 1 && isinf(b))) ? NAN : pow(a, b);
        if (!isfinite(res)) return TERR(c, x, "exponentiation result is not a finite real number");
        *out = (l.t == V_FLOAT || r.t == V_FLOAT || b < 0) ? vfloat(res) : vint(res);
        return RC_OK;
    }
    if (is_num(l) && is_num(r)) {
        double a = l.u.n, b = r.u.n;
        bool fl = l.t == V_FLOAT || r.t == V_FLOAT;
        switch (op) {
        case OP_ADD:
            *out = fl ? vfloat(a + b) : vint(a + b);
            return RC_OK;
        case OP_SUB:
            *out = fl ? vfloat(a - b) : vint(a - b);
            return RC_OK;
        case OP_MUL:
            *out = fl ? vfloat(a * b) : vint(a * b);
            return RC_OK;
        case OP_DIV:
            *out = vfloat(a / b);
            return RC_OK;
        case OP_FLOORDIV:
            *out = fl ? vfloat(floor(a / b)) : vint(floor(a / b));
            return RC_OK;
        case OP_MOD:
            *out = fl ? vfloat(fmod(a, b)) : vint(fmod(a, b));
            return RC_OK;
        case OP_LT:
            *out = vbool(a < b);
            return RC_OK;
        case OP_GT:
            *out = vbool(a > b);
            return RC_OK;
        case OP_GE:
            *out = vbool(a >= b);
            return RC_OK;
        case OP_LE:
            *out = vbool(a <= b);
            return RC_OK;
        default:
            break;
        }
    } else if (l.t == V_ARR && r.t == V_ARR) {
        if (op != OP_ADD)
            return TERR(c, x, "unknown operator \"%s\" between %s and %s", opname[op],
                        cgt_type_name(l), cgt_type_name(r));
        jarr *a = cgt_arr_new(&c->ar, l.u.a->n + r.u.a->n);
        if (l.u.a->n) memcpy(a->v, l.u.a->v, l.u.a->n * sizeof(val));
        if (r.u.a->n) memcpy(a->v + l.u.a->n, r.u.a->v, r.u.a->n * sizeof(val));
        *out = varr(a, 0);
        return cgt_step(c, x, a->n);
    } else if (r.t == V_ARR && (op == OP_IN || op == OP_NOTIN)) {
        bool member = false;
        TRY(cgt_step(c, x, r.u.a->n));
        for (size_t i = 0; i < r.u.a->n && !member; i++)
            member = cgt_strict_eq(r.u.a->v[i], l);
        *out = vbool(op == OP_IN ? member : !member);
        return RC_OK;
    }
    if ((l.t == V_STR || r.t == V_STR) && op == OP_ADD) {
        val a, b;
        TRY(cgt_raw_val(c, x, l, &a));
        TRY(cgt_raw_val(c, x, r, &b));
        return cgt_str_concat(c, x, a.u.s, b.u.s, out);
    }
    if (l.t == V_STR && r.t == V_STR && (op == OP_IN || op == OP_NOTIN)) {
        TRY(cgt_work(c, x, r.u.s->len));
        bool in = cgt_memfind(r.u.s->p, r.u.s->len, l.u.s->p, l.u.s->len) != NULL;
        *out = vbool(op == OP_IN ? in : !in);
        return RC_OK;
    }
    if (l.t == V_STR && r.t == V_OBJ && (op == OP_IN || op == OP_NOTIN)) {
        bool in = cgt_obj_find(r.u.o, l.u.s->p, l.u.s->len) >= 0;
        *out = vbool(op == OP_IN ? in : !in);
        return RC_OK;
    }
    return TERR(c, x, "unknown operator \"%s\" between %s and %s", opname[op], cgt_type_name(l),
                cgt_type_name(r));
}

static int eval_member(ctx *c, env *e, const node *x, val *out)
{
    val obj, prop;
    TRY(eval(c, e, x->a, &obj));
    const node *p = x->b;
    if (x->flag && p->kind == N_SLICE) {
        if (obj.t != V_ARR && obj.t != V_STR)
            return TERR(c, x, "slice object must be an array or string");
        val s[3] = {UNDEF, UNDEF, UNDEF};
        const node *parts[3] = {p->a, p->b, p->c};
        for (int i = 0; i < 3; i++) {
            if (parts[i]) TRY(eval(c, e, parts[i], &s[i]));
            if (s[i].t != V_INT && s[i].t != V_UNDEF)
                return TERR(c, x, "slice %s must be numeric or undefined",
                            i == 0   ? "start"
                            : i == 1 ? "stop"
                                     : "step");
        }
        if (obj.t == V_ARR) {
            slicer sl = cgt_slice_begin((double)obj.u.a->n, &s[0], &s[1], &s[2]);
            jarr *r = cgt_arr_new(&c->ar, obj.u.a->n);
            r->n = 0;
            size_t idx;
            while (r->n < obj.u.a->n && cgt_slice_next(&sl, &idx)) {
                r->v[r->n++] = obj.u.a->v[idx];
                TRY(cgt_step(c, x, 1));
            }
            *out = varr(r, 0);
            return RC_OK;
        }
        size_t ncp;
        size_t *off = cgt_cp_offsets(c, obj.u.s, &ncp);
        TRY(cgt_work(c, x, obj.u.s->len));
        slicer sl = cgt_slice_begin((double)ncp, &s[0], &s[1], &s[2]);
        sbuf b = {0};
        size_t idx, taken = 0;
        int r = RC_OK;
        while (!r && taken < ncp && cgt_slice_next(&sl, &idx)) {
            r = cgt_cput(c, x, &b, obj.u.s->p + off[idx], off[idx + 1] - off[idx]);
            taken++;
        }
        return cgt_sbuf_done(c, x, &b, r, out);
    }
    if (x->flag)
        TRY(eval(c, e, p, &prop));
    else if (p->kind == N_INT)
        prop = vint(p->num);
    else
        prop = vstr(p->s);
    return cgt_member_get(c, x, obj, prop, out);
}

static int eval(ctx *c, env *e, const node *x, val *out)
{
    TRY(cgt_step(c, x, 1));
    TRY(enter_depth(c, x));
    int r = RC_OK;
    switch (x->kind) {
    case N_STR:
        *out = vstr(x->s);
        break;
    case N_INT:
        *out = vint(x->num);
        break;
    case N_FLOAT:
        *out = vfloat(x->num);
        break;
    case N_IDENT:
        *out = cgt_env_lookup(c, e, x->s);
        break;
    case N_ARRAY:
    case N_TUPLE: {
        jarr *a = cgt_arr_new(&c->ar, x->l1.n);
        for (size_t i = 0; i < x->l1.n && !r; i++)
            r = eval(c, e, x->l1.v[i], &a->v[i]);
        *out = varr(a, x->kind == N_TUPLE ? SUB_TUPLE : 0);
        break;
    }
    case N_DICT: {
        jobj *o = cgt_obj_new(&c->ar);
        for (size_t i = 0; i < x->l1.n && !r; i++) {
            val k, v;
            r = eval(c, e, x->l1.v[i], &k);
            if (!r && k.t != V_STR)
                r = TERR(c, x->l1.v[i], "object keys must be strings: got %s", cgt_type_name(k));
            if (!r) r = eval(c, e, x->l2.v[i], &v);
            if (!r) cgt_obj_set(&c->ar, o, k.u.s, v);
        }
        *out = vobj(o, 0);
        break;
    }
    case N_MEMBER:
        r = eval_member(c, e, x, out);
        break;
    case N_CALL:
        r = eval_call(c, e, x, out);
        break;
    case N_UNARY: {
        val v;
        r = eval(c, e, x->a, &v);
        if (r) break;
        if (x->op == OP_NOT) {
            *out = vbool(!cgt_truthy(v));
        } else if (is_num(v) || v.t == V_BOOL) {
            double d = v.t == V_BOOL ? v.u.b : v.u.n;
            d = x->op == OP_NEG ? -d : d;
            *out = v.t == V_FLOAT ? vfloat(d) : vint(d);
        } else {
            r = TERR(c, x, "unknown operator \"%s\" for %s", x->op == OP_NEG ? "-" : "+",
                     cgt_type_name(v));
        }
        break;
    }
    case N_BINARY:
        r = eval_binary(c, e, x, out);
        break;
    case N_FILTER: {
        val v;
        r = eval(c, e, x->a, &v);
        if (!r) r = cgt_apply_filter(c, e, x, v, out);
        break;
    }
    case N_TEST: {
        val v;
        bool res;
        r = eval(c, e, x->a, &v);
        if (!r) r = cgt_run_test(c, x, x->op, v, NULL, &res);
        if (!r) *out = vbool(x->flag ? !res : res);
        break;
    }
    case N_SELECT: {
        val t;
        r = eval(c, e, x->b, &t);
        if (!r) {
            if (cgt_truthy(t))
                r = eval(c, e, x->a, out);
            else
                *out = UNDEF;
        }
        break;
    }
    case N_TERNARY: {
        val t;
        r = eval(c, e, x->a, &t);
        if (!r) r = eval(c, e, cgt_truthy(t) ? x->b : x->c, out);
        break;
    }
    default:
        r = TERR(c, x, "unknown expression");
        break;
    }
    c->depth--;
    return r;
}

/* ---- statements ---- */

static int assign_loop_var(ctx *c, env *scope, const node *target, val item)
{
    if (target->kind == N_IDENT) {
        cgt_env_set(c, scope, target->s, item);
        return RC_OK;
    }
    if (item.t != V_ARR || item.sub == SUB_TUPLE)
        return TERR(c, target, "cannot unpack non-iterable type: %s", cgt_type_name(item));
    if (item.u.a->n != target->l1.n)
        return TERR(c, target, "too %s items to unpack",
                    target->l1.n > item.u.a->n ? "few" : "many");
    for (size_t j = 0; j < target->l1.n; j++)
        cgt_env_set(c, scope, target->l1.v[j]->s, item.u.a->v[j]);
    return RC_OK;
}

static int exec_for(ctx *c, env *e, const node *x)
{
    env *scope = cgt_env_new(c, e);
    val it;
    TRY(eval(c, scope, x->b, &it));
    if (it.t != V_ARR && it.t != V_OBJ)
        return TERR(c, x, "expected iterable or object type in for loop: got %s",
                    cgt_type_name(it));
    if (it.t == V_OBJ) TRY(cgt_obj_items(c, it.u.o, 1, &it));
    const jarr *src = it.u.a;
    jarr *items = cgt_arr_new(&c->ar, src->n);
    items->n = 0;
    for (size_t i = 0; i < src->n; i++) {
        TRY(cgt_step(c, x, 1));
        env *ls = cgt_env_new(c, scope);
        TRY(assign_loop_var(c, ls, x->a, src->v[i])); /* unpacking is checked for every item */
        if (x->c) {
            val t;
            TRY(eval(c, ls, x->c, &t));
            if (!cgt_truthy(t)) continue;
        }
        items->v[items->n++] = src->v[i];
    }
    static jstr K[9] = {
        {"index", 5, 5, true},     {"index0", 6, 6, true},   {"revindex", 8, 8, true},
        {"revindex0", 9, 9, true}, {"first", 5, 5, true},    {"last", 4, 4, true},
        {"length", 6, 6, true},    {"previtem", 8, 8, true}, {"nextitem", 8, 8, true}};
    static jstr LOOP = {"loop", 4, 4, true};
    bool none = true;
    size_t n = items->n;
    for (size_t i = 0; i < n; i++) {
        TRY(cgt_step(c, x, 1));
        jobj *lo = cgt_obj_new(&c->ar);
        cgt_obj_set(&c->ar, lo, &K[0], vint((double)i + 1));
        cgt_obj_set(&c->ar, lo, &K[1], vint((double)i));
        cgt_obj_set(&c->ar, lo, &K[2], vint((double)(n - i)));
        cgt_obj_set(&c->ar, lo, &K[3], vint((double)(n - i - 1)));
        cgt_obj_set(&c->ar, lo, &K[4], vbool(i == 0));
        cgt_obj_set(&c->ar, lo, &K[5], vbool(i == n - 1));
        cgt_obj_set(&c->ar, lo, &K[6], vint((double)n));
        cgt_obj_set(&c->ar, lo, &K[7], i > 0 ? items->v[i - 1] : UNDEF);
        cgt_obj_set(&c->ar, lo, &K[8], i + 1 < n ? items->v[i + 1] : UNDEF);
        cgt_env_set(c, scope, &LOOP, vobj(lo, 0));
        TRY(assign_loop_var(c, scope, x->a, items->v[i]));
        size_t mark = c->out->len;
        int r = cgt_exec_list(c, scope, &x->l1);
        /* break and continue drop what their iteration printed, as the reference does */
        if (r == RC_CONT) {
            c->out->len = mark;
            continue;
        }
        if (r == RC_BREAK) {
            c->out->len = mark;
            break;
        }
        if (r) return r;
        none = false;
    }
    if (none) TRY(cgt_exec_list(c, scope, &x->l2));
    return RC_OK;
}

static int exec_set(ctx *c, env *e, const node *x)
{
    val v;
    if (x->b)
        TRY(eval(c, e, x->b, &v));
    else
        TRY(capture(c, e, x, &x->l1, &v));
    const node *t = x->a;
    if (t->kind == N_IDENT) {
        cgt_env_set(c, e, t->s, v);
    } else if (t->kind == N_TUPLE) {
        if (v.t != V_ARR)
            return TERR(c, x, "cannot unpack non-iterable type in set: %s", cgt_type_name(v));
        if (v.u.a->n != t->l1.n)
            return TERR(c, x, "too %s items to unpack in set", t->l1.n > v.u.a->n ? "few" : "many");
        for (size_t i = 0; i < t->l1.n; i++)
            cgt_env_set(c, e, t->l1.v[i]->s, v.u.a->v[i]);
    } else {
        val obj;
        TRY(eval(c, e, t->a, &obj));
        if (obj.t != V_NS) return TERR(c, x, "cannot assign attribute on non-namespace object");
        cgt_obj_set(&c->ar, obj.u.o, t->b->s, v);
    }
    return RC_OK;
}

static int exec_print(ctx *c, const node *at, val v)
{
    if (v.t == V_NULL || v.t == V_UNDEF) return RC_OK;
    return cgt_emit(c, at, c->out, v);
}

static int exec(ctx *c, env *e, const node *x)
{
    TRY(cgt_step(c, x, 1));
    TRY(enter_depth(c, x));
    int r = RC_OK;
    switch (x->kind) {
    case N_TEXT:
        r = cgt_cput(c, x, c->out, x->s->p, x->s->len);
        break;
    case N_COMMENT:
        break;
    case N_OUTPUT: {
        val v;
        r = eval(c, e, x->a, &v);
        if (!r) r = exec_print(c, x->a, v);
        break;
    }
    case N_IF: {
        val t;
        r = eval(c, e, x->a, &t);
        if (!r) r = cgt_exec_list(c, e, cgt_truthy(t) ? &x->l1 : &x->l2);
        break;
    }
    case N_FOR:
        r = exec_for(c, e, x);
        break;
    case N_SET:
        r = exec_set(c, e, x);
        break;
    case N_MACRO: {
        val f = cgt_fn_val(c, FN_MACRO);
        f.u.f->def = x;
        cgt_env_set(c, e, x->s, f);
        break;
    }
    case N_CALLBLOCK: {
        static jstr CALLER = {"caller", 6, 6, true};
        val caller = cgt_fn_val(c, FN_CALLER), fn, v;
        caller.u.f->def = x;
        caller.u.f->lex = e;
        val *pos;
        size_t np;
        jobj *kw;
        r = cgt_eval_args(c, e, &x->a->l1, &pos, &np, &kw);
        if (r) break;
        pos[np++] = cgt_kwargs_val(c, kw);
        r = eval(c, e, x->a->a, &fn);
        if (r) break;
        env *ne = cgt_env_new(c, e);
        cgt_env_set(c, ne, &CALLER, caller);
        r = call_value(c, ne, x->a, fn, pos, np, &v);
        if (!r) r = exec_print(c, x, v);
        break;
    }
    case N_FILTERBLOCK: {
        val body, v;
        r = capture(c, e, x, &x->l1, &body);
        if (!r) r = cgt_apply_filter(c, e, x->a, body, &v);
        if (!r) r = exec_print(c, x, v);
        break;
    }
    case N_BREAK:
    case N_CONTINUE:
        c->ctl = x;
        r = x->kind == N_BREAK ? RC_BREAK : RC_CONT;
        break;
    default: {
        val v; /* an expression used as a statement */
        r = eval(c, e, x, &v);
        if (!r) r = exec_print(c, x, v);
        break;
    }
    }
    c->depth--;
    return r;
}

int cgt_exec_list(ctx *c, env *e, const nodelist *l)
{
    for (size_t i = 0; i < l->n; i++)
        TRY(exec(c, e, l->v[i]));
    return RC_OK;
}
