/* Chat templates, the primitives every stage uses: UTF-8 decoding and JavaScript's character
 * classes, the arena that holds a template's nodes and a render's values, immutable strings
 * (with their UTF-16 length), growable buffers and JavaScript's number text (String(n),
 * Number(s), parseInt, parseFloat). */
#include "cache/chat_template_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 and JavaScript character classes                                                      */
/* ------------------------------------------------------------------------------------------ */

uint32_t cgt_u8_decode(const unsigned char *p, size_t n, size_t *len)
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

size_t cgt_u8_encode(uint32_t c, char *o)
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

void cgt_utf8_clip(char *s)
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

size_t cgt_js_space_at(const char *p, size_t n)
{
    if (n == 0) return 0;
    unsigned char c = (unsigned char)p[0];
    if (c < 0x80) return (c == ' ' || (c >= 0x09 && c <= 0x0D)) ? 1 : 0;
    size_t l;
    uint32_t cp = cgt_u8_decode((const unsigned char *)p, n, &l);
    return js_space(cp) ? l : 0;
}

size_t cgt_js_space_before(const char *p, size_t n)
{
    if (n == 0) return 0;
    size_t s = n - 1;
    while (s > 0 && n - s < 4 && ((unsigned char)p[s] & 0xC0) == 0x80)
        s--;
    size_t l = cgt_js_space_at(p + s, n - s);
    return (l && s + l == n) ? l : 0;
}

size_t cgt_skip_js_space(const char *s, size_t n, size_t i)
{
    size_t l;
    while (i < n && (l = cgt_js_space_at(s + i, n - i)))
        i += l;
    return i;
}

size_t cgt_skip_digits(const char *s, size_t n, size_t i)
{
    while (i < n && is_digit(s[i]))
        i++;
    return i;
}

int cgt_hex_digit(int c)
{
    return is_digit(c)              ? c - '0'
           : (c >= 'a' && c <= 'f') ? c - 'a' + 10
           : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                    : -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Arena: every value of one render (and every node of one template) lives here                */
/* ------------------------------------------------------------------------------------------ */

void *cgt_arena_alloc(arena *a, size_t n)
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

void *cgt_arena_zalloc(arena *a, size_t n)
{
    void *p = cgt_arena_alloc(a, n);
    memset(p, 0, n);
    return p;
}

void cgt_arena_free(arena *a)
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

void cgt_jstr_measure(jstr *s)
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
        uint32_t c = cgt_u8_decode(p + i, s->len - i, &l);
        u16 += c >= 0x10000 ? 2 : 1;
        i += l;
    }
    s->u16 = u16;
    s->ascii = ascii;
}

jstr *cgt_jstr_borrow(arena *a, const char *p, size_t len)
{
    jstr *s = cgt_arena_alloc(a, sizeof(jstr));
    s->p = p;
    s->len = len;
    cgt_jstr_measure(s);
    return s;
}

jstr *cgt_jstr_copy(arena *a, const char *p, size_t len)
{
    char *d = cgt_arena_alloc(a, len + 1);
    if (len) memcpy(d, p, len);
    d[len] = 0;
    return cgt_jstr_borrow(a, d, len);
}

void cgt_sbuf_free(sbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void cgt_sbuf_put(sbuf *b, const void *p, size_t n)
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

void cgt_sbuf_putc(sbuf *b, char c)
{
    cgt_sbuf_put(b, &c, 1);
}

/* ------------------------------------------------------------------------------------------ */
/* JavaScript number formatting and parsing                                                    */
/* ------------------------------------------------------------------------------------------ */

void cgt_js_num(double d, char *out)
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

void cgt_js_float_str(double d, char *out, size_t outlen)
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
    cgt_js_num(d, tmp);
    snprintf(out, outlen, "%s", tmp);
}

/* The length of the exponent ('e' or 'E', a sign, digits) at p[i], 0 if no digit follows. */
static size_t exponent_len(const char *p, size_t n, size_t i)
{
    size_t j = i + 1;
    if (j < n && (p[j] == '+' || p[j] == '-')) j++;
    size_t d = cgt_skip_digits(p, n, j);
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

double cgt_js_str_to_num(const char *p, size_t n)
{
    size_t l = cgt_skip_js_space(p, n, 0);
    p += l, n -= l;
    while (n && (l = cgt_js_space_before(p, n)))
        n -= l;
    if (n == 0) return 0;
    if (n > 2 && p[0] == '0' && strchr("xXoObB", p[1])) {
        int base = (p[1] == 'x' || p[1] == 'X') ? 16 : (p[1] == 'o' || p[1] == 'O') ? 8 : 2;
        double v = 0;
        for (size_t i = 2; i < n; i++) {
            int dgt = cgt_hex_digit(p[i]);
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
    size_t i = cgt_skip_js_space(p, n, 0);
    *neg = i < n && p[i] == '-';
    if (i < n && (p[i] == '+' || p[i] == '-')) i++;
    return i;
}

double cgt_js_parse_int(const char *p, size_t n)
{
    bool neg;
    size_t s = js_number_start(p, n, &neg), i = cgt_skip_digits(p, n, s);
    if (i == s) return NAN;
    return js_decimal(p + s, i - s, neg);
}

double cgt_js_parse_float(const char *p, size_t n)
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
void cgt_src_linecol(const char *src, size_t len, size_t off, unsigned *line, unsigned *col)
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
