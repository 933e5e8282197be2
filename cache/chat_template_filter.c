/* Chat templates, the named operations: tests ("x is odd"), the methods of strings and
 * mappings ("s.split()", "d.items()") and filters ("x | tojson"), with @huggingface/jinja's
 * rules for which apply to which type. */
#include "cache/chat_template_impl.h"

#include <math.h>
#include <string.h>

/* ---- tests ---- */

int cgt_run_test(ctx *c, const node *at, int test, val v, const val *arg, bool *res)
{
    switch (test) {
    case T_boolean:
        *res = v.t == V_BOOL;
        break;
    case T_callable:
        *res = v.t == V_FUNC;
        break;
    case T_odd:
    case T_even:
        if (v.t != V_INT)
            return TERR(c, at, "cannot %s on %s", cgt_test_names[test], cgt_type_name(v));
        *res = (fmod(v.u.n, 2) != 0) == (test == T_odd);
        break;
    case T_false:
        *res = v.t == V_BOOL && !v.u.b;
        break;
    case T_true:
        *res = v.t == V_BOOL && v.u.b;
        break;
    case T_none:
        *res = v.t == V_NULL;
        break;
    case T_string:
        *res = v.t == V_STR;
        break;
    case T_number:
        *res = is_num(v);
        break;
    case T_integer:
        *res = v.t == V_INT;
        break;
    case T_iterable:
        *res = (v.t == V_ARR && v.sub != SUB_TUPLE) || v.t == V_STR;
        break;
    case T_mapping:
        *res = v.t == V_OBJ;
        break;
    case T_sequence:
        *res = v.t == V_ARR || v.t == V_OBJ || v.t == V_STR;
        break;
    case T_lower:
    case T_upper: {
        *res = false;
        if (v.t != V_STR) break;
        val m;
        TRY(cgt_case_val(c, at, v.u.s, test == T_upper, &m));
        *res = jstr_eq(m.u.s, v.u.s);
        break;
    }
    case T_defined:
        *res = v.t != V_UNDEF;
        break;
    case T_undefined:
        *res = v.t == V_UNDEF;
        break;
    case T_equalto:
    case T_eq:
        if (!arg)
            return TERR(c, at, "the %s test needs a value to compare with", cgt_test_names[test]);
        /* a.value === b.value */
        *res = cgt_strict_eq(v, *arg);
        break;
    default:
        return TERR(c, at, "unknown test");
    }
    return RC_OK;
}

/* ---- methods of strings and mappings ---- */

int cgt_obj_items(ctx *c, const jobj *o, int which, val *out) /* 0 items, 1 keys, 2 values */
{
    jarr *a = cgt_arr_new(&c->ar, o->n);
    for (size_t i = 0; i < o->n; i++) {
        val k = vstr((jstr *)o->k[i]);
        if (which == 1)
            a->v[i] = k;
        else if (which == 2)
            a->v[i] = o->v[i];
        else {
            jarr *pair = cgt_arr_new(&c->ar, 2);
            pair->v[0] = k;
            pair->v[1] = o->v[i];
            a->v[i] = varr(pair, 0);
        }
    }
    *out = varr(a, 0);
    return cgt_step(c, NULL, o->n);
}

int cgt_method_call(ctx *c, env *e, const node *at, const jfunc *f, val *args, size_t n, val *out)
{
    (void)e;
    val self = f->self;
    if (f->method >= M_FIRST_MAPPING) {
        const jobj *o = self.u.o;
        switch (f->method) {
        case M_get: {
            val key = n > 0 ? args[0] : UNDEF;
            if (key.t != V_STR)
                return TERR(c, at, "object key must be a string: got %s", cgt_type_name(key));
            if (!cgt_obj_get(o, key.u.s->p, key.u.s->len, out)) *out = n > 1 ? args[1] : VNULL;
            return RC_OK;
        }
        case M_items:
            return cgt_obj_items(c, o, 0, out);
        case M_keys:
            return cgt_obj_items(c, o, 1, out);
        case M_values:
            return cgt_obj_items(c, o, 2, out);
        case M_dictsort: {
            const jobj *kw = NULL;
            val pos[3];
            size_t np = 0;
            for (size_t i = 0; i < n; i++) {
                if (args[i].t == V_OBJ && args[i].sub == SUB_KWARGS)
                    kw = args[i].u.o;
                else if (np < 3)
                    pos[np++] = args[i];
            }
            val cs = cgt_arg_or(pos, np, 0, kw, "case_sensitive", vbool(false));
            if (cs.t != V_BOOL) return TERR(c, at, "case_sensitive must be a boolean");
            static jstr KEY = {"key", 3, 3, true};
            val by = cgt_arg_or(pos, np, 1, kw, "by", vstr(&KEY));
            if (by.t != V_STR) return TERR(c, at, "by must be a string");
            bool by_value = jstr_eqc(by.u.s, "value");
            if (!by_value && !jstr_eqc(by.u.s, "key"))
                return TERR(c, at, "by must be either 'key' or 'value'");
            val rev = cgt_arg_or(pos, np, 2, kw, "reverse", vbool(false));
            if (rev.t != V_BOOL) return TERR(c, at, "reverse must be a boolean");
            val items;
            TRY(cgt_obj_items(c, o, 0, &items));
            static jstr IDX0 = {"0", 1, 1, true}, IDX1 = {"1", 1, 1, true};
            sortctx s = {c, at, cs.u.b, rev.u.b, by_value ? &IDX1 : &IDX0};
            TRY(cgt_merge_sort(&s, items.u.a->v, items.u.a->n));
            *out = items;
            return RC_OK;
        }
        }
        return TERR(c, at, "unknown method");
    }
    const jstr *s = self.u.s;
    switch (f->method) {
    case M_upper:
        return cgt_case_val(c, at, s, true, out);
    case M_lower:
        return cgt_case_val(c, at, s, false, out);
    case M_strip:
        *out = cgt_str_trim(c, s, true, true);
        return cgt_work(c, at, s->len);
    case M_lstrip:
        *out = cgt_str_trim(c, s, true, false);
        return cgt_work(c, at, s->len);
    case M_rstrip:
        *out = cgt_str_trim(c, s, false, true);
        return cgt_work(c, at, s->len);
    case M_title:
        return cgt_str_title(c, at, s, out);
    case M_capitalize:
        return cgt_str_capitalize(c, at, s, out);
    case M_startswith:
    case M_endswith: {
        const char *name = f->method == M_startswith ? "startswith" : "endswith";
        bool suffix = f->method == M_endswith;
        if (n == 0) return TERR(c, at, "%s() requires at least one argument", name);
        val p = args[0];
        if (p.t == V_STR) {
            *out = vbool(cgt_has_prefix(s, p.u.s, suffix));
            return RC_OK;
        }
        if (p.t == V_ARR) {
            for (size_t i = 0; i < p.u.a->n; i++) {
                if (p.u.a->v[i].t != V_STR)
                    return TERR(c, at, "%s() tuple elements must be strings", name);
                if (cgt_has_prefix(s, p.u.a->v[i].u.s, suffix)) {
                    *out = vbool(true);
                    return RC_OK;
                }
            }
            *out = vbool(false);
            return RC_OK;
        }
        return TERR(c, at, "%s() argument must be a string or tuple of strings", name);
    }
    case M_split:
        return cgt_str_split(c, at, s, n > 0 ? args[0] : VNULL, n > 1 ? args[1] : vint(-1), out);
    case M_replace: {
        if (n < 2) return TERR(c, at, "replace() requires at least two arguments");
        if (args[0].t != V_STR || args[1].t != V_STR)
            return TERR(c, at, "replace() arguments must be strings");
        val count = VNULL;
        if (n > 2) {
            if (args[2].t == V_OBJ && args[2].sub == SUB_KWARGS) {
                if (!cgt_kw_get(args[2].u.o, "count", &count)) count = VNULL;
            } else {
                count = args[2];
            }
        }
        if (count.t != V_INT && count.t != V_NULL)
            return TERR(c, at, "replace() count argument must be a number or null");
        return cgt_str_replace(c, at, s, args[0].u.s, args[1].u.s, count, out);
    }
    }
    return TERR(c, at, "unknown method");
}

static val method_val(ctx *c, val self, int method)
{
    val f = cgt_fn_val(c, FN_METHOD);
    f.u.f->method = (uint8_t)method;
    f.u.f->self = self;
    return f;
}

static int method_index(const jstr *name, int first, int last)
{
    for (int i = first; i < last; i++)
        if (jstr_eqc(name, cgt_method_names[i])) return i;
    return -1;
}

int cgt_member_get(ctx *c, const node *at, val obj, val prop, val *out)
{
    if (is_container(obj)) {
        if (prop.t != V_STR)
            return TERR(c, at, "cannot access property with non-string: got %s",
                        cgt_type_name(prop));
        if (cgt_obj_get(obj.u.o, prop.u.s->p, prop.u.s->len, out)) return RC_OK;
        int m = obj.t == V_OBJ ? method_index(prop.u.s, M_FIRST_MAPPING, M_COUNT) : -1;
        *out = m >= 0 ? method_val(c, obj, m) : UNDEF;
        return RC_OK;
    }
    if (obj.t == V_ARR || obj.t == V_STR) {
        if (prop.t == V_INT) {
            if (obj.t == V_STR) return cgt_str_at(c, at, obj.u.s, prop.u.n, out);
            double i = isnan(prop.u.n) ? 0 : prop.u.n, len = (double)obj.u.a->n;
            double k = i >= 0 ? i : len + i;
            *out = (k < 0 || k >= len) ? UNDEF : obj.u.a->v[(size_t)k];
            return RC_OK;
        }
        if (prop.t != V_STR)
            return TERR(c, at, "cannot access property with non-string/non-number: got %s",
                        cgt_type_name(prop));
        if (jstr_eqc(prop.u.s, "length")) {
            *out = vint(obj.t == V_STR ? (double)obj.u.s->u16 : (double)obj.u.a->n);
            return RC_OK;
        }
        int m = obj.t == V_STR ? method_index(prop.u.s, 0, M_FIRST_MAPPING) : -1;
        *out = m >= 0 ? method_val(c, obj, m) : UNDEF;
        return RC_OK;
    }
    if (prop.t != V_STR)
        return TERR(c, at, "cannot access property with non-string: got %s", cgt_type_name(prop));
    *out = UNDEF;
    return RC_OK;
}

/* ---- filters ---- */

static int join_vals(ctx *c, const node *at, const jarr *a, const jstr *sep, val *out)
{
    sbuf b = {0};
    int r = RC_OK;
    for (size_t i = 0; i < a->n && !r; i++) {
        if (i && sep) r = cgt_cput(c, at, &b, sep->p, sep->len);
        val v = a->v[i];
        if (!r && v.t != V_UNDEF && v.t != V_NULL) r = cgt_raw_str(c, at, &b, v, 0);
    }
    return cgt_sbuf_done(c, at, &b, r, out);
}

static int tojson_val(ctx *c, const node *at, val v, const jopts *o, val *out)
{
    sbuf b = {0};
    int r = cgt_to_json(c, at, &b, v, o, 0, true);
    return cgt_sbuf_done(c, at, &b, r, out);
}

static int num_from_str(const jstr *s, bool as_int, double *v)
{
    *v = as_int ? cgt_js_parse_int(s->p, s->len) : cgt_js_parse_float(s->p, s->len);
    return !isnan(*v);
}

/* A sorted copy of a, by s's order (a stays as it is). */
static int sorted_copy(ctx *c, const jarr *a, sortctx s, val *out)
{
    jarr *r = cgt_arr_new(&c->ar, a->n);
    if (a->n) memcpy(r->v, a->v, a->n * sizeof(val));
    TRY(cgt_merge_sort(&s, r->v, r->n));
    *out = varr(r, 0);
    return RC_OK;
}

/* ---- filters without arguments ("x | f"), by the type of x ---- */

static int plain_array(ctx *c, const node *f, val v, val *out)
{
    const jarr *a = v.u.a;
    switch (f->op) {
    case F_list:
        *out = v;
        return RC_OK;
    case F_first:
        *out = a->n ? a->v[0] : UNDEF;
        return RC_OK;
    case F_last:
        *out = a->n ? a->v[a->n - 1] : UNDEF;
        return RC_OK;
    case F_length:
        *out = vint((double)a->n);
        return RC_OK;
    case F_reverse: {
        jarr *r = cgt_arr_new(&c->ar, a->n);
        for (size_t i = 0; i < a->n; i++)
            r->v[i] = a->v[a->n - 1 - i];
        *out = varr(r, 0);
        return cgt_step(c, f, a->n);
    }
    case F_sort:
        return sorted_copy(c, a, (sortctx){c, f, false, false, NULL}, out);
    case F_join:
        return join_vals(c, f, a, NULL, out);
    case F_string: {
        sbuf b = {0};
        int r = cgt_to_json(c, f, &b, v, &JSON_DEFAULT, 0, false);
        return cgt_sbuf_done(c, f, &b, r, out);
    }
    case F_unique: {
        jarr *r = cgt_arr_new(&c->ar, a->n);
        r->n = 0;
        TRY(cgt_step(c, f, (uint64_t)a->n * a->n / 2));
        for (size_t i = 0; i < a->n; i++) {
            bool seen = false;
            for (size_t k = 0; k < r->n && !seen; k++)
                seen = cgt_same_value_zero(r->v[k], a->v[i]);
            if (!seen) r->v[r->n++] = a->v[i];
        }
        *out = varr(r, 0);
        return RC_OK;
    }
    }
    return TERR(c, f, "unknown ArrayValue filter: %s", cgt_filter_names[f->op]);
}

static int plain_string(ctx *c, const node *f, val v, val *out)
{
    const jstr *s = v.u.s;
    switch (f->op) {
    case F_length:
        *out = vint((double)s->u16);
        return RC_OK;
    case F_upper:
        return cgt_case_val(c, f, s, true, out);
    case F_lower:
        return cgt_case_val(c, f, s, false, out);
    case F_title:
        return cgt_str_title(c, f, s, out);
    case F_capitalize:
        return cgt_str_capitalize(c, f, s, out);
    case F_trim:
        *out = cgt_str_trim(c, s, true, true);
        return cgt_work(c, f, s->len);
    case F_indent:
        return cgt_str_indent(c, f, s, 4, false, false, out);
    case F_join:
    case F_string:
        *out = v;
        return RC_OK;
    case F_int:
    case F_float: {
        double d;
        if (!num_from_str(s, f->op == F_int, &d)) d = 0;
        *out = f->op == F_int ? vint(d) : vfloat(d);
        return RC_OK;
    }
    }
    return TERR(c, f, "unknown StringValue filter: %s", cgt_filter_names[f->op]);
}

static int plain_number(ctx *c, const node *f, val v, val *out)
{
    switch (f->op) {
    case F_abs:
        *out = v;
        out->u.n = fabs(v.u.n);
        return RC_OK;
    case F_int:
        *out = vint(floor(v.u.n));
        return RC_OK;
    case F_float:
        *out = vfloat(v.u.n);
        return RC_OK;
    case F_string: {
        sbuf b = {0};
        int r = cgt_emit(c, f, &b, v);
        return cgt_sbuf_done(c, f, &b, r, out);
    }
    }
    return TERR(c, f, "unknown NumericValue filter: %s", cgt_filter_names[f->op]);
}

static int plain_object(ctx *c, env *e, const node *f, val v, val *out)
{
    switch (f->op) {
    case F_items:
        return cgt_obj_items(c, v.u.o, 0, out);
    case F_length:
        *out = vint((double)v.u.o->n);
        return RC_OK;
    default: {
        int m = method_index(f->s, M_FIRST_MAPPING, M_COUNT);
        if (m < 0) break;
        val fn = method_val(c, v, m);
        return cgt_method_call(c, e, f, fn.u.f, NULL, 0, out);
    }
    }
    return TERR(c, f, "unknown ObjectValue filter: %s", cgt_filter_names[f->op]);
}

static int plain_bool(ctx *c, const node *f, val v, val *out)
{
    switch (f->op) {
    case F_bool:
        *out = v;
        return RC_OK;
    case F_int:
        *out = vint(v.u.b);
        return RC_OK;
    case F_float:
        *out = vfloat(v.u.b);
        return RC_OK;
    case F_string:
        return cgt_str_val(c, f, v.u.b ? "true" : "false", v.u.b ? 4 : 5, out);
    }
    return TERR(c, f, "unknown BooleanValue filter: %s", cgt_filter_names[f->op]);
}

static int filter_plain(ctx *c, env *e, const node *f, val v, val *out)
{
    if (f->op == F_safe) return *out = v, RC_OK;
    if (f->op == F_tojson) return tojson_val(c, f, v, &JSON_DEFAULT, out);
    switch (v.t) {
    case V_ARR:
        return plain_array(c, f, v, out);
    case V_STR:
        return plain_string(c, f, v, out);
    case V_INT:
    case V_FLOAT:
        return plain_number(c, f, v, out);
    case V_OBJ:
        return plain_object(c, e, f, v, out);
    case V_BOOL:
        return plain_bool(c, f, v, out);
    default:
        break;
    }
    return TERR(c, f, "cannot apply filter \"%s\" to type: %s", cgt_filter_names[f->op],
                cgt_type_name(v));
}

/* ---- filters with arguments ("x | f(...)") ---- */

/* The evaluated arguments of a filter call. */
typedef struct fargs {
    val *pos;
    size_t np;
    jobj *kw;
} fargs;

static int filter_args(ctx *c, env *e, const node *f, fargs *a)
{
    return cgt_eval_args(c, e, &f->l1, &a->pos, &a->np, &a->kw);
}

/* The positional argument i, else the keyword name, else def. */
static val farg(const fargs *a, size_t i, const char *name, val def)
{
    return cgt_arg_or(a->pos, a->np, i, a->kw, name, def);
}

/* tojson(indent=, ensure_ascii=, sort_keys=, separators=): keywords only. */
static int call_tojson(ctx *c, env *e, const node *f, val v, val *out)
{
    fargs a;
    TRY(filter_args(c, e, f, &a));
    jopts o = {0};
    val indent = cgt_arg_or(NULL, 0, 0, a.kw, "indent", VNULL);
    if (indent.t != V_INT && indent.t != V_NULL)
        return TERR(c, f, "if set, indent must be a number");
    if (indent.t == V_INT && !isnan(indent.u.n) && indent.u.n != 0) {
        if (indent.u.n < 0) return TERR(c, f, "invalid count value: %g", indent.u.n);
        if (indent.u.n > TPL_MAX_INDENT) return TERR(c, f, "indent over %d", TPL_MAX_INDENT);
        o.indent = indent.u.n;
    }
    val ea = cgt_arg_or(NULL, 0, 0, a.kw, "ensure_ascii", vbool(false));
    if (ea.t != V_BOOL) return TERR(c, f, "if set, ensure_ascii must be a boolean");
    val sk = cgt_arg_or(NULL, 0, 0, a.kw, "sort_keys", vbool(false));
    if (sk.t != V_BOOL) return TERR(c, f, "if set, sort_keys must be a boolean");
    val sep = cgt_arg_or(NULL, 0, 0, a.kw, "separators", VNULL);
    if (sep.t == V_ARR) {
        if (sep.u.a->n != 2 || sep.u.a->v[0].t != V_STR || sep.u.a->v[1].t != V_STR)
            return TERR(c, f, "separators must be a tuple of two strings");
        o.item_sep = sep.u.a->v[0].u.s;
        o.key_sep = sep.u.a->v[1].u.s;
    } else if (sep.t != V_NULL) {
        return TERR(c, f, "if set, separators must be a tuple of two strings");
    }
    o.ensure_ascii = ea.u.b;
    o.sort_keys = sk.u.b;
    return tojson_val(c, f, v, &o, out);
}

/* The empty string, the default of join's separator and of default's value. */
static jstr EMPTY_STR = {"", 0, 0, true};

/* join(separator): the items of a list, or the characters of a string. */
static int call_join(ctx *c, env *e, const node *f, val v, val *out)
{
    if (v.t != V_STR && v.t != V_ARR)
        return TERR(c, f, "cannot apply filter \"join\" to type: %s", cgt_type_name(v));
    fargs a;
    TRY(filter_args(c, e, f, &a));
    val sep = farg(&a, 0, "separator", vstr(&EMPTY_STR));
    if (sep.t != V_STR) return TERR(c, f, "separator must be a string");
    if (v.t == V_ARR) return join_vals(c, f, v.u.a, sep.u.s, out);
    size_t ncp;
    size_t *off = cgt_cp_offsets(c, v.u.s, &ncp);
    sbuf b = {0};
    int r = cgt_work(c, f, v.u.s->len);
    for (size_t i = 0; i < ncp && !r; i++) {
        if (i) r = cgt_cput(c, f, &b, sep.u.s->p, sep.u.s->len);
        if (!r) r = cgt_cput(c, f, &b, v.u.s->p + off[i], off[i + 1] - off[i]);
    }
    return cgt_sbuf_done(c, f, &b, r, out);
}

/* int(default) and float(default): the default when a string is no number. */
static int call_number(ctx *c, env *e, const node *f, val v, val *out)
{
    bool as_int = f->op == F_int;
    fargs a;
    TRY(filter_args(c, e, f, &a));
    val def = farg(&a, 0, "default", as_int ? vint(0) : vfloat(0));
    if (v.t == V_STR) {
        double d;
        if (!num_from_str(v.u.s, as_int, &d)) return *out = def, RC_OK;
        *out = as_int ? vint(d) : vfloat(d);
        return RC_OK;
    }
    if (is_num(v)) return *out = v, RC_OK;
    if (v.t == V_BOOL) return *out = as_int ? vint(v.u.b) : vfloat(v.u.b), RC_OK;
    return TERR(c, f, "cannot apply filter \"%s\" to type: %s", cgt_filter_names[f->op],
                cgt_type_name(v));
}

/* default(value, boolean): value for an undefined x (or, with boolean, a falsy one). */
static int call_default(ctx *c, env *e, const node *f, val v, val *out)
{
    fargs a;
    TRY(filter_args(c, e, f, &a));
    val def = a.np > 0 ? a.pos[0] : vstr(&EMPTY_STR);
    val boolean = farg(&a, 1, "boolean", vbool(false));
    if (boolean.t != V_BOOL) return TERR(c, f, "`default` filter flag must be a boolean");
    *out = (v.t == V_UNDEF || (boolean.u.b && !cgt_truthy(v))) ? def : v;
    return RC_OK;
}

/* sort(reverse, case_sensitive, attribute) */
static int call_sort(ctx *c, env *e, const node *f, const jarr *l, val *out)
{
    fargs a;
    TRY(filter_args(c, e, f, &a));
    val rev = farg(&a, 0, "reverse", vbool(false));
    if (rev.t != V_BOOL) return TERR(c, f, "reverse must be a boolean");
    val cs = farg(&a, 1, "case_sensitive", vbool(false));
    if (cs.t != V_BOOL) return TERR(c, f, "case_sensitive must be a boolean");
    val attr = farg(&a, 2, "attribute", VNULL);
    if (attr.t != V_STR && attr.t != V_INT && attr.t != V_NULL)
        return TERR(c, f, "attribute must be a string, integer, or null");
    if (attr.t == V_INT) TRY(cgt_raw_val(c, f, attr, &attr));
    return sorted_copy(c, l, (sortctx){c, f, cs.u.b, rev.u.b, attr.t == V_STR ? attr.u.s : NULL},
                       out);
}

/* selectattr / rejectattr(attribute, test, value): string literals only, as in
 * @huggingface/jinja, so the arguments are read from the syntax tree. */
static int call_selectattr(ctx *c, const node *f, const jarr *l, val *out)
{
    const char *name = cgt_filter_names[f->op];
    bool select = f->op == F_selectattr;
    for (size_t i = 0; i < l->n; i++)
        if (!is_container(l->v[i]))
            return TERR(c, f, "`%s` can only be applied to array of objects", name);
    for (size_t i = 0; i < f->l1.n; i++)
        if (f->l1.v[i]->kind != N_STR) return TERR(c, f, "arguments of `%s` must be strings", name);
    if (f->l1.n == 0) return TERR(c, f, "`%s` needs an attribute name", name);
    const jstr *attr = f->l1.v[0]->s;
    int test = -1;
    if (f->l1.n > 1) {
        const jstr *tn = f->l1.v[1]->s;
        for (int k = 0; k < TEST_COUNT && test < 0; k++)
            if (jstr_eqc(tn, cgt_test_names[k])) test = k;
        if (test < 0) return TERR(c, f, "unknown test: %.*s", (int)tn->len, tn->p);
    }
    val tv = f->l1.n > 2 ? vstr(f->l1.v[2]->s) : UNDEF;
    jarr *r = cgt_arr_new(&c->ar, l->n);
    r->n = 0;
    for (size_t i = 0; i < l->n; i++) {
        TRY(cgt_step(c, f, 1));
        val item;
        bool res = false;
        if (cgt_obj_get(l->v[i].u.o, attr->p, attr->len, &item)) {
            if (test < 0)
                res = cgt_truthy(item);
            else
                TRY(cgt_run_test(c, f, test, item, f->l1.n > 2 ? &tv : NULL, &res));
        }
        if (res == select) r->v[r->n++] = l->v[i];
    }
    *out = varr(r, 0);
    return RC_OK;
}

/* map(attribute=, default=) */
static int call_map(ctx *c, env *e, const node *f, const jarr *l, val *out)
{
    fargs a;
    TRY(filter_args(c, e, f, &a));
    val attr;
    if (!cgt_kw_get(a.kw, "attribute", &attr))
        return TERR(c, f, "`map` expressions without `attribute` set are not currently supported.");
    if (attr.t != V_STR) return TERR(c, f, "attribute must be a string");
    val def;
    bool has_def = cgt_kw_get(a.kw, "default", &def);
    jarr *r = cgt_arr_new(&c->ar, l->n);
    for (size_t i = 0; i < l->n; i++) {
        if (!is_container(l->v[i])) return TERR(c, f, "items in map must be an object");
        val x = cgt_attr_path(c, l->v[i], attr.u.s);
        r->v[i] = (x.t == V_UNDEF && has_def) ? def : x;
    }
    *out = varr(r, 0);
    return cgt_step(c, f, l->n);
}

/* A method called as a filter: the method of v named like the filter, with the filter's
 * arguments and, when always_kw or there are any, its keywords as a last argument. */
static int call_as_method(ctx *c, env *e, const node *f, val v, int method, bool always_kw,
                          val *out)
{
    fargs a;
    TRY(filter_args(c, e, f, &a));
    val *args = cgt_arena_alloc(&c->ar, (a.np + 1) * sizeof(val));
    if (a.np) memcpy(args, a.pos, a.np * sizeof(val));
    size_t n = a.np;
    if (always_kw || a.kw->n) args[n++] = cgt_kwargs_val(c, a.kw);
    val fn = method_val(c, v, method);
    return cgt_method_call(c, e, f, fn.u.f, args, n, out);
}

static int filter_call(ctx *c, env *e, const node *f, val v, val *out)
{
    int id = f->op;
    const char *name = cgt_filter_names[id];
    switch (id) {
    case F_tojson:
        return call_tojson(c, e, f, v, out);
    case F_join:
        return call_join(c, e, f, v, out);
    case F_int:
    case F_float:
        return call_number(c, e, f, v, out);
    case F_default:
        return call_default(c, e, f, v, out);
    }
    if (v.t == V_ARR) {
        switch (id) {
        case F_sort:
            return call_sort(c, e, f, v.u.a, out);
        case F_selectattr:
        case F_rejectattr:
            return call_selectattr(c, f, v.u.a, out);
        case F_map:
            return call_map(c, e, f, v.u.a, out);
        }
        return TERR(c, f, "unknown ArrayValue filter: %s", name);
    }
    if (v.t == V_STR) {
        if (id == F_indent) {
            fargs a;
            TRY(filter_args(c, e, f, &a));
            val width = farg(&a, 0, "width", vint(4));
            if (width.t != V_INT) return TERR(c, f, "width must be a number");
            val first = farg(&a, 1, "first", vbool(false));
            val blank = farg(&a, 2, "blank", vbool(false));
            return cgt_str_indent(c, f, v.u.s, width.u.n, cgt_raw_truthy(first),
                                  cgt_raw_truthy(blank), out);
        }
        if (id == F_replace) return call_as_method(c, e, f, v, M_replace, true, out);
        return TERR(c, f, "unknown StringValue filter: %s", name);
    }
    if (v.t == V_OBJ) {
        int m = method_index(f->s, M_FIRST_MAPPING, M_COUNT);
        if (m >= 0) return call_as_method(c, e, f, v, m, false, out);
        return TERR(c, f, "unknown ObjectValue filter: %s", name);
    }
    return TERR(c, f, "cannot apply filter \"%s\" to type: %s", name, cgt_type_name(v));
}

int cgt_apply_filter(ctx *c, env *e, const node *f, val v, val *out)
{
    TRY(cgt_step(c, f, 1));
    return f->flag ? filter_call(c, e, f, v, out) : filter_plain(c, e, f, v, out);
}
