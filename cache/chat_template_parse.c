/* Chat templates, from tokens to the syntax tree: the grammar and operator precedence of
 * @huggingface/jinja, and the checks after parsing that refuse calls to anything the renderer
 * cannot call. */
#include "cache/chat_template_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The names of filters, tests and methods, indexed by their F_, T_ and M_ enums. */
const char *const cgt_filter_names[] = {FILTERS(NAME_)};
const char *const cgt_test_names[] = {TESTS(NAME_)};
const char *const cgt_method_names[] = {METHODS(NAME_)};

/* ------------------------------------------------------------------------------------------ */
/* Parser: the grammar and precedence of @huggingface/jinja                                    */
/* ------------------------------------------------------------------------------------------ */
/* Fields per kind: TEXT s | OUTPUT a | IF a=test l1=body l2=else | FOR a=target b=iterable
 * c=inline filter l1=body l2=else | SET a=target b=value (NULL: block) l1=body | MACRO s=name
 * l1=params l2=body | CALLBLOCK a=call l1=caller params l2=body | FILTERBLOCK a=filter l1=body
 * | STR s | INT/FLOAT num | IDENT s | ARRAY/TUPLE l1 | DICT l1=keys l2=values | MEMBER a b
 * flag=computed | SLICE a b c | CALL a=callee l1=args | KWARG s a | SPREAD/KWSPREAD a | UNARY op
 * a | BINARY op a b | FILTER a=operand op s=name flag=call form l1=args | TEST a op flag=negated
 * | SELECT a=value b=test | TERNARY a=cond b=then c=else. */

typedef struct nvec {
    node **v;
    size_t n, cap;
} nvec;

static void nvec_push(arena *a, nvec *v, node *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        node **nv = cgt_arena_alloc(a, cap * sizeof(node *));
        if (v->n) memcpy(nv, v->v, v->n * sizeof(node *));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static nodelist nvec_list(nvec v)
{
    return (nodelist){v.v, v.n};
}

#define P(x)                                                                                       \
    do {                                                                                           \
        if (!(x)) return NULL;                                                                     \
    } while (0)

static tok *peek(parser *ps)
{
    return &ps->toks[ps->cur < ps->n ? ps->cur : ps->n - 1];
}

static tok *peek_at(parser *ps, size_t k)
{
    size_t i = ps->cur + k;
    return &ps->toks[i < ps->n ? i : ps->n - 1];
}

static tok *advance(parser *ps)
{
    tok *t = peek(ps);
    if (t->type != K_EOF) ps->cur++;
    return t;
}

static bool is(parser *ps, int type)
{
    return peek(ps)->type == type;
}

static bool tok_is_word(const tok *t, const char *w)
{
    return t->type == K_IDENT && t->len == strlen(w) && memcmp(t->v, w, t->len) == 0;
}

static bool is_ident(parser *ps, const char *w)
{
    return tok_is_word(peek(ps), w);
}

static bool is_stmt(parser *ps, const char *a, const char *b, const char *c)
{
    if (peek(ps)->type != K_OPEN_STMT) return false;
    tok *t = peek_at(ps, 1);
    return tok_is_word(t, a) || (b && tok_is_word(t, b)) || (c && tok_is_word(t, c));
}

static const char *tok_desc(const tok *t)
{
    static const char *const names[] = {"end of template",
                                        "text",
                                        "number",
                                        "string",
                                        "identifier",
                                        "'='",
                                        "'('",
                                        "')'",
                                        "'{%'",
                                        "'%}'",
                                        "'{{'",
                                        "'}}'",
                                        "'['",
                                        "']'",
                                        "'{'",
                                        "'}'",
                                        "','",
                                        "'.'",
                                        "':'",
                                        "'|'",
                                        "operator",
                                        "operator",
                                        "'**'",
                                        "comparison",
                                        "unary operator",
                                        "comment"};
    return names[t->type];
}

static tok *expect(parser *ps, int type, const char *what)
{
    tok *t = peek(ps);
    if (t->type != type)
        return cgt_perr_at(ps, CG_E_VALUE, t->pos, "expected %s, got %s", what, tok_desc(t));
    return advance(ps);
}

static tok *expect_word(parser *ps, const char *w)
{
    tok *t = peek(ps);
    if (!tok_is_word(t, w)) return cgt_perr_at(ps, CG_E_VALUE, t->pos, "expected '%s'", w);
    return advance(ps);
}

static node *mk(parser *ps, int kind, const tok *t)
{
    node *x = cgt_arena_zalloc(&ps->t->ar, sizeof(node));
    x->kind = (uint8_t)kind;
    x->pos = ps->pt->map[t->pos];
    return x;
}

static unsigned list_depth(const nodelist *l)
{
    unsigned d = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i] && l->v[i]->depth > d) d = l->v[i]->depth;
    return d;
}

/* Sets the height of x from its children; refuses trees deeper than TPL_MAX_NEST, so that the
 * evaluator's recursion stays bounded by the template, not by its input. */
static node *fin(parser *ps, node *x)
{
    unsigned d = 0;
    if (x->a && x->a->depth > d) d = x->a->depth;
    if (x->b && x->b->depth > d) d = x->b->depth;
    if (x->c && x->c->depth > d) d = x->c->depth;
    unsigned l = list_depth(&x->l1);
    if (l > d) d = l;
    l = list_depth(&x->l2);
    if (l > d) d = l;
    if (d + 1 > TPL_MAX_NEST) {
        if (ps->st == CG_OK) {
            ps->st = CG_E_UNSUPPORTED;
            ps->errpos = x->pos;
            snprintf(ps->msg, sizeof ps->msg, "template nests deeper than %d", TPL_MAX_NEST);
        }
        return NULL;
    }
    x->depth = (uint16_t)(d + 1);
    return x;
}

static jstr *tok_str(parser *ps, const tok *t)
{
    return cgt_jstr_copy(&ps->t->ar, t->v, t->len);
}

static int name_index(const char *const *names, size_t count, const tok *t)
{
    for (size_t i = 0; i < count; i++)
        if (tok_is_word(t, names[i])) return (int)i;
    return -1;
}

static node *parse_expression(parser *ps);
static node *parse_any(parser *ps);
static node *parse_primary(parser *ps);
static node *parse_call_expression(parser *ps, node *callee);

static bool enter(parser *ps)
{
    if (++ps->depth > TPL_MAX_NEST) {
        cgt_perr_at(ps, CG_E_UNSUPPORTED, peek(ps)->pos, "template nests deeper than %d",
                    TPL_MAX_NEST);
        return false;
    }
    return true;
}

static node *parse_expression_sequence(parser *ps, bool primary)
{
    tok *t0 = peek(ps);
    node *first = primary ? parse_primary(ps) : parse_expression(ps);
    P(first);
    if (!is(ps, K_COMMA)) return first;
    nvec v = {0};
    nvec_push(&ps->t->ar, &v, first);
    while (is(ps, K_COMMA)) {
        advance(ps);
        node *x = primary ? parse_primary(ps) : parse_expression(ps);
        P(x);
        nvec_push(&ps->t->ar, &v, x);
        if (!is(ps, K_COMMA)) break;
    }
    node *tup = mk(ps, N_TUPLE, t0);
    tup->l1 = nvec_list(v);
    return fin(ps, tup);
}

/* Argument lists of calls (mode 'c') and parameter lists of macros (mode 'p'). */
static bool parse_args(parser *ps, char mode, nodelist *out)
{
    if (!expect(ps, K_LPAREN, "'('")) return false;
    nvec v = {0};
    bool saw_kw = false, saw_spread = false;
    while (!is(ps, K_RPAREN)) {
        tok *t = peek(ps);
        bool kwspread = t->type == K_POW;
        bool spread = t->type == K_MUL && t->len == 1 && t->v[0] == '*';
        if (mode == 'p' && (kwspread || spread))
            return cgt_perr_at(ps, CG_E_VALUE, t->pos,
                               "argument unpacking is not allowed in parameters"),
                   false;
        if (kwspread) {
            advance(ps);
            node *x = mk(ps, N_KWSPREAD, t);
            if (!(x->a = parse_expression(ps)) || !fin(ps, x)) return false;
            nvec_push(&ps->t->ar, &v, x);
            if (is(ps, K_COMMA)) advance(ps);
            if (!is(ps, K_RPAREN))
                return cgt_perr_at(ps, CG_E_VALUE, peek(ps)->pos,
                                   "'**' must be applied to the final argument"),
                       false;
            break;
        }
        node *arg;
        if (spread) {
            if (saw_spread)
                return cgt_perr_at(ps, CG_E_VALUE, t->pos,
                                   "only one '*' argument unpacking is allowed"),
                       false;
            saw_spread = true;
            advance(ps);
            arg = mk(ps, N_SPREAD, t);
            if (!(arg->a = parse_expression(ps)) || !fin(ps, arg)) return false;
        } else {
            if (!(arg = parse_expression(ps))) return false;
            if (is(ps, K_EQUALS)) {
                advance(ps);
                if (arg->kind != N_IDENT)
                    return cgt_perr_at(ps, CG_E_VALUE, t->pos, "expected an identifier before '='"),
                           false;
                node *kw = mk(ps, N_KWARG, t);
                kw->s = arg->s;
                if (!(kw->a = parse_expression(ps)) || !fin(ps, kw)) return false;
                arg = kw;
            }
            if (mode == 'p') {
                if (arg->kind != N_IDENT && arg->kind != N_KWARG)
                    return cgt_perr_at(ps, CG_E_VALUE, t->pos,
                                       "expected an identifier for a parameter"),
                           false;
                for (size_t i = 0; i < v.n; i++)
                    if (jstr_eq(v.v[i]->s, arg->s))
                        return cgt_perr_at(ps, CG_E_VALUE, t->pos, "duplicate parameter name: %.*s",
                                           (int)arg->s->len, arg->s->p),
                               false;
            }
            if (arg->kind == N_KWARG)
                saw_kw = true;
            else if (saw_kw)
                return cgt_perr_at(ps, CG_E_VALUE, t->pos,
                                   mode == 'c' ? "positional argument follows keyword argument"
                                               : "non-default parameter follows default parameter"),
                       false;
            else if (saw_spread)
                return cgt_perr_at(ps, CG_E_VALUE, t->pos,
                                   "positional argument follows '*' unpacking"),
                       false;
        }
        nvec_push(&ps->t->ar, &v, arg);
        if (is(ps, K_COMMA)) advance(ps);
        if (ps->st != CG_OK) return false;
    }
    advance(ps);
    *out = nvec_list(v);
    return true;
}

/* The inside of [...]: an index or a slice a:b:c. */
static node *parse_subscript(parser *ps, tok *t0)
{
    node *parts[8] = {0};
    size_t n = 0;
    bool is_slice = false;
    while (!is(ps, K_RBRACKET)) {
        if (is(ps, K_EOF)) return cgt_perr_at(ps, CG_E_VALUE, peek(ps)->pos, "expected ']'");
        if (n == CG_ARRAY_LEN(parts))
            return cgt_perr_at(ps, CG_E_VALUE, peek(ps)->pos, "too many parts in a subscript");
        if (is(ps, K_COLON)) {
            parts[n++] = NULL;
            advance(ps);
            is_slice = true;
        } else {
            P(parts[n++] = parse_expression(ps));
            if (is(ps, K_COLON)) {
                advance(ps);
                is_slice = true;
            }
        }
    }
    if (n == 0) return cgt_perr_at(ps, CG_E_VALUE, t0->pos, "expected an index or a slice");
    if (!is_slice) return parts[0];
    if (n > 3) return cgt_perr_at(ps, CG_E_VALUE, t0->pos, "a slice has at most 3 parts");
    node *sl = mk(ps, N_SLICE, t0);
    sl->a = parts[0];
    sl->b = n > 1 ? parts[1] : NULL;
    sl->c = n > 2 ? parts[2] : NULL;
    return fin(ps, sl);
}

static node *parse_member(parser *ps, node *obj)
{
    while (is(ps, K_DOT) || is(ps, K_LBRACKET)) {
        tok *op = advance(ps);
        node *m = mk(ps, N_MEMBER, op);
        m->a = obj;
        if (op->type == K_LBRACKET) {
            m->flag = 1;
            P(m->b = parse_subscript(ps, op));
            P(expect(ps, K_RBRACKET, "']'"));
        } else {
            tok *pt = peek(ps);
            P(m->b = parse_primary(ps));
            if (m->b->kind != N_IDENT && m->b->kind != N_INT)
                return cgt_perr_at(ps, CG_E_VALUE, pt->pos,
                                   "expected an identifier or an integer after '.'");
        }
        P(obj = fin(ps, m));
    }
    return obj;
}

static node *parse_call_expression(parser *ps, node *callee)
{
    node *c = mk(ps, N_CALL, peek(ps));
    c->pos = callee->pos;
    c->a = callee;
    if (!parse_args(ps, 'c', &c->l1)) return NULL;
    P(c = fin(ps, c));
    P(c = parse_member(ps, c));
    if (is(ps, K_LPAREN)) return parse_call_expression(ps, c);
    return c;
}

static node *parse_call_member(parser *ps)
{
    node *p = parse_primary(ps);
    P(p);
    P(p = parse_member(ps, p));
    if (is(ps, K_LPAREN)) return parse_call_expression(ps, p);
    return p;
}

static node *parse_unary_sign(parser *ps)
{
    tok *t = peek(ps);
    if ((t->type == K_UNARY || t->type == K_ADD) && t->len == 1 &&
        (t->v[0] == '-' || t->v[0] == '+')) {
        if (!enter(ps)) return NULL;
        advance(ps);
        node *u = mk(ps, N_UNARY, t);
        u->op = t->v[0] == '-' ? OP_NEG : OP_POS;
        P(u->a = parse_unary_sign(ps));
        ps->depth--;
        return fin(ps, u);
    }
    return parse_call_member(ps);
}

/* A name (an identifier expression) at the parser's token *at; anything else fails there with
 * st and msg. */
static node *parse_name(parser *ps, cg_status st, const char *msg, tok **at)
{
    tok *t = peek(ps);
    node *name = parse_primary(ps);
    P(name);
    if (name->kind != N_IDENT) return cgt_perr_at(ps, st, t->pos, "%s", msg);
    *at = t;
    return name;
}

/* The N_FILTER node of the filter called name (at t); refused unless it is a known filter. */
static node *filter_node(parser *ps, tok *t, const node *name)
{
    int id = name_index(cgt_filter_names, F_COUNT, t);
    if (id < 0)
        return cgt_perr_at(ps, CG_E_UNSUPPORTED, t->pos, "unsupported filter '%.*s'", (int)t->len,
                           t->v);
    node *f = mk(ps, N_FILTER, t);
    f->s = name->s;
    f->op = (uint8_t)id;
    return f;
}

static node *parse_filter(parser *ps)
{
    node *operand = parse_unary_sign(ps);
    P(operand);
    while (is(ps, K_PIPE)) {
        advance(ps);
        tok *nt;
        node *name = parse_name(ps, CG_E_VALUE, "expected a filter name after '|'", &nt);
        P(name);
        node *f = filter_node(ps, nt, name);
        P(f);
        f->a = operand;
        if (is(ps, K_LPAREN)) {
            node *call = parse_call_expression(ps, name);
            P(call);
            if (call->kind != N_CALL || call->a != name)
                return cgt_perr_at(ps, CG_E_UNSUPPORTED, nt->pos, "unsupported filter expression");
            f->flag = 1;
            f->l1 = call->l1;
        }
        P(operand = fin(ps, f));
    }
    return operand;
}

static node *parse_test(parser *ps)
{
    node *operand = parse_filter(ps);
    P(operand);
    while (is_ident(ps, "is")) {
        advance(ps);
        bool neg = is_ident(ps, "not");
        if (neg) advance(ps);
        tok *nt;
        node *name = parse_name(ps, CG_E_VALUE, "expected a test name", &nt);
        P(name);
        int id = name_index(cgt_test_names, TEST_COUNT, nt);
        if (id < 0 || id == T_equalto || id == T_eq)
            return cgt_perr_at(ps, CG_E_UNSUPPORTED, nt->pos, "unsupported test '%.*s'",
                               (int)nt->len, nt->v);
        node *x = mk(ps, N_TEST, nt);
        x->a = operand;
        x->op = (uint8_t)id;
        x->flag = neg;
        P(operand = fin(ps, x));
    }
    return operand;
}

static node *binary(parser *ps, tok *t, int op, node *l, node *r)
{
    node *b = mk(ps, N_BINARY, t);
    b->op = (uint8_t)op;
    b->a = l;
    b->b = r;
    return fin(ps, b);
}

/* Operands parsed by next, joined left to right into binary nodes while op_at finds one of
 * the level's operators at the parser's token (it returns the op, or -1). */
static node *parse_chain(parser *ps, node *(*next)(parser *), int (*op_at)(parser *))
{
    node *l = next(ps);
    P(l);
    for (int op; (op = op_at(ps)) >= 0;) {
        tok *t = advance(ps);
        node *r = next(ps);
        P(r);
        P(l = binary(ps, t, op, l, r));
    }
    return l;
}

static int op_pow(parser *ps)
{
    return is(ps, K_POW) ? OP_POW : -1;
}

static int op_mul(parser *ps)
{
    if (!is(ps, K_MUL)) return -1;
    const tok *t = peek(ps);
    return t->len == 2 ? OP_FLOORDIV : t->v[0] == '*' ? OP_MUL : t->v[0] == '/' ? OP_DIV : OP_MOD;
}

static int op_add(parser *ps)
{
    if (!is(ps, K_ADD)) return -1;
    const tok *t = peek(ps);
    return t->v[0] == '+' ? OP_ADD : t->v[0] == '-' ? OP_SUB : OP_CAT;
}

static int op_and(parser *ps)
{
    return is_ident(ps, "and") ? OP_AND : -1;
}

static int op_or(parser *ps)
{
    return is_ident(ps, "or") ? OP_OR : -1;
}

static node *parse_power(parser *ps)
{
    return parse_chain(ps, parse_test, op_pow);
}

static node *parse_multiplicative(parser *ps)
{
    return parse_chain(ps, parse_power, op_mul);
}

static node *parse_additive(parser *ps)
{
    return parse_chain(ps, parse_multiplicative, op_add);
}

static node *parse_comparison(parser *ps)
{
    node *l = parse_additive(ps);
    P(l);
    for (;;) {
        tok *t = peek(ps);
        int op;
        if (tok_is_word(t, "not") && tok_is_word(peek_at(ps, 1), "in")) {
            op = OP_NOTIN;
            advance(ps);
            advance(ps);
        } else if (tok_is_word(t, "in")) {
            op = OP_IN;
            advance(ps);
        } else if (t->type == K_CMP) {
            op = t->v[0] == '='   ? OP_EQ
                 : t->v[0] == '!' ? OP_NE
                 : t->v[0] == '<' ? (t->len == 2 ? OP_LE : OP_LT)
                                  : (t->len == 2 ? OP_GE : OP_GT);
            advance(ps);
        } else {
            break;
        }
        node *r = parse_additive(ps);
        P(r);
        P(l = binary(ps, t, op, l, r));
    }
    return l;
}

static node *parse_not(parser *ps)
{
    node *right = NULL;
    while (is_ident(ps, "not")) {
        if (!enter(ps)) return NULL;
        tok *t = advance(ps);
        node *arg = parse_not(ps);
        P(arg);
        ps->depth--;
        node *u = mk(ps, N_UNARY, t);
        u->op = OP_NOT;
        u->a = arg;
        P(right = fin(ps, u));
    }
    return right ? right : parse_comparison(ps);
}

static node *parse_and(parser *ps)
{
    return parse_chain(ps, parse_not, op_and);
}

static node *parse_or(parser *ps)
{
    return parse_chain(ps, parse_and, op_or);
}

static node *parse_if_expression(parser *ps)
{
    node *a = parse_or(ps);
    P(a);
    if (!is_ident(ps, "if")) return a;
    if (!enter(ps)) return NULL; /* a if b else c if d else ...: recursion per 'else' */
    tok *t = advance(ps);
    node *test = parse_or(ps);
    P(test);
    if (is_ident(ps, "else")) {
        advance(ps);
        node *f = parse_if_expression(ps);
        P(f);
        node *x = mk(ps, N_TERNARY, t);
        x->a = test;
        x->b = a;
        x->c = f;
        ps->depth--;
        return fin(ps, x);
    }
    node *x = mk(ps, N_SELECT, t);
    x->a = a;
    x->b = test;
    ps->depth--;
    return fin(ps, x);
}

static node *parse_expression(parser *ps)
{
    if (!enter(ps)) return NULL;
    node *x = parse_if_expression(ps);
    ps->depth--;
    return x;
}

static node *parse_primary(parser *ps)
{
    tok *t = peek(ps);
    switch (t->type) {
    case K_NUM: {
        advance(ps);
        bool is_float = memchr(t->v, '.', t->len) != NULL;
        node *x = mk(ps, is_float ? N_FLOAT : N_INT, t);
        char *tmp = cg_strndup(t->v, t->len);
        x->num = strtod(tmp, NULL);
        free(tmp);
        return fin(ps, x);
    }
    case K_STR: {
        advance(ps);
        node *x = mk(ps, N_STR, t);
        x->s = (jstr *)t->v;
        if (is(ps, K_STR)) { /* adjacent literals concatenate */
            sbuf b = {0};
            cgt_sbuf_put(&b, x->s->p, x->s->len);
            while (is(ps, K_STR)) {
                jstr *n = (jstr *)advance(ps)->v;
                cgt_sbuf_put(&b, n->p, n->len);
            }
            x->s = cgt_jstr_copy(&ps->t->ar, b.p ? b.p : "", b.len);
            cgt_sbuf_free(&b);
        }
        return fin(ps, x);
    }
    case K_IDENT: {
        advance(ps);
        node *x = mk(ps, N_IDENT, t);
        x->s = tok_str(ps, t);
        return fin(ps, x);
    }
    case K_LPAREN: {
        advance(ps);
        node *x = parse_expression_sequence(ps, false);
        P(x);
        P(expect(ps, K_RPAREN, "')'"));
        return x;
    }
    case K_LBRACKET: {
        advance(ps);
        nvec v = {0};
        while (!is(ps, K_RBRACKET)) {
            node *e = parse_expression(ps);
            P(e);
            nvec_push(&ps->t->ar, &v, e);
            if (is(ps, K_COMMA)) advance(ps);
        }
        advance(ps);
        node *x = mk(ps, N_ARRAY, t);
        x->l1 = nvec_list(v);
        return fin(ps, x);
    }
    case K_LBRACE: {
        advance(ps);
        nvec k = {0}, v = {0};
        while (!is(ps, K_RBRACE)) {
            node *key = parse_expression(ps);
            P(key);
            P(expect(ps, K_COLON, "':'"));
            node *value = parse_expression(ps);
            P(value);
            nvec_push(&ps->t->ar, &k, key);
            nvec_push(&ps->t->ar, &v, value);
            if (is(ps, K_COMMA)) advance(ps);
        }
        advance(ps);
        node *x = mk(ps, N_DICT, t);
        x->l1 = nvec_list(k);
        x->l2 = nvec_list(v);
        return fin(ps, x);
    }
    default:
        return cgt_perr_at(ps, CG_E_VALUE, t->pos, "unexpected %s", tok_desc(t));
    }
}

/* Body of a block up to one of the closing statements. */
static bool parse_body(parser *ps, nodelist *out, const char *a, const char *b, const char *c)
{
    nvec v = {0};
    while (!is_stmt(ps, a, b, c)) {
        node *x = parse_any(ps);
        if (!x) return false;
        nvec_push(&ps->t->ar, &v, x);
    }
    *out = nvec_list(v);
    return true;
}

static bool end_stmt(parser *ps, const char *w)
{
    return expect(ps, K_OPEN_STMT, "'{%'") && expect_word(ps, w) &&
           expect(ps, K_CLOSE_STMT, "'%}'");
}

/* The rest of a block statement without an else: its '%}', the body, then {% end %}. */
static bool block_body(parser *ps, nodelist *out, const char *end)
{
    return expect(ps, K_CLOSE_STMT, "'%}'") && parse_body(ps, out, end, NULL, NULL) &&
           end_stmt(ps, end);
}

static bool valid_target(const node *x, bool allow_member)
{
    if (x->kind == N_IDENT) return true;
    if (x->kind == N_TUPLE) {
        for (size_t i = 0; i < x->l1.n; i++)
            if (x->l1.v[i]->kind != N_IDENT) return false;
        return true;
    }
    return allow_member && x->kind == N_MEMBER && !x->flag && x->b->kind == N_IDENT;
}

static node *parse_if(parser *ps, tok *t)
{
    if (!enter(ps)) return NULL; /* recursion per elif */
    node *x = mk(ps, N_IF, t);
    P(x->a = parse_expression(ps));
    P(expect(ps, K_CLOSE_STMT, "'%}'"));
    if (!parse_body(ps, &x->l1, "elif", "else", "endif")) return NULL;
    if (is_stmt(ps, "elif", NULL, NULL)) {
        advance(ps);
        tok *et = advance(ps);
        nvec v = {0};
        node *e = parse_if(ps, et);
        P(e);
        nvec_push(&ps->t->ar, &v, e);
        x->l2 = nvec_list(v);
    } else if (is_stmt(ps, "else", NULL, NULL)) {
        advance(ps);
        advance(ps);
        P(expect(ps, K_CLOSE_STMT, "'%}'"));
        if (!parse_body(ps, &x->l2, "endif", NULL, NULL)) return NULL;
    }
    ps->depth--;
    return fin(ps, x);
}

/* {% set target = value %} or {% set target %}body{% endset %} */
static node *parse_set(parser *ps, tok *t)
{
    node *x = mk(ps, N_SET, t);
    tok *tt = peek(ps);
    P(x->a = parse_expression_sequence(ps, false));
    if (!valid_target(x->a, true))
        return cgt_perr_at(ps, CG_E_VALUE, tt->pos, "cannot assign to this expression");
    if (is(ps, K_EQUALS)) {
        advance(ps);
        P(x->b = parse_expression_sequence(ps, false));
        P(expect(ps, K_CLOSE_STMT, "'%}'"));
    } else {
        P(block_body(ps, &x->l1, "endset"));
    }
    return x;
}

/* {% macro name(params) %}body{% endmacro %} */
static node *parse_macro(parser *ps, tok *t)
{
    node *x = mk(ps, N_MACRO, t);
    tok *nt;
    node *name = parse_name(ps, CG_E_VALUE, "expected a macro name", &nt);
    P(name);
    x->s = name->s;
    if (!parse_args(ps, 'p', &x->l1) || !block_body(ps, &x->l2, "endmacro")) return NULL;
    return x;
}

/* {% for target in iterable [if test] %}body[{% else %}body]{% endfor %} */
static node *parse_for(parser *ps, tok *t)
{
    node *x = mk(ps, N_FOR, t);
    tok *vt = peek(ps);
    P(x->a = parse_expression_sequence(ps, true));
    if (!valid_target(x->a, false))
        return cgt_perr_at(ps, CG_E_VALUE, vt->pos,
                           "expected a name or a tuple of names for the loop variable");
    if (!is_ident(ps, "in"))
        return cgt_perr_at(ps, CG_E_VALUE, peek(ps)->pos, "expected 'in' after the loop variable");
    advance(ps);
    node *it = parse_expression(ps);
    P(it);
    if (it->kind == N_SELECT) {
        x->b = it->a;
        x->c = it->b;
    } else {
        x->b = it;
    }
    P(expect(ps, K_CLOSE_STMT, "'%}'"));
    if (!parse_body(ps, &x->l1, "endfor", "else", NULL)) return NULL;
    if (is_stmt(ps, "else", NULL, NULL)) {
        advance(ps);
        advance(ps);
        P(expect(ps, K_CLOSE_STMT, "'%}'"));
        if (!parse_body(ps, &x->l2, "endfor", NULL, NULL)) return NULL;
    }
    if (!end_stmt(ps, "endfor")) return NULL;
    return x;
}

/* {% call[(params)] macro(args) %}body{% endcall %} */
static node *parse_callblock(parser *ps, tok *t)
{
    node *x = mk(ps, N_CALLBLOCK, t);
    if (is(ps, K_LPAREN) && !parse_args(ps, 'p', &x->l1)) return NULL;
    tok *ct;
    node *callee = parse_name(ps, CG_E_VALUE, "expected a macro name after 'call'", &ct);
    P(callee);
    node *call = mk(ps, N_CALL, ct);
    call->a = callee;
    if (!parse_args(ps, 'c', &call->l1)) return NULL;
    P(x->a = fin(ps, call));
    P(block_body(ps, &x->l2, "endcall"));
    return x;
}

/* {% filter name[(args)] %}body{% endfilter %} */
static node *parse_filterblock(parser *ps, tok *t)
{
    node *x = mk(ps, N_FILTERBLOCK, t);
    tok *ft;
    node *name = parse_name(ps, CG_E_UNSUPPORTED, "unsupported filter expression", &ft);
    P(name);
    node *f = filter_node(ps, ft, name);
    P(f);
    if (is(ps, K_LPAREN)) {
        f->flag = 1;
        if (!parse_args(ps, 'c', &f->l1)) return NULL;
    }
    P(x->a = fin(ps, f));
    P(block_body(ps, &x->l1, "endfilter"));
    return x;
}

/* A statement name this renderer does not parse: Jinja's others are unsupported, a closing
 * name out of place is an error, anything else is unknown. Returns NULL. */
static node *bad_statement(parser *ps, const tok *t)
{
    static const char *const known[] = {"raw",     "include", "import",   "from",
                                        "extends", "block",   "with",     "autoescape",
                                        "do",      "trans",   "pluralize"};
    for (size_t i = 0; i < CG_ARRAY_LEN(known); i++)
        if (tok_is_word(t, known[i]))
            return cgt_perr_at(ps, CG_E_UNSUPPORTED, t->pos, "unsupported statement '%s'",
                               known[i]);
    static const char *const closing[] = {"endif",  "elif",     "else",    "endfor",
                                          "endset", "endmacro", "endcall", "endfilter"};
    for (size_t i = 0; i < CG_ARRAY_LEN(closing); i++)
        if (tok_is_word(t, closing[i]))
            return cgt_perr_at(ps, CG_E_VALUE, t->pos, "unexpected '%s'", closing[i]);
    return cgt_perr_at(ps, CG_E_UNSUPPORTED, t->pos, "unknown statement '%.*s'", (int)t->len, t->v);
}

static node *parse_statement(parser *ps)
{
    advance(ps); /* '{%' */
    tok *t = peek(ps);
    if (t->type != K_IDENT) return cgt_perr_at(ps, CG_E_VALUE, t->pos, "expected a statement name");
    node *x = NULL;
    if (tok_is_word(t, "set")) {
        advance(ps);
        P(x = parse_set(ps, t));
    } else if (tok_is_word(t, "if")) {
        advance(ps);
        P(x = parse_if(ps, t));
        if (!end_stmt(ps, "endif")) return NULL;
    } else if (tok_is_word(t, "macro")) {
        advance(ps);
        P(x = parse_macro(ps, t));
    } else if (tok_is_word(t, "for")) {
        advance(ps);
        P(x = parse_for(ps, t));
    } else if (tok_is_word(t, "call")) {
        advance(ps);
        P(x = parse_callblock(ps, t));
    } else if (tok_is_word(t, "break") || tok_is_word(t, "continue")) {
        advance(ps);
        x = mk(ps, tok_is_word(t, "break") ? N_BREAK : N_CONTINUE, t);
        P(expect(ps, K_CLOSE_STMT, "'%}'"));
    } else if (tok_is_word(t, "filter")) {
        advance(ps);
        P(x = parse_filterblock(ps, t));
    } else {
        return bad_statement(ps, t);
    }
    return fin(ps, x);
}

static node *parse_any(parser *ps)
{
    tok *t = peek(ps);
    if (!enter(ps)) return NULL;
    node *x = NULL;
    switch (t->type) {
    case K_COMMENT:
        advance(ps);
        x = fin(ps, mk(ps, N_COMMENT, t));
        break;
    case K_TEXT:
        advance(ps);
        x = mk(ps, N_TEXT, t);
        x->s = tok_str(ps, t);
        x = fin(ps, x);
        break;
    case K_OPEN_STMT:
        x = parse_statement(ps);
        break;
    case K_OPEN_EXPR: {
        advance(ps);
        x = mk(ps, N_OUTPUT, t);
        if (!(x->a = parse_expression(ps)) || !expect(ps, K_CLOSE_EXPR, "'}}'")) return NULL;
        x = fin(ps, x);
        break;
    }
    default:
        return cgt_perr_at(ps, CG_E_VALUE, t->pos, "unexpected %s", tok_desc(t));
    }
    ps->depth--;
    return x;
}

/* ------------------------------------------------------------------------------------------ */
/* Post-parse checks: calls must name something the renderer can call                          */
/* ------------------------------------------------------------------------------------------ */

typedef struct names {
    const jstr **v;
    size_t n, cap;
} names;

static void names_add(names *ns, const jstr *s)
{
    for (size_t i = 0; i < ns->n; i++)
        if (jstr_eq(ns->v[i], s)) return;
    if (ns->n == ns->cap) {
        ns->cap = ns->cap ? ns->cap * 2 : 16;
        ns->v = cg_realloc(ns->v, ns->cap * sizeof(*ns->v));
    }
    ns->v[ns->n++] = s;
}

static bool names_has(const names *ns, const jstr *s)
{
    for (size_t i = 0; i < ns->n; i++)
        if (jstr_eq(ns->v[i], s)) return true;
    return false;
}

static void bind_target(names *ns, const node *t)
{
    if (!t) return;
    if (t->kind == N_IDENT)
        names_add(ns, t->s);
    else if (t->kind == N_TUPLE)
        for (size_t i = 0; i < t->l1.n; i++)
            bind_target(ns, t->l1.v[i]);
}

static void bind_params(names *ns, const nodelist *params)
{
    for (size_t i = 0; i < params->n; i++)
        names_add(ns, params->v[i]->s);
}

/* Names a template binds anywhere (set, for, macro and its parameters, call parameters). */
static void collect_bound(names *ns, const node *x)
{
    if (!x) return;
    switch (x->kind) {
    case N_SET:
    case N_FOR:
        bind_target(ns, x->a);
        break;
    case N_MACRO:
        names_add(ns, x->s);
        bind_params(ns, &x->l1);
        break;
    case N_CALLBLOCK:
        bind_params(ns, &x->l1);
        break;
    default:
        break;
    }
    collect_bound(ns, x->a);
    collect_bound(ns, x->b);
    collect_bound(ns, x->c);
    for (size_t i = 0; i < x->l1.n; i++)
        collect_bound(ns, x->l1.v[i]);
    for (size_t i = 0; i < x->l2.n; i++)
        collect_bound(ns, x->l2.v[i]);
}

/* Whether a macro body reads kwargs / varargs without binding them (bit 1 / bit 2). */
static int special_args(const node *x)
{
    if (!x) return 0;
    int r = 0;
    if (x->kind == N_IDENT) {
        if (jstr_eqc(x->s, "kwargs")) r |= 1;
        if (jstr_eqc(x->s, "varargs")) r |= 2;
    }
    if (!(x->kind == N_MEMBER && !x->flag)) r |= special_args(x->b);
    r |= special_args(x->a) | special_args(x->c);
    for (size_t i = 0; i < x->l1.n; i++)
        r |= special_args(x->l1.v[i]);
    for (size_t i = 0; i < x->l2.n; i++)
        r |= special_args(x->l2.v[i]);
    return r;
}

static int params_declare(const nodelist *params)
{
    int r = 0;
    for (size_t i = 0; i < params->n; i++) {
        if (jstr_eqc(params->v[i]->s, "kwargs")) r |= 1;
        if (jstr_eqc(params->v[i]->s, "varargs")) r |= 2;
    }
    return r;
}

static bool check_calls(parser *ps, const names *bound, node *x)
{
    if (!x) return true;
    if (x->kind == N_MACRO || x->kind == N_CALLBLOCK) {
        const nodelist *body = &x->l2;
        int used = 0;
        for (size_t i = 0; i < body->n; i++)
            used |= special_args(body->v[i]);
        for (size_t i = 0; i < x->l1.n; i++)
            if (x->l1.v[i]->kind == N_KWARG) used |= special_args(x->l1.v[i]->a);
        x->flag = (uint8_t)(used & ~params_declare(&x->l1));
    }
    if (x->kind == N_CALL) {
        const node *callee = x->a;
        if (callee->kind == N_IDENT) {
            static const char *const globals[] = {"namespace", "range", "raise_exception",
                                                  "strftime_now", "caller"};
            bool ok = names_has(bound, callee->s);
            for (size_t i = 0; i < CG_ARRAY_LEN(globals) && !ok; i++)
                ok = jstr_eqc(callee->s, globals[i]);
            if (!ok) {
                ps->st = CG_E_UNSUPPORTED;
                ps->errpos = callee->pos;
                snprintf(ps->msg, sizeof ps->msg, "unknown function '%.*s'", (int)callee->s->len,
                         callee->s->p);
                return false;
            }
        } else if (callee->kind == N_MEMBER && !callee->flag && callee->b->kind == N_IDENT) {
            bool ok = false;
            for (size_t i = 0; i < M_COUNT && !ok; i++)
                ok = jstr_eqc(callee->b->s, cgt_method_names[i]);
            if (!ok) {
                ps->st = CG_E_UNSUPPORTED;
                ps->errpos = callee->b->pos;
                snprintf(ps->msg, sizeof ps->msg, "unsupported method '%.*s'",
                         (int)callee->b->s->len, callee->b->s->p);
                return false;
            }
        }
    }
    if (!check_calls(ps, bound, x->a) || !check_calls(ps, bound, x->b) ||
        !check_calls(ps, bound, x->c))
        return false;
    for (size_t i = 0; i < x->l1.n; i++)
        if (!check_calls(ps, bound, x->l1.v[i])) return false;
    for (size_t i = 0; i < x->l2.n; i++)
        if (!check_calls(ps, bound, x->l2.v[i])) return false;
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry point                                                                                 */
/* ------------------------------------------------------------------------------------------ */

bool cgt_parse(parser *ps)
{
    cg_chat_template *t = ps->t;
    names bound = {0};
    if (cgt_lex(ps)) {
        nvec body = {0};
        while (!is(ps, K_EOF)) {
            node *x = parse_any(ps);
            if (!x) break;
            nvec_push(&t->ar, &body, x);
        }
        t->body = nvec_list(body);
    }
    if (ps->st == CG_OK) {
        for (size_t i = 0; i < t->body.n; i++)
            collect_bound(&bound, t->body.v[i]);
        for (size_t i = 0; i < t->body.n && ps->st == CG_OK; i++)
            check_calls(ps, &bound, t->body.v[i]);
    }
    free(bound.v);
    return ps->st == CG_OK;
}
