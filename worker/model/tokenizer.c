/* Hugging Face tokenizer.json tokenizers and the tiny model's byte tokenizer. The pipeline and
 * its corner cases follow the `tokenizers` library (Rust) so that ids match token for token:
 * added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor, and the decoder chain
 * on the way back. Regexes run on PCRE2 (UTF + UCP + JIT), rewritten where Oniguruma, which
 * tokenizers uses, defines a class differently; Unicode normalization comes from utf8proc.
 * This file is the runtime (encode, decode); tokenizer_load.c loads tokenizer.json and
 * tokenizer_regex.c rewrites and runs its regexes. */
#include "worker/model/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "cache/split.h" /* cg_utf8_valid */

/* ---------------------------------------------------------------------------------------------
 * Small helpers: growable arrays, UTF-8
 * ------------------------------------------------------------------------------------------- */

void tk_grow(void *pp, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    *(void **)pp = cg_realloc(*(void **)pp, c * sz);
    *cap = c;
}

void tk_sb_add(sbuf *b, const void *s, size_t n)
{
    tk_grow(&b->p, &b->cap, b->n + n + 1, 1);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void tk_sb_free(sbuf *b)
{
    cg_free(&b->p);
    b->n = b->cap = 0;
}

static size_t u8enc(uint32_t cp, char *out)
{
    return (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)out);
}

/* Start of the code point that ends at s[n] (n > 0, valid UTF-8). */
static size_t u8prev(const char *s, size_t n)
{
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    return i;
}

/* Rust's char::is_whitespace (the White_Space property), from the general category. */
static bool is_ws(uint32_t cp)
{
    if ((cp >= 9 && cp <= 13) || cp == 0x85) return true;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

/* Rust's char::is_numeric: general category Nd, Nl or No. */
static bool is_numeric(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

/* Appends s[0..n) with every ill-formed subsequence replaced by U+FFFD, one per maximal
 * subpart, as Rust's String::from_utf8_lossy (and the WHATWG decoder) do. */
static void append_lossy(sbuf *out, const char *s, size_t n)
{
    static const char fffd[] = "\xEF\xBF\xBD";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned char b = u[i];
        if (b < 0x80) {
            size_t j = i + 1;
            while (j < n && u[j] < 0x80)
                j++;
            tk_sb_add(out, s + i, j - i);
            i = j;
            continue;
        }
        uint32_t cp;
        size_t w = cg_utf8_decode(u + i, n - i, &cp);
        if (w) {
            tk_sb_add(out, s + i, w);
            i += w;
            continue;
        }
        /* the maximal subpart: the longest start of a sequence that could still be valid */
        size_t k = 1;
        while (i + k < n && cg_utf8_is_prefix(u + i, k + 1))
            k++;
        tk_sb_add(out, fffd, 3);
        i += k;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Hash maps: byte string -> int32 (vocabularies) and (id, id) -> (rank, id) (merges)
 * ------------------------------------------------------------------------------------------- */

static void smap_rehash(smap *m, size_t nslots)
{
    free(m->slot);
    m->slot = cg_malloc(nslots * sizeof *m->slot);
    memset(m->slot, 0xFF, nslots * sizeof *m->slot);
    m->mask = nslots - 1;
    for (size_t i = 0; i < m->n; i++) {
        size_t s = m->ent[i].h & m->mask;
        while (m->slot[s] != NO_ID)
            s = (s + 1) & m->mask;
        m->slot[s] = (uint32_t)i;
    }
}

static uint32_t smap_hash(const char *k, size_t n)
{
    return (uint32_t)XXH3_64bits(k, n);
}

/* Slot holding key k, or the empty slot where it would go. */
static size_t smap_find(const smap *m, const char *k, size_t n, uint32_t h)
{
    size_t s = h & m->mask;
    for (;;) {
        uint32_t e = m->slot[s];
        if (e == NO_ID) return s;
        const smap_ent *x = &m->ent[e];
        if (x->h == h && x->len == n && memcmp(m->keys.p + x->off, k, n) == 0) return s;
        s = (s + 1) & m->mask;
    }
}

void tk_smap_put(smap *m, const char *k, size_t n, int32_t v)
{
    if (!m->slot) smap_rehash(m, 64);
    uint32_t h = smap_hash(k, n);
    size_t s = smap_find(m, k, n, h);
    if (m->slot[s] != NO_ID) {
        m->ent[m->slot[s]].val = v;
        return;
    }
    tk_grow(&m->ent, &m->cap, m->n + 1, sizeof *m->ent);
    m->ent[m->n] = (smap_ent){(uint32_t)m->keys.n, (uint32_t)n, v, h};
    tk_sb_add(&m->keys, k, n);
    m->slot[s] = (uint32_t)m->n++;
    if (m->n * 2 > m->mask + 1) smap_rehash(m, (m->mask + 1) * 2);
}

int32_t tk_smap_get(const smap *m, const char *k, size_t n)
{
    if (!m->slot) return -1;
    size_t s = smap_find(m, k, n, smap_hash(k, n));
    return m->slot[s] == NO_ID ? -1 : m->ent[m->slot[s]].val;
}

void tk_smap_free(smap *m)
{
    cg_free(&m->slot);
    cg_free(&m->ent);
    tk_sb_free(&m->keys);
    m->n = m->cap = 0;
}

static inline size_t pmap_slot(uint64_t k, size_t mask)
{
    k ^= k >> 29;
    k *= 0xBF58476D1CE4E5B9ull;
    k ^= k >> 32;
    return (size_t)k & mask;
}

void tk_pmap_init(pmap *m, size_t expected)
{
    size_t n = 64;
    while (n < expected + expected / 2)
        n *= 2;
    m->v = cg_malloc(n * sizeof *m->v);
    for (size_t i = 0; i < n; i++)
        m->v[i].key = UINT64_MAX;
    m->mask = n - 1;
    m->n = 0;
}

void tk_pmap_put(pmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id)
{
    uint64_t k = (uint64_t)a << 32 | b;
    size_t s = pmap_slot(k, m->mask);
    while (m->v[s].key != UINT64_MAX && m->v[s].key != k)
        s = (s + 1) & m->mask;
    if (m->v[s].key == UINT64_MAX) m->n++;
    m->v[s] = (pent){k, (uint64_t)rank << 32 | id};
}

static inline bool pmap_get(const pmap *m, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *id)
{
    if (!m->v) return false;
    uint64_t k = (uint64_t)a << 32 | b;
    for (size_t s = pmap_slot(k, m->mask);; s = (s + 1) & m->mask) {
        const pent *e = &m->v[s];
        if (e->key == k) {
            *rank = (uint32_t)(e->val >> 32);
            *id = (uint32_t)e->val;
            return true;
        }
        if (e->key == UINT64_MAX) return false;
    }
}

void tk_pmap_free(pmap *m)
{
    cg_free(&m->v);
}

int tk_hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Tokenizer structure
 * ------------------------------------------------------------------------------------------- */

/* Byte-level alphabet of GPT-2: byte b <-> one printable code point. */
static uint32_t bl_cp[256];
static char bl_utf8[256][2]; /* bl_cp as UTF-8 (one or two bytes) */
static uint8_t bl_utf8_len[256];
static int16_t bl_byte[324]; /* code point -> byte, -1 */
void tk_bl_init(void)
{
    for (int i = 0; i < 324; i++)
        bl_byte[i] = -1;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        bl_cp[b] = keep ? (uint32_t)b : next++;
        bl_byte[bl_cp[b]] = (int16_t)b;
        bl_utf8_len[b] = (uint8_t)u8enc(bl_cp[b], bl_utf8[b]);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Encoding: scratch state of one call
 * ------------------------------------------------------------------------------------------- */

static void pl_reset(plist *l)
{
    l->buf.n = 0;
    l->n = 0;
}

static void pl_add(plist *l, const char *s, size_t n, bool first)
{
    tk_grow(&l->v, &l->cap, l->n + 1, sizeof *l->v);
    l->v[l->n++] = (span){(uint32_t)l->buf.n, (uint32_t)n, first};
    tk_sb_add(&l->buf, s, n);
}

static void pl_free(plist *l)
{
    tk_sb_free(&l->buf);
    cg_free(&l->v);
    l->n = l->cap = 0;
}

static void mr_add(ectx *c, size_t s, size_t e, bool m)
{
    tk_grow(&c->mr, &c->cmr, c->nmr + 1, sizeof *c->mr);
    c->mr[c->nmr++] = (mrange){s, e, m};
}

static void kr_add(ectx *c, size_t s, size_t e)
{
    tk_grow(&c->kr, &c->ckr, c->nkr + 1, sizeof *c->kr);
    c->kr[c->nkr++] = (mrange){s, e, false};
}

static void ids_add(cg_tokens *o, int32_t id)
{
    tk_grow(&o->ids, &o->cap, o->n + 1, sizeof *o->ids);
    o->ids[o->n++] = id;
}

/* Matches of re over s[0..n) as tokenizers' Pattern::find_matches sees them: the whole string
 * covered by alternating (non-)matches. Iteration follows Rust's find_iter: after a match,
 * an empty match ending where the last one ended is skipped. Returns -1 on an engine error. */
static int find_matches_rx(ectx *c, const pcre2_code *re, const char *s, size_t n)
{
    c->nmr = 0;
    if (n == 0) {
        mr_add(c, 0, 0, false);
        return 0;
    }
    size_t pos = 0, prev = 0, last_end = SIZE_MAX;
    while (pos <= n) {
        size_t ms, me;
        int rc = tk_rx_match(re, s, n, pos, 0, c->md, &ms, &me);
        if (rc < 0) return -1;
        if (rc == 0) break;
        if (ms == me && last_end == me) {
            if (pos >= n) break;
            pos += u8len((unsigned char)s[pos]);
            continue;
        }
        if (prev != ms) mr_add(c, prev, ms, false);
        mr_add(c, ms, me, true);
        prev = me;
        pos = me;
        last_end = me;
    }
    if (prev != n) mr_add(c, prev, n, false);
    return 0;
}

/* Matches of a character predicate: each matching character is one match. */
static void find_matches_char(ectx *c, const char *s, size_t n, bool (*pred)(uint32_t, uint32_t),
                              uint32_t arg)
{
    c->nmr = 0;
    if (n == 0) {
        mr_add(c, 0, 0, false);
        return;
    }
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t cp = u8dec(s + i, &l);
        if (pred(cp, arg)) {
            if (last < i) mr_add(c, last, i, false);
            mr_add(c, i, i + l, true);
            last = i + l;
        }
        i += l;
    }
    if (last < n) mr_add(c, last, n, false);
}

/* Applies a split behaviour to c->mr; the kept ranges go to c->kr (empty ones included, the
 * caller drops them). */
static void apply_behavior(ectx *c, behavior b, bool invert)
{
    c->nkr = 0;
    if (invert)
        for (size_t i = 0; i < c->nmr; i++)
            c->mr[i].m = !c->mr[i].m;
    bool prev_match = false;
    switch (b) {
    case BEH_ISOLATED:
        for (size_t i = 0; i < c->nmr; i++)
            kr_add(c, c->mr[i].s, c->mr[i].e);
        break;
    case BEH_REMOVED:
        for (size_t i = 0; i < c->nmr; i++)
            if (!c->mr[i].m) kr_add(c, c->mr[i].s, c->mr[i].e);
        break;
    case BEH_MERGED_PREV:
    case BEH_CONTIGUOUS:
        /* a range joins the one before: a match after a non-match (MergedWithPrevious), or
         * any range of the same kind as the one before (Contiguous) */
        for (size_t i = 0; i < c->nmr; i++) {
            bool join = b == BEH_CONTIGUOUS ? c->mr[i].m == prev_match : c->mr[i].m && !prev_match;
            if (join && c->nkr)
                c->kr[c->nkr - 1].e = c->mr[i].e;
            else
                kr_add(c, c->mr[i].s, c->mr[i].e);
            prev_match = c->mr[i].m;
        }
        break;
    case BEH_MERGED_NEXT:
        for (size_t i = c->nmr; i-- > 0;) {
            if (c->mr[i].m && !prev_match && c->nkr)
                c->kr[c->nkr - 1].s = c->mr[i].s;
            else
                kr_add(c, c->mr[i].s, c->mr[i].e);
            prev_match = c->mr[i].m;
        }
        for (size_t i = 0, j = c->nkr; i < j / 2; i++) {
            mrange x = c->kr[i];
            c->kr[i] = c->kr[j - 1 - i];
            c->kr[j - 1 - i] = x;
        }
        break;
    }
}

/* Emits the kept ranges of piece s (of span p) into out, dropping empty ones. */
static void emit_kept(ectx *c, const char *s, bool first, plist *out)
{
    for (size_t i = 0; i < c->nkr; i++)
        if (c->kr[i].e > c->kr[i].s)
            pl_add(out, s + c->kr[i].s, c->kr[i].e - c->kr[i].s, first && c->kr[i].s == 0);
}

static bool pred_eq(uint32_t cp, uint32_t arg)
{
    return cp == arg;
}

static bool pred_numeric(uint32_t cp, uint32_t arg)
{
    (void)arg;
    return is_numeric(cp);
}

/* ---------------------------------------------------------------------------------------------
 * Normalizers
 * ------------------------------------------------------------------------------------------- */

/* Replaces the matches of re in s by rep, into out. */
static int replace_all(ectx *c, const pcre2_code *re, const char *s, size_t n, const char *rep,
                       size_t rep_len, sbuf *out)
{
    if (find_matches_rx(c, re, s, n) < 0) return -1;
    for (size_t i = 0; i < c->nmr; i++) {
        if (c->mr[i].m)
            tk_sb_add(out, rep, rep_len);
        else
            tk_sb_add(out, s + c->mr[i].s, c->mr[i].e - c->mr[i].s);
    }
    return 0;
}

/* The largest lead byte in s: below 0x80 the text is ASCII, which no normalization form
 * changes; below 0xCC every code point is below U+0300, where NFC changes nothing (those
 * characters are NFC_QC=Yes with combining class 0, and composition needs a mark >= U+0300). */
static unsigned char max_lead(const char *s, size_t n)
{
    unsigned char m = 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] > m) m = (unsigned char)s[i];
    return m;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sorts each run of non-starters of b[0..n) by canonical combining class, stably (the
 * Canonical Ordering Algorithm). utf8proc's own reordering swaps neighbours, which costs time
 * quadratic in a run's length (an 'a' followed by 80k alternating U+0301 U+0316); this costs
 * O(m log m) per run of m, so a hostile prompt costs what its length does. */
static void canonical_order(utf8proc_int32_t *b, size_t n)
{
    uint64_t *keys = NULL;
    size_t keys_cap = 0;
    for (size_t i = 0; i < n;) {
        if (!utf8proc_get_property(b[i])->combining_class) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && utf8proc_get_property(b[j])->combining_class)
            j++;
        const size_t m = j - i;
        if (m <= 32) { /* the usual case: a stable insertion sort */
            for (size_t k = i + 1; k < j; k++) {
                utf8proc_int32_t x = b[k];
                int cx = utf8proc_get_property(x)->combining_class;
                size_t q = k;
                while (q > i && utf8proc_get_property(b[q - 1])->combining_class > cx) {
                    b[q] = b[q - 1];
                    q--;
                }
                b[q] = x;
            }
        } else { /* class, then position: unique keys, so any sort is stable */
            if (m > keys_cap) {
                keys_cap = m;
                keys = cg_realloc(keys, keys_cap * sizeof *keys);
            }
            for (size_t k = 0; k < m; k++)
                keys[k] = (uint64_t)utf8proc_get_property(b[i + k])->combining_class << 56 |
                          (uint64_t)k << 21 | (uint64_t)b[i + k];
            qsort(keys, m, sizeof *keys, cmp_u64);
            for (size_t k = 0; k < m; k++)
                b[i + k] = (utf8proc_int32_t)(keys[k] & 0x1FFFFF);
        }
        i = j;
    }
    free(keys);
}

cg_status cg_unicode_normalize(const char *s, size_t n, cg_nf form, cg_buf *out)
{
    const int compose = form == CG_NF_C || form == CG_NF_KC;
    utf8proc_option_t opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    if (form == CG_NF_KC || form == CG_NF_KD) opt |= UTF8PROC_COMPAT;
    size_t cap = n + 16, len = 0;
    utf8proc_int32_t *b = cg_malloc(cap * sizeof *b);
    cg_status st = CG_OK;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t uc;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &uc);
        if (k <= 0) {
            st = CG_E_UTF8;
            goto out;
        }
        i += (size_t)k;
        for (;;) { /* decomposition only: the reordering is canonical_order's */
            utf8proc_ssize_t w =
                utf8proc_decompose_char(uc, b + len, (utf8proc_ssize_t)(cap - len), opt, NULL);
            if (w < 0) {
                st = CG_E_INTERNAL;
                goto out;
            }
            if ((size_t)w <= cap - len) {
                len += (size_t)w;
                break;
            }
            cap = 2 * cap + (size_t)w;
            b = cg_realloc(b, cap * sizeof *b);
        }
    }
    canonical_order(b, len);
    if (compose) {
        utf8proc_ssize_t r =
            utf8proc_normalize_utf32(b, (utf8proc_ssize_t)len, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0) {
            st = CG_E_INTERNAL;
            goto out;
        }
        len = (size_t)r;
    }
    for (size_t i = 0; i < len; i++) {
        utf8proc_uint8_t u[4];
        utf8proc_ssize_t w = utf8proc_encode_char(b[i], u);
        if ((st = cg_buf_append(out, u, (size_t)w)) != CG_OK) goto out;
    }
out:
    free(b);
    return st;
}

int tk_normalize(ectx *c, const char *s, size_t n)
{
    const cg_tokenizer *t = c->t;
    sbuf *cur = &c->norm, *tmp = &c->tmp;
    cur->n = 0;
    tk_sb_add(cur, s, n);
    for (size_t i = 0; i < t->n_nz; i++) {
        const nz_step *z = &t->nz[i];
        tmp->n = 0;
        switch (z->kind) {
        case NZ_NFC:
        case NZ_NFD:
        case NZ_NFKC:
        case NZ_NFKD: {
            unsigned char ml = max_lead(cur->p, cur->n);
            if (ml < 0x80 || (ml < 0xCC && z->kind == NZ_NFC)) continue;
            static const cg_nf form[] = {
                [NZ_NFC] = CG_NF_C, [NZ_NFD] = CG_NF_D, [NZ_NFKC] = CG_NF_KC, [NZ_NFKD] = CG_NF_KD};
            cg_buf d;
            cg_buf_init_unbounded(&d); /* the UTF-8 of code points already decomposed */
            cg_status st = cg_unicode_normalize(cur->p, cur->n, form[z->kind], &d);
            if (st == CG_OK) tk_sb_add(tmp, d.data, d.len);
            cg_buf_free(&d);
            if (st != CG_OK) return -1;
            break;
        }
        case NZ_PREPEND:
            if (cur->n == 0) continue;
            tk_sb_add(tmp, z->str, z->str_len);
            tk_sb_add(tmp, cur->p, cur->n);
            break;
        case NZ_REPLACE:
            if (replace_all(c, z->re, cur->p, cur->n, z->str, z->str_len, tmp) < 0) return -1;
            break;
        }
        cur->n = 0;
        tk_sb_add(cur, tmp->p, tmp->n);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Pre-tokenizers
 * ------------------------------------------------------------------------------------------- */

static int pretok_step(ectx *c, const pt_step *p, const plist *in, plist *out)
{
    pl_reset(out);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->buf.p + in->v[i].off;
        size_t n = in->v[i].len;
        bool first = in->v[i].first;
        switch (p->kind) {
        case PT_SPLIT:
            if (find_matches_rx(c, p->re, s, n) < 0) return -1;
            apply_behavior(c, p->beh, p->invert);
            emit_kept(c, s, first, out);
            break;
        case PT_DIGITS:
            find_matches_char(c, s, n, pred_numeric, 0);
            apply_behavior(c, p->individual ? BEH_ISOLATED : BEH_CONTIGUOUS, false);
            emit_kept(c, s, first, out);
            break;
        case PT_BYTELEVEL: {
            sbuf *w = &c->tmp;
            w->n = 0;
            if (p->add_prefix_space && (n == 0 || s[0] != ' ')) tk_sb_add(w, " ", 1);
            tk_sb_add(w, s, n);
            if (p->use_regex) {
                if (find_matches_rx(c, p->re, w->p, w->n) < 0) return -1;
                apply_behavior(c, BEH_ISOLATED, false);
            } else {
                c->nkr = 0;
                kr_add(c, 0, w->n);
            }
            for (size_t k = 0; k < c->nkr; k++) {
                size_t a = c->kr[k].s, e = c->kr[k].e;
                if (e <= a) continue;
                tk_grow(&out->v, &out->cap, out->n + 1, sizeof *out->v);
                tk_grow(&out->buf.p, &out->buf.cap, out->buf.n + 2 * (e - a) + 1, 1);
                span sp = {(uint32_t)out->buf.n, 0, first && a == 0};
                char *o = out->buf.p + out->buf.n;
                for (size_t j = a; j < e; j++) {
                    unsigned char b = (unsigned char)w->p[j];
                    *o++ = bl_utf8[b][0];
                    if (bl_utf8_len[b] == 2) *o++ = bl_utf8[b][1];
                }
                *o = '\0';
                out->buf.n = (size_t)(o - out->buf.p);
                sp.len = (uint32_t)(out->buf.n - sp.off);
                out->v[out->n++] = sp;
            }
            break;
        }
        case PT_METASPACE: {
            sbuf *w = &c->tmp;
            w->n = 0;
            char rep[4];
            size_t rl = u8enc(p->repl, rep);
            bool starts = n >= rl && memcmp(s, rep, rl) == 0;
            /* spaces are replaced first, so a leading space counts as a leading replacement */
            if (n && s[0] == ' ') starts = true;
            if (!starts && (p->scheme == PS_ALWAYS || (p->scheme == PS_FIRST && first)))
                tk_sb_add(w, rep, rl);
            for (size_t j = 0; j < n; j++) {
                if (s[j] == ' ')
                    tk_sb_add(w, rep, rl);
                else
                    tk_sb_add(w, s + j, 1);
            }
            if (p->split) {
                find_matches_char(c, w->p, w->n, pred_eq, p->repl);
                apply_behavior(c, BEH_MERGED_NEXT, false);
            } else {
                c->nkr = 0;
                kr_add(c, 0, w->n);
            }
            emit_kept(c, w->p, first, out);
            break;
        }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * BPE model
 * ------------------------------------------------------------------------------------------- */

static inline bool hless(const hent *a, const hent *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void hpush(ectx *c, hent e)
{
    tk_grow(&c->hp, &c->chp, c->nhp + 1, sizeof *c->hp);
    size_t i = c->nhp++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(&e, &c->hp[p])) break;
        c->hp[i] = c->hp[p];
        i = p;
    }
    c->hp[i] = e;
}

static hent hpop(ectx *c)
{
    hent top = c->hp[0], last = c->hp[--c->nhp];
    size_t i = 0, n = c->nhp;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const hent *best = &last;
        if (l < n && hless(&c->hp[l], best)) {
            m = l;
            best = &c->hp[l];
        }
        if (r < n && hless(&c->hp[r], best)) m = r;
        if (m == i) break;
        c->hp[i] = c->hp[m];
        i = m;
    }
    if (n) c->hp[i] = last;
    return top;
}

static void sym_add(ectx *c, uint32_t id)
{
    tk_grow(&c->sy, &c->csy, c->nsy + 1, sizeof *c->sy);
    int32_t i = (int32_t)c->nsy;
    c->sy[c->nsy++] = (sym){id, i - 1, i + 1, false};
}

/* The word's characters as symbols (tokenizers' BPE::merge_word before merging): unknown
 * characters become <0xXX> byte tokens with byte_fallback, else the unk token (fused when
 * fuse_unk), else they are dropped. */
static void bpe_symbols(ectx *c, const char *s, size_t n)
{
    const cg_tokenizer *t = c->t;
    c->nsy = 0;
    int32_t unk = -1; /* pending unk */
    sbuf *k = &c->tmp;
    for (size_t i = 0; i < n;) {
        size_t l = u8len((unsigned char)s[i]);
        const char *key = s + i;
        size_t kl = l;
        if ((t->cs_prefix && i > 0) || (t->eow_suffix && i + l == n)) {
            k->n = 0;
            if (t->cs_prefix && i > 0) tk_sb_add(k, t->cs_prefix, t->cs_prefix_len);
            tk_sb_add(k, s + i, l);
            if (t->eow_suffix && i + l == n) tk_sb_add(k, t->eow_suffix, t->eow_suffix_len);
            key = k->p;
            kl = k->n;
        }
        i += l;
        int32_t id = tk_smap_get(&t->model_vocab, key, kl);
        if (id >= 0) {
            if (unk >= 0) sym_add(c, (uint32_t)unk);
            unk = -1;
            sym_add(c, (uint32_t)id);
            continue;
        }
        if (t->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < kl && all; j++)
                all = t->byte_ids[(unsigned char)key[j]] >= 0;
            if (all) {
                for (size_t j = 0; j < kl; j++)
                    sym_add(c, (uint32_t)t->byte_ids[(unsigned char)key[j]]);
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && !t->fuse_unk) sym_add(c, (uint32_t)unk);
            unk = t->unk_id;
        }
    }
    if (unk >= 0) sym_add(c, (uint32_t)unk);
    if (c->nsy) c->sy[c->nsy - 1].next = -1;
}

/* tokenizers' Word::merge_all: always the lowest-ranked pair, leftmost first. */
static void bpe_merge(ectx *c)
{
    const cg_tokenizer *t = c->t;
    sym *sy = c->sy;
    c->nhp = 0;
    for (size_t i = 0; i + 1 < c->nsy; i++) {
        uint32_t rank, id;
        if (pmap_get(&t->merges, sy[i].id, sy[i + 1].id, &rank, &id))
            hpush(c, (hent){rank, (uint32_t)i, id});
    }
    while (c->nhp) {
        hent top = hpop(c);
        sym *a = &c->sy[top.pos];
        if (a->gone || a->next < 0) continue;
        sym *b = &c->sy[a->next];
        uint32_t rank, id;
        if (!pmap_get(&t->merges, a->id, b->id, &rank, &id) || id != top.id) continue;
        a->id = top.id;
        b->gone = true;
        a->next = b->next;
        if (b->next >= 0) c->sy[b->next].prev = (int32_t)top.pos;
        if (a->prev >= 0 && pmap_get(&t->merges, c->sy[a->prev].id, a->id, &rank, &id))
            hpush(c, (hent){rank, (uint32_t)a->prev, id});
        if (a->next >= 0 && pmap_get(&t->merges, a->id, c->sy[a->next].id, &rank, &id))
            hpush(c, (hent){rank, top.pos, id});
    }
}

static cache_ent *cache_lookup_locked(cache_shard *sh, uint64_t h, const char *s, size_t n)
{
    cache_ent *e = sh->slot[(h >> 6) % CACHE_SLOTS];
    if (e && e->h == h && e->klen == n &&
        memcmp((const char *)((int32_t *)(e + 1) + e->nids), s, n) == 0)
        return e;
    return NULL;
}

/* Runs the model on one pre-token and appends its ids. */
static void bpe_word(ectx *c, const char *s, size_t n)
{
    const cg_tokenizer *t = c->t;
    if (n == 0) return;
    if (t->ignore_merges) {
        int32_t id = tk_smap_get(&t->model_vocab, s, n);
        if (id >= 0) {
            ids_add(c->out, id);
            return;
        }
    }
    uint64_t h = 0;
    cache_shard *sh = NULL;
    if (n < CACHE_MAX_KEY) {
        h = XXH3_64bits(s, n);
        sh = &t->cache[h % CACHE_SHARDS];
        pthread_mutex_lock(&sh->lock);
        cache_ent *e = cache_lookup_locked(sh, h, s, n);
        if (e) {
            const int32_t *ids = (const int32_t *)(e + 1);
            tk_grow(&c->out->ids, &c->out->cap, c->out->n + e->nids, sizeof *c->out->ids);
            memcpy(c->out->ids + c->out->n, ids, e->nids * sizeof *ids);
            c->out->n += e->nids;
            pthread_mutex_unlock(&sh->lock);
            return;
        }
        pthread_mutex_unlock(&sh->lock);
    }
    bpe_symbols(c, s, n);
    bpe_merge(c);
    size_t start = c->out->n;
    for (size_t i = 0; i < c->nsy; i++)
        if (!c->sy[i].gone) ids_add(c->out, (int32_t)c->sy[i].id);
    if (sh) {
        uint32_t k = (uint32_t)(c->out->n - start);
        cache_ent *e = cg_malloc(sizeof *e + k * sizeof(int32_t) + n);
        e->h = h;
        e->klen = (uint32_t)n;
        e->nids = k;
        memcpy(e + 1, c->out->ids + start, k * sizeof(int32_t));
        memcpy((char *)((int32_t *)(e + 1) + k), s, n);
        pthread_mutex_lock(&sh->lock);
        cache_ent **slot = &sh->slot[(h >> 6) % CACHE_SLOTS];
        free(*slot);
        *slot = e;
        pthread_mutex_unlock(&sh->lock);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Added tokens
 * ------------------------------------------------------------------------------------------- */

void tk_trie_insert(trie *tr, const char *s, size_t n, int32_t tok)
{
    if (!tr->n) {
        tk_grow(&tr->v, &tr->cap, 1, sizeof *tr->v);
        tr->v[tr->n++] = (trie_node){NO_ID, NO_ID, -1, 0};
    }
    uint32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        uint32_t ch = tr->v[cur].child;
        while (ch != NO_ID && tr->v[ch].byte != b)
            ch = tr->v[ch].sibling;
        if (ch == NO_ID) {
            tk_grow(&tr->v, &tr->cap, tr->n + 1, sizeof *tr->v);
            ch = (uint32_t)tr->n++;
            tr->v[ch] = (trie_node){NO_ID, tr->v[cur].child, -1, b};
            tr->v[cur].child = ch;
        }
        cur = ch;
    }
    if (tr->v[cur].tok < 0) tr->v[cur].tok = tok; /* a duplicate keeps the first token */
    tr->first[(unsigned char)s[0]] = true;
}

/* Longest token starting at s[i], its length in *len; -1 when none. */
static int32_t trie_longest(const trie *tr, const char *s, size_t n, size_t i, size_t *len)
{
    int32_t best = -1;
    uint32_t cur = 0;
    for (size_t j = i; j < n; j++) {
        uint32_t ch = tr->v[cur].child;
        while (ch != NO_ID && tr->v[ch].byte != (unsigned char)s[j])
            ch = tr->v[ch].sibling;
        if (ch == NO_ID) break;
        cur = ch;
        if (tr->v[cur].tok >= 0) {
            best = tr->v[cur].tok;
            *len = j + 1 - i;
        }
    }
    return best;
}

/* Rust regex's \w at the code point starting at s[i]. */
static bool word_at(const cg_tokenizer *t, ectx *c, const char *s, size_t n, size_t i)
{
    size_t ms, me;
    return tk_rx_match(t->word_rx, s, n, i, PCRE2_ANCHORED, c->md, &ms, &me) == 1;
}

typedef struct seg {
    size_t s, e;
    int32_t tok; /* index into added, -1 for text */
} seg;

/* tokenizers' AddedVocabulary::find_matches: the leftmost-longest matches in s[0..n), with
 * single_word, lstrip and rstrip applied, as segments covering the string. */
static void find_added(ectx *c, const trie *tr, const char *s, size_t n, seg **out, size_t *nout,
                       size_t *cap)
{
    const cg_tokenizer *t = c->t;
    *nout = 0;
    size_t start_off = 0;
    for (size_t i = 0; tr->n && i < n;) {
        size_t ml = 0;
        int32_t k = tr->first[(unsigned char)s[i]] ? trie_longest(tr, s, n, i, &ml) : -1;
        if (k < 0) {
            i++;
            continue;
        }
        const added_tok *a = &t->added[k];
        size_t ms = i, me = i + ml;
        if (a->special && c->split_special) { /* plain text: look again one byte on */
            i++;
            continue;
        }
        i = me; /* matching resumes after this match, kept or not */
        if (a->single_word) {
            bool ok_start = ms == 0 || !word_at(t, c, s, n, u8prev(s, ms));
            bool ok_stop = me == n || !word_at(t, c, s, n, me);
            if (!ok_start || !ok_stop) continue;
        }
        if (a->lstrip) {
            size_t ns = ms;
            while (ns > 0) {
                size_t p = u8prev(s, ns), l;
                if (!is_ws(u8dec(s + p, &l))) break;
                ns = p;
            }
            ms = ns > start_off ? ns : start_off;
        }
        if (a->rstrip) {
            while (me < n) {
                size_t l;
                if (!is_ws(u8dec(s + me, &l))) break;
                me += l;
            }
            i = me;
        }
        tk_grow(out, cap, *nout + 2, sizeof **out);
        if (start_off < ms) (*out)[(*nout)++] = (seg){start_off, ms, -1};
        (*out)[(*nout)++] = (seg){ms, me, k};
        start_off = me;
    }
    if (start_off < n) {
        tk_grow(out, cap, *nout + 1, sizeof **out);
        (*out)[(*nout)++] = (seg){start_off, n, -1};
    }
}

/* ---------------------------------------------------------------------------------------------
 * Encode
 * ------------------------------------------------------------------------------------------- */

/* Asks the cancel hook once about every 64 KiB of input bytes worked through. */
static void ask_cancelled(ectx *c, size_t bytes)
{
    c->checked += bytes + 1;
    if (!c->cancelled || c->checked < (64u << 10)) return;
    c->checked = 0;
    if (c->cancelled(c->cancel_ud)) c->over = c->gone = true;
}

/* Pre-tokenizes one normalized piece and runs the model on each pre-token. */
static int encode_piece(ectx *c, const char *s, size_t n, bool first)
{
    const cg_tokenizer *t = c->t;
    if (n == 0) return 0;
    plist *in = &c->pa, *out = &c->pb;
    pl_reset(in);
    pl_add(in, s, n, first);
    for (size_t i = 0; i < t->n_pt; i++) {
        if (pretok_step(c, &t->pt[i], in, out) < 0) return -1;
        plist *x = in;
        in = out;
        out = x;
    }
    for (size_t i = 0; i < in->n && !c->over; i++) {
        bpe_word(c, in->buf.p + in->v[i].off, in->v[i].len);
        c->over = c->limit && c->out->n - c->start > c->limit;
        ask_cancelled(c, in->v[i].len);
    }
    return 0;
}

static cg_status encode_hf(const cg_tokenizer *t, const char *text, size_t len,
                           const cg_encode_opts *o, cg_tokens *out)
{
    if (!cg_utf8_valid(text, len)) return CG_E_UTF8;
    cg_status st = CG_OK;
    const int add_special = o->add_special;
    size_t start = out->n;
    ectx c = {.t = t,
              .out = out,
              .start = start,
              .limit = o->max_tokens,
              .split_special = o->split_special != 0,
              .cancelled = o->cancelled,
              .cancel_ud = o->cancel_ud};
    c.md = pcre2_match_data_create(1, NULL);
    if (!c.md) abort();
    seg *s1 = NULL, *s2 = NULL;
    size_t n1 = 0, n2 = 0, c1 = 0, c2 = 0;
    find_added(&c, &t->raw_trie, text, len, &s1, &n1, &c1);
    for (size_t i = 0; i < n1 && !c.over; i++) {
        if (s1[i].tok >= 0) {
            ids_add(out, t->added[s1[i].tok].id);
            continue;
        }
        /* c.norm is written only by normalize(): it holds the piece while its parts are encoded */
        ask_cancelled(&c, s1[i].e - s1[i].s);
        if (c.over) break;
        if (tk_normalize(&c, text + s1[i].s, s1[i].e - s1[i].s) < 0) goto fail;
        find_added(&c, &t->norm_trie, c.norm.p, c.norm.n, &s2, &n2, &c2);
        for (size_t j = 0; j < n2 && !c.over; j++) {
            if (s2[j].tok >= 0)
                ids_add(out, t->added[s2[j].tok].id);
            else if (encode_piece(&c, c.norm.p + s2[j].s, s2[j].e - s2[j].s,
                                  s1[i].s == 0 && s2[j].s == 0) < 0)
                goto fail;
        }
    }
    if (c.over || (c.limit && out->n - start > c.limit)) {
        out->n = start;
        st = c.gone ? CG_E_UNAVAILABLE : CG_E_CONTEXT;
        goto out;
    }
    if (add_special && t->n_tmpl) {
        size_t k = out->n - start;
        int32_t *seq = cg_malloc((k ? k : 1) * sizeof *seq);
        if (k) memcpy(seq, out->ids + start, k * sizeof *seq);
        out->n = start;
        for (size_t i = 0; i < t->n_tmpl; i++) {
            if (t->tmpl[i] >= 0) {
                ids_add(out, t->tmpl[i]);
                continue;
            }
            if (!k) continue;
            tk_grow(&out->ids, &out->cap, out->n + k, sizeof *out->ids);
            memcpy(out->ids + out->n, seq, k * sizeof *seq);
            out->n += k;
        }
        free(seq);
        if (c.limit && out->n - start > c.limit) {
            out->n = start;
            st = CG_E_CONTEXT;
        }
    }
    goto out;
fail:
    out->n = start;
    st = CG_E_INTERNAL;
out:
    free(s1);
    free(s2);
    pl_free(&c.pa);
    pl_free(&c.pb);
    free(c.mr);
    free(c.kr);
    tk_sb_free(&c.tmp);
    tk_sb_free(&c.norm);
    free(c.sy);
    free(c.hp);
    pcre2_match_data_free(c.md);
    return st;
}

void cg_tokens_free(cg_tokens *t)
{
    if (!t) return;
    cg_free(&t->ids);
    t->n = t->cap = 0;
}

cg_encode_opts cg_encode_default_opts(void)
{
    return (cg_encode_opts){.add_special = 1, .split_special = 0, .max_tokens = 0};
}

cg_status cg_tokenizer_encode_opts(const cg_tokenizer *t, const char *text, size_t len,
                                   const cg_encode_opts *o, cg_tokens *out)
{
    if (!t->bytes) return encode_hf(t, text, len, o, out);
    if (o->max_tokens && len + (o->add_special ? 1 : 0) > o->max_tokens) return CG_E_CONTEXT;
    tk_grow(&out->ids, &out->cap, out->n + len + 1, sizeof *out->ids);
    if (o->add_special) out->ids[out->n++] = t->bos;
    for (size_t i = 0; i < len; i++)
        out->ids[out->n++] = (unsigned char)text[i];
    return CG_OK;
}

cg_status cg_tokenizer_encode(const cg_tokenizer *t, const char *text, size_t len, int add_special,
                              cg_tokens *out)
{
    cg_encode_opts o = cg_encode_default_opts();
    o.add_special = add_special;
    return cg_tokenizer_encode_opts(t, text, len, &o, out);
}

/* ---------------------------------------------------------------------------------------------
 * Decode
 * ------------------------------------------------------------------------------------------- */

static bool token_has(const cg_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->str_off[id] != NO_ID;
}

/* Replaces pattern matches in each token; the match list uses a throwaway context. */
static int dc_replace(const dc_step *d, plist *in, plist *out, ectx *c)
{
    pl_reset(out);
    for (size_t i = 0; i < in->n; i++) {
        sbuf *w = &c->tmp;
        w->n = 0;
        if (replace_all(c, d->re, in->buf.p + in->v[i].off, in->v[i].len, d->str, d->str_len, w) <
            0)
            return -1;
        pl_add(out, w->p ? w->p : "", w->n, false);
    }
    return 0;
}

/* "<0xXX>" -> byte, as tokenizers' ByteFallback reads it (u8::from_str_radix accepts a '+'). */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = tk_hexval(s[3]), lo = tk_hexval(s[4]);
    if (s[3] == '+' && lo >= 0) return lo;
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static void dc_bytefallback(plist *in, plist *out)
{
    pl_reset(out);
    sbuf pend = {0};
    for (size_t i = 0; i <= in->n; i++) {
        int b = i < in->n ? byte_token(in->buf.p + in->v[i].off, in->v[i].len) : -1;
        if (b >= 0) {
            char ch = (char)b;
            tk_sb_add(&pend, &ch, 1);
            continue;
        }
        if (pend.n) {
            if (cg_utf8_valid(pend.p, pend.n))
                pl_add(out, pend.p, pend.n, false);
            else
                for (size_t k = 0; k < pend.n; k++)
                    pl_add(out, "\xEF\xBF\xBD", 3, false);
            pend.n = 0;
        }
        if (i < in->n) pl_add(out, in->buf.p + in->v[i].off, in->v[i].len, false);
    }
    tk_sb_free(&pend);
}

static void dc_strip(const dc_step *d, plist *in, plist *out)
{
    pl_reset(out);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->buf.p + in->v[i].off;
        size_t n = in->v[i].len, a = 0, e = n;
        for (size_t k = 0; k < d->start && a < n; k++) {
            size_t l;
            if (u8dec(s + a, &l) != d->ch) break;
            a += l;
        }
        for (size_t k = 0; k < d->stop && e > a; k++) {
            size_t p = u8prev(s, e), l;
            if (u8dec(s + p, &l) != d->ch) break;
            e = p;
        }
        pl_add(out, s + a, e - a, false);
    }
}

static void dc_metaspace(const dc_step *d, plist *in, plist *out)
{
    pl_reset(out);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->buf.p + in->v[i].off;
        size_t n = in->v[i].len;
        tk_grow(&out->v, &out->cap, out->n + 1, sizeof *out->v);
        span sp = {(uint32_t)out->buf.n, 0, false};
        for (size_t j = 0; j < n;) {
            size_t l;
            uint32_t cp = u8dec(s + j, &l);
            if (cp == d->ch) {
                if (!(i == 0 && d->scheme != PS_NEVER)) tk_sb_add(&out->buf, " ", 1);
            } else
                tk_sb_add(&out->buf, s + j, l);
            j += l;
        }
        sp.len = (uint32_t)(out->buf.n - sp.off);
        out->v[out->n++] = sp;
    }
}

/* Byte-level: each token's characters back to bytes (a token with a character outside the
 * alphabet keeps its UTF-8), all concatenated, then made valid UTF-8. */
static void bytelevel_bytes(const char *s, size_t n, sbuf *out)
{
    size_t mark = out->n;
    for (size_t j = 0; j < n;) {
        size_t l;
        uint32_t cp = u8dec(s + j, &l);
        if (cp >= 324 || bl_byte[cp] < 0) {
            out->n = mark;
            tk_sb_add(out, s, n);
            return;
        }
        char b = (char)bl_byte[cp];
        tk_sb_add(out, &b, 1);
        j += l;
    }
}

static void dc_bytelevel(plist *in, plist *out)
{
    sbuf raw = {0};
    for (size_t i = 0; i < in->n; i++)
        bytelevel_bytes(in->buf.p + in->v[i].off, in->v[i].len, &raw);
    pl_reset(out);
    sbuf fixed = {0};
    append_lossy(&fixed, raw.p ? raw.p : "", raw.n);
    pl_add(out, fixed.p ? fixed.p : "", fixed.n, false);
    tk_sb_free(&raw);
    tk_sb_free(&fixed);
}

static void dc_fuse(plist *in, plist *out)
{
    pl_reset(out);
    sbuf all = {0};
    for (size_t i = 0; i < in->n; i++)
        tk_sb_add(&all, in->buf.p + in->v[i].off, in->v[i].len);
    pl_add(out, all.p ? all.p : "", all.n, false);
    tk_sb_free(&all);
}

/* transformers' clean_up_tokenization: a fixed list of English spacing fixes, in order. */
static void clean_up(sbuf *s)
{
    static const char *const from[] = {" .",   " ?",  " !",  " ,",   " ' ",
                                       " n't", " 'm", " 's", " 've", " 're"};
    static const char *const to[] = {".", "?", "!", ",", "'", "n't", "'m", "'s", "'ve", "'re"};
    for (size_t r = 0; r < CG_ARRAY_LEN(from); r++) {
        size_t fl = strlen(from[r]), tl = strlen(to[r]), w = 0;
        if (s->n < fl) continue;
        for (size_t i = 0; i < s->n;) {
            if (i + fl <= s->n && memcmp(s->p + i, from[r], fl) == 0) {
                memmove(s->p + w, to[r], tl);
                w += tl;
                i += fl;
            } else
                s->p[w++] = s->p[i++];
        }
        s->n = w;
        s->p[w] = '\0';
    }
}

cg_status cg_tokenizer_decode(const cg_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                              cg_buf *out)
{
    if (t->bytes) {
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] > 255) continue;
            char b = (char)ids[i];
            cg_status st = cg_buf_append(out, &b, 1);
            if (st != CG_OK) return st;
        }
        return CG_OK;
    }
    cg_status st = CG_OK;
    ectx c = {.t = t};
    plist a = {0}, b = {0};
    for (size_t i = 0; i < n; i++) {
        if (!token_has(t, ids[i])) continue;
        if (skip_special && t->special[ids[i]]) continue;
        pl_add(&a, t->strs.p + t->str_off[ids[i]], t->str_len[ids[i]], false);
    }
    sbuf res = {0};
    if (!t->has_decoder) {
        for (size_t i = 0; i < a.n; i++) {
            if (i) tk_sb_add(&res, " ", 1);
            tk_sb_add(&res, a.buf.p + a.v[i].off, a.v[i].len);
        }
    } else {
        plist *in = &a, *o = &b;
        for (size_t k = 0; k < t->n_dc; k++) {
            const dc_step *d = &t->dc[k];
            switch (d->kind) {
            case DC_BYTELEVEL:
                dc_bytelevel(in, o);
                break;
            case DC_METASPACE:
                dc_metaspace(d, in, o);
                break;
            case DC_BYTEFALLBACK:
                dc_bytefallback(in, o);
                break;
            case DC_FUSE:
                dc_fuse(in, o);
                break;
            case DC_STRIP:
                dc_strip(d, in, o);
                break;
            case DC_REPLACE:
                if (!c.md) c.md = pcre2_match_data_create(1, NULL);
                if (dc_replace(d, in, o, &c) < 0) {
                    st = CG_E_INTERNAL;
                    goto out;
                }
                break;
            }
            plist *x = in;
            in = o;
            o = x;
        }
        for (size_t i = 0; i < in->n; i++)
            tk_sb_add(&res, in->buf.p + in->v[i].off, in->v[i].len);
    }
    if (t->clean_up && res.n) clean_up(&res);
    st = cg_buf_append(out, res.p ? res.p : "", res.n);
out:
    tk_sb_free(&res);
    pl_free(&a);
    pl_free(&b);
    free(c.mr);
    free(c.kr);
    tk_sb_free(&c.tmp);
    if (c.md) pcre2_match_data_free(c.md);
    return st;
}

int tk_stream_bytes(const cg_tokenizer *t, ectx *c, const char *s, size_t n, sbuf *out)
{
    out->n = 0;
    tk_sb_add(out, s, n);
    if (!t->has_decoder) return 0;
    sbuf w = {0};
    int rc = 0;
    for (size_t k = 0; k < t->n_dc; k++) {
        const dc_step *d = &t->dc[k];
        w.n = 0;
        switch (d->kind) {
        case DC_BYTELEVEL:
            bytelevel_bytes(out->p, out->n, &w);
            break;
        case DC_METASPACE:
            for (size_t j = 0; j < out->n;) {
                size_t l;
                uint32_t cp = u8dec(out->p + j, &l);
                if (cp == d->ch)
                    tk_sb_add(&w, " ", 1);
                else
                    tk_sb_add(&w, out->p + j, l);
                j += l;
            }
            break;
        case DC_BYTEFALLBACK: {
            int b = byte_token(out->p, out->n);
            if (b < 0)
                tk_sb_add(&w, out->p, out->n);
            else {
                char ch = (char)b;
                tk_sb_add(&w, &ch, 1);
            }
            break;
        }
        case DC_REPLACE:
            if (!cg_utf8_valid(out->p, out->n)) continue; /* a raw byte: nothing to replace */
            if (replace_all(c, d->re, out->p, out->n, d->str, d->str_len, &w) < 0) rc = -1;
            break;
        case DC_FUSE:
        case DC_STRIP:
            continue;
        }
        out->n = 0;
        tk_sb_add(out, w.p ? w.p : "", w.n);
    }
    tk_sb_free(&w);
    return rc;
}

const char *cg_tokenizer_token_bytes(const cg_tokenizer *t, int32_t id, size_t *len)
{
    if (t->bytes) {
        static const char bytes[256] = {
#define B4(i) (char)(i), (char)(i + 1), (char)(i + 2), (char)(i + 3)
#define B16(i) B4(i), B4(i + 4), B4(i + 8), B4(i + 12)
#define B64(i) B16(i), B16(i + 16), B16(i + 32), B16(i + 48)
            B64(0), B64(64), B64(128), B64(192)
#undef B64
#undef B16
#undef B4
        };
        *len = id >= 0 && id < 256 ? 1 : 0;
        return *len ? bytes + id : "";
    }
    if (!token_has(t, id)) {
        *len = 0;
        return "";
    }
    *len = t->sb_len[id];
    return t->sbytes.p + t->sb_off[id];
}

const char *cg_tokenizer_token_str(const cg_tokenizer *t, int32_t id, size_t *len)
{
    if (t->bytes || !token_has(t, id)) {
        *len = 0;
        return NULL;
    }
    *len = t->str_len[id];
    return t->strs.p + t->str_off[id];
}

int32_t cg_tokenizer_vocab_size(const cg_tokenizer *t)
{
    return t->n_ids;
}

int32_t cg_tokenizer_bos(const cg_tokenizer *t)
{
    return t->bos;
}

int32_t cg_tokenizer_eos(const cg_tokenizer *t)
{
    return t->eos;
}

int cg_tokenizer_adds_bos(const cg_tokenizer *t)
{
    return t->adds_bos;
}

int32_t cg_tokenizer_token_id(const cg_tokenizer *t, const char *s)
{
    if (t->bytes) return -1;
    size_t n = strlen(s);
    int32_t k = tk_smap_get(&t->added_map, s, n);
    if (k >= 0) return t->added[k].id;
    return tk_smap_get(&t->model_vocab, s, n);
}

int cg_tokenizer_is_special(const cg_tokenizer *t, int32_t id)
{
    if (t->bytes) return id >= 0 && (id == t->bos || id == t->eos);
    return id >= 0 && id < t->n_ids && t->special[id];
}

const char *cg_tokenizer_chat_template(const cg_tokenizer *t)
{
    return t->chat_template;
}
