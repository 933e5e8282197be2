/* Chat-template renderer: a lexer, parser and evaluator for the Jinja subset that Hugging Face
 * chat templates use, matching @huggingface/jinja (the JavaScript renderer of transformers.js)
 * byte for byte: its whitespace preprocessing, its value semantics (JavaScript numbers and
 * loose equality, JSON printing of lists) and its filters, tests and methods. Templates are
 * parsed once and are immutable; each render allocates its values from its own arena.
 *
 * Where @huggingface/jinja and Python's jinja2 (what transformers runs) disagree, this follows
 * @huggingface/jinja, which the parity tests check. The differences a chat template can meet:
 * true/false/none print as "true"/"false"/"" and lists/dicts print as JSON; == is JavaScript's
 * loose equality ("" == false, "0" == 0); strip/lstrip/rstrip ignore their argument and strip
 * whitespace; an integral float prints "1" in tojson and JSON input 1.0 is an integer;
 * index-like keys of input objects come first; ~ and + fail on none or undefined; a for loop
 * over a string or undefined fails; break/continue drop what their iteration printed; macros
 * see the caller's variables; title/capitalize do not lower the rest; length counts UTF-16
 * units; % keeps the dividend's sign; ** is left-associative; the text rewrites of
 * trim_blocks/lstrip_blocks also apply to literal text, and CRLF is kept.
 * This renderer is stricter in one way: unknown filters, tests, methods, functions and
 * statements are refused when the template is parsed, not when the branch runs. */
#include "cache/chat_template_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cg_chat_template_limits cg_chat_template_default_limits(void)
{
    cg_chat_template_limits l = {
        .max_output = 16u << 20,
        .max_memory = 256u << 20,
        .max_steps = 20000000,
        .max_depth = 1000,
    };
    return l;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    cgt_utf8_clip(err);
}

void cg_chat_template_free(cg_chat_template **tp)
{
    if (!tp || !*tp) return;
    cgt_arena_free(&(*tp)->ar);
    free((*tp)->src);
    cg_free(tp);
}

cg_status cg_chat_template_new(const char *src, size_t len, const cg_chat_template_limits *limits,
                               cg_chat_template **out, char *err, size_t errlen)
{
    cg_chat_template *t = NULL;
    ptext p0 = {0}, p1 = {0}, p2 = {0}, p3 = {0};
    parser ps = {0};
    cg_status st = CG_OK;
    *out = NULL;
    if (!src && len) {
        set_err(err, errlen, "no template");
        return CG_E_VALUE;
    }
    if (len > TPL_MAX_SOURCE) {
        set_err(err, errlen, "template is larger than %u bytes", TPL_MAX_SOURCE);
        return CG_E_TOO_LARGE;
    }
    for (size_t i = 0; i < len;) {
        size_t l;
        uint32_t cp = cgt_u8_decode((const unsigned char *)src + i, len - i, &l);
        if (cp == 0xFFFD && l == 1) {
            unsigned line, col;
            cgt_src_linecol(src, len, i, &line, &col);
            set_err(err, errlen, "%u:%u: template is not valid UTF-8", line, col);
            return CG_E_VALUE;
        }
        i += l;
    }
    t = cg_calloc(1, sizeof *t);
    t->src = cg_malloc(len + 1);
    if (len) memcpy(t->src, src, len);
    t->src[len] = 0;
    t->len = len;
    t->lim = limits ? *limits : cg_chat_template_default_limits();

    /* the rewrites of @huggingface/jinja's preprocess(), in its order */
    cgt_ptext_init(&p0, len);
    memcpy(p0.s, t->src, len);
    for (size_t i = 0; i <= len; i++)
        p0.map[i] = (uint32_t)i;
    p0.n = len;
    if (p0.n && p0.s[p0.n - 1] == '\n') p0.n--;
    p0.s[p0.n] = 0;
    cgt_pp_lstrip(&p0, &p1);
    cgt_pp_trim(&p1, &p2);
    cgt_pp_generation(&p2, &p3);

    ps.t = t;
    ps.pt = &p3;
    if (!cgt_parse(&ps)) {
        unsigned line, col;
        cgt_src_linecol(t->src, t->len, ps.errpos, &line, &col);
        set_err(err, errlen, "%u:%u: %s", line, col, ps.msg);
        st = ps.st;
        cg_chat_template_free(&t);
    }
    free(ps.toks);
    cgt_ptext_free(&p0);
    cgt_ptext_free(&p1);
    cgt_ptext_free(&p2);
    cgt_ptext_free(&p3);
    *out = t;
    return st;
}

cg_status cg_chat_template_render(const cg_chat_template *t, const json_t *vars, cg_buf *out,
                                  char *err, size_t errlen)
{
    if (!t || !out) {
        set_err(err, errlen, "no template");
        return CG_E_VALUE;
    }
    if (vars && !json_is_object(vars)) {
        set_err(err, errlen, "template variables must be a JSON object");
        return CG_E_TYPE;
    }
    ctx c = {.t = t, .lim = &t->lim};
    sbuf o = {0};
    c.out = &o;
    cg_status st = CG_OK;
    env *g = cgt_env_new(&c, NULL);
    c.global = g;
    static const char *const reserved[] = {"false", "true",         "none", "raise_exception",
                                           "range", "strftime_now", "True", "False",
                                           "None",  "namespace"};
    cgt_env_set(&c, g, cgt_cname(&c, "false"), vbool(false));
    cgt_env_set(&c, g, cgt_cname(&c, "true"), vbool(true));
    cgt_env_set(&c, g, cgt_cname(&c, "none"), VNULL);
    cgt_env_set(&c, g, cgt_cname(&c, "raise_exception"), cgt_fn_val(&c, FN_RAISE));
    cgt_env_set(&c, g, cgt_cname(&c, "range"), cgt_fn_val(&c, FN_RANGE));
    cgt_env_set(&c, g, cgt_cname(&c, "strftime_now"), cgt_fn_val(&c, FN_STRFTIME));
    cgt_env_set(&c, g, cgt_cname(&c, "True"), vbool(true));
    cgt_env_set(&c, g, cgt_cname(&c, "False"), vbool(false));
    cgt_env_set(&c, g, cgt_cname(&c, "None"), VNULL);
    int r = RC_OK;
    if (vars) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v)
        {
            for (size_t i = 0; i < CG_ARRAY_LEN(reserved); i++)
                if (strcmp(k, reserved[i]) == 0) {
                    r = cgt_rerr(&c, NULL, CG_E_VALUE, "variable already declared: %s", k);
                    break;
                }
            if (r) break;
            val x;
            r = cgt_from_json(&c, v, &x, 0);
            if (r) break;
            cgt_env_set(&c, g, cgt_jstr_borrow(&c.ar, k, strlen(k)), x);
        }
    }
    if (!r) r = cgt_exec_list(&c, g, &t->body);
    if (r == RC_BREAK || r == RC_CONT)
        r = cgt_rerr(&c, c.ctl, CG_E_VALUE, "%s outside a loop",
                     r == RC_BREAK ? "break" : "continue");
    if (r) {
        st = c.st != CG_OK ? c.st : CG_E_INTERNAL;
        set_err(err, errlen, "%s", c.msg);
    } else {
        st = cg_buf_append(out, o.p ? o.p : "", o.len);
        if (st != CG_OK) set_err(err, errlen, "rendered text exceeds the output buffer");
    }
    cgt_sbuf_free(&o);
    cgt_arena_free(&c.ar);
    return st;
}
