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
#include "cache/chat_template.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#define TPL_MAX_SOURCE (1u << 20) /* bytes of template source */
#define TPL_MAX_NEST 256          /* nesting depth of the syntax tree */
#define TPL_MAX_INDENT 10000      /* widest indent tojson/indent accept */

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 and JavaScript character classes                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Decodes one code point at p (n bytes left, n > 0); stores its length. Invalid bytes decode
 * as U+FFFD of length 1, so every input makes progress. */
static uint32_t u8_decode(const unsigned char *p, size_t n, size_t *len)
{
    uint32_t c = p[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    size_t need;
    uint32_t min;
    if ((c & 0xE0) == 0xC0)
        need = 2, c &= 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        need = 3, c &= 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        need = 4, c &= 0x07, min = 0x10000;
    else {
        *len = 1;
        return 0xFFFD;
    }
    if (need > n) {
        *len = 1;
        return 0xFFFD;
    }
    for (size_t i = 1; i < need; i++) {
        if ((p[i] & 0xC0) != 0x80) {
            *len = 1;
            return 0xFFFD;
        }
        c = (c << 6) | (p[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        *len = 1;
        return 0xFFFD;
    }
    *len = need;
    return c;
}

static size_t u8_encode(uint32_t c, char *o)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c >= 0xD800 && c <= 0xDFFF) c = 0xFFFD; /* a lone surrogate reaches UTF-8 as U+FFFD */
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* Cuts a NUL-terminated message that snprintf may have truncated inside a character back to
 * whole characters, so an error message is always valid UTF-8 (it goes into JSON replies). */
static void utf8_clip(char *s)
{
    size_t n = strlen(s), lead = n;
    while (lead > 0 && n - lead < 4 && ((unsigned char)s[lead - 1] & 0xC0) == 0x80)
        lead--;
    if (lead == 0) return;
    unsigned char c = (unsigned char)s[lead - 1];
    size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    if (c >= 0x80 && n - (lead - 1) < need) s[lead - 1] = 0;
}

/* JavaScript's \s and String.prototype.trim() set. */
static bool js_space(uint32_t c)
{
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return true;
    if (c < 0xA0) return false;
    return c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

/* Length of the JavaScript whitespace character at p, 0 if there is none. */
static size_t js_space_at(const char *p, size_t n)
{
    if (n == 0) return 0;
    unsigned char c = (unsigned char)p[0];
    if (c < 0x80) return (c == ' ' || (c >= 0x09 && c <= 0x0D)) ? 1 : 0;
    size_t l;
    uint32_t cp = u8_decode((const unsigned char *)p, n, &l);
    return js_space(cp) ? l : 0;
}

/* Length of the JavaScript whitespace character that ends at p + n, 0 if none. */
static size_t js_space_before(const char *p, size_t n)
{
    if (n == 0) return 0;
    size_t s = n - 1;
    while (s > 0 && n - s < 4 && ((unsigned char)p[s] & 0xC0) == 0x80)
        s--;
    size_t l = js_space_at(p + s, n - s);
    return (l && s + l == n) ? l : 0;
}

/* The offset of the first character at or after i in s[0, n) that is no JavaScript space. */
static size_t skip_js_space(const char *s, size_t n, size_t i)
{
    size_t l;
    while (i < n && (l = js_space_at(s + i, n - i)))
        i += l;
    return i;
}

static bool is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static size_t skip_digits(const char *s, size_t n, size_t i)
{
    while (i < n && is_digit(s[i]))
        i++;
    return i;
}

/* The value of a hexadecimal digit, -1 for any other character. */
static int hex_digit(int c)
{
    return is_digit(c)              ? c - '0'
           : (c >= 'a' && c <= 'f') ? c - 'a' + 10
           : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                    : -1;
}

static bool is_word(int c) /* JavaScript's \w: ASCII only */
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* ------------------------------------------------------------------------------------------ */
/* Arena: every value of one render (and every node of one template) lives here                */
/* ------------------------------------------------------------------------------------------ */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct arena {
    chunk *head;
    size_t total; /* bytes handed out */
} arena;

static void *arena_alloc(arena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
    if (n == 0) n = sizeof(max_align_t);
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 32768 ? n : 32768;
        chunk *c = cg_malloc(sizeof(chunk) + cap);
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    a->total += n;
    return p;
}

static void *arena_zalloc(arena *a, size_t n)
{
    void *p = arena_alloc(a, n);
    memset(p, 0, n);
    return p;
}

static void arena_free(arena *a)
{
    chunk *c = a->head;
    while (c) {
        chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Strings                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* An immutable string: UTF-8 bytes (borrowed from the vars, the template or the arena) with
 * its length in UTF-16 units, which is what JavaScript's length and indexing count. */
typedef struct jstr {
    const char *p;
    size_t len;
    size_t u16; /* UTF-16 length */
    bool ascii;
} jstr;

static void jstr_measure(jstr *s)
{
    size_t u16 = 0;
    bool ascii = true;
    const unsigned char *p = (const unsigned char *)s->p;
    for (size_t i = 0; i < s->len;) {
        if (p[i] < 0x80) {
            i++;
            u16++;
            continue;
        }
        ascii = false;
        size_t l;
        uint32_t c = u8_decode(p + i, s->len - i, &l);
        u16 += c >= 0x10000 ? 2 : 1;
        i += l;
    }
    s->u16 = u16;
    s->ascii = ascii;
}

static jstr *jstr_borrow(arena *a, const char *p, size_t len)
{
    jstr *s = arena_alloc(a, sizeof(jstr));
    s->p = p;
    s->len = len;
    jstr_measure(s);
    return s;
}

static jstr *jstr_copy(arena *a, const char *p, size_t len)
{
    char *d = arena_alloc(a, len + 1);
    if (len) memcpy(d, p, len);
    d[len] = 0;
    return jstr_borrow(a, d, len);
}

static bool jstr_eq(const jstr *a, const jstr *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

static bool jstr_eqc(const jstr *a, const char *s)
{
    size_t n = strlen(s);
    return a->len == n && memcmp(a->p, s, n) == 0;
}

/* Growable byte buffer (malloc) with the render's output cap. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sbuf_free(sbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Appends without a cap; callers check the size they build. */
static void sbuf_put(sbuf *b, const void *p, size_t n)
{
    if (n == 0) return;
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->len < n + 1)
            cap *= 2;
        b->p = cg_realloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sbuf_putc(sbuf *b, char c)
{
    sbuf_put(b, &c, 1);
}

/* ------------------------------------------------------------------------------------------ */
/* JavaScript number formatting and parsing                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Number.prototype.toString(): shortest round-trip digits, fixed notation for exponents in
 * [-7, 21), exponent notation outside. out must hold 32 bytes. */
static void js_num(double d, char *out)
{
    if (isnan(d)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(d)) {
        strcpy(out, d < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (d == 0) {
        strcpy(out, "0");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, d);
        if (strtod(tmp, NULL) == d) break;
    }
    snprintf(tmp, sizeof tmp, "%.*e", prec, d);
    /* tmp: [-]d[.ddd]e[+-]xx */
    char digits[24];
    int k = 0;
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') neg = true, p++;
    for (; *p && *p != 'e'; p++)
        if (is_digit(*p)) digits[k++] = *p;
    while (k > 1 && digits[k - 1] == '0')
        k--;
    digits[k] = 0;
    int e = atoi(p + 1);
    int n = e + 1; /* position of the decimal point */
    char *o = out;
    if (neg) *o++ = '-';
    if (k <= n && n <= 21) {
        memcpy(o, digits, (size_t)k);
        o += k;
        for (int i = 0; i < n - k; i++)
            *o++ = '0';
    } else if (0 < n && n <= 21) {
        memcpy(o, digits, (size_t)n);
        o += n;
        *o++ = '.';
        memcpy(o, digits + n, (size_t)(k - n));
        o += k - n;
    } else if (-6 < n && n <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -n; i++)
            *o++ = '0';
        memcpy(o, digits, (size_t)k);
        o += k;
    } else {
        *o++ = digits[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(k - 1));
            o += k - 1;
        }
        o += sprintf(o, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
    }
    *o = 0;
}

/* The FloatValue printer of @huggingface/jinja: integral values keep one decimal ("1.0"). */
static void js_float_str(double d, char *out, size_t outlen)
{
    if (d == 0 && signbit(d)) {
        snprintf(out, outlen, "-0.0");
        return;
    }
    if (isfinite(d) && floor(d) == d && fabs(d) < 1e21) {
        snprintf(out, outlen, "%.1f", d);
        return;
    }
    char tmp[32];
    js_num(d, tmp);
    snprintf(out, outlen, "%s", tmp);
}

/* The length of the exponent ('e' or 'E', a sign, digits) at p[i], 0 if no digit follows. */
static size_t exponent_len(const char *p, size_t n, size_t i)
{
    size_t j = i + 1;
    if (j < n && (p[j] == '+' || p[j] == '-')) j++;
    size_t d = skip_digits(p, n, j);
    return d > j ? d - i : 0;
}

/* The value of the decimal literal p[0, n) (digits, '.', exponent), negated if neg. */
static double js_decimal(const char *p, size_t n, bool neg)
{
    char *tmp = cg_strndup(p, n);
    double v = strtod(tmp, NULL);
    free(tmp);
    return neg ? -v : v;
}

/* ES StringToNumber: whitespace-trimmed decimal, 0x/0o/0b integers, Infinity; "" is 0. */
static double js_str_to_num(const char *p, size_t n)
{
    size_t l = skip_js_space(p, n, 0);
    p += l, n -= l;
    while (n && (l = js_space_before(p, n)))
        n -= l;
    if (n == 0) return 0;
    if (n > 2 && p[0] == '0' && strchr("xXoObB", p[1])) {
        int base = (p[1] == 'x' || p[1] == 'X') ? 16 : (p[1] == 'o' || p[1] == 'O') ? 8 : 2;
        double v = 0;
        for (size_t i = 2; i < n; i++) {
            int dgt = hex_digit(p[i]);
            if (dgt < 0 || dgt >= base) return NAN;
            v = v * base + dgt;
        }
        return v;
    }
    size_t i = 0;
    bool neg = false;
    if (p[i] == '+' || p[i] == '-') neg = p[i] == '-', i++;
    if (n - i == 8 && memcmp(p + i, "Infinity", 8) == 0) return neg ? -INFINITY : INFINITY;
    size_t start = i, nd = 0;
    while (i < n && is_digit(p[i]))
        i++, nd++;
    if (i < n && p[i] == '.') {
        i++;
        while (i < n && is_digit(p[i]))
            i++, nd++;
    }
    if (nd == 0) return NAN;
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        size_t el = exponent_len(p, n, i);
        if (el == 0) return NAN;
        i += el;
    }
    if (i != n) return NAN;
    return js_decimal(p + start, n - start, neg);
}

/* Where parseInt and parseFloat read the number of p[0, n): after the leading whitespace and a
 * sign, '-' setting *neg. */
static size_t js_number_start(const char *p, size_t n, bool *neg)
{
    size_t i = skip_js_space(p, n, 0);
    *neg = i < n && p[i] == '-';
    if (i < n && (p[i] == '+' || p[i] == '-')) i++;
    return i;
}

/* parseInt(s, 10): leading whitespace, sign, digits; NaN when there are none. */
static double js_parse_int(const char *p, size_t n)
{
    bool neg;
    size_t s = js_number_start(p, n, &neg), i = skip_digits(p, n, s);
    if (i == s) return NAN;
    return js_decimal(p + s, i - s, neg);
}

/* parseFloat(s): the longest prefix that is a decimal literal or Infinity; NaN if none. */
static double js_parse_float(const char *p, size_t n)
{
    bool neg;
    size_t i = js_number_start(p, n, &neg);
    if (n - i >= 8 && memcmp(p + i, "Infinity", 8) == 0) return neg ? -INFINITY : INFINITY;
    size_t s = i, nd = 0;
    while (i < n && is_digit(p[i]))
        i++, nd++;
    if (i < n && p[i] == '.') {
        size_t j = i + 1, fd = 0;
        while (j < n && is_digit(p[j]))
            j++, fd++;
        if (nd + fd > 0) i = j, nd += fd;
    }
    if (nd == 0) return NAN;
    if (i < n && (p[i] == 'e' || p[i] == 'E')) i += exponent_len(p, n, i);
    return js_decimal(p + s, i - s, neg);
}

/* ------------------------------------------------------------------------------------------ */
/* Syntax tree                                                                                 */
/* ------------------------------------------------------------------------------------------ */

typedef enum {
    /* statements */
    N_TEXT,
    N_OUTPUT,
    N_IF,
    N_FOR,
    N_SET,
    N_MACRO,
    N_CALLBLOCK,
    N_FILTERBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_COMMENT,
    /* expressions */
    N_STR,
    N_INT,
    N_FLOAT,
    N_IDENT,
    N_ARRAY,
    N_TUPLE,
    N_DICT,
    N_MEMBER,
    N_SLICE,
    N_CALL,
    N_KWARG,
    N_SPREAD,
    N_KWSPREAD,
    N_UNARY,
    N_BINARY,
    N_FILTER,
    N_TEST,
    N_SELECT,
    N_TERNARY
} node_kind;

typedef enum {
    OP_OR,
    OP_AND,
    OP_NOT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_IN,
    OP_NOTIN,
    OP_ADD,
    OP_SUB,
    OP_CAT,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_NEG,
    OP_POS
} op_kind;

/* clang-format off */
#define FILTERS(X)                                                                                 \
    X(safe) X(tojson) X(list) X(first) X(last) X(length) X(reverse) X(sort) X(join) X(string)      \
    X(unique) X(upper) X(lower) X(title) X(capitalize) X(trim) X(indent) X(int) X(float) X(abs)    \
    X(items) X(bool) X(default) X(selectattr) X(rejectattr) X(map) X(replace) X(dictsort) X(get)   \
    X(keys) X(values)
#define TESTS(X)                                                                                   \
    X(boolean) X(callable) X(odd) X(even) X(false) X(true) X(none) X(string) X(number)             \
    X(integer) X(iterable) X(mapping) X(sequence) X(lower) X(upper) X(defined) X(undefined)        \
    X(equalto) X(eq)
/* Methods of strings (first two rows) and of mappings (last row). */
#define METHODS(X)                                                                                 \
    X(upper) X(lower) X(strip) X(title) X(capitalize) X(rstrip) X(lstrip) X(startswith)            \
    X(endswith) X(split) X(replace)                                                                \
    X(get) X(items) X(keys) X(values) X(dictsort)
/* clang-format on */

#define ENUM_F(n) F_##n,
#define ENUM_T(n) T_##n,
#define ENUM_M(n) M_##n,
#define NAME_(n) #n,
enum { FILTERS(ENUM_F) F_COUNT };
enum { TESTS(ENUM_T) TEST_COUNT };
enum { METHODS(ENUM_M) M_COUNT };
static const char *const filter_names[] = {FILTERS(NAME_)};
static const char *const test_names[] = {TESTS(NAME_)};
static const char *const method_names[] = {METHODS(NAME_)};
#define M_FIRST_MAPPING M_get

typedef struct node node;
typedef struct nodelist {
    node **v;
    size_t n;
} nodelist;

/* One node type for all kinds; which fields a kind uses is listed with the parser below. */
struct node {
    uint8_t kind;
    uint8_t op;     /* op_kind, filter, test */
    uint8_t flag;   /* MEMBER: computed; FILTER: call form; TEST: negated; MACRO: uses kwargs(1)
                       varargs(2) */
    uint16_t depth; /* height of the subtree */
    uint32_t pos;   /* byte offset in the original source */
    node *a, *b, *c;
    nodelist l1, l2;
    jstr *s;
    double num;
};

struct cg_chat_template {
    arena ar; /* nodes and literal strings */
    char *src;
    size_t len;
    nodelist body;
    cg_chat_template_limits lim;
};

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

/* 1-based line and column (in code points) of a byte offset of the source. */
static void src_linecol(const char *src, size_t len, size_t off, unsigned *line, unsigned *col)
{
    unsigned l = 1, c = 1;
    if (off > len) off = len;
    for (size_t i = 0; i < off; i++) {
        if (src[i] == '\n')
            l++, c = 1;
        else if (((unsigned char)src[i] & 0xC0) != 0x80)
            c++;
    }
    *line = l;
    *col = c;
}

/* ------------------------------------------------------------------------------------------ */
/* Preprocessing: the text rewrites @huggingface/jinja applies before lexing                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct ptext {
    char *s;
    uint32_t *map; /* map[i]: offset in the original source of byte i (n + 1 entries) */
    size_t n;
} ptext;

static void ptext_init(ptext *o, size_t cap)
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

static void ptext_free(ptext *p)
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

/* lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1" */
static void pp_lstrip(const ptext *in, ptext *o)
{
    ptext_init(o, in->n);
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

/* trim_blocks: /([#%-]})\n/g -> "$1" */
static void pp_trim(const ptext *in, ptext *o)
{
    ptext_init(o, in->n);
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
    j = skip_js_space(s, n, j);
    if (n - j >= 3 && memcmp(s + j, "end", 3) == 0 && n - j >= 13 &&
        memcmp(s + j + 3, "generation", 10) == 0)
        j += 3;
    if (n - j < 10 || memcmp(s + j, "generation", 10) != 0) return 0;
    j = skip_js_space(s, n, j + 10);
    *rminus = j < n && s[j] == '-';
    if (*rminus) j++;
    if (n - j < 2 || s[j] != '%' || s[j + 1] != '}') return 0;
    return j + 2;
}

/* /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs: the tag goes, and the whitespace around
 * it stays unless the tag's '-' says otherwise (transformers' AssistantTracker blocks render
 * their body). */
static void pp_generation(const ptext *in, ptext *o)
{
    ptext_init(o, in->n);
    const char *s = in->s;
    size_t n = in->n;
    for (size_t i = 0; i < n;) {
        size_t j = skip_js_space(s, n, i);
        bool lm = false, rm = false;
        size_t e = generation_tag(s, n, j, &lm, &rm);
        if (!e) {
            size_t upto = j > i ? j : i + 1;
            ptext_copy(o, in, i, upto - i);
            i = upto;
            continue;
        }
        size_t after = skip_js_space(s, n, e);
        if (!lm) ptext_copy(o, in, i, j - i);
        if (!rm) ptext_copy(o, in, e, after - e);
        i = after;
    }
    ptext_finish(o, in);
}

/* ------------------------------------------------------------------------------------------ */
/* Lexer                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef enum {
    K_EOF,
    K_TEXT,
    K_NUM,
    K_STR,
    K_IDENT,
    K_EQUALS,
    K_LPAREN,
    K_RPAREN,
    K_OPEN_STMT,
    K_CLOSE_STMT,
    K_OPEN_EXPR,
    K_CLOSE_EXPR,
    K_LBRACKET,
    K_RBRACKET,
    K_LBRACE,
    K_RBRACE,
    K_COMMA,
    K_DOT,
    K_COLON,
    K_PIPE,
    K_ADD,
    K_MUL,
    K_POW,
    K_CMP,
    K_UNARY,
    K_COMMENT
} tok_kind;

typedef struct tok {
    uint8_t type;
    uint32_t pos; /* offset in the preprocessed text */
    const char *v;
    size_t len;
} tok;

typedef struct parser {
    cg_chat_template *t;
    const ptext *pt;
    tok *toks;
    size_t n, cap, cur;
    cg_status st;
    char msg[256];
    size_t errpos; /* offset in the original source */
    int depth;
} parser;

static void *perr_at(parser *ps, cg_status st, size_t ppos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void *perr_at(parser *ps, cg_status st, size_t ppos, const char *fmt, ...)
{
    if (ps->st != CG_OK) return NULL;
    ps->st = st;
    if (ppos > ps->pt->n) ppos = ps->pt->n;
    ps->errpos = ps->pt->map[ppos];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->msg, sizeof ps->msg, fmt, ap);
    va_end(ap);
    utf8_clip(ps->msg);
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
    while (t->len && (l = js_space_before(t->v, t->len)))
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
            sbuf_put(b, enc, u8_encode(cp, enc));
            return;
        }
        sbuf_put(b, enc, u8_encode(0xFFFD, enc));
        *pending_hi = 0;
    }
    if (u >= 0xD800 && u <= 0xDBFF) {
        *pending_hi = u;
        return;
    }
    sbuf_put(b, enc, u8_encode(u, enc));
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
    perr_at(lx->ps, CG_E_VALUE, lx->pos, "unexpected end of input");
    return false;
}

/* The '.' and digits after a number's integer part, when a digit follows the '.'. */
static bool lex_fraction(lexer *lx)
{
    if (lx->s[lx->pos] != '.' || lx->pos + 1 >= lx->n || !is_digit(lx->s[lx->pos + 1])) return true;
    lx->pos = skip_digits(lx->s, lx->n, lx->pos + 1);
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
            return perr_at(lx->ps, CG_E_VALUE, st, "missing end of comment tag"), LEX_ERR;
        pos++;
    }
    bool strip_after = pos > cs && s[pos - 1] == '-';
    if (strip_before) strip_trailing(lx->ps);
    push_tok(lx->ps, K_COMMENT, st, s + cs, pos - cs);
    lx->pos = strip_after ? skip_js_space(s, n, pos + 2) : pos + 2;
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
    while (lx->pos < lx->n && (l = js_space_at(lx->s + lx->pos, lx->n - lx->pos))) {
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
    lx->pos = skip_js_space(lx->s, lx->n, lx->pos + 3);
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
        return perr_at(lx->ps, CG_E_VALUE, lx->pos, "unexpected character: %c", c), LEX_ERR;
    if (lt == K_IDENT || lt == K_NUM || lt == K_STR || lt == K_RPAREN || lt == K_RBRACKET)
        return LEX_NO;
    size_t st = lx->pos;
    lx->pos = skip_digits(lx->s, lx->n, st + 1);
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
            perr_at(ps, CG_E_VALUE, start, "unterminated string literal");
            goto out;
        }
        char c = s[pos];
        if (c == q) break;
        if (c == '\\') {
            if (++pos >= n) {
                perr_at(ps, CG_E_VALUE, pos, "unexpected end of input");
                goto out;
            }
            char e = s[pos++];
            if (e == 'x' || e == 'u') {
                size_t hl = e == 'x' ? 2 : 4;
                uint32_t v = 0;
                if (n - pos < hl) {
                    perr_at(ps, CG_E_VALUE, pos - 2, "invalid hexadecimal escape sequence");
                    goto out;
                }
                for (size_t k = 0; k < hl; k++) {
                    int d = hex_digit(s[pos + k]);
                    if (d < 0) {
                        perr_at(ps, CG_E_VALUE, pos - 2, "invalid hexadecimal escape sequence");
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
                perr_at(ps, CG_E_VALUE, pos - 2, "unexpected escaped character: %c", e);
                goto out;
            }
            put_u16(&b, (unsigned char)to[f - from], &hi);
            continue;
        }
        if (hi) put_u16(&b, 0xFFFD, &hi), hi = 0; /* lone high surrogate before a raw char */
        sbuf_putc(&b, c);
        pos++;
    }
    if (hi) {
        char enc[4];
        sbuf_put(&b, enc, u8_encode(0xFFFD, enc));
    }
    {
        jstr *js = jstr_copy(&ps->t->ar, b.p ? b.p : "", b.len);
        push_tok(ps, K_STR, start, (const char *)js, 0); /* v carries the decoded jstr */
    }
    lx->pos = pos + 1;
    ok = true;
out:
    sbuf_free(&b);
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
    lx->pos = skip_digits(lx->s, lx->n, st);
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
    u8_decode((const unsigned char *)p, lx->n - lx->pos, &l);
    return perr_at(lx->ps, CG_E_VALUE, lx->pos, "unexpected character: %.*s", (int)l, p), LEX_ERR;
}

/* The tokens of @huggingface/jinja's tokenize(): at each place the first rule that applies. */
static bool lex(parser *ps)
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
        node **nv = arena_alloc(a, cap * sizeof(node *));
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
        return perr_at(ps, CG_E_VALUE, t->pos, "expected %s, got %s", what, tok_desc(t));
    return advance(ps);
}

static tok *expect_word(parser *ps, const char *w)
{
    tok *t = peek(ps);
    if (!tok_is_word(t, w)) return perr_at(ps, CG_E_VALUE, t->pos, "expected '%s'", w);
    return advance(ps);
}

static node *mk(parser *ps, int kind, const tok *t)
{
    node *x = arena_zalloc(&ps->t->ar, sizeof(node));
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
    return jstr_copy(&ps->t->ar, t->v, t->len);
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
        perr_at(ps, CG_E_UNSUPPORTED, peek(ps)->pos, "template nests deeper than %d", TPL_MAX_NEST);
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
            return perr_at(ps, CG_E_VALUE, t->pos,
                           "argument unpacking is not allowed in parameters"),
                   false;
        if (kwspread) {
            advance(ps);
            node *x = mk(ps, N_KWSPREAD, t);
            if (!(x->a = parse_expression(ps)) || !fin(ps, x)) return false;
            nvec_push(&ps->t->ar, &v, x);
            if (is(ps, K_COMMA)) advance(ps);
            if (!is(ps, K_RPAREN))
                return perr_at(ps, CG_E_VALUE, peek(ps)->pos,
                               "'**' must be applied to the final argument"),
                       false;
            break;
        }
        node *arg;
        if (spread) {
            if (saw_spread)
                return perr_at(ps, CG_E_VALUE, t->pos,
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
                    return perr_at(ps, CG_E_VALUE, t->pos, "expected an identifier before '='"),
                           false;
                node *kw = mk(ps, N_KWARG, t);
                kw->s = arg->s;
                if (!(kw->a = parse_expression(ps)) || !fin(ps, kw)) return false;
                arg = kw;
            }
            if (mode == 'p') {
                if (arg->kind != N_IDENT && arg->kind != N_KWARG)
                    return perr_at(ps, CG_E_VALUE, t->pos,
                                   "expected an identifier for a parameter"),
                           false;
                for (size_t i = 0; i < v.n; i++)
                    if (jstr_eq(v.v[i]->s, arg->s))
                        return perr_at(ps, CG_E_VALUE, t->pos, "duplicate parameter name: %.*s",
                                       (int)arg->s->len, arg->s->p),
                               false;
            }
            if (arg->kind == N_KWARG)
                saw_kw = true;
            else if (saw_kw)
                return perr_at(ps, CG_E_VALUE, t->pos,
                               mode == 'c' ? "positional argument follows keyword argument"
                                           : "non-default parameter follows default parameter"),
                       false;
            else if (saw_spread)
                return perr_at(ps, CG_E_VALUE, t->pos, "positional argument follows '*' unpacking"),
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
        if (is(ps, K_EOF)) return perr_at(ps, CG_E_VALUE, peek(ps)->pos, "expected ']'");
        if (n == CG_ARRAY_LEN(parts))
            return perr_at(ps, CG_E_VALUE, peek(ps)->pos, "too many parts in a subscript");
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
    if (n == 0) return perr_at(ps, CG_E_VALUE, t0->pos, "expected an index or a slice");
    if (!is_slice) return parts[0];
    if (n > 3) return perr_at(ps, CG_E_VALUE, t0->pos, "a slice has at most 3 parts");
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
                return perr_at(ps, CG_E_VALUE, pt->pos,
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
    if (name->kind != N_IDENT) return perr_at(ps, st, t->pos, "%s", msg);
    *at = t;
    return name;
}

/* The N_FILTER node of the filter called name (at t); refused unless it is a known filter. */
static node *filter_node(parser *ps, tok *t, const node *name)
{
    int id = name_index(filter_names, F_COUNT, t);
    if (id < 0)
        return perr_at(ps, CG_E_UNSUPPORTED, t->pos, "unsupported filter '%.*s'", (int)t->len,
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
                return perr_at(ps, CG_E_UNSUPPORTED, nt->pos, "unsupported filter expression");
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
        int id = name_index(test_names, TEST_COUNT, nt);
        if (id < 0 || id == T_equalto || id == T_eq)
            return perr_at(ps, CG_E_UNSUPPORTED, nt->pos, "unsupported test '%.*s'", (int)nt->len,
                           nt->v);
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
            sbuf_put(&b, x->s->p, x->s->len);
            while (is(ps, K_STR)) {
                jstr *n = (jstr *)advance(ps)->v;
                sbuf_put(&b, n->p, n->len);
            }
            x->s = jstr_copy(&ps->t->ar, b.p ? b.p : "", b.len);
            sbuf_free(&b);
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
            node *val = parse_expression(ps);
            P(val);
            nvec_push(&ps->t->ar, &k, key);
            nvec_push(&ps->t->ar, &v, val);
            if (is(ps, K_COMMA)) advance(ps);
        }
        advance(ps);
        node *x = mk(ps, N_DICT, t);
        x->l1 = nvec_list(k);
        x->l2 = nvec_list(v);
        return fin(ps, x);
    }
    default:
        return perr_at(ps, CG_E_VALUE, t->pos, "unexpected %s", tok_desc(t));
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
        return perr_at(ps, CG_E_VALUE, tt->pos, "cannot assign to this expression");
    if (is(ps, K_EQUALS)) {
        advance(ps);
        P(x->b = parse_expression_sequence(ps, false));
    } else {
        P(expect(ps, K_CLOSE_STMT, "'%}'"));
        if (!parse_body(ps, &x->l1, "endset", NULL, NULL)) return NULL;
        P(expect(ps, K_OPEN_STMT, "'{%'"));
        P(expect_word(ps, "endset"));
    }
    P(expect(ps, K_CLOSE_STMT, "'%}'"));
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
    if (!parse_args(ps, 'p', &x->l1)) return NULL;
    P(expect(ps, K_CLOSE_STMT, "'%}'"));
    if (!parse_body(ps, &x->l2, "endmacro", NULL, NULL) || !end_stmt(ps, "endmacro")) return NULL;
    return x;
}

/* {% for target in iterable [if test] %}body[{% else %}body]{% endfor %} */
static node *parse_for(parser *ps, tok *t)
{
    node *x = mk(ps, N_FOR, t);
    tok *vt = peek(ps);
    P(x->a = parse_expression_sequence(ps, true));
    if (!valid_target(x->a, false))
        return perr_at(ps, CG_E_VALUE, vt->pos,
                       "expected a name or a tuple of names for the loop variable");
    if (!is_ident(ps, "in"))
        return perr_at(ps, CG_E_VALUE, peek(ps)->pos, "expected 'in' after the loop variable");
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
    P(expect(ps, K_CLOSE_STMT, "'%}'"));
    if (!parse_body(ps, &x->l2, "endcall", NULL, NULL) || !end_stmt(ps, "endcall")) return NULL;
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
    P(expect(ps, K_CLOSE_STMT, "'%}'"));
    if (!parse_body(ps, &x->l1, "endfilter", NULL, NULL) || !end_stmt(ps, "endfilter")) return NULL;
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
            return perr_at(ps, CG_E_UNSUPPORTED, t->pos, "unsupported statement '%s'", known[i]);
    static const char *const closing[] = {"endif",  "elif",     "else",    "endfor",
                                          "endset", "endmacro", "endcall", "endfilter"};
    for (size_t i = 0; i < CG_ARRAY_LEN(closing); i++)
        if (tok_is_word(t, closing[i]))
            return perr_at(ps, CG_E_VALUE, t->pos, "unexpected '%s'", closing[i]);
    return perr_at(ps, CG_E_UNSUPPORTED, t->pos, "unknown statement '%.*s'", (int)t->len, t->v);
}

static node *parse_statement(parser *ps)
{
    advance(ps); /* '{%' */
    tok *t = peek(ps);
    if (t->type != K_IDENT) return perr_at(ps, CG_E_VALUE, t->pos, "expected a statement name");
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
        return perr_at(ps, CG_E_VALUE, t->pos, "unexpected %s", tok_desc(t));
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
                ok = jstr_eqc(callee->b->s, method_names[i]);
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
/* Values                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef enum { V_UNDEF, V_NULL, V_BOOL, V_INT, V_FLOAT, V_STR, V_ARR, V_OBJ, V_NS, V_FUNC } vtype;
#define SUB_TUPLE 1  /* V_ARR: a tuple */
#define SUB_KWARGS 1 /* V_OBJ: keyword arguments */

typedef struct jarr jarr;
typedef struct jobj jobj;
typedef struct jfunc jfunc;

typedef struct val {
    uint8_t t;
    uint8_t sub;
    union {
        bool b;
        double n;
        jstr *s;
        jarr *a;
        jobj *o;
        jfunc *f;
    } u;
} val;

struct jarr {
    size_t n;
    val *v;
};

/* Insertion-ordered map (JavaScript Map); a hash index once it grows past 8 keys. */
struct jobj {
    size_t n, cap;
    const jstr **k;
    val *v;
    uint32_t *idx; /* slot -> entry + 1 */
    size_t idxcap;
};

typedef enum {
    FN_NAMESPACE,
    FN_RANGE,
    FN_RAISE,
    FN_STRFTIME,
    FN_METHOD,
    FN_MACRO,
    FN_CALLER
} fn_kind;

typedef struct env env;
struct jfunc {
    uint8_t kind;
    uint8_t method;
    val self;        /* FN_METHOD: the string or mapping */
    const node *def; /* FN_MACRO: the macro; FN_CALLER: the call block */
    env *lex;        /* FN_CALLER: the scope of the call block */
};

struct env {
    env *parent;
    /* Its variables: a mapping, so a scope with many of them (a request's
     * chat_template_kwargs) gets the mapping's hash index, not a scan per lookup. */
    jobj vars;
};

static const val UNDEF = {.t = V_UNDEF};
static const val VNULL = {.t = V_NULL};

static val vbool(bool b)
{
    return (val){.t = V_BOOL, .u.b = b};
}
static val vint(double n)
{
    return (val){.t = V_INT, .u.n = n};
}
static val vfloat(double n)
{
    return (val){.t = V_FLOAT, .u.n = n};
}
static val vstr(jstr *s)
{
    return (val){.t = V_STR, .u.s = s};
}
static val varr(jarr *a, int sub)
{
    return (val){.t = V_ARR, .sub = (uint8_t)sub, .u.a = a};
}
static val vobj(jobj *o, int sub)
{
    return (val){.t = V_OBJ, .sub = (uint8_t)sub, .u.o = o};
}
static bool is_num(val v)
{
    return v.t == V_INT || v.t == V_FLOAT;
}
static bool is_container(val v) /* ObjectValue or NamespaceValue */
{
    return v.t == V_OBJ || v.t == V_NS;
}

static const char *type_name(val v)
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

static jarr *arr_new(arena *a, size_t n)
{
    jarr *r = arena_alloc(a, sizeof(jarr));
    r->n = n;
    r->v = n ? arena_alloc(a, n * sizeof(val)) : NULL;
    return r;
}

static jobj *obj_new(arena *a)
{
    return arena_zalloc(a, sizeof(jobj));
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
    o->idx = arena_zalloc(a, o->idxcap * sizeof(uint32_t));
    for (size_t i = 0; i < o->n; i++) {
        size_t s = str_hash(o->k[i]->p, o->k[i]->len) & (o->idxcap - 1);
        while (o->idx[s])
            s = (s + 1) & (o->idxcap - 1);
        o->idx[s] = (uint32_t)(i + 1);
    }
}

static long obj_find(const jobj *o, const char *p, size_t n)
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

static bool obj_get(const jobj *o, const char *p, size_t n, val *out)
{
    long i = obj_find(o, p, n);
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
    const jstr **nk = arena_alloc(a, nc * sizeof(*nk));
    val *nv = arena_alloc(a, nc * sizeof(val));
    if (n) {
        memcpy(nk, *k, n * sizeof(*nk));
        memcpy(nv, *v, n * sizeof(val));
    }
    *k = nk;
    *v = nv;
    *cap = nc;
}

/* Map.set: a new key goes last, an existing key keeps its place. */
static void obj_set(arena *a, jobj *o, const jstr *k, val v)
{
    long i = obj_find(o, k->p, k->len);
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

enum { RC_OK = 0, RC_ERR, RC_BREAK, RC_CONT };

typedef struct ctx {
    const cg_chat_template *t;
    const cg_chat_template_limits *lim;
    arena ar;
    sbuf *out;
    uint64_t steps;
    unsigned depth;
    cg_status st;
    char msg[1024];
    env *global;
    const node *ctl;  /* the last break or continue, for the error when it escapes every loop */
    size_t buf_alloc; /* bytes of text buffers allocated so far (never decremented) */
} ctx;

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int r_ = (x);                                                                              \
        if (r_) return r_;                                                                         \
    } while (0)

static int rerr(ctx *c, const node *at, cg_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int rerr(ctx *c, const node *at, cg_status st, const char *fmt, ...)
{
    if (c->st != CG_OK) return RC_ERR;
    c->st = st;
    size_t off = 0;
    if (at) {
        unsigned line, col;
        src_linecol(c->t->src, c->t->len, at->pos, &line, &col);
        off = (size_t)snprintf(c->msg, sizeof c->msg, "%u:%u: ", line, col);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg + off, sizeof c->msg - off, fmt, ap);
    va_end(ap);
    utf8_clip(c->msg);
    return RC_ERR;
}

#define TERR(c, at, ...) rerr((c), (at), CG_E_VALUE, __VA_ARGS__)

/* Values and text buffers both count, cumulatively: a render allocates at most max_memory. */
static int check_memory(ctx *c, const node *at)
{
    if (c->ar.total + c->buf_alloc > c->lim->max_memory)
        return rerr(c, at, CG_E_TOO_LARGE, "template evaluation exceeds %zu bytes of memory",
                    c->lim->max_memory);
    return RC_OK;
}

/* Charges k units of work; fails when the render crosses its step or memory bound. */
static int step(ctx *c, const node *at, uint64_t k)
{
    c->steps += k;
    if (c->steps > c->lim->max_steps)
        return rerr(c, at, CG_E_TOO_LARGE, "template evaluation exceeds %llu steps",
                    (unsigned long long)c->lim->max_steps);
    return check_memory(c, at);
}

static int work(ctx *c, const node *at, size_t bytes)
{
    return step(c, at, 1 + bytes / 64);
}

/* Appends to a buffer of the render, which no string or output may grow past max_output. */
static int cput(ctx *c, const node *at, sbuf *b, const void *p, size_t n)
{
    if (n > c->lim->max_output || b->len > c->lim->max_output - n)
        return rerr(c, at, CG_E_TOO_LARGE, "rendered text exceeds %zu bytes", c->lim->max_output);
    size_t cap = b->cap;
    sbuf_put(b, p, n);
    if (b->cap != cap) {
        c->buf_alloc += b->cap - cap;
        return check_memory(c, at);
    }
    return RC_OK;
}

static int cputs(ctx *c, const node *at, sbuf *b, const char *s)
{
    return cput(c, at, b, s, strlen(s));
}

static int str_val(ctx *c, const node *at, const char *p, size_t n, val *out)
{
    if (n > c->lim->max_output)
        return rerr(c, at, CG_E_TOO_LARGE, "a string exceeds %zu bytes", c->lim->max_output);
    TRY(work(c, at, n));
    *out = vstr(jstr_copy(&c->ar, p, n));
    return RC_OK;
}

/* Moves a built buffer into a string value and frees the buffer. */
static int sbuf_val(ctx *c, const node *at, sbuf *b, val *out)
{
    int r = str_val(c, at, b->p ? b->p : "", b->len, out);
    sbuf_free(b);
    return r;
}

/* Ends a string built in b: after an error r, frees it and returns r; else *out is the string. */
static int sbuf_done(ctx *c, const node *at, sbuf *b, int r, val *out)
{
    if (r) {
        sbuf_free(b);
        return r;
    }
    return sbuf_val(c, at, b, out);
}

static env *env_new(ctx *c, env *parent)
{
    env *e = arena_zalloc(&c->ar, sizeof(env));
    e->parent = parent;
    return e;
}

static void env_set(ctx *c, env *e, const jstr *name, val v)
{
    obj_set(&c->ar, &e->vars, name, v);
}

static bool env_own(const env *e, const jstr *name, val *out)
{
    return obj_get(&e->vars, name->p, name->len, out);
}

static val fn_val(ctx *c, int kind)
{
    jfunc *f = arena_zalloc(&c->ar, sizeof(jfunc));
    f->kind = (uint8_t)kind;
    return (val){.t = V_FUNC, .u.f = f};
}

/* Every scope of @huggingface/jinja holds its own 'namespace'; other names resolve outwards. */
static val env_lookup(ctx *c, const env *e, const jstr *name)
{
    val v;
    if (jstr_eqc(name, "namespace")) {
        if (env_own(e, name, &v)) return v;
        return fn_val(c, FN_NAMESPACE);
    }
    for (; e; e = e->parent)
        if (env_own(e, name, &v)) return v;
    return UNDEF;
}

static const jstr *cname(ctx *c, const char *s)
{
    return jstr_borrow(&c->ar, s, strlen(s));
}

/* ------------------------------------------------------------------------------------------ */
/* Case mapping (String.prototype.toUpperCase / toLowerCase)                                   */
/* ------------------------------------------------------------------------------------------ */

/* Unconditional multi-character upper-case mappings (Unicode SpecialCasing.txt). */
static const struct {
    uint32_t cp;
    uint32_t to[3];
} special_upper[] = {{0x00DF, {0x0053, 0x0053, 0x0000}}, {0x0149, {0x02BC, 0x004E, 0x0000}},
                     {0x01F0, {0x004A, 0x030C, 0x0000}}, {0x0390, {0x0399, 0x0308, 0x0301}},
                     {0x03B0, {0x03A5, 0x0308, 0x0301}}, {0x0587, {0x0535, 0x0552, 0x0000}},
                     {0x1E96, {0x0048, 0x0331, 0x0000}}, {0x1E97, {0x0054, 0x0308, 0x0000}},
                     {0x1E98, {0x0057, 0x030A, 0x0000}}, {0x1E99, {0x0059, 0x030A, 0x0000}},
                     {0x1E9A, {0x0041, 0x02BE, 0x0000}}, {0x1F50, {0x03A5, 0x0313, 0x0000}},
                     {0x1F52, {0x03A5, 0x0313, 0x0300}}, {0x1F54, {0x03A5, 0x0313, 0x0301}},
                     {0x1F56, {0x03A5, 0x0313, 0x0342}}, {0x1F80, {0x1F08, 0x0399, 0x0000}},
                     {0x1F81, {0x1F09, 0x0399, 0x0000}}, {0x1F82, {0x1F0A, 0x0399, 0x0000}},
                     {0x1F83, {0x1F0B, 0x0399, 0x0000}}, {0x1F84, {0x1F0C, 0x0399, 0x0000}},
                     {0x1F85, {0x1F0D, 0x0399, 0x0000}}, {0x1F86, {0x1F0E, 0x0399, 0x0000}},
                     {0x1F87, {0x1F0F, 0x0399, 0x0000}}, {0x1F88, {0x1F08, 0x0399, 0x0000}},
                     {0x1F89, {0x1F09, 0x0399, 0x0000}}, {0x1F8A, {0x1F0A, 0x0399, 0x0000}},
                     {0x1F8B, {0x1F0B, 0x0399, 0x0000}}, {0x1F8C, {0x1F0C, 0x0399, 0x0000}},
                     {0x1F8D, {0x1F0D, 0x0399, 0x0000}}, {0x1F8E, {0x1F0E, 0x0399, 0x0000}},
                     {0x1F8F, {0x1F0F, 0x0399, 0x0000}}, {0x1F90, {0x1F28, 0x0399, 0x0000}},
                     {0x1F91, {0x1F29, 0x0399, 0x0000}}, {0x1F92, {0x1F2A, 0x0399, 0x0000}},
                     {0x1F93, {0x1F2B, 0x0399, 0x0000}}, {0x1F94, {0x1F2C, 0x0399, 0x0000}},
                     {0x1F95, {0x1F2D, 0x0399, 0x0000}}, {0x1F96, {0x1F2E, 0x0399, 0x0000}},
                     {0x1F97, {0x1F2F, 0x0399, 0x0000}}, {0x1F98, {0x1F28, 0x0399, 0x0000}},
                     {0x1F99, {0x1F29, 0x0399, 0x0000}}, {0x1F9A, {0x1F2A, 0x0399, 0x0000}},
                     {0x1F9B, {0x1F2B, 0x0399, 0x0000}}, {0x1F9C, {0x1F2C, 0x0399, 0x0000}},
                     {0x1F9D, {0x1F2D, 0x0399, 0x0000}}, {0x1F9E, {0x1F2E, 0x0399, 0x0000}},
                     {0x1F9F, {0x1F2F, 0x0399, 0x0000}}, {0x1FA0, {0x1F68, 0x0399, 0x0000}},
                     {0x1FA1, {0x1F69, 0x0399, 0x0000}}, {0x1FA2, {0x1F6A, 0x0399, 0x0000}},
                     {0x1FA3, {0x1F6B, 0x0399, 0x0000}}, {0x1FA4, {0x1F6C, 0x0399, 0x0000}},
                     {0x1FA5, {0x1F6D, 0x0399, 0x0000}}, {0x1FA6, {0x1F6E, 0x0399, 0x0000}},
                     {0x1FA7, {0x1F6F, 0x0399, 0x0000}}, {0x1FA8, {0x1F68, 0x0399, 0x0000}},
                     {0x1FA9, {0x1F69, 0x0399, 0x0000}}, {0x1FAA, {0x1F6A, 0x0399, 0x0000}},
                     {0x1FAB, {0x1F6B, 0x0399, 0x0000}}, {0x1FAC, {0x1F6C, 0x0399, 0x0000}},
                     {0x1FAD, {0x1F6D, 0x0399, 0x0000}}, {0x1FAE, {0x1F6E, 0x0399, 0x0000}},
                     {0x1FAF, {0x1F6F, 0x0399, 0x0000}}, {0x1FB2, {0x1FBA, 0x0399, 0x0000}},
                     {0x1FB3, {0x0391, 0x0399, 0x0000}}, {0x1FB4, {0x0386, 0x0399, 0x0000}},
                     {0x1FB6, {0x0391, 0x0342, 0x0000}}, {0x1FB7, {0x0391, 0x0342, 0x0399}},
                     {0x1FBC, {0x0391, 0x0399, 0x0000}}, {0x1FC2, {0x1FCA, 0x0399, 0x0000}},
                     {0x1FC3, {0x0397, 0x0399, 0x0000}}, {0x1FC4, {0x0389, 0x0399, 0x0000}},
                     {0x1FC6, {0x0397, 0x0342, 0x0000}}, {0x1FC7, {0x0397, 0x0342, 0x0399}},
                     {0x1FCC, {0x0397, 0x0399, 0x0000}}, {0x1FD2, {0x0399, 0x0308, 0x0300}},
                     {0x1FD3, {0x0399, 0x0308, 0x0301}}, {0x1FD6, {0x0399, 0x0342, 0x0000}},
                     {0x1FD7, {0x0399, 0x0308, 0x0342}}, {0x1FE2, {0x03A5, 0x0308, 0x0300}},
                     {0x1FE3, {0x03A5, 0x0308, 0x0301}}, {0x1FE4, {0x03A1, 0x0313, 0x0000}},
                     {0x1FE6, {0x03A5, 0x0342, 0x0000}}, {0x1FE7, {0x03A5, 0x0308, 0x0342}},
                     {0x1FF2, {0x1FFA, 0x0399, 0x0000}}, {0x1FF3, {0x03A9, 0x0399, 0x0000}},
                     {0x1FF4, {0x038F, 0x0399, 0x0000}}, {0x1FF6, {0x03A9, 0x0342, 0x0000}},
                     {0x1FF7, {0x03A9, 0x0342, 0x0399}}, {0x1FFC, {0x03A9, 0x0399, 0x0000}},
                     {0xFB00, {0x0046, 0x0046, 0x0000}}, {0xFB01, {0x0046, 0x0049, 0x0000}},
                     {0xFB02, {0x0046, 0x004C, 0x0000}}, {0xFB03, {0x0046, 0x0046, 0x0049}},
                     {0xFB04, {0x0046, 0x0046, 0x004C}}, {0xFB05, {0x0053, 0x0054, 0x0000}},
                     {0xFB06, {0x0053, 0x0054, 0x0000}}, {0xFB13, {0x0544, 0x0546, 0x0000}},
                     {0xFB14, {0x0544, 0x0535, 0x0000}}, {0xFB15, {0x0544, 0x053B, 0x0000}},
                     {0xFB16, {0x054E, 0x0546, 0x0000}}, {0xFB17, {0x0544, 0x053D, 0x0000}}};

static const uint32_t *upper_special(uint32_t cp)
{
    size_t lo = 0, hi = CG_ARRAY_LEN(special_upper);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (special_upper[mid].cp == cp) return special_upper[mid].to;
        if (special_upper[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static bool cased(uint32_t cp)
{
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
           cat == UTF8PROC_CATEGORY_LT || utf8proc_toupper((utf8proc_int32_t)cp) != (int32_t)cp ||
           utf8proc_tolower((utf8proc_int32_t)cp) != (int32_t)cp;
}

static bool case_ignorable(uint32_t cp)
{
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_ME || cat == UTF8PROC_CATEGORY_CF ||
        cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_SK)
        return true;
    static const uint32_t mid[] = {0x27,   0x2E,   0x3A,   0xB7,   0x387,  0x5F4,  0x2018, 0x2019,
                                   0x2024, 0x2027, 0xFE13, 0xFE52, 0xFE55, 0xFF07, 0xFF0E, 0xFF1A};
    for (size_t i = 0; i < CG_ARRAY_LEN(mid); i++)
        if (mid[i] == cp) return true;
    return false;
}

/* Final_Sigma: a capital sigma after a cased letter and not before one lowers to U+03C2. */
static bool final_sigma(const unsigned char *p, size_t n, size_t at, size_t len)
{
    bool before = false;
    size_t i = at;
    while (i > 0) {
        size_t s = i - 1, l;
        while (s > 0 && (p[s] & 0xC0) == 0x80)
            s--;
        uint32_t cp = u8_decode(p + s, n - s, &l);
        i = s;
        if (case_ignorable(cp)) continue;
        before = cased(cp);
        break;
    }
    if (!before) return false;
    for (i = at + len; i < n;) {
        size_t l;
        uint32_t cp = u8_decode(p + i, n - i, &l);
        i += l;
        if (case_ignorable(cp)) continue;
        return !cased(cp);
    }
    return true;
}

/* Appends s upper-cased (upper) or lower-cased to b. */
static int case_map(ctx *c, const node *at, const jstr *s, bool upper, sbuf *b)
{
    TRY(work(c, at, s->len));
    const unsigned char *p = (const unsigned char *)s->p;
    char enc[12];
    for (size_t i = 0; i < s->len;) {
        if (p[i] < 0x80) {
            char ch = (char)p[i];
            if (upper && ch >= 'a' && ch <= 'z') ch = (char)(ch - 32);
            if (!upper && ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
            TRY(cput(c, at, b, &ch, 1));
            i++;
            continue;
        }
        size_t l, k = 0;
        uint32_t cp = u8_decode(p + i, s->len - i, &l);
        if (upper) {
            const uint32_t *sp = upper_special(cp);
            if (sp)
                for (int j = 0; j < 3 && sp[j]; j++)
                    k += u8_encode(sp[j], enc + k);
            else
                k = u8_encode((uint32_t)utf8proc_toupper((utf8proc_int32_t)cp), enc);
        } else if (cp == 0x130) {
            k = u8_encode('i', enc);
            k += u8_encode(0x307, enc + k);
        } else if (cp == 0x3A3 && final_sigma(p, s->len, i, l)) {
            k = u8_encode(0x3C2, enc);
        } else {
            k = u8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
        }
        TRY(cput(c, at, b, enc, k));
        i += l;
    }
    return RC_OK;
}

static int case_val(ctx *c, const node *at, const jstr *s, bool upper, val *out)
{
    if (s->ascii) {
        bool same = true;
        for (size_t i = 0; i < s->len && same; i++) {
            char ch = s->p[i];
            same = upper ? !(ch >= 'a' && ch <= 'z') : !(ch >= 'A' && ch <= 'Z');
        }
        if (same) {
            *out = vstr((jstr *)s);
            return RC_OK;
        }
    }
    sbuf b = {0};
    int r = case_map(c, at, s, upper, &b);
    return sbuf_done(c, at, &b, r, out);
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

/* JSON (borrowed) to a value, as JSON.parse and @huggingface/jinja's convertToRuntimeValues
 * would see it: integral numbers are integers, index-like keys come first. */
static int from_json(ctx *c, const json_t *j, val *out, unsigned depth)
{
    if (depth > c->lim->max_depth)
        return rerr(c, NULL, CG_E_TOO_LARGE, "variables nest deeper than %u", c->lim->max_depth);
    TRY(step(c, NULL, 1));
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
        *out = vstr(jstr_borrow(&c->ar, json_string_value(j), json_string_length(j)));
        return step(c, NULL, json_string_length(j) / 64);
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jarr *a = arr_new(&c->ar, n);
        for (size_t i = 0; i < n; i++)
            TRY(from_json(c, json_array_get(j, i), &a->v[i], depth + 1));
        *out = varr(a, 0);
        return RC_OK;
    }
    case JSON_OBJECT: {
        jobj *o = obj_new(&c->ar);
        size_t n = json_object_size(j), ni = 0;
        ikey *ik = n ? arena_alloc(&c->ar, n * sizeof(ikey)) : NULL;
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
            TRY(from_json(c, ik[i].val, &x, depth + 1));
            obj_set(&c->ar, o, jstr_borrow(&c->ar, ik[i].k, strlen(ik[i].k)), x);
        }
        json_object_foreach((json_t *)j, k, v)
        {
            double d;
            if (index_key(k, strlen(k), &d)) continue;
            val x;
            TRY(from_json(c, v, &x, depth + 1));
            obj_set(&c->ar, o, jstr_borrow(&c->ar, k, strlen(k)), x);
        }
        *out = vobj(o, 0);
        return RC_OK;
    }
    }
    return TERR(c, NULL, "unsupported JSON value");
}

typedef struct jopts {
    double indent; /* 0: none */
    bool ensure_ascii;
    bool sort_keys;
    const jstr *item_sep, *key_sep; /* NULL: the defaults */
} jopts;

/* JSON.stringify of a string, then @huggingface/jinja's ensure_ascii rewrite. */
static int json_str(ctx *c, const node *at, sbuf *b, const char *p, size_t n, bool ascii)
{
    TRY(work(c, at, n));
    TRY(cput(c, at, b, "\"", 1));
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)p[i];
        const char *esc = NULL;
        char tmp[16];
        size_t l = 1;
        if (ch == '"')
            esc = "\\\"";
        else if (ch == '\\')
            esc = "\\\\";
        else if (ch == '\b')
            esc = "\\b";
        else if (ch == '\f')
            esc = "\\f";
        else if (ch == '\n')
            esc = "\\n";
        else if (ch == '\r')
            esc = "\\r";
        else if (ch == '\t')
            esc = "\\t";
        else if (ch < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", ch);
            esc = tmp;
        } else if (ascii && ch >= 0x7F) {
            uint32_t cp = ch == 0x7F ? 0x7F : u8_decode((const unsigned char *)p + i, n - i, &l);
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
        TRY(cput(c, at, b, p + i - run, run));
        run = 0;
        TRY(cputs(c, at, b, esc));
        i += l;
    }
    TRY(cput(c, at, b, p + n - run, run));
    return cput(c, at, b, "\"", 1);
}

static int put_indent(ctx *c, const node *at, sbuf *b, double indent, int depth)
{
    TRY(cput(c, at, b, "\n", 1));
    for (int d = 0; d < depth; d++)
        for (double i = 0; i < indent; i++)
            TRY(cput(c, at, b, " ", 1));
    return RC_OK;
}

static int utf16_cmp(const jstr *a, const jstr *b);

/* Before item i of a list or mapping at depth: the separator after the item before (the
 * separators option, else ", ", or "," when indenting), then the new line's indent. */
static int json_item_start(ctx *c, const node *at, sbuf *b, const jopts *o, size_t i, int depth)
{
    if (i && o->item_sep)
        TRY(cput(c, at, b, o->item_sep->p, o->item_sep->len));
    else if (i)
        TRY(cputs(c, at, b, o->indent ? "," : ", "));
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
    size_t *ord = arena_alloc(&c->ar, ob->n * sizeof(size_t));
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

/* toJSON of @huggingface/jinja: tojson, and printing of lists, mappings and namespaces. */
static int to_json(ctx *c, const node *at, sbuf *b, val v, const jopts *o, int depth,
                   bool undef_null)
{
    char num[32];
    if ((unsigned)depth > c->lim->max_depth)
        return rerr(c, at, CG_E_TOO_LARGE, "value nests deeper than %u", c->lim->max_depth);
    TRY(step(c, at, 1));
    switch (v.t) {
    case V_NULL:
        return cputs(c, at, b, "null");
    case V_UNDEF:
        return cputs(c, at, b, undef_null ? "null" : "undefined");
    case V_BOOL:
        return cputs(c, at, b, v.u.b ? "true" : "false");
    case V_INT:
    case V_FLOAT:
        if (!isfinite(v.u.n)) return cputs(c, at, b, "null");
        js_num(v.u.n, num);
        return cputs(c, at, b, num);
    case V_STR:
        return json_str(c, at, b, v.u.s->p, v.u.s->len, o->ensure_ascii);
    case V_ARR:
        if (v.sub == SUB_TUPLE) break;
        TRY(cput(c, at, b, "[", 1));
        for (size_t i = 0; i < v.u.a->n; i++) {
            TRY(json_item_start(c, at, b, o, i, depth));
            TRY(to_json(c, at, b, v.u.a->v[i], o, depth + 1, undef_null));
        }
        if (o->indent && v.u.a->n) TRY(put_indent(c, at, b, o->indent, depth));
        return cput(c, at, b, "]", 1);
    case V_OBJ:
    case V_NS: {
        if (v.t == V_OBJ && v.sub == SUB_KWARGS) break;
        const jobj *ob = v.u.o;
        size_t *order = NULL;
        if (o->sort_keys && ob->n > 1) TRY(json_key_order(c, at, ob, &order));
        TRY(cput(c, at, b, "{", 1));
        for (size_t i = 0; i < ob->n; i++) {
            size_t e = order ? order[i] : i;
            TRY(json_item_start(c, at, b, o, i, depth));
            TRY(json_str(c, at, b, ob->k[e]->p, ob->k[e]->len, o->ensure_ascii));
            if (o->key_sep)
                TRY(cput(c, at, b, o->key_sep->p, o->key_sep->len));
            else
                TRY(cputs(c, at, b, ": "));
            TRY(to_json(c, at, b, ob->v[e], o, depth + 1, undef_null));
        }
        if (o->indent && ob->n) TRY(put_indent(c, at, b, o->indent, depth));
        return cput(c, at, b, "}", 1);
    }
    default:
        break;
    }
    return TERR(c, at, "cannot convert to JSON: %s", type_name(v));
}

static const jopts JSON_DEFAULT = {0};

/* RuntimeValue.toString(): how {{ v }} prints a value. */
static int emit(ctx *c, const node *at, sbuf *b, val v)
{
    char num[40];
    switch (v.t) {
    case V_UNDEF:
        return cputs(c, at, b, "undefined");
    case V_NULL:
        return cputs(c, at, b, "null");
    case V_BOOL:
        return cputs(c, at, b, v.u.b ? "true" : "false");
    case V_INT:
        js_num(v.u.n, num);
        return cputs(c, at, b, num);
    case V_FLOAT:
        js_float_str(v.u.n, num, sizeof num);
        return cputs(c, at, b, num);
    case V_STR:
        TRY(work(c, at, v.u.s->len));
        return cput(c, at, b, v.u.s->p, v.u.s->len);
    case V_ARR:
    case V_OBJ:
    case V_NS:
        return to_json(c, at, b, v, &JSON_DEFAULT, 0, false);
    default:
        return TERR(c, at, "cannot print a function");
    }
}

/* String(v.value): how '+' and '~' and join see a value (lists join with ',', mappings are
 * "[object Map]"). */
static int raw_str(ctx *c, const node *at, sbuf *b, val v, unsigned depth)
{
    char num[32];
    if (depth > c->lim->max_depth)
        return rerr(c, at, CG_E_TOO_LARGE, "value nests deeper than %u", c->lim->max_depth);
    switch (v.t) {
    case V_INT:
    case V_FLOAT:
        js_num(v.u.n, num);
        return cputs(c, at, b, num);
    case V_ARR:
        for (size_t i = 0; i < v.u.a->n; i++) {
            if (i) TRY(cput(c, at, b, ",", 1));
            TRY(emit(c, at, b, v.u.a->v[i]));
        }
        return RC_OK;
    case V_OBJ:
    case V_NS:
        return cputs(c, at, b, "[object Map]");
    case V_FUNC:
        return TERR(c, at, "cannot convert a function to a string");
    default:
        return emit(c, at, b, v);
    }
}

/* __bool__ of @huggingface/jinja (Python-like: empty lists and mappings are false). */
static bool truthy(val v)
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

/* !!v.value: JavaScript truthiness of the underlying value (objects are always true). */
static bool raw_truthy(val v)
{
    if (v.t == V_ARR || v.t == V_OBJ) return true;
    return truthy(v);
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

/* ===: same type and value; objects by identity; integers and floats are both numbers. */
static bool strict_eq(val a, val b)
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

/* SameValueZero, the equality of Set (NaN equals itself). */
static bool same_value_zero(val a, val b)
{
    if (is_num(a) && is_num(b) && isnan(a.u.n) && isnan(b.u.n)) return true;
    return strict_eq(a, b);
}

/* JavaScript's == on the underlying values (IsLooselyEqual). */
static int loose_eq(ctx *c, const node *at, val a, val b, bool *res)
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
            *res = strict_eq(a, b);
            return RC_OK;
        }
        if (anil || bnil) {
            *res = anil && bnil;
            return RC_OK;
        }
        if (an && b.t == V_STR) {
            *res = a.u.n == js_str_to_num(b.u.s->p, b.u.s->len);
            return RC_OK;
        }
        if (a.t == V_STR && bn) {
            *res = js_str_to_num(a.u.s->p, a.u.s->len) == b.u.n;
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
        int r = raw_str(c, at, &s, *obj, 0);
        if (!r) r = sbuf_val(c, at, &s, obj);
        sbuf_free(&s);
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
    uint32_t cp = u8_decode((const unsigned char *)s->p + *i, s->len - *i, &l);
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
    TRY(step(c, at, 1));
    if (a.t == V_NULL && b.t == V_NULL) return *res = 0, RC_OK;
    if (a.t == V_NULL || b.t == V_NULL || a.t == V_UNDEF || b.t == V_UNDEF) {
        if (a.t == V_UNDEF && b.t == V_UNDEF) return *res = 0, RC_OK;
        return TERR(c, at, "cannot compare %s with %s", type_name(a), type_name(b));
    }
    bool an = is_num(a) || a.t == V_BOOL, bn = is_num(b) || b.t == V_BOOL;
    if (an && bn) {
        double x = a.t == V_BOOL ? a.u.b : a.u.n, y = b.t == V_BOOL ? b.u.b : b.u.n;
        *res = x < y ? -1 : x > y ? 1 : 0;
        return RC_OK;
    }
    if (strcmp(type_name(a), type_name(b)) != 0)
        return TERR(c, at, "cannot compare different types: %s and %s", type_name(a), type_name(b));
    if (a.t != V_STR) return TERR(c, at, "cannot compare type: %s", type_name(a));
    if (case_sensitive) {
        *res = utf16_cmp(a.u.s, b.u.s);
        return RC_OK;
    }
    val la, lb;
    TRY(case_val(c, at, a.u.s, false, &la));
    TRY(case_val(c, at, b.u.s, false, &lb));
    *res = utf16_cmp(la.u.s, lb.u.s);
    return RC_OK;
}

typedef struct sortctx {
    ctx *c;
    const node *at;
    bool case_sensitive, reverse;
    const jstr *attr; /* sort by this attribute path, NULL: the items themselves */
} sortctx;

static val attr_path(ctx *c, val item, const jstr *path);

static int sort_cmp(sortctx *s, val a, val b, int *res)
{
    if (s->attr) {
        a = attr_path(s->c, a, s->attr);
        b = attr_path(s->c, b, s->attr);
    }
    TRY(compare_values(s->c, s->at, a, b, s->case_sensitive, res));
    if (s->reverse) *res = -*res;
    return RC_OK;
}

/* Stable merge sort (Array.prototype.sort is stable) whose comparison may fail. */
static int merge_sort(sortctx *s, val *v, size_t n)
{
    if (n < 2) return RC_OK;
    val *tmp = arena_alloc(&s->c->ar, n * sizeof(val));
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

/* getAttributeValue: a dotted path through mappings, namespaces and list indices. */
static val attr_path(ctx *c, val item, const jstr *path)
{
    (void)c;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < path->len && path->p[j] != '.')
            j++;
        if (is_container(item)) {
            if (!obj_get(item.u.o, path->p + i, j - i, &item)) return UNDEF;
        } else if (item.t == V_ARR) {
            double idx = js_parse_int(path->p + i, j - i);
            if (isnan(idx) || idx < 0 || idx >= (double)item.u.a->n) return UNDEF;
            item = item.u.a->v[(size_t)idx];
        } else {
            return UNDEF;
        }
        if (j >= path->len) return item;
        i = j + 1;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Strings: JavaScript String methods as @huggingface/jinja uses them                          */
/* ------------------------------------------------------------------------------------------ */

static double jmin(double a, double b)
{
    return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
}

static double jmax(double a, double b)
{
    return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
}

/* utils.slice of @huggingface/jinja: the indices a[start:stop:step] picks from len items. */
typedef struct slicer {
    double i, stop, step;
    int dir;
} slicer;

static slicer slice_begin(double len, const val *start, const val *stop, const val *stepv)
{
    slicer s;
    s.step = stepv->t == V_UNDEF ? 1 : stepv->u.n;
    s.dir = isnan(s.step) ? -2 : s.step > 0 ? 1 : s.step < 0 ? -1 : 0;
    double a, b;
    if (s.dir >= 0) {
        a = start->t == V_UNDEF ? 0 : start->u.n;
        a = a < 0 ? jmax(len + a, 0) : jmin(a, len);
        b = stop->t == V_UNDEF ? len : stop->u.n;
        b = b < 0 ? jmax(len + b, 0) : jmin(b, len);
    } else {
        a = start->t == V_UNDEF ? len - 1 : start->u.n;
        a = a < 0 ? jmax(len + a, -1) : jmin(a, len - 1);
        b = stop->t == V_UNDEF ? -1 : stop->u.n;
        b = b < -1 ? jmax(len + b, -1) : jmin(b, len - 1);
    }
    s.i = a;
    s.stop = b;
    if (s.dir == -2) s.dir = 0; /* NaN step: Math.sign(NaN) compares false, nothing is picked */
    return s;
}

static bool slice_next(slicer *s, size_t *idx)
{
    if (s->dir == 0 || !(s->dir * s->i < s->dir * s->stop)) return false;
    *idx = (size_t)s->i;
    s->i += s->step;
    return true;
}

/* Byte offsets of the code points of s (n + 1 entries). */
static size_t *cp_offsets(ctx *c, const jstr *s, size_t *n)
{
    size_t *off = arena_alloc(&c->ar, (s->len + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < s->len;) {
        size_t l;
        off[k++] = i;
        u8_decode((const unsigned char *)s->p + i, s->len - i, &l);
        i += l;
    }
    off[k] = s->len;
    *n = k;
    return off;
}

/* s[i]: JavaScript's String.prototype.at (UTF-16 units; half a surrogate pair prints as
 * U+FFFD). */
static int str_at(ctx *c, const node *at, const jstr *s, double i, val *out)
{
    TRY(work(c, at, s->len));
    if (isnan(i)) i = 0;
    double len = (double)s->u16, k = i >= 0 ? i : len + i;
    if (k < 0 || k >= len) {
        *out = UNDEF;
        return RC_OK;
    }
    size_t target = (size_t)k;
    if (s->ascii) return str_val(c, at, s->p + target, 1, out);
    size_t u = 0;
    for (size_t b = 0; b < s->len;) {
        size_t l;
        uint32_t cp = u8_decode((const unsigned char *)s->p + b, s->len - b, &l);
        size_t w = cp >= 0x10000 ? 2 : 1;
        if (target < u + w) {
            if (w == 2) return str_val(c, at, "\xEF\xBF\xBD", 3, out);
            return str_val(c, at, s->p + b, l, out);
        }
        u += w;
        b += l;
    }
    *out = UNDEF;
    return RC_OK;
}

static val substr(ctx *c, const jstr *s, size_t from, size_t to)
{
    return vstr(jstr_borrow(&c->ar, s->p + from, to - from));
}

/* trim / trimStart / trimEnd with JavaScript's whitespace. */
static val str_trim(ctx *c, const jstr *s, bool left, bool right)
{
    size_t a = 0, b = s->len, l;
    if (left)
        while (a < b && (l = js_space_at(s->p + a, b - a)))
            a += l;
    if (right)
        while (b > a && (l = js_space_before(s->p + a, b - a)))
            b -= l;
    if (a == 0 && b == s->len) return vstr((jstr *)s);
    return substr(c, s, a, b);
}

/* titleCase: /\b\w/g upper-cased; \w and \b are ASCII-only. */
static int str_title(ctx *c, const node *at, const jstr *s, val *out)
{
    TRY(work(c, at, s->len));
    char *d = arena_alloc(&c->ar, s->len + 1);
    memcpy(d, s->p, s->len);
    d[s->len] = 0;
    for (size_t i = 0; i < s->len; i++)
        if (is_word((unsigned char)d[i]) && (i == 0 || !is_word((unsigned char)s->p[i - 1])) &&
            d[i] >= 'a' && d[i] <= 'z')
            d[i] = (char)(d[i] - 32);
    *out = vstr(jstr_borrow(&c->ar, d, s->len));
    return RC_OK;
}

/* charAt(0).toUpperCase() + slice(1): only the first UTF-16 unit changes. */
static int str_capitalize(ctx *c, const node *at, const jstr *s, val *out)
{
    if (s->len == 0) {
        *out = vstr((jstr *)s);
        return RC_OK;
    }
    size_t l;
    uint32_t cp = u8_decode((const unsigned char *)s->p, s->len, &l);
    if (cp >= 0x10000) {
        *out = vstr((jstr *)s);
        return RC_OK;
    }
    jstr first = {.p = s->p, .len = l};
    jstr_measure(&first);
    sbuf b = {0};
    int r = case_map(c, at, &first, true, &b);
    if (!r) r = cput(c, at, &b, s->p + l, s->len - l);
    return sbuf_done(c, at, &b, r, out);
}

static bool has_prefix(const jstr *s, const jstr *p, bool suffix)
{
    if (p->len > s->len) return false;
    const char *from = suffix ? s->p + s->len - p->len : s->p;
    return p->len == 0 || memcmp(from, p->p, p->len) == 0;
}

static const char *memfind(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

/* Python-style str.split(sep=None, maxsplit=-1) as @huggingface/jinja implements it. */
static int str_split(ctx *c, const node *at, const jstr *s, val sep, val maxsplit, val *out)
{
    TRY(work(c, at, s->len));
    if (sep.t != V_STR && sep.t != V_NULL)
        return TERR(c, at, "sep argument must be a string or null");
    if (maxsplit.t != V_INT) return TERR(c, at, "maxsplit argument must be a number");
    double m = maxsplit.u.n;
    size_t n = 0, cap = 8;
    val *parts = arena_alloc(&c->ar, cap * sizeof(val));
#define PUSH_PART(v)                                                                               \
    do {                                                                                           \
        if (n == cap) {                                                                            \
            val *np_ = arena_alloc(&c->ar, cap * 2 * sizeof(val));                                 \
            memcpy(np_, parts, n * sizeof(val));                                                   \
            parts = np_;                                                                           \
            cap *= 2;                                                                              \
        }                                                                                          \
        parts[n++] = (v);                                                                          \
    } while (0)
    if (sep.t == V_NULL) {
        val t = str_trim(c, s, true, false);
        const jstr *ts = t.u.s;
        size_t i = 0, l;
        for (;;) {
            while (i < ts->len && (l = js_space_at(ts->p + i, ts->len - i)))
                i += l;
            if (i >= ts->len) break;
            size_t j = i;
            while (j < ts->len && !js_space_at(ts->p + j, ts->len - j)) {
                u8_decode((const unsigned char *)ts->p + j, ts->len - j, &l);
                j += l;
            }
            if (m != -1 && (double)n >= m) {
                PUSH_PART(substr(c, ts, i, ts->len));
                break;
            }
            PUSH_PART(substr(c, ts, i, j));
            i = j;
        }
    } else {
        const jstr *sp = sep.u.s;
        if (sp->len == 0) return TERR(c, at, "empty separator");
        size_t i = 0;
        for (;;) {
            const char *f = memfind(s->p + i, s->len - i, sp->p, sp->len);
            if (!f) {
                PUSH_PART(substr(c, s, i, s->len));
                break;
            }
            size_t j = (size_t)(f - s->p);
            PUSH_PART(substr(c, s, i, j));
            i = j + sp->len;
        }
        if (m != -1 && (double)n > m) {
            /* result.push(result.splice(m).join(sep)) */
            double from = m < 0 ? jmax((double)n + m, 0) : m;
            size_t k = (size_t)from;
            sbuf b = {0};
            for (size_t q = k; q < n; q++) {
                int r = q > k ? cput(c, at, &b, sp->p, sp->len) : RC_OK;
                if (!r) r = cput(c, at, &b, parts[q].u.s->p, parts[q].u.s->len);
                if (r) {
                    sbuf_free(&b);
                    return r;
                }
            }
            val joined;
            TRY(sbuf_val(c, at, &b, &joined));
            n = k;
            PUSH_PART(joined);
        }
    }
#undef PUSH_PART
    jarr *a = arr_new(&c->ar, 0);
    a->n = n;
    a->v = parts;
    *out = varr(a, 0);
    return RC_OK;
}

/* utils.replace: count < 0 or null replaces all; an empty needle matches between code points. */
static int str_replace(ctx *c, const node *at, const jstr *s, const jstr *from, const jstr *to,
                       val count, val *out)
{
    TRY(work(c, at, s->len));
    if (count.t == V_INT && count.u.n == 0) {
        *out = vstr((jstr *)s);
        return RC_OK;
    }
    double remaining = (count.t != V_INT || count.u.n < 0) ? INFINITY : count.u.n;
    sbuf b = {0};
    int r = RC_OK;
    if (from->len == 0) {
        for (size_t i = 0; !r;) {
            if (remaining > 0) {
                remaining--;
                r = cput(c, at, &b, to->p, to->len);
            }
            if (r || i >= s->len) break;
            size_t l;
            u8_decode((const unsigned char *)s->p + i, s->len - i, &l);
            r = cput(c, at, &b, s->p + i, l);
            i += l;
        }
    } else {
        size_t i = 0;
        while (!r && i <= s->len) {
            const char *f =
                remaining > 0 ? memfind(s->p + i, s->len - i, from->p, from->len) : NULL;
            if (!f) {
                r = cput(c, at, &b, s->p + i, s->len - i);
                break;
            }
            size_t j = (size_t)(f - s->p);
            r = cput(c, at, &b, s->p + i, j - i);
            if (!r) r = cput(c, at, &b, to->p, to->len);
            remaining--;
            i = j + from->len;
            if (!r) r = step(c, at, 1);
        }
    }
    return sbuf_done(c, at, &b, r, out);
}

/* The indent filter: every line but (unless first) the first and (unless blank) empty ones. */
static int str_indent(ctx *c, const node *at, const jstr *s, double width, bool first, bool blank,
                      val *out)
{
    if (width < 0) return TERR(c, at, "invalid count value: %g", width);
    if (width > TPL_MAX_INDENT) return TERR(c, at, "indent width over %d", TPL_MAX_INDENT);
    TRY(work(c, at, s->len));
    sbuf b = {0};
    int r = RC_OK;
    size_t i = 0, line = 0;
    for (;;) {
        const char *nl = memchr(s->p + i, '\n', s->len - i);
        size_t j = nl ? (size_t)(nl - s->p) : s->len;
        bool keep = (!first && line == 0) || (!blank && j == i);
        if (!keep)
            for (double w = 0; w < width && !r; w++)
                r = cput(c, at, &b, " ", 1);
        if (!r) r = cput(c, at, &b, s->p + i, j - i);
        if (r || !nl) break;
        r = cput(c, at, &b, "\n", 1);
        i = j + 1;
        line++;
    }
    return sbuf_done(c, at, &b, r, out);
}

/* Concatenation of two strings (no copy when one side is empty). */
static int str_concat(ctx *c, const node *at, const jstr *a, const jstr *b, val *out)
{
    if (a->len == 0) return *out = vstr((jstr *)b), RC_OK;
    if (b->len == 0) return *out = vstr((jstr *)a), RC_OK;
    if (a->len + b->len > c->lim->max_output)
        return rerr(c, at, CG_E_TOO_LARGE, "a string exceeds %zu bytes", c->lim->max_output);
    TRY(work(c, at, a->len + b->len));
    char *d = arena_alloc(&c->ar, a->len + b->len + 1);
    memcpy(d, a->p, a->len);
    memcpy(d + a->len, b->p, b->len);
    d[a->len + b->len] = 0;
    jstr *s = arena_alloc(&c->ar, sizeof(jstr));
    s->p = d;
    s->len = a->len + b->len;
    s->u16 = a->u16 + b->u16;
    s->ascii = a->ascii && b->ascii;
    *out = vstr(s);
    return RC_OK;
}

/* String(v) as a string value. */
static int raw_val(ctx *c, const node *at, val v, val *out)
{
    if (v.t == V_STR) return *out = v, RC_OK;
    sbuf b = {0};
    int r = raw_str(c, at, &b, v, 0);
    return sbuf_done(c, at, &b, r, out);
}

/* ------------------------------------------------------------------------------------------ */
/* Evaluator                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static int eval(ctx *c, env *e, const node *x, val *out);
static int exec_list(ctx *c, env *e, const nodelist *l);
static int call_value(ctx *c, env *e, const node *at, val fn, val *args, size_t n, val *out);

static int enter_depth(ctx *c, const node *at)
{
    if (++c->depth > c->lim->max_depth)
        return rerr(c, at, CG_E_TOO_LARGE, "template evaluation nests deeper than %u",
                    c->lim->max_depth);
    return RC_OK;
}

/* Runs a block into a fresh buffer and returns what it printed as a string. */
static int capture(ctx *c, env *e, const node *at, const nodelist *body, val *out)
{
    sbuf b = {0}, *saved = c->out;
    c->out = &b;
    int r = exec_list(c, e, body);
    c->out = saved;
    return sbuf_done(c, at, &b, r, out);
}

static val kwargs_val(ctx *c, jobj *kw)
{
    (void)c;
    return vobj(kw, SUB_KWARGS);
}

/* evaluateArguments: positional values (with *spread) and keyword values (with **spread). */
static int eval_args(ctx *c, env *e, const nodelist *args, val **pos, size_t *npos, jobj **kw)
{
    size_t cap = args->n + 1, n = 0;
    val *p = arena_alloc(&c->ar, cap * sizeof(val));
    for (size_t i = 0; i < args->n; i++) {
        const node *a = args->v[i];
        if (a->kind == N_KWARG || a->kind == N_KWSPREAD) continue;
        val v;
        TRY(eval(c, e, a->kind == N_SPREAD ? a->a : a, &v));
        if (a->kind != N_SPREAD) {
            p[n++] = v;
            continue;
        }
        if (v.t != V_ARR) return TERR(c, a, "cannot unpack non-iterable type: %s", type_name(v));
        if (n + v.u.a->n + args->n >= cap) {
            size_t ncap = n + v.u.a->n + args->n + 1;
            val *np = arena_alloc(&c->ar, ncap * sizeof(val));
            memcpy(np, p, n * sizeof(val));
            p = np;
            cap = ncap;
        }
        for (size_t k = 0; k < v.u.a->n; k++)
            p[n++] = v.u.a->v[k];
    }
    jobj *o = obj_new(&c->ar);
    for (size_t i = 0; i < args->n; i++) {
        const node *a = args->v[i];
        if (a->kind == N_KWARG) {
            if (obj_find(o, a->s->p, a->s->len) >= 0)
                return TERR(c, a, "got multiple values for keyword argument '%.*s'", (int)a->s->len,
                            a->s->p);
            val v;
            TRY(eval(c, e, a->a, &v));
            obj_set(&c->ar, o, a->s, v);
        } else if (a->kind == N_KWSPREAD) {
            val v;
            TRY(eval(c, e, a->a, &v));
            if (v.t != V_OBJ)
                return TERR(c, a, "argument after ** must be a mapping, not %s", type_name(v));
            for (size_t k = 0; k < v.u.o->n; k++) {
                if (obj_find(o, v.u.o->k[k]->p, v.u.o->k[k]->len) >= 0)
                    return TERR(c, a, "got multiple values for keyword argument '%.*s'",
                                (int)v.u.o->k[k]->len, v.u.o->k[k]->p);
                obj_set(&c->ar, o, v.u.o->k[k], v.u.o->v[k]);
            }
        }
    }
    *pos = p;
    *npos = n;
    *kw = o;
    return RC_OK;
}

static bool kw_get(const jobj *kw, const char *name, val *out)
{
    return obj_get(kw, name, strlen(name), out);
}

/* args.at(i) ?? kwargs.get(name) ?? fallback */
static val arg_or(const val *pos, size_t n, size_t i, const jobj *kw, const char *name,
                  val fallback)
{
    if (i < n) return pos[i];
    val v;
    if (kw && name && kw_get(kw, name, &v)) return v;
    return fallback;
}

/* ---- tests ---- */

static int run_test(ctx *c, const node *at, int test, val v, const val *arg, bool *res)
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
        if (v.t != V_INT) return TERR(c, at, "cannot %s on %s", test_names[test], type_name(v));
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
        TRY(case_val(c, at, v.u.s, test == T_upper, &m));
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
        if (!arg) return TERR(c, at, "the %s test needs a value to compare with", test_names[test]);
        /* a.value === b.value */
        *res = strict_eq(v, *arg);
        break;
    default:
        return TERR(c, at, "unknown test");
    }
    return RC_OK;
}

/* ---- methods of strings and mappings ---- */

static int method_call(ctx *c, env *e, const node *at, const jfunc *f, val *args, size_t n,
                       val *out);

static int obj_items(ctx *c, const jobj *o, int which, val *out) /* 0 items, 1 keys, 2 values */
{
    jarr *a = arr_new(&c->ar, o->n);
    for (size_t i = 0; i < o->n; i++) {
        val k = vstr((jstr *)o->k[i]);
        if (which == 1)
            a->v[i] = k;
        else if (which == 2)
            a->v[i] = o->v[i];
        else {
            jarr *pair = arr_new(&c->ar, 2);
            pair->v[0] = k;
            pair->v[1] = o->v[i];
            a->v[i] = varr(pair, 0);
        }
    }
    *out = varr(a, 0);
    return step(c, NULL, o->n);
}

static int method_call(ctx *c, env *e, const node *at, const jfunc *f, val *args, size_t n,
                       val *out)
{
    (void)e;
    val self = f->self;
    if (f->method >= M_FIRST_MAPPING) {
        const jobj *o = self.u.o;
        switch (f->method) {
        case M_get: {
            val key = n > 0 ? args[0] : UNDEF;
            if (key.t != V_STR)
                return TERR(c, at, "object key must be a string: got %s", type_name(key));
            if (!obj_get(o, key.u.s->p, key.u.s->len, out)) *out = n > 1 ? args[1] : VNULL;
            return RC_OK;
        }
        case M_items:
            return obj_items(c, o, 0, out);
        case M_keys:
            return obj_items(c, o, 1, out);
        case M_values:
            return obj_items(c, o, 2, out);
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
            val cs = arg_or(pos, np, 0, kw, "case_sensitive", vbool(false));
            if (cs.t != V_BOOL) return TERR(c, at, "case_sensitive must be a boolean");
            static jstr KEY = {"key", 3, 3, true};
            val by = arg_or(pos, np, 1, kw, "by", vstr(&KEY));
            if (by.t != V_STR) return TERR(c, at, "by must be a string");
            bool by_value = jstr_eqc(by.u.s, "value");
            if (!by_value && !jstr_eqc(by.u.s, "key"))
                return TERR(c, at, "by must be either 'key' or 'value'");
            val rev = arg_or(pos, np, 2, kw, "reverse", vbool(false));
            if (rev.t != V_BOOL) return TERR(c, at, "reverse must be a boolean");
            val items;
            TRY(obj_items(c, o, 0, &items));
            static jstr IDX0 = {"0", 1, 1, true}, IDX1 = {"1", 1, 1, true};
            sortctx s = {c, at, cs.u.b, rev.u.b, by_value ? &IDX1 : &IDX0};
            TRY(merge_sort(&s, items.u.a->v, items.u.a->n));
            *out = items;
            return RC_OK;
        }
        }
        return TERR(c, at, "unknown method");
    }
    const jstr *s = self.u.s;
    switch (f->method) {
    case M_upper:
        return case_val(c, at, s, true, out);
    case M_lower:
        return case_val(c, at, s, false, out);
    case M_strip:
        *out = str_trim(c, s, true, true);
        return work(c, at, s->len);
    case M_lstrip:
        *out = str_trim(c, s, true, false);
        return work(c, at, s->len);
    case M_rstrip:
        *out = str_trim(c, s, false, true);
        return work(c, at, s->len);
    case M_title:
        return str_title(c, at, s, out);
    case M_capitalize:
        return str_capitalize(c, at, s, out);
    case M_startswith:
    case M_endswith: {
        const char *name = f->method == M_startswith ? "startswith" : "endswith";
        bool suffix = f->method == M_endswith;
        if (n == 0) return TERR(c, at, "%s() requires at least one argument", name);
        val p = args[0];
        if (p.t == V_STR) {
            *out = vbool(has_prefix(s, p.u.s, suffix));
            return RC_OK;
        }
        if (p.t == V_ARR) {
            for (size_t i = 0; i < p.u.a->n; i++) {
                if (p.u.a->v[i].t != V_STR)
                    return TERR(c, at, "%s() tuple elements must be strings", name);
                if (has_prefix(s, p.u.a->v[i].u.s, suffix)) {
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
        return str_split(c, at, s, n > 0 ? args[0] : VNULL, n > 1 ? args[1] : vint(-1), out);
    case M_replace: {
        if (n < 2) return TERR(c, at, "replace() requires at least two arguments");
        if (args[0].t != V_STR || args[1].t != V_STR)
            return TERR(c, at, "replace() arguments must be strings");
        val count = VNULL;
        if (n > 2) {
            if (args[2].t == V_OBJ && args[2].sub == SUB_KWARGS) {
                if (!kw_get(args[2].u.o, "count", &count)) count = VNULL;
            } else {
                count = args[2];
            }
        }
        if (count.t != V_INT && count.t != V_NULL)
            return TERR(c, at, "replace() count argument must be a number or null");
        return str_replace(c, at, s, args[0].u.s, args[1].u.s, count, out);
    }
    }
    return TERR(c, at, "unknown method");
}

static val method_val(ctx *c, val self, int method)
{
    val f = fn_val(c, FN_METHOD);
    f.u.f->method = (uint8_t)method;
    f.u.f->self = self;
    return f;
}

static int method_index(const jstr *name, int first, int last)
{
    for (int i = first; i < last; i++)
        if (jstr_eqc(name, method_names[i])) return i;
    return -1;
}

/* Property access (MemberExpression): mapping keys, then a mapping's methods; list and string
 * indices; a string's methods and length. Anything else is undefined. */
static int member_get(ctx *c, const node *at, val obj, val prop, val *out)
{
    if (is_container(obj)) {
        if (prop.t != V_STR)
            return TERR(c, at, "cannot access property with non-string: got %s", type_name(prop));
        if (obj_get(obj.u.o, prop.u.s->p, prop.u.s->len, out)) return RC_OK;
        int m = obj.t == V_OBJ ? method_index(prop.u.s, M_FIRST_MAPPING, M_COUNT) : -1;
        *out = m >= 0 ? method_val(c, obj, m) : UNDEF;
        return RC_OK;
    }
    if (obj.t == V_ARR || obj.t == V_STR) {
        if (prop.t == V_INT) {
            if (obj.t == V_STR) return str_at(c, at, obj.u.s, prop.u.n, out);
            double i = isnan(prop.u.n) ? 0 : prop.u.n, len = (double)obj.u.a->n;
            double k = i >= 0 ? i : len + i;
            *out = (k < 0 || k >= len) ? UNDEF : obj.u.a->v[(size_t)k];
            return RC_OK;
        }
        if (prop.t != V_STR)
            return TERR(c, at, "cannot access property with non-string/non-number: got %s",
                        type_name(prop));
        if (jstr_eqc(prop.u.s, "length")) {
            *out = vint(obj.t == V_STR ? (double)obj.u.s->u16 : (double)obj.u.a->n);
            return RC_OK;
        }
        int m = obj.t == V_STR ? method_index(prop.u.s, 0, M_FIRST_MAPPING) : -1;
        *out = m >= 0 ? method_val(c, obj, m) : UNDEF;
        return RC_OK;
    }
    if (prop.t != V_STR)
        return TERR(c, at, "cannot access property with non-string: got %s", type_name(prop));
    *out = UNDEF;
    return RC_OK;
}

/* ---- filters ---- */

static int join_vals(ctx *c, const node *at, const jarr *a, const jstr *sep, val *out)
{
    sbuf b = {0};
    int r = RC_OK;
    for (size_t i = 0; i < a->n && !r; i++) {
        if (i && sep) r = cput(c, at, &b, sep->p, sep->len);
        val v = a->v[i];
        if (!r && v.t != V_UNDEF && v.t != V_NULL) r = raw_str(c, at, &b, v, 0);
    }
    return sbuf_done(c, at, &b, r, out);
}

static int tojson_val(ctx *c, const node *at, val v, const jopts *o, val *out)
{
    sbuf b = {0};
    int r = to_json(c, at, &b, v, o, 0, true);
    return sbuf_done(c, at, &b, r, out);
}

static int num_from_str(const jstr *s, bool as_int, double *v)
{
    *v = as_int ? js_parse_int(s->p, s->len) : js_parse_float(s->p, s->len);
    return !isnan(*v);
}

/* A sorted copy of a, by s's order (a stays as it is). */
static int sorted_copy(ctx *c, const jarr *a, sortctx s, val *out)
{
    jarr *r = arr_new(&c->ar, a->n);
    if (a->n) memcpy(r->v, a->v, a->n * sizeof(val));
    TRY(merge_sort(&s, r->v, r->n));
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
        jarr *r = arr_new(&c->ar, a->n);
        for (size_t i = 0; i < a->n; i++)
            r->v[i] = a->v[a->n - 1 - i];
        *out = varr(r, 0);
        return step(c, f, a->n);
    }
    case F_sort:
        return sorted_copy(c, a, (sortctx){c, f, false, false, NULL}, out);
    case F_join:
        return join_vals(c, f, a, NULL, out);
    case F_string: {
        sbuf b = {0};
        int r = to_json(c, f, &b, v, &JSON_DEFAULT, 0, false);
        return sbuf_done(c, f, &b, r, out);
    }
    case F_unique: {
        jarr *r = arr_new(&c->ar, a->n);
        r->n = 0;
        TRY(step(c, f, (uint64_t)a->n * a->n / 2));
        for (size_t i = 0; i < a->n; i++) {
            bool seen = false;
            for (size_t k = 0; k < r->n && !seen; k++)
                seen = same_value_zero(r->v[k], a->v[i]);
            if (!seen) r->v[r->n++] = a->v[i];
        }
        *out = varr(r, 0);
        return RC_OK;
    }
    }
    return TERR(c, f, "unknown ArrayValue filter: %s", filter_names[f->op]);
}

static int plain_string(ctx *c, const node *f, val v, val *out)
{
    const jstr *s = v.u.s;
    switch (f->op) {
    case F_length:
        *out = vint((double)s->u16);
        return RC_OK;
    case F_upper:
        return case_val(c, f, s, true, out);
    case F_lower:
        return case_val(c, f, s, false, out);
    case F_title:
        return str_title(c, f, s, out);
    case F_capitalize:
        return str_capitalize(c, f, s, out);
    case F_trim:
        *out = str_trim(c, s, true, true);
        return work(c, f, s->len);
    case F_indent:
        return str_indent(c, f, s, 4, false, false, out);
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
    return TERR(c, f, "unknown StringValue filter: %s", filter_names[f->op]);
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
        int r = emit(c, f, &b, v);
        return sbuf_done(c, f, &b, r, out);
    }
    }
    return TERR(c, f, "unknown NumericValue filter: %s", filter_names[f->op]);
}

static int plain_object(ctx *c, env *e, const node *f, val v, val *out)
{
    switch (f->op) {
    case F_items:
        return obj_items(c, v.u.o, 0, out);
    case F_length:
        *out = vint((double)v.u.o->n);
        return RC_OK;
    default: {
        int m = method_index(f->s, M_FIRST_MAPPING, M_COUNT);
        if (m < 0) break;
        val fn = method_val(c, v, m);
        return method_call(c, e, f, fn.u.f, NULL, 0, out);
    }
    }
    return TERR(c, f, "unknown ObjectValue filter: %s", filter_names[f->op]);
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
        return str_val(c, f, v.u.b ? "true" : "false", v.u.b ? 4 : 5, out);
    }
    return TERR(c, f, "unknown BooleanValue filter: %s", filter_names[f->op]);
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
    return TERR(c, f, "cannot apply filter \"%s\" to type: %s", filter_names[f->op], type_name(v));
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
    return eval_args(c, e, &f->l1, &a->pos, &a->np, &a->kw);
}

/* The positional argument i, else the keyword name, else def. */
static val farg(const fargs *a, size_t i, const char *name, val def)
{
    return arg_or(a->pos, a->np, i, a->kw, name, def);
}

/* tojson(indent=, ensure_ascii=, sort_keys=, separators=): keywords only. */
static int call_tojson(ctx *c, env *e, const node *f, val v, val *out)
{
    fargs a;
    TRY(filter_args(c, e, f, &a));
    jopts o = {0};
    val indent = arg_or(NULL, 0, 0, a.kw, "indent", VNULL);
    if (indent.t != V_INT && indent.t != V_NULL)
        return TERR(c, f, "if set, indent must be a number");
    if (indent.t == V_INT && !isnan(indent.u.n) && indent.u.n != 0) {
        if (indent.u.n < 0) return TERR(c, f, "invalid count value: %g", indent.u.n);
        if (indent.u.n > TPL_MAX_INDENT) return TERR(c, f, "indent over %d", TPL_MAX_INDENT);
        o.indent = indent.u.n;
    }
    val ea = arg_or(NULL, 0, 0, a.kw, "ensure_ascii", vbool(false));
    if (ea.t != V_BOOL) return TERR(c, f, "if set, ensure_ascii must be a boolean");
    val sk = arg_or(NULL, 0, 0, a.kw, "sort_keys", vbool(false));
    if (sk.t != V_BOOL) return TERR(c, f, "if set, sort_keys must be a boolean");
    val sep = arg_or(NULL, 0, 0, a.kw, "separators", VNULL);
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
        return TERR(c, f, "cannot apply filter \"join\" to type: %s", type_name(v));
    fargs a;
    TRY(filter_args(c, e, f, &a));
    val sep = farg(&a, 0, "separator", vstr(&EMPTY_STR));
    if (sep.t != V_STR) return TERR(c, f, "separator must be a string");
    if (v.t == V_ARR) return join_vals(c, f, v.u.a, sep.u.s, out);
    size_t ncp;
    size_t *off = cp_offsets(c, v.u.s, &ncp);
    sbuf b = {0};
    int r = work(c, f, v.u.s->len);
    for (size_t i = 0; i < ncp && !r; i++) {
        if (i) r = cput(c, f, &b, sep.u.s->p, sep.u.s->len);
        if (!r) r = cput(c, f, &b, v.u.s->p + off[i], off[i + 1] - off[i]);
    }
    return sbuf_done(c, f, &b, r, out);
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
    return TERR(c, f, "cannot apply filter \"%s\" to type: %s", filter_names[f->op], type_name(v));
}

/* default(value, boolean): value for an undefined x (or, with boolean, a falsy one). */
static int call_default(ctx *c, env *e, const node *f, val v, val *out)
{
    fargs a;
    TRY(filter_args(c, e, f, &a));
    val def = a.np > 0 ? a.pos[0] : vstr(&EMPTY_STR);
    val boolean = farg(&a, 1, "boolean", vbool(false));
    if (boolean.t != V_BOOL) return TERR(c, f, "`default` filter flag must be a boolean");
    *out = (v.t == V_UNDEF || (boolean.u.b && !truthy(v))) ? def : v;
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
    if (attr.t == V_INT) TRY(raw_val(c, f, attr, &attr));
    return sorted_copy(c, l, (sortctx){c, f, cs.u.b, rev.u.b, attr.t == V_STR ? attr.u.s : NULL},
                       out);
}

/* selectattr / rejectattr(attribute, test, value): string literals only, as in
 * @huggingface/jinja, so the arguments are read from the syntax tree. */
static int call_selectattr(ctx *c, const node *f, const jarr *l, val *out)
{
    const char *name = filter_names[f->op];
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
            if (jstr_eqc(tn, test_names[k])) test = k;
        if (test < 0) return TERR(c, f, "unknown test: %.*s", (int)tn->len, tn->p);
    }
    val tv = f->l1.n > 2 ? vstr(f->l1.v[2]->s) : UNDEF;
    jarr *r = arr_new(&c->ar, l->n);
    r->n = 0;
    for (size_t i = 0; i < l->n; i++) {
        TRY(step(c, f, 1));
        val item;
        bool res = false;
        if (obj_get(l->v[i].u.o, attr->p, attr->len, &item)) {
            if (test < 0)
                res = truthy(item);
            else
                TRY(run_test(c, f, test, item, f->l1.n > 2 ? &tv : NULL, &res));
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
    if (!kw_get(a.kw, "attribute", &attr))
        return TERR(c, f, "`map` expressions without `attribute` set are not currently supported.");
    if (attr.t != V_STR) return TERR(c, f, "attribute must be a string");
    val def;
    bool has_def = kw_get(a.kw, "default", &def);
    jarr *r = arr_new(&c->ar, l->n);
    for (size_t i = 0; i < l->n; i++) {
        if (!is_container(l->v[i])) return TERR(c, f, "items in map must be an object");
        val x = attr_path(c, l->v[i], attr.u.s);
        r->v[i] = (x.t == V_UNDEF && has_def) ? def : x;
    }
    *out = varr(r, 0);
    return step(c, f, l->n);
}

/* A method called as a filter: the method of v named like the filter, with the filter's
 * arguments and, when always_kw or there are any, its keywords as a last argument. */
static int call_as_method(ctx *c, env *e, const node *f, val v, int method, bool always_kw,
                          val *out)
{
    fargs a;
    TRY(filter_args(c, e, f, &a));
    val *args = arena_alloc(&c->ar, (a.np + 1) * sizeof(val));
    if (a.np) memcpy(args, a.pos, a.np * sizeof(val));
    size_t n = a.np;
    if (always_kw || a.kw->n) args[n++] = kwargs_val(c, a.kw);
    val fn = method_val(c, v, method);
    return method_call(c, e, f, fn.u.f, args, n, out);
}

static int filter_call(ctx *c, env *e, const node *f, val v, val *out)
{
    int id = f->op;
    const char *name = filter_names[id];
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
            return str_indent(c, f, v.u.s, width.u.n, raw_truthy(first), raw_truthy(blank), out);
        }
        if (id == F_replace) return call_as_method(c, e, f, v, M_replace, true, out);
        return TERR(c, f, "unknown StringValue filter: %s", name);
    }
    if (v.t == V_OBJ) {
        int m = method_index(f->s, M_FIRST_MAPPING, M_COUNT);
        if (m >= 0) return call_as_method(c, e, f, v, m, false, out);
        return TERR(c, f, "unknown ObjectValue filter: %s", name);
    }
    return TERR(c, f, "cannot apply filter \"%s\" to type: %s", name, type_name(v));
}

static int apply_filter(ctx *c, env *e, const node *f, val v, val *out)
{
    TRY(step(c, f, 1));
    return f->flag ? filter_call(c, e, f, v, out) : filter_plain(c, e, f, v, out);
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
            return TERR(c, at, "range() arguments must be numbers, got %s", type_name(args[i]));
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
    val *v = arena_alloc(&c->ar, cap * sizeof(val));
    for (double i = start; stp > 0 ? i < stop : i > stop; i += stp) {
        TRY(step(c, at, 1));
        if (cnt == cap) {
            val *nv = arena_alloc(&c->ar, cap * 2 * sizeof(val));
            memcpy(nv, v, cnt * sizeof(val));
            v = nv;
            cap *= 2;
        }
        v[cnt++] = (isfinite(i) && floor(i) == i) ? vint(i) : vfloat(i);
    }
    jarr *r = arr_new(&c->ar, 0);
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
    int r = work(c, at, f->len);
    char tmp[32];
    for (size_t i = 0; i < f->len && !r; i++) {
        char d = i + 1 < f->len && f->p[i] == '%' ? f->p[i + 1] : 0;
        const char *s = strftime_field(d, &tm, tmp);
        if (s) {
            r = cputs(c, at, &b, s);
            i++;
        } else {
            r = cput(c, at, &b, f->p + i, 1);
        }
    }
    return sbuf_done(c, at, &b, r, out);
}

/* namespace(mapping or pairs, **kwargs) */
static int call_namespace(ctx *c, const node *at, val *args, size_t n, val *out)
{
    jobj *kw = NULL;
    if (n && args[n - 1].t == V_OBJ && args[n - 1].sub == SUB_KWARGS) kw = args[--n].u.o;
    if (n > 1) return TERR(c, at, "namespace expected at most 1 argument, got %zu", n);
    jobj *o = obj_new(&c->ar);
    if (n == 1) {
        val src = args[0];
        if (src.t == V_OBJ) {
            for (size_t i = 0; i < src.u.o->n; i++)
                obj_set(&c->ar, o, src.u.o->k[i], src.u.o->v[i]);
        } else if (src.t == V_ARR) {
            for (size_t i = 0; i < src.u.a->n; i++) {
                val pair = src.u.a->v[i], k, v;
                if (pair.t == V_ARR && pair.u.a->n == 2) {
                    k = pair.u.a->v[0];
                    v = pair.u.a->v[1];
                } else if (pair.t == V_STR && pair.u.s->u16 == 2 && pair.u.s->len == 2) {
                    TRY(str_val(c, at, pair.u.s->p, 1, &k));
                    TRY(str_val(c, at, pair.u.s->p + 1, 1, &v));
                } else {
                    return TERR(
                        c, at, "namespace expected an object or an iterable of [key, value] pairs");
                }
                if (k.t != V_STR) return TERR(c, at, "namespace keys must be strings");
                obj_set(&c->ar, o, k.u.s, v);
            }
        } else {
            return TERR(c, at, "'%s' object is not iterable", type_name(src));
        }
    }
    if (kw)
        for (size_t i = 0; i < kw->n; i++)
            obj_set(&c->ar, o, kw->k[i], kw->v[i]);
    *out = (val){.t = V_NS, .u.o = o};
    return RC_OK;
}

/* bindMacroArguments: positional, then keyword, then defaults (evaluated in the new scope). */
static int bind_macro_args(ctx *c, const node *at, const char *display, const nodelist *params,
                           int special, val *args, size_t n, env *scope)
{
    const jobj *kw = NULL;
    if (n && args[n - 1].t == V_OBJ && args[n - 1].sub == SUB_KWARGS) kw = args[--n].u.o;
    bool *used = kw && kw->n ? arena_zalloc(&c->ar, kw->n * sizeof(bool)) : NULL;
    for (size_t i = 0; i < params->n; i++) {
        const node *p = params->v[i];
        val v = UNDEF;
        bool have = i < n;
        if (have) v = args[i];
        if (!have && kw) {
            long k = obj_find(kw, p->s->p, p->s->len);
            if (k >= 0) {
                v = kw->v[k];
                used[k] = true;
                have = true;
            }
        }
        env_set(c, scope, p->s, v);
    }
    size_t left = 0;
    for (size_t k = 0; kw && k < kw->n; k++)
        left += !used[k];
    if (special & 1) {
        jobj *rest = obj_new(&c->ar);
        for (size_t k = 0; kw && k < kw->n; k++)
            if (!used[k]) obj_set(&c->ar, rest, kw->k[k], kw->v[k]);
        env_set(c, scope, cname(c, "kwargs"), vobj(rest, 0));
    } else if (left) {
        for (size_t k = 0; k < kw->n; k++)
            if (!used[k])
                return TERR(c, at, "macro %s takes no keyword argument '%.*s'", display,
                            (int)kw->k[k]->len, kw->k[k]->p);
    }
    if (special & 2) {
        size_t extra = n > params->n ? n - params->n : 0;
        jarr *va = arr_new(&c->ar, extra);
        for (size_t i = 0; i < extra; i++)
            va->v[i] = args[params->n + i];
        env_set(c, scope, cname(c, "varargs"), varr(va, 0));
    } else if (n > params->n) {
        return TERR(c, at, "macro %s takes not more than %zu argument(s)", display, params->n);
    }
    /* defaults, for the parameters that got nothing */
    for (size_t i = 0; i < params->n; i++) {
        const node *p = params->v[i];
        if (p->kind != N_KWARG || i < n) continue;
        if (kw) {
            long k = obj_find(kw, p->s->p, p->s->len);
            if (k >= 0) continue;
        }
        val d;
        TRY(eval(c, scope, p->a, &d));
        env_set(c, scope, p->s, d);
    }
    return RC_OK;
}

static int call_value(ctx *c, env *e, const node *at, val fn, val *args, size_t n, val *out)
{
    if (fn.t != V_FUNC)
        return TERR(c, at, "cannot call something that is not a function: got %s", type_name(fn));
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
            m = vstr(jstr_borrow(&c->ar, "", 0));
        else
            TRY(raw_val(c, at, m, &m));
        if (c->st == CG_OK) {
            c->st = CG_E_VALUE;
            snprintf(c->msg, sizeof c->msg, "%.*s", (int)m.u.s->len, m.u.s->p);
            utf8_clip(c->msg);
        }
        return RC_ERR;
    }
    case FN_METHOD:
        return method_call(c, e, at, f, args, n, out);
    case FN_MACRO:
    case FN_CALLER: {
        const node *def = f->def;
        bool macro = f->kind == FN_MACRO;
        TRY(enter_depth(c, at));
        env *scope = env_new(c, macro ? e : f->lex);
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
    TRY(eval_args(c, e, &x->l1, &pos, &np, &kw));
    if (kw->n) pos[np++] = kwargs_val(c, kw);
    TRY(eval(c, e, x->a, &fn));
    return call_value(c, e, x, fn, pos, np, out);
}

/* ---- operators ---- */

static int eval_binary(ctx *c, env *e, const node *x, val *out)
{
    val l, r;
    TRY(eval(c, e, x->a, &l));
    if (x->op == OP_AND) return truthy(l) ? eval(c, e, x->b, out) : (*out = l, RC_OK);
    if (x->op == OP_OR) return truthy(l) ? (*out = l, RC_OK) : eval(c, e, x->b, out);
    TRY(eval(c, e, x->b, &r));
    int op = x->op;
    if (op == OP_EQ || op == OP_NE) {
        bool eq;
        TRY(loose_eq(c, x, l, r, &eq));
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
        TRY(raw_val(c, x, l, &a));
        TRY(raw_val(c, x, r, &b));
        return str_concat(c, x, a.u.s, b.u.s, out);
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
            return TERR(c, x, "unknown operator \"%s\" between %s and %s", opname[op], type_name(l),
                        type_name(r));
        jarr *a = arr_new(&c->ar, l.u.a->n + r.u.a->n);
        if (l.u.a->n) memcpy(a->v, l.u.a->v, l.u.a->n * sizeof(val));
        if (r.u.a->n) memcpy(a->v + l.u.a->n, r.u.a->v, r.u.a->n * sizeof(val));
        *out = varr(a, 0);
        return step(c, x, a->n);
    } else if (r.t == V_ARR && (op == OP_IN || op == OP_NOTIN)) {
        bool member = false;
        TRY(step(c, x, r.u.a->n));
        for (size_t i = 0; i < r.u.a->n && !member; i++)
            member = strict_eq(r.u.a->v[i], l);
        *out = vbool(op == OP_IN ? member : !member);
        return RC_OK;
    }
    if ((l.t == V_STR || r.t == V_STR) && op == OP_ADD) {
        val a, b;
        TRY(raw_val(c, x, l, &a));
        TRY(raw_val(c, x, r, &b));
        return str_concat(c, x, a.u.s, b.u.s, out);
    }
    if (l.t == V_STR && r.t == V_STR && (op == OP_IN || op == OP_NOTIN)) {
        TRY(work(c, x, r.u.s->len));
        bool in = memfind(r.u.s->p, r.u.s->len, l.u.s->p, l.u.s->len) != NULL;
        *out = vbool(op == OP_IN ? in : !in);
        return RC_OK;
    }
    if (l.t == V_STR && r.t == V_OBJ && (op == OP_IN || op == OP_NOTIN)) {
        bool in = obj_find(r.u.o, l.u.s->p, l.u.s->len) >= 0;
        *out = vbool(op == OP_IN ? in : !in);
        return RC_OK;
    }
    return TERR(c, x, "unknown operator \"%s\" between %s and %s", opname[op], type_name(l),
                type_name(r));
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
            slicer sl = slice_begin((double)obj.u.a->n, &s[0], &s[1], &s[2]);
            jarr *r = arr_new(&c->ar, obj.u.a->n);
            r->n = 0;
            size_t idx;
            while (r->n < obj.u.a->n && slice_next(&sl, &idx)) {
                r->v[r->n++] = obj.u.a->v[idx];
                TRY(step(c, x, 1));
            }
            *out = varr(r, 0);
            return RC_OK;
        }
        size_t ncp;
        size_t *off = cp_offsets(c, obj.u.s, &ncp);
        TRY(work(c, x, obj.u.s->len));
        slicer sl = slice_begin((double)ncp, &s[0], &s[1], &s[2]);
        sbuf b = {0};
        size_t idx, taken = 0;
        int r = RC_OK;
        while (!r && taken < ncp && slice_next(&sl, &idx)) {
            r = cput(c, x, &b, obj.u.s->p + off[idx], off[idx + 1] - off[idx]);
            taken++;
        }
        return sbuf_done(c, x, &b, r, out);
    }
    if (x->flag)
        TRY(eval(c, e, p, &prop));
    else if (p->kind == N_INT)
        prop = vint(p->num);
    else
        prop = vstr(p->s);
    return member_get(c, x, obj, prop, out);
}

static int eval(ctx *c, env *e, const node *x, val *out)
{
    TRY(step(c, x, 1));
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
        *out = env_lookup(c, e, x->s);
        break;
    case N_ARRAY:
    case N_TUPLE: {
        jarr *a = arr_new(&c->ar, x->l1.n);
        for (size_t i = 0; i < x->l1.n && !r; i++)
            r = eval(c, e, x->l1.v[i], &a->v[i]);
        *out = varr(a, x->kind == N_TUPLE ? SUB_TUPLE : 0);
        break;
    }
    case N_DICT: {
        jobj *o = obj_new(&c->ar);
        for (size_t i = 0; i < x->l1.n && !r; i++) {
            val k, v;
            r = eval(c, e, x->l1.v[i], &k);
            if (!r && k.t != V_STR)
                r = TERR(c, x->l1.v[i], "object keys must be strings: got %s", type_name(k));
            if (!r) r = eval(c, e, x->l2.v[i], &v);
            if (!r) obj_set(&c->ar, o, k.u.s, v);
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
            *out = vbool(!truthy(v));
        } else if (is_num(v) || v.t == V_BOOL) {
            double d = v.t == V_BOOL ? v.u.b : v.u.n;
            d = x->op == OP_NEG ? -d : d;
            *out = v.t == V_FLOAT ? vfloat(d) : vint(d);
        } else {
            r = TERR(c, x, "unknown operator \"%s\" for %s", x->op == OP_NEG ? "-" : "+",
                     type_name(v));
        }
        break;
    }
    case N_BINARY:
        r = eval_binary(c, e, x, out);
        break;
    case N_FILTER: {
        val v;
        r = eval(c, e, x->a, &v);
        if (!r) r = apply_filter(c, e, x, v, out);
        break;
    }
    case N_TEST: {
        val v;
        bool res;
        r = eval(c, e, x->a, &v);
        if (!r) r = run_test(c, x, x->op, v, NULL, &res);
        if (!r) *out = vbool(x->flag ? !res : res);
        break;
    }
    case N_SELECT: {
        val t;
        r = eval(c, e, x->b, &t);
        if (!r) {
            if (truthy(t))
                r = eval(c, e, x->a, out);
            else
                *out = UNDEF;
        }
        break;
    }
    case N_TERNARY: {
        val t;
        r = eval(c, e, x->a, &t);
        if (!r) r = eval(c, e, truthy(t) ? x->b : x->c, out);
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
        env_set(c, scope, target->s, item);
        return RC_OK;
    }
    if (item.t != V_ARR || item.sub == SUB_TUPLE)
        return TERR(c, target, "cannot unpack non-iterable type: %s", type_name(item));
    if (item.u.a->n != target->l1.n)
        return TERR(c, target, "too %s items to unpack",
                    target->l1.n > item.u.a->n ? "few" : "many");
    for (size_t j = 0; j < target->l1.n; j++)
        env_set(c, scope, target->l1.v[j]->s, item.u.a->v[j]);
    return RC_OK;
}

static int exec_for(ctx *c, env *e, const node *x)
{
    env *scope = env_new(c, e);
    val it;
    TRY(eval(c, scope, x->b, &it));
    if (it.t != V_ARR && it.t != V_OBJ)
        return TERR(c, x, "expected iterable or object type in for loop: got %s", type_name(it));
    if (it.t == V_OBJ) TRY(obj_items(c, it.u.o, 1, &it));
    const jarr *src = it.u.a;
    jarr *items = arr_new(&c->ar, src->n);
    items->n = 0;
    for (size_t i = 0; i < src->n; i++) {
        TRY(step(c, x, 1));
        env *ls = env_new(c, scope);
        TRY(assign_loop_var(c, ls, x->a, src->v[i])); /* unpacking is checked for every item */
        if (x->c) {
            val t;
            TRY(eval(c, ls, x->c, &t));
            if (!truthy(t)) continue;
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
        TRY(step(c, x, 1));
        jobj *lo = obj_new(&c->ar);
        obj_set(&c->ar, lo, &K[0], vint((double)i + 1));
        obj_set(&c->ar, lo, &K[1], vint((double)i));
        obj_set(&c->ar, lo, &K[2], vint((double)(n - i)));
        obj_set(&c->ar, lo, &K[3], vint((double)(n - i - 1)));
        obj_set(&c->ar, lo, &K[4], vbool(i == 0));
        obj_set(&c->ar, lo, &K[5], vbool(i == n - 1));
        obj_set(&c->ar, lo, &K[6], vint((double)n));
        obj_set(&c->ar, lo, &K[7], i > 0 ? items->v[i - 1] : UNDEF);
        obj_set(&c->ar, lo, &K[8], i + 1 < n ? items->v[i + 1] : UNDEF);
        env_set(c, scope, &LOOP, vobj(lo, 0));
        TRY(assign_loop_var(c, scope, x->a, items->v[i]));
        size_t mark = c->out->len;
        int r = exec_list(c, scope, &x->l1);
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
    if (none) TRY(exec_list(c, scope, &x->l2));
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
        env_set(c, e, t->s, v);
    } else if (t->kind == N_TUPLE) {
        if (v.t != V_ARR)
            return TERR(c, x, "cannot unpack non-iterable type in set: %s", type_name(v));
        if (v.u.a->n != t->l1.n)
            return TERR(c, x, "too %s items to unpack in set", t->l1.n > v.u.a->n ? "few" : "many");
        for (size_t i = 0; i < t->l1.n; i++)
            env_set(c, e, t->l1.v[i]->s, v.u.a->v[i]);
    } else {
        val obj;
        TRY(eval(c, e, t->a, &obj));
        if (obj.t != V_NS) return TERR(c, x, "cannot assign attribute on non-namespace object");
        obj_set(&c->ar, obj.u.o, t->b->s, v);
    }
    return RC_OK;
}

static int exec_print(ctx *c, const node *at, val v)
{
    if (v.t == V_NULL || v.t == V_UNDEF) return RC_OK;
    return emit(c, at, c->out, v);
}

static int exec(ctx *c, env *e, const node *x)
{
    TRY(step(c, x, 1));
    TRY(enter_depth(c, x));
    int r = RC_OK;
    switch (x->kind) {
    case N_TEXT:
        r = cput(c, x, c->out, x->s->p, x->s->len);
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
        if (!r) r = exec_list(c, e, truthy(t) ? &x->l1 : &x->l2);
        break;
    }
    case N_FOR:
        r = exec_for(c, e, x);
        break;
    case N_SET:
        r = exec_set(c, e, x);
        break;
    case N_MACRO: {
        val f = fn_val(c, FN_MACRO);
        f.u.f->def = x;
        env_set(c, e, x->s, f);
        break;
    }
    case N_CALLBLOCK: {
        static jstr CALLER = {"caller", 6, 6, true};
        val caller = fn_val(c, FN_CALLER), fn, v;
        caller.u.f->def = x;
        caller.u.f->lex = e;
        val *pos;
        size_t np;
        jobj *kw;
        r = eval_args(c, e, &x->a->l1, &pos, &np, &kw);
        if (r) break;
        pos[np++] = kwargs_val(c, kw);
        r = eval(c, e, x->a->a, &fn);
        if (r) break;
        env *ne = env_new(c, e);
        env_set(c, ne, &CALLER, caller);
        r = call_value(c, ne, x->a, fn, pos, np, &v);
        if (!r) r = exec_print(c, x, v);
        break;
    }
    case N_FILTERBLOCK: {
        val body, v;
        r = capture(c, e, x, &x->l1, &body);
        if (!r) r = apply_filter(c, e, x->a, body, &v);
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

static int exec_list(ctx *c, env *e, const nodelist *l)
{
    for (size_t i = 0; i < l->n; i++)
        TRY(exec(c, e, l->v[i]));
    return RC_OK;
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
    utf8_clip(err);
}

void cg_chat_template_free(cg_chat_template **tp)
{
    if (!tp || !*tp) return;
    arena_free(&(*tp)->ar);
    free((*tp)->src);
    cg_free(tp);
}

cg_status cg_chat_template_new(const char *src, size_t len, const cg_chat_template_limits *limits,
                               cg_chat_template **out, char *err, size_t errlen)
{
    cg_chat_template *t = NULL;
    ptext p0 = {0}, p1 = {0}, p2 = {0}, p3 = {0};
    parser ps = {0};
    names bound = {0};
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
        uint32_t cp = u8_decode((const unsigned char *)src + i, len - i, &l);
        if (cp == 0xFFFD && l == 1) {
            unsigned line, col;
            src_linecol(src, len, i, &line, &col);
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
    ptext_init(&p0, len);
    memcpy(p0.s, t->src, len);
    for (size_t i = 0; i <= len; i++)
        p0.map[i] = (uint32_t)i;
    p0.n = len;
    if (p0.n && p0.s[p0.n - 1] == '\n') p0.n--;
    p0.s[p0.n] = 0;
    pp_lstrip(&p0, &p1);
    pp_trim(&p1, &p2);
    pp_generation(&p2, &p3);

    ps.t = t;
    ps.pt = &p3;
    if (lex(&ps)) {
        nvec body = {0};
        while (!is(&ps, K_EOF)) {
            node *x = parse_any(&ps);
            if (!x) break;
            nvec_push(&t->ar, &body, x);
        }
        t->body = nvec_list(body);
    }
    if (ps.st == CG_OK) {
        for (size_t i = 0; i < t->body.n; i++)
            collect_bound(&bound, t->body.v[i]);
        for (size_t i = 0; i < t->body.n && ps.st == CG_OK; i++)
            check_calls(&ps, &bound, t->body.v[i]);
    }
    if (ps.st != CG_OK) {
        unsigned line, col;
        src_linecol(t->src, t->len, ps.errpos, &line, &col);
        set_err(err, errlen, "%u:%u: %s", line, col, ps.msg);
        st = ps.st;
        cg_chat_template_free(&t);
    }
    free(bound.v);
    free(ps.toks);
    ptext_free(&p0);
    ptext_free(&p1);
    ptext_free(&p2);
    ptext_free(&p3);
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
    env *g = env_new(&c, NULL);
    c.global = g;
    static const char *const reserved[] = {"false", "true",         "none", "raise_exception",
                                           "range", "strftime_now", "True", "False",
                                           "None",  "namespace"};
    env_set(&c, g, cname(&c, "false"), vbool(false));
    env_set(&c, g, cname(&c, "true"), vbool(true));
    env_set(&c, g, cname(&c, "none"), VNULL);
    env_set(&c, g, cname(&c, "raise_exception"), fn_val(&c, FN_RAISE));
    env_set(&c, g, cname(&c, "range"), fn_val(&c, FN_RANGE));
    env_set(&c, g, cname(&c, "strftime_now"), fn_val(&c, FN_STRFTIME));
    env_set(&c, g, cname(&c, "True"), vbool(true));
    env_set(&c, g, cname(&c, "False"), vbool(false));
    env_set(&c, g, cname(&c, "None"), VNULL);
    int r = RC_OK;
    if (vars) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v)
        {
            for (size_t i = 0; i < CG_ARRAY_LEN(reserved); i++)
                if (strcmp(k, reserved[i]) == 0) {
                    r = rerr(&c, NULL, CG_E_VALUE, "variable already declared: %s", k);
                    break;
                }
            if (r) break;
            val x;
            r = from_json(&c, v, &x, 0);
            if (r) break;
            env_set(&c, g, jstr_borrow(&c.ar, k, strlen(k)), x);
        }
    }
    if (!r) r = exec_list(&c, g, &t->body);
    if (r == RC_BREAK || r == RC_CONT)
        r = rerr(&c, c.ctl, CG_E_VALUE, "%s outside a loop", r == RC_BREAK ? "break" : "continue");
    if (r) {
        st = c.st != CG_OK ? c.st : CG_E_INTERNAL;
        set_err(err, errlen, "%s", c.msg);
    } else {
        st = cg_buf_append(out, o.p ? o.p : "", o.len);
        if (st != CG_OK) set_err(err, errlen, "rendered text exceeds the output buffer");
    }
    sbuf_free(&o);
    arena_free(&c.ar);
    return st;
}
