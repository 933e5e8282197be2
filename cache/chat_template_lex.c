/* Chat templates, from source to tokens: the text rewrites @huggingface/jinja applies before
 * lexing (lstrip_blocks, trim_blocks, {% generation %}) and the lexer, which fills the parser's
 * token array. */
#include "cache/chat_template_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Preprocessing: the text rewrites @huggingface/jinja applies before lexing                   */
/* ------------------------------------------------------------------------------------------ */

void cgt_ptext_init(ptext *o, size_t cap)
{
    o->s = cg_malloc(cap + 1);
    o->map = cg_malloc((cap + 1) * sizeof(uint32_t));
    o->n = 0;
}

static void ptext_copy(ptext *o, const ptext *in, size_t i, size_t n)
{
    memcpy(o->s + o->n, in->s + i, n);
    memcpy(o->map + o->n, in->map + i, n * sizeof(uint32_t));
    o->n += n;
}

static void ptext_finish(ptext *o, const ptext *in)
{
    o->s[o->n] = 0;
    o->map[o->n] = in->map[in->n];
}

void cgt_ptext_free(ptext *p)
{
    free(p->s);
    free(p->map);
    p->s = NULL;
    p->map = NULL;
}

static bool line_start(const char *s, size_t i)
{
    if (i == 0) return true;
    if (s[i - 1] == '\n' || s[i - 1] == '\r') return true;
    return i >= 3 && (unsigned char)s[i - 3] == 0xE2 && (unsigned char)s[i - 2] == 0x80 &&
           ((unsigned char)s[i - 1] == 0xA8 || (unsigned char)s[i - 1] == 0xA9);
}

void cgt_pp_lstrip(const ptext *in, ptext *o)
{
    cgt_ptext_init(o, in->n);
    for (size_t i = 0; i < in->n;) {
        if (line_start(in->s, i)) {
            size_t j = i;
            while (j < in->n && (in->s[j] == ' ' || in->s[j] == '\t'))
                j++;
            if (j + 1 < in->n && in->s[j] == '{' &&
                (in->s[j + 1] == '#' || in->s[j + 1] == '%' || in->s[j + 1] == '-')) {
                ptext_copy(o, in, j, 2);
                i = j + 2;
                continue;
            }
        }
        ptext_copy(o, in, i, 1);
        i++;
    }
    ptext_finish(o, in);
}

void cgt_pp_trim(const ptext *in, ptext *o)
{
    cgt_ptext_init(o, in->n);
    for (size_t i = 0; i < in->n;) {
        char c = in->s[i];
        if ((c == '#' || c == '%' || c == '-') && i + 2 < in->n && in->s[i + 1] == '}' &&
            in->s[i + 2] == '\n') {
            ptext_copy(o, in, i, 2);
            i += 3;
            continue;
        }
        ptext_copy(o, in, i, 1);
        i++;
    }
    ptext_finish(o, in);
}

/* If a {% generation %} or {% endgeneration %} tag starts at j, returns its end and its two
 * '-' flags. */
static size_t generation_tag(const char *s, size_t n, size_t j, bool *lminus, bool *rminus)
{
    if (j + 1 >= n || s[j] != '{' || s[j + 1] != '%') return 0;
    j += 2;
    *lminus = j < n && s[j] == '-';
    if (*lminus) j++;
    j = cgt_skip_js_space(s, n, j);
    if (n - j >= 3 && memcmp(s + j, "end", 3) == 0 && n - j >= 13 &&
        memcmp(s + j + 3, "generation", 10) == 0)
        j += 3;
    if (n - j < 10 || memcmp(s + j, "generation", 10) != 0) return 0;
    j = cgt_skip_js_space(s, n, j + 10);
    *rminus = j < n && s[j] == '-';
    if (*rminus) j++;
    if (n - j < 2 || s[j] != '%' || s[j + 1] != '}') return 0;
    return j + 2;
}

void cgt_pp_generation(const ptext *in, ptext *o)
{
    cgt_ptext_init(o, in->n);
    const char *s = in->s;
    size_t n = in->n;
    for (size_t i = 0; i < n;) {
        size_t j = cgt_skip_js_space(s, n, i);
        bool lm = false, rm = false;
        size_t e = generation_tag(s, n, j, &lm, &rm);
        if (!e) {
            size_t upto = j > i ? j : i + 1;
            ptext_copy(o, in, i, upto - i);
            i = upto;
            continue;
        }
        size_t after = cgt_skip_js_space(s, n, e);
        if (!lm) ptext_copy(o, in, i, j - i);
        if (!rm) ptext_copy(o, in, e, after - e);
        i = after;
    }
    ptext_finish(o, in);
}

/* ------------------------------------------------------------------------------------------ */
/* Lexer                                                                                       */
/* ------------------------------------------------------------------------------------------ */

void *cgt_perr_at(parser *ps, cg_status st, size_t ppos, const char *fmt, ...)
{
    if (ps->st != CG_OK) return NULL;
    ps->st = st;
    if (ppos > ps->pt->n) ppos = ps->pt->n;
    ps->errpos = ps->pt->map[ppos];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->msg, sizeof ps->msg, fmt, ap);
    va_end(ap);
    cgt_utf8_clip(ps->msg);
    return NULL;
}

static void push_tok(parser *ps, int type, size_t pos, const char *v, size_t len)
{
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? ps->cap * 2 : 256;
        ps->toks = cg_realloc(ps->toks, ps->cap * sizeof(tok));
    }
    ps->toks[ps->n++] = (tok){.type = (uint8_t)type, .pos = (uint32_t)pos, .v = v, .len = len};
}

static int last_type(const parser *ps)
{
    return ps->n ? ps->toks[ps->n - 1].type : -1;
}

/* '{%-' and '{{-' trim the text before them (String.prototype.trimEnd). */
static void strip_trailing(parser *ps)
{
    if (last_type(ps) != K_TEXT) return;
    tok *t = &ps->toks[ps->n - 1];
    size_t l;
    while (t->len && (l = cgt_js_space_before(t->v, t->len)))
        t->len -= l;
    if (t->len == 0) ps->n--;
}

/* Appends the UTF-16 unit u of a string escape; pairs of surrogate escapes combine. */
static void put_u16(sbuf *b, uint32_t u, uint32_t *pending_hi)
{
    char enc[4];
    if (*pending_hi) {
        if (u >= 0xDC00 && u <= 0xDFFF) {
            uint32_t cp = 0x10000 + ((*pending_hi - 0xD800) << 10) + (u - 0xDC00);
            *pending_hi = 0;
            cgt_sbuf_put(b, enc, cgt_u8_encode(cp, enc));
            return;
        }
        cgt_sbuf_put(b, enc, cgt_u8_encode(0xFFFD, enc));
        *pending_hi = 0;
    }
    if (u >= 0xD800 && u <= 0xDBFF) {
        *pending_hi = u;
        return;
    }
    cgt_sbuf_put(b, enc, cgt_u8_encode(u, enc));
}

/* The lexer's state: the parser it fills and the place it reads. */
typedef struct lexer {
    parser *ps;
    const char *s;
    size_t n, pos;
    int curly; /* '{' open since the last '{{' (a '}}' then closes two braces, not the tag) */
} lexer;

/* What one lexer rule did at lx->pos: not its input, a token taken, or an error in lx->ps. */
enum { LEX_NO, LEX_OK, LEX_ERR };

static bool lex_at(const lexer *lx, const char *seq)
{
    size_t l = strlen(seq);
    return lx->n - lx->pos >= l && memcmp(lx->s + lx->pos, seq, l) == 0;
}

/* Inside a tag the input must go on: fails with "unexpected end of input" where it ends. */
static bool lex_more(lexer *lx)
{
    if (lx->pos < lx->n) return true;
    cgt_perr_at(lx->ps, CG_E_VALUE, lx->pos, "unexpected end of input");
    return false;
}

/* The '.' and digits after a number's integer part, when a digit follows the '.'. */
static bool lex_fraction(lexer *lx)
{
    if (lx->s[lx->pos] != '.' || lx->pos + 1 >= lx->n || !is_digit(lx->s[lx->pos + 1])) return true;
    lx->pos = cgt_skip_digits(lx->s, lx->n, lx->pos + 1);
    return lex_more(lx);
}

/* Template text, at the start or after a tag: up to the next '{%', '{{' or '{#'. */
static int lex_text(lexer *lx)
{
    int lt = last_type(lx->ps);
    if (lt != -1 && lt != K_CLOSE_STMT && lt != K_CLOSE_EXPR && lt != K_COMMENT) return LEX_NO;
    const char *s = lx->s;
    size_t n = lx->n, st = lx->pos, pos = st;
    while (pos < n && !(s[pos] == '{' && pos + 1 < n &&
                        (s[pos + 1] == '%' || s[pos + 1] == '{' || s[pos + 1] == '#')))
        pos++;
    if (pos == st) return LEX_NO;
    push_tok(lx->ps, K_TEXT, st, s + st, pos - st);
    lx->pos = pos;
    return LEX_OK;
}

/* {# ... #}, with '-' on either side trimming the text around it. */
static int lex_comment(lexer *lx)
{
    if (!lex_at(lx, "{#")) return LEX_NO;
    const char *s = lx->s;
    size_t n = lx->n, st = lx->pos, pos = st + 2;
    bool strip_before = pos < n && s[pos] == '-';
    if (strip_before) pos++;
    size_t cs = pos;
    while (!(pos + 1 < n && s[pos] == '#' && s[pos + 1] == '}')) {
        if (pos + 2 >= n)
            return cgt_perr_at(lx->ps, CG_E_VALUE, st, "missing end of comment tag"), LEX_ERR;
        pos++;
    }
    bool strip_after = pos > cs && s[pos - 1] == '-';
    if (strip_before) strip_trailing(lx->ps);
    push_tok(lx->ps, K_COMMENT, st, s + cs, pos - cs);
    lx->pos = strip_after ? cgt_skip_js_space(s, n, pos + 2) : pos + 2;
    return LEX_OK;
}

/* '{%-' and '{{-': a tag that trims the text before it. */
static int lex_open_trim(lexer *lx)
{
    int type = lex_at(lx, "{%-") ? K_OPEN_STMT : lex_at(lx, "{{-") ? K_OPEN_EXPR : -1;
    if (type < 0) return LEX_NO;
    strip_trailing(lx->ps);
    push_tok(lx->ps, type, lx->pos, lx->s + lx->pos, 2);
    if (type == K_OPEN_EXPR) lx->curly = 0;
    lx->pos += 3;
    return LEX_OK;
}

/* Whitespace between the tokens of a tag: skipped, never a token. */
static int lex_space(lexer *lx)
{
    size_t l;
    while (lx->pos < lx->n && (l = cgt_js_space_at(lx->s + lx->pos, lx->n - lx->pos))) {
        lx->pos += l;
        if (!lex_more(lx)) return LEX_ERR;
    }
    return LEX_NO;
}

/* '-%}' and '-}}': a tag end that trims the whitespace after it. */
static int lex_close_trim(lexer *lx)
{
    int type = lex_at(lx, "-%}") ? K_CLOSE_STMT : lex_at(lx, "-}}") ? K_CLOSE_EXPR : -1;
    if (type < 0) return LEX_NO;
    push_tok(lx->ps, type, lx->pos, lx->s + lx->pos + 1, 2);
    lx->pos = cgt_skip_js_space(lx->s, lx->n, lx->pos + 3);
    return LEX_OK;
}

/* '-' or '+' where no operand precedes it: a signed number literal or a unary operator. After
 * an operand it is the binary operator, left to lex_punct. */
static int lex_sign(lexer *lx)
{
    char c = lx->s[lx->pos];
    if (c != '-' && c != '+') return LEX_NO;
    int lt = last_type(lx->ps);
    if (lt == K_TEXT || lt == -1)
        return cgt_perr_at(lx->ps, CG_E_VALUE, lx->pos, "unexpected character: %c", c), LEX_ERR;
    if (lt == K_IDENT || lt == K_NUM || lt == K_STR || lt == K_RPAREN || lt == K_RBRACKET)
        return LEX_NO;
    size_t st = lx->pos;
    lx->pos = cgt_skip_digits(lx->s, lx->n, st + 1);
    bool num = lx->pos > st + 1;
    if (num && (!lex_more(lx) || !lex_fraction(lx))) return LEX_ERR;
    push_tok(lx->ps, num ? K_NUM : K_UNARY, st, lx->s + st, lx->pos - st);
    return LEX_OK;
}

/* A string literal in ' or ", its escapes decoded. */
static int lex_string(lexer *lx)
{
    parser *ps = lx->ps;
    const char *s = lx->s;
    size_t n = lx->n, pos = lx->pos, start = pos;
    char q = s[pos++];
    if (q != '\'' && q != '"') return LEX_NO;
    sbuf b = {0};
    uint32_t hi = 0;
    bool ok = false;
    for (;;) {
        if (pos >= n) {
            cgt_perr_at(ps, CG_E_VALUE, start, "unterminated string literal");
            goto out;
        }
        char c = s[pos];
        if (c == q) break;
        if (c == '\\') {
            if (++pos >= n) {
                cgt_perr_at(ps, CG_E_VALUE, pos, "unexpected end of input");
                goto out;
            }
            char e = s[pos++];
            if (e == 'x' || e == 'u') {
                size_t hl = e == 'x' ? 2 : 4;
                uint32_t v = 0;
                if (n - pos < hl) {
                    cgt_perr_at(ps, CG_E_VALUE, pos - 2, "invalid hexadecimal escape sequence");
                    goto out;
                }
                for (size_t k = 0; k < hl; k++) {
                    int d = cgt_hex_digit(s[pos + k]);
                    if (d < 0) {
                        cgt_perr_at(ps, CG_E_VALUE, pos - 2, "invalid hexadecimal escape sequence");
                        goto out;
                    }
                    v = v * 16 + (uint32_t)d;
                }
                pos += hl;
                put_u16(&b, v, &hi);
                continue;
            }
            const char *from = "ntrbfv'\"\\", *to = "\n\t\r\b\f\v'\"\\";
            const char *f = strchr(from, e);
            if (!e || !f) {
                cgt_perr_at(ps, CG_E_VALUE, pos - 2, "unexpected escaped character: %c", e);
                goto out;
            }
            put_u16(&b, (unsigned char)to[f - from], &hi);
            continue;
        }
        if (hi) put_u16(&b, 0xFFFD, &hi), hi = 0; /* lone high surrogate before a raw char */
        cgt_sbuf_putc(&b, c);
        pos++;
    }
    if (hi) {
        char enc[4];
        cgt_sbuf_put(&b, enc, cgt_u8_encode(0xFFFD, enc));
    }
    {
        jstr *js = cgt_jstr_copy(&ps->t->ar, b.p ? b.p : "", b.len);
        push_tok(ps, K_STR, start, (const char *)js, 0); /* v carries the decoded jstr */
    }
    lx->pos = pos + 1;
    ok = true;
out:
    cgt_sbuf_free(&b);
    return ok ? LEX_OK : LEX_ERR;
}

/* Delimiters and operators, the longest first where one is the prefix of another. */
static int lex_punct(lexer *lx)
{
    static const struct {
        const char *seq;
        int type;
    } table[] = {
        {"{%", K_OPEN_STMT}, {"%}", K_CLOSE_STMT}, {"{{", K_OPEN_EXPR}, {"}}", K_CLOSE_EXPR},
        {"(", K_LPAREN},     {")", K_RPAREN},      {"{", K_LBRACE},     {"}", K_RBRACE},
        {"[", K_LBRACKET},   {"]", K_RBRACKET},    {",", K_COMMA},      {".", K_DOT},
        {":", K_COLON},      {"|", K_PIPE},        {"<=", K_CMP},       {">=", K_CMP},
        {"==", K_CMP},       {"!=", K_CMP},        {"<", K_CMP},        {">", K_CMP},
        {"+", K_ADD},        {"-", K_ADD},         {"~", K_ADD},        {"**", K_POW},
        {"*", K_MUL},        {"//", K_MUL},        {"/", K_MUL},        {"%", K_MUL},
        {"=", K_EQUALS},
    };
    for (size_t k = 0; k < CG_ARRAY_LEN(table); k++) {
        int type = table[k].type;
        if (type == K_CLOSE_EXPR && lx->curly > 0) continue;
        if (!lex_at(lx, table[k].seq)) continue;
        size_t l = strlen(table[k].seq);
        push_tok(lx->ps, type, lx->pos, lx->s + lx->pos, l);
        if (type == K_OPEN_EXPR)
            lx->curly = 0;
        else if (type == K_LBRACE)
            lx->curly++;
        else if (type == K_RBRACE)
            lx->curly--;
        lx->pos += l;
        return LEX_OK;
    }
    return LEX_NO;
}

/* An unsigned number literal; after a '.' (an attribute) the digits end it. */
static int lex_number(lexer *lx)
{
    if (!is_digit(lx->s[lx->pos])) return LEX_NO;
    size_t st = lx->pos;
    lx->pos = cgt_skip_digits(lx->s, lx->n, st);
    if (!lex_more(lx)) return LEX_ERR;
    if (last_type(lx->ps) != K_DOT && !lex_fraction(lx)) return LEX_ERR;
    push_tok(lx->ps, K_NUM, st, lx->s + st, lx->pos - st);
    return LEX_OK;
}

static int lex_word(lexer *lx)
{
    if (!is_word(lx->s[lx->pos])) return LEX_NO;
    size_t st = lx->pos;
    while (lx->pos < lx->n && is_word(lx->s[lx->pos]))
        lx->pos++;
    if (!lex_more(lx)) return LEX_ERR;
    push_tok(lx->ps, K_IDENT, st, lx->s + st, lx->pos - st);
    return LEX_OK;
}

/* The last rule: what no other rule takes is an error. */
static int lex_bad(lexer *lx)
{
    size_t l;
    const char *p = lx->s + lx->pos;
    cgt_u8_decode((const unsigned char *)p, lx->n - lx->pos, &l);
    return cgt_perr_at(lx->ps, CG_E_VALUE, lx->pos, "unexpected character: %.*s", (int)l, p),
           LEX_ERR;
}

bool cgt_lex(parser *ps)
{
    static int (*const rules[])(lexer *) = {
        lex_text,  lex_comment, lex_open_trim, lex_space, lex_close_trim, lex_sign,
        lex_punct, lex_string,  lex_number,    lex_word,  lex_bad,
    };
    lexer lx = {.ps = ps, .s = ps->pt->s, .n = ps->pt->n};
    while (lx.pos < lx.n) {
        int r = LEX_NO;
        for (size_t k = 0; r == LEX_NO && k < CG_ARRAY_LEN(rules); k++)
            r = rules[k](&lx);
        if (r == LEX_ERR) return false;
    }
    push_tok(ps, K_EOF, lx.n, lx.s + lx.n, 0);
    return true;
}
