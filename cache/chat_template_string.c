/* Chat templates, strings: Unicode case mapping as JavaScript's toUpperCase/toLowerCase do it
 * and the JavaScript String methods @huggingface/jinja's filters and methods use (slicing,
 * trimming, title case, split, replace, indent, concatenation). */
#include "cache/chat_template_impl.h"

#include <math.h>
#include <string.h>
#include <utf8proc.h>

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
        uint32_t cp = cgt_u8_decode(p + s, n - s, &l);
        i = s;
        if (case_ignorable(cp)) continue;
        before = cased(cp);
        break;
    }
    if (!before) return false;
    for (i = at + len; i < n;) {
        size_t l;
        uint32_t cp = cgt_u8_decode(p + i, n - i, &l);
        i += l;
        if (case_ignorable(cp)) continue;
        return !cased(cp);
    }
    return true;
}

int cgt_case_map(ctx *c, const node *at, const jstr *s, bool upper, sbuf *b)
{
    TRY(cgt_work(c, at, s->len));
    const unsigned char *p = (const unsigned char *)s->p;
    char enc[12];
    for (size_t i = 0; i < s->len;) {
        if (p[i] < 0x80) {
            char ch = (char)p[i];
            if (upper && ch >= 'a' && ch <= 'z') ch = (char)(ch - 32);
            if (!upper && ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
            TRY(cgt_cput(c, at, b, &ch, 1));
            i++;
            continue;
        }
        size_t l, k = 0;
        uint32_t cp = cgt_u8_decode(p + i, s->len - i, &l);
        if (upper) {
            const uint32_t *sp = upper_special(cp);
            if (sp)
                for (int j = 0; j < 3 && sp[j]; j++)
                    k += cgt_u8_encode(sp[j], enc + k);
            else
                k = cgt_u8_encode((uint32_t)utf8proc_toupper((utf8proc_int32_t)cp), enc);
        } else if (cp == 0x130) {
            k = cgt_u8_encode('i', enc);
            k += cgt_u8_encode(0x307, enc + k);
        } else if (cp == 0x3A3 && final_sigma(p, s->len, i, l)) {
            k = cgt_u8_encode(0x3C2, enc);
        } else {
            k = cgt_u8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
        }
        TRY(cgt_cput(c, at, b, enc, k));
        i += l;
    }
    return RC_OK;
}

int cgt_case_val(ctx *c, const node *at, const jstr *s, bool upper, val *out)
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
    int r = cgt_case_map(c, at, s, upper, &b);
    return cgt_sbuf_done(c, at, &b, r, out);
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

slicer cgt_slice_begin(double len, const val *start, const val *stop, const val *stepv)
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

bool cgt_slice_next(slicer *s, size_t *idx)
{
    if (s->dir == 0 || !(s->dir * s->i < s->dir * s->stop)) return false;
    *idx = (size_t)s->i;
    s->i += s->step;
    return true;
}

size_t *cgt_cp_offsets(ctx *c, const jstr *s, size_t *n)
{
    size_t *off = cgt_arena_alloc(&c->ar, (s->len + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < s->len;) {
        size_t l;
        off[k++] = i;
        cgt_u8_decode((const unsigned char *)s->p + i, s->len - i, &l);
        i += l;
    }
    off[k] = s->len;
    *n = k;
    return off;
}

int cgt_str_at(ctx *c, const node *at, const jstr *s, double i, val *out)
{
    TRY(cgt_work(c, at, s->len));
    if (isnan(i)) i = 0;
    double len = (double)s->u16, k = i >= 0 ? i : len + i;
    if (k < 0 || k >= len) {
        *out = UNDEF;
        return RC_OK;
    }
    size_t target = (size_t)k;
    if (s->ascii) return cgt_str_val(c, at, s->p + target, 1, out);
    size_t u = 0;
    for (size_t b = 0; b < s->len;) {
        size_t l;
        uint32_t cp = cgt_u8_decode((const unsigned char *)s->p + b, s->len - b, &l);
        size_t w = cp >= 0x10000 ? 2 : 1;
        if (target < u + w) {
            if (w == 2) return cgt_str_val(c, at, "\xEF\xBF\xBD", 3, out);
            return cgt_str_val(c, at, s->p + b, l, out);
        }
        u += w;
        b += l;
    }
    *out = UNDEF;
    return RC_OK;
}

static val substr(ctx *c, const jstr *s, size_t from, size_t to)
{
    return vstr(cgt_jstr_borrow(&c->ar, s->p + from, to - from));
}

val cgt_str_trim(ctx *c, const jstr *s, bool left, bool right)
{
    size_t a = 0, b = s->len, l;
    if (left)
        while (a < b && (l = cgt_js_space_at(s->p + a, b - a)))
            a += l;
    if (right)
        while (b > a && (l = cgt_js_space_before(s->p + a, b - a)))
            b -= l;
    if (a == 0 && b == s->len) return vstr((jstr *)s);
    return substr(c, s, a, b);
}

int cgt_str_title(ctx *c, const node *at, const jstr *s, val *out)
{
    TRY(cgt_work(c, at, s->len));
    char *d = cgt_arena_alloc(&c->ar, s->len + 1);
    memcpy(d, s->p, s->len);
    d[s->len] = 0;
    for (size_t i = 0; i < s->len; i++)
        if (is_word((unsigned char)d[i]) && (i == 0 || !is_word((unsigned char)s->p[i - 1])) &&
            d[i] >= 'a' && d[i] <= 'z')
            d[i] = (char)(d[i] - 32);
    *out = vstr(cgt_jstr_borrow(&c->ar, d, s->len));
    return RC_OK;
}

int cgt_str_capitalize(ctx *c, const node *at, const jstr *s, val *out)
{
    if (s->len == 0) {
        *out = vstr((jstr *)s);
        return RC_OK;
    }
    size_t l;
    uint32_t cp = cgt_u8_decode((const unsigned char *)s->p, s->len, &l);
    if (cp >= 0x10000) {
        *out = vstr((jstr *)s);
        return RC_OK;
    }
    jstr first = {.p = s->p, .len = l};
    cgt_jstr_measure(&first);
    sbuf b = {0};
    int r = cgt_case_map(c, at, &first, true, &b);
    if (!r) r = cgt_cput(c, at, &b, s->p + l, s->len - l);
    return cgt_sbuf_done(c, at, &b, r, out);
}

bool cgt_has_prefix(const jstr *s, const jstr *p, bool suffix)
{
    if (p->len > s->len) return false;
    const char *from = suffix ? s->p + s->len - p->len : s->p;
    return p->len == 0 || memcmp(from, p->p, p->len) == 0;
}

const char *cgt_memfind(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

int cgt_str_split(ctx *c, const node *at, const jstr *s, val sep, val maxsplit, val *out)
{
    TRY(cgt_work(c, at, s->len));
    if (sep.t != V_STR && sep.t != V_NULL)
        return TERR(c, at, "sep argument must be a string or null");
    if (maxsplit.t != V_INT) return TERR(c, at, "maxsplit argument must be a number");
    double m = maxsplit.u.n;
    size_t n = 0, cap = 8;
    val *parts = cgt_arena_alloc(&c->ar, cap * sizeof(val));
#define PUSH_PART(v)                                                                               \
    do {                                                                                           \
        if (n == cap) {                                                                            \
            val *np_ = cgt_arena_alloc(&c->ar, cap * 2 * sizeof(val));                             \
            memcpy(np_, parts, n * sizeof(val));                                                   \
            parts = np_;                                                                           \
            cap *= 2;                                                                              \
        }                                                                                          \
        parts[n++] = (v);                                                                          \
    } while (0)
    if (sep.t == V_NULL) {
        val t = cgt_str_trim(c, s, true, false);
        const jstr *ts = t.u.s;
        size_t i = 0, l;
        for (;;) {
            while (i < ts->len && (l = cgt_js_space_at(ts->p + i, ts->len - i)))
                i += l;
            if (i >= ts->len) break;
            size_t j = i;
            while (j < ts->len && !cgt_js_space_at(ts->p + j, ts->len - j)) {
                cgt_u8_decode((const unsigned char *)ts->p + j, ts->len - j, &l);
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
            const char *f = cgt_memfind(s->p + i, s->len - i, sp->p, sp->len);
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
                int r = q > k ? cgt_cput(c, at, &b, sp->p, sp->len) : RC_OK;
                if (!r) r = cgt_cput(c, at, &b, parts[q].u.s->p, parts[q].u.s->len);
                if (r) {
                    cgt_sbuf_free(&b);
                    return r;
                }
            }
            val joined;
            TRY(cgt_sbuf_val(c, at, &b, &joined));
            n = k;
            PUSH_PART(joined);
        }
    }
#undef PUSH_PART
    jarr *a = cgt_arr_new(&c->ar, 0);
    a->n = n;
    a->v = parts;
    *out = varr(a, 0);
    return RC_OK;
}

int cgt_str_replace(ctx *c, const node *at, const jstr *s, const jstr *from, const jstr *to,
                    val count, val *out)
{
    TRY(cgt_work(c, at, s->len));
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
                r = cgt_cput(c, at, &b, to->p, to->len);
            }
            if (r || i >= s->len) break;
            size_t l;
            cgt_u8_decode((const unsigned char *)s->p + i, s->len - i, &l);
            r = cgt_cput(c, at, &b, s->p + i, l);
            i += l;
        }
    } else {
        size_t i = 0;
        while (!r && i <= s->len) {
            const char *f =
                remaining > 0 ? cgt_memfind(s->p + i, s->len - i, from->p, from->len) : NULL;
            if (!f) {
                r = cgt_cput(c, at, &b, s->p + i, s->len - i);
                break;
            }
            size_t j = (size_t)(f - s->p);
            r = cgt_cput(c, at, &b, s->p + i, j - i);
            if (!r) r = cgt_cput(c, at, &b, to->p, to->len);
            remaining--;
            i = j + from->len;
            if (!r) r = cgt_step(c, at, 1);
        }
    }
    return cgt_sbuf_done(c, at, &b, r, out);
}

int cgt_str_indent(ctx *c, const node *at, const jstr *s, double width, bool first, bool blank,
                   val *out)
{
    if (width < 0) return TERR(c, at, "invalid count value: %g", width);
    if (width > TPL_MAX_INDENT) return TERR(c, at, "indent width over %d", TPL_MAX_INDENT);
    TRY(cgt_work(c, at, s->len));
    sbuf b = {0};
    int r = RC_OK;
    size_t i = 0, line = 0;
    for (;;) {
        const char *nl = memchr(s->p + i, '\n', s->len - i);
        size_t j = nl ? (size_t)(nl - s->p) : s->len;
        bool keep = (!first && line == 0) || (!blank && j == i);
        if (!keep)
            for (double w = 0; w < width && !r; w++)
                r = cgt_cput(c, at, &b, " ", 1);
        if (!r) r = cgt_cput(c, at, &b, s->p + i, j - i);
        if (r || !nl) break;
        r = cgt_cput(c, at, &b, "\n", 1);
        i = j + 1;
        line++;
    }
    return cgt_sbuf_done(c, at, &b, r, out);
}

int cgt_str_concat(ctx *c, const node *at, const jstr *a, const jstr *b, val *out)
{
    if (a->len == 0) return *out = vstr((jstr *)b), RC_OK;
    if (b->len == 0) return *out = vstr((jstr *)a), RC_OK;
    if (a->len + b->len > c->lim->max_output)
        return cgt_rerr(c, at, CG_E_TOO_LARGE, "a string exceeds %zu bytes", c->lim->max_output);
    TRY(cgt_work(c, at, a->len + b->len));
    char *d = cgt_arena_alloc(&c->ar, a->len + b->len + 1);
    memcpy(d, a->p, a->len);
    memcpy(d + a->len, b->p, b->len);
    d[a->len + b->len] = 0;
    jstr *s = cgt_arena_alloc(&c->ar, sizeof(jstr));
    s->p = d;
    s->len = a->len + b->len;
    s->u16 = a->u16 + b->u16;
    s->ascii = a->ascii && b->ascii;
    *out = vstr(s);
    return RC_OK;
}

int cgt_raw_val(ctx *c, const node *at, val v, val *out)
{
    if (v.t == V_STR) return *out = v, RC_OK;
    sbuf b = {0};
    int r = cgt_raw_str(c, at, &b, v, 0);
    return cgt_sbuf_done(c, at, &b, r, out);
}
