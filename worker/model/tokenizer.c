/* Hugging Face tokenizer.json tokenizers and the tiny model's byte tokenizer. The pipeline and
 * its corner cases follow the `tokenizers` library (Rust) so that ids match token for token:
 * added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor, and the decoder chain
 * on the way back. Regexes run on PCRE2 (UTF + UCP + JIT), rewritten where Oniguruma, which
 * tokenizers uses, defines a class differently; Unicode normalization comes from utf8proc. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "worker/model/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "cache/split.h" /* cg_utf8_valid */

#define NO_ID UINT32_MAX

/* ---------------------------------------------------------------------------------------------
 * Small helpers: growable arrays, UTF-8
 * ------------------------------------------------------------------------------------------- */

/* Grows *p (elements of size sz, capacity *cap) to hold at least need elements. */
static void grow(void *pp, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    *(void **)pp = cg_realloc(*(void **)pp, c * sz);
    *cap = c;
}

/* A byte string under construction (no cap: these hold tokenizer-internal data). */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const void *s, size_t n)
{
    grow(&b->p, &b->cap, b->n + n + 1, 1);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_free(sbuf *b)
{
    cg_free(&b->p);
    b->n = b->cap = 0;
}

static inline size_t u8len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Decodes the code point at s (valid UTF-8, at least one byte) and its length. */
static inline uint32_t u8dec(const char *s, size_t *len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t l = u8len(u[0]);
    *len = l;
    switch (l) {
    case 1:
        return u[0];
    case 2:
        return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    case 3:
        return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    default:
        return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 |
               (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
    }
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
            sb_add(out, s + i, j - i);
            i = j;
            continue;
        }
        size_t w = (b >= 0xC2 && b <= 0xDF)   ? 2
                   : (b >= 0xE0 && b <= 0xEF) ? 3
                   : (b >= 0xF0 && b <= 0xF4) ? 4
                                              : 0;
        if (!w) {
            sb_add(out, fffd, 3);
            i++;
            continue;
        }
        unsigned char lo = 0x80, hi = 0xBF;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
        size_t k = 1;
        if (i + 1 < n && u[i + 1] >= lo && u[i + 1] <= hi) {
            k = 2;
            while (k < w && i + k < n && (u[i + k] & 0xC0) == 0x80)
                k++;
        }
        if (k == w)
            sb_add(out, s + i, w);
        else
            sb_add(out, fffd, 3);
        i += k;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Hash maps: byte string -> int32 (vocabularies) and (id, id) -> (rank, id) (merges)
 * ------------------------------------------------------------------------------------------- */

typedef struct smap_ent {
    uint32_t off, len;
    int32_t val;
    uint32_t h;
} smap_ent;

typedef struct smap {
    uint32_t *slot; /* index into ent, NO_ID when empty */
    size_t mask;
    smap_ent *ent;
    size_t n, cap;
    sbuf keys;
} smap;

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

/* Inserts or overwrites k -> v. */
static void smap_put(smap *m, const char *k, size_t n, int32_t v)
{
    if (!m->slot) smap_rehash(m, 64);
    uint32_t h = smap_hash(k, n);
    size_t s = smap_find(m, k, n, h);
    if (m->slot[s] != NO_ID) {
        m->ent[m->slot[s]].val = v;
        return;
    }
    grow(&m->ent, &m->cap, m->n + 1, sizeof *m->ent);
    m->ent[m->n] = (smap_ent){(uint32_t)m->keys.n, (uint32_t)n, v, h};
    sb_add(&m->keys, k, n);
    m->slot[s] = (uint32_t)m->n++;
    if (m->n * 2 > m->mask + 1) smap_rehash(m, (m->mask + 1) * 2);
}

static int32_t smap_get(const smap *m, const char *k, size_t n)
{
    if (!m->slot) return -1;
    size_t s = smap_find(m, k, n, smap_hash(k, n));
    return m->slot[s] == NO_ID ? -1 : m->ent[m->slot[s]].val;
}

static void smap_free(smap *m)
{
    cg_free(&m->slot);
    cg_free(&m->ent);
    sb_free(&m->keys);
    m->n = m->cap = 0;
}

typedef struct pent {
    uint64_t key; /* (a << 32 | b), UINT64_MAX when empty */
    uint64_t val; /* (rank << 32 | new_id) */
} pent;

typedef struct pmap {
    pent *v;
    size_t mask, n;
} pmap;

static inline size_t pmap_slot(uint64_t k, size_t mask)
{
    k ^= k >> 29;
    k *= 0xBF58476D1CE4E5B9ull;
    k ^= k >> 32;
    return (size_t)k & mask;
}

static void pmap_init(pmap *m, size_t expected)
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

/* Inserts or overwrites: a later merge of the same pair replaces the earlier rank, as the
 * HashMap that tokenizers collects the merges into does. */
static void pmap_put(pmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id)
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

static void pmap_free(pmap *m)
{
    cg_free(&m->v);
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Regexes (PCRE2)
 * ------------------------------------------------------------------------------------------- */

/* Rewrites a tokenizers (Oniguruma) pattern for PCRE2 with UCP. The classes that differ:
 * Oniguruma's \s is White_Space (PCRE2 adds U+180E), \w is letters, marks, numbers and
 * connector punctuation (PCRE2 lacks marks), \uHHHH is a code point (PCRE2: an error), \h is a
 * hex digit (PCRE2: horizontal space). \b, \B, \h, \H, \W inside a class, POSIX classes,
 * nested classes and class intersection are refused rather than approximated. (^ and $ are line
 * anchors in Oniguruma: rx_compile sets PCRE2_MULTILINE.) Returns NULL and sets why on refusal. */
static char *rx_rewrite(const char *p, size_t n, const char **why)
{
    static const char word[] = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
    sbuf o = {0};
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            i++;
            switch (d) {
            case 's':
                sb_add(&o, "\\p{White_Space}", 15);
                break;
            case 'S':
                sb_add(&o, "\\P{White_Space}", 15);
                break;
            case 'w':
                if (in_class)
                    sb_add(&o, word, sizeof word - 1);
                else {
                    sb_add(&o, "[", 1);
                    sb_add(&o, word, sizeof word - 1);
                    sb_add(&o, "]", 1);
                }
                break;
            case 'W':
                if (in_class) {
                    *why = "\\W inside a character class";
                    goto fail;
                }
                sb_add(&o, "[^", 2);
                sb_add(&o, word, sizeof word - 1);
                sb_add(&o, "]", 1);
                break;
            case 'b':
            case 'B':
                *why = "word boundaries (\\b, \\B)";
                goto fail;
            case 'h':
            case 'H':
                *why = "\\h and \\H";
                goto fail;
            case 'u': {
                size_t k = 0;
                while (k < 4 && i + 1 + k < n && hexval(p[i + 1 + k]) >= 0)
                    k++;
                if (k != 4) {
                    *why = "\\u without four hex digits";
                    goto fail;
                }
                sb_add(&o, "\\x{", 3);
                sb_add(&o, p + i + 1, 4);
                sb_add(&o, "}", 1);
                i += 4;
                break;
            }
            default:
                sb_add(&o, p + i - 1, 2);
                /* \p{..}, \x{..} and friends pass through whole */
                break;
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            sb_add(&o, &c, 1);
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && p[i + 1] == '^') sb_add(&o, p + ++i, 1);
            if (i + 1 < n && p[i + 1] == ']') sb_add(&o, p + ++i, 1);
            continue;
        }
        if (in_class && c == '[' && i + 1 < n &&
            (p[i + 1] == ':' || p[i + 1] == '=' || p[i + 1] == '.')) {
            *why = "POSIX character classes";
            goto fail;
        }
        if (in_class && c == '[') {
            *why = "nested character classes";
            goto fail;
        }
        if (in_class && c == '&' && i + 1 < n && p[i + 1] == '&') {
            *why = "class intersection (&&)";
            goto fail;
        }
        if (in_class && c == ']') in_class = false;
        sb_add(&o, &c, 1);
    }
    if (!o.p) sb_add(&o, "", 0);
    return o.p;
fail:
    sb_free(&o);
    return NULL;
}

/* Compiles a pattern (literal: a plain string to find). Returns NULL with a message in why and
 * *st CG_E_UNSUPPORTED (a construct refused by rx_rewrite) or CG_E_VALUE (does not compile). */
static pcre2_code *rx_compile(const char *pat, size_t n, bool literal, char *why, size_t whylen,
                              cg_status *st)
{
    const char *refusal = NULL;
    char *src = literal ? cg_strndup(pat, n) : rx_rewrite(pat, n, &refusal);
    *st = CG_E_UNSUPPORTED;
    if (!src) {
        snprintf(why, whylen, "uses %s, which is not supported", refusal);
        return NULL;
    }
    *st = CG_E_VALUE;
    int ec = 0;
    PCRE2_SIZE eo = 0;
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) abort();
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF); /* Oniguruma's newline, whatever PCRE2's build says */
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)src, literal ? n : PCRE2_ZERO_TERMINATED, opt, &ec, &eo, cc);
    pcre2_compile_context_free(cc);
    free(src);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(why, whylen, "does not compile: %s at offset %zu", (char *)msg, (size_t)eo);
        return NULL;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
    return re;
}

/* One match attempt from pos; returns 1 with [*s, *e) on a match, 0 on none, -1 on error. */
static int rx_match(const pcre2_code *re, const char *s, size_t n, size_t pos, uint32_t opts,
                    pcre2_match_data *md, size_t *ms, size_t *me)
{
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | opts, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT | opts, md,
                         NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* ---------------------------------------------------------------------------------------------
 * Tokenizer structure
 * ------------------------------------------------------------------------------------------- */

typedef enum {
    BEH_REMOVED,
    BEH_ISOLATED,
    BEH_MERGED_PREV,
    BEH_MERGED_NEXT,
    BEH_CONTIGUOUS
} behavior;
typedef enum { PS_ALWAYS, PS_FIRST, PS_NEVER } prepend_scheme;

typedef enum { NZ_NFC, NZ_NFD, NZ_NFKC, NZ_NFKD, NZ_PREPEND, NZ_REPLACE } nz_kind;
typedef struct nz_step {
    nz_kind kind;
    char *str; /* Prepend's text, Replace's content */
    size_t str_len;
    pcre2_code *re; /* Replace's pattern */
} nz_step;

typedef enum { PT_BYTELEVEL, PT_SPLIT, PT_METASPACE, PT_DIGITS } pt_kind;
typedef struct pt_step {
    pt_kind kind;
    bool add_prefix_space, use_regex; /* ByteLevel */
    pcre2_code *re;                   /* ByteLevel (GPT-2 pattern) or Split */
    behavior beh;                     /* Split */
    bool invert;                      /* Split */
    uint32_t repl;                    /* Metaspace replacement character */
    prepend_scheme scheme;            /* Metaspace */
    bool split;                       /* Metaspace */
    bool individual;                  /* Digits */
} pt_step;

typedef enum { DC_BYTELEVEL, DC_METASPACE, DC_REPLACE, DC_BYTEFALLBACK, DC_FUSE, DC_STRIP } dc_kind;
typedef struct dc_step {
    dc_kind kind;
    pcre2_code *re; /* Replace */
    char *str;      /* Replace's content */
    size_t str_len;
    uint32_t ch;           /* Metaspace replacement, Strip content */
    prepend_scheme scheme; /* Metaspace */
    size_t start, stop;    /* Strip */
} dc_step;

typedef struct added_tok {
    int32_t id;
    char *content;
    size_t len;
    char *match; /* what is searched for: content, normalized when the token is */
    size_t match_len;
    bool special, lstrip, rstrip, single_word, normalized;
} added_tok;

/* A byte trie of added tokens, searched leftmost-longest. */
typedef struct trie_node {
    uint32_t child, sibling;
    int32_t tok; /* index into added, -1 */
    unsigned char byte;
} trie_node;
typedef struct trie {
    trie_node *v;
    size_t n, cap;
    bool first[256];
} trie;

/* The BPE cache: pre-token -> ids, direct-mapped, sharded, one lock per shard. Words of fewer
 * than CACHE_MAX_KEY bytes are cached; an entry is at most 16 + 5 * 127 bytes, so the cache
 * holds at most ~42 MB whatever the input (a few MB on real text). */
#define CACHE_SHARDS 64
#define CACHE_SLOTS 1024 /* per shard: 65536 entries in all */
#define CACHE_MAX_KEY 128
typedef struct cache_ent {
    uint64_t h;
    uint32_t klen, nids;
    /* int32_t ids[nids]; then char key[klen] */
} cache_ent;
typedef struct cache_shard {
    pthread_mutex_t lock;
    cache_ent *slot[CACHE_SLOTS];
} cache_shard;

struct cg_tokenizer {
    bool bytes; /* the tiny model's byte tokenizer */
    int32_t n_ids;
    int32_t bos, eos;
    bool adds_bos;

    /* id -> string (added tokens over the model's), id -> stream bytes, flags */
    uint32_t *str_off, *str_len;
    sbuf strs;
    uint32_t *sb_off, *sb_len;
    sbuf sbytes;
    uint8_t *special;
    smap model_vocab; /* the BPE model's own vocabulary */
    smap added_map;   /* added token content -> index into added */

    /* BPE */
    pmap merges;
    int32_t unk_id; /* -1 without unk_token */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *cs_prefix, *eow_suffix; /* NULL when absent or empty */
    size_t cs_prefix_len, eow_suffix_len;
    int32_t byte_ids[256];
    cache_shard *cache;

    /* pipeline */
    nz_step *nz;
    size_t n_nz;
    pt_step *pt;
    size_t n_pt;
    dc_step *dc;
    size_t n_dc;
    bool has_decoder;
    added_tok *added;
    size_t n_added;
    trie raw_trie, norm_trie;
    pcre2_code *word_rx; /* single_word: Rust regex's \w */
    int32_t *tmpl;       /* single template; -1 stands for the sequence */
    size_t n_tmpl;
    bool clean_up;
    char *chat_template;
};

/* Byte-level alphabet of GPT-2: byte b <-> one printable code point. */
static uint32_t bl_cp[256];
static char bl_utf8[256][2]; /* bl_cp as UTF-8 (one or two bytes) */
static uint8_t bl_utf8_len[256];
static int16_t bl_byte[324]; /* code point -> byte, -1 */
static pthread_once_t bl_once = PTHREAD_ONCE_INIT;
static void bl_init(void)
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

typedef struct span {
    uint32_t off, len;
    bool first; /* starts at offset 0 of the original text (Metaspace's prepend_scheme first) */
} span;

/* Pieces of text: spans into buf. */
typedef struct plist {
    sbuf buf;
    span *v;
    size_t n, cap;
} plist;

typedef struct mrange {
    size_t s, e;
    bool m;
} mrange;

typedef struct sym {
    uint32_t id;
    int32_t prev, next;
    bool gone;
} sym;

typedef struct hent {
    uint32_t rank, pos, id;
} hent;

typedef struct ectx {
    const cg_tokenizer *t;
    pcre2_match_data *md;
    plist pa, pb;
    mrange *mr, *kr;
    size_t nmr, cmr, nkr, ckr;
    sbuf tmp, norm;
    sym *sy;
    size_t nsy, csy;
    hent *hp;
    size_t nhp, chp;
    cg_tokens *out;
    size_t start; /* out->n when the encode began */
    size_t limit; /* most ids this encode may add (0 = any) */
    bool over;    /* the limit was passed, or the request went away: the encode stopped */
    bool gone;    /* it was the request going away */
    int (*cancelled)(void *ud);
    void *cancel_ud;
    size_t checked;     /* work units since cancelled was last asked */
    bool split_special; /* special tokens' text in the input is plain text */
} ectx;

static void pl_reset(plist *l)
{
    l->buf.n = 0;
    l->n = 0;
}

static void pl_add(plist *l, const char *s, size_t n, bool first)
{
    grow(&l->v, &l->cap, l->n + 1, sizeof *l->v);
    l->v[l->n++] = (span){(uint32_t)l->buf.n, (uint32_t)n, first};
    sb_add(&l->buf, s, n);
}

static void pl_free(plist *l)
{
    sb_free(&l->buf);
    cg_free(&l->v);
    l->n = l->cap = 0;
}

static void mr_add(ectx *c, size_t s, size_t e, bool m)
{
    grow(&c->mr, &c->cmr, c->nmr + 1, sizeof *c->mr);
    c->mr[c->nmr++] = (mrange){s, e, m};
}

static void kr_add(ectx *c, size_t s, size_t e)
{
    grow(&c->kr, &c->ckr, c->nkr + 1, sizeof *c->kr);
    c->kr[c->nkr++] = (mrange){s, e, false};
}

static void ids_add(cg_tokens *o, int32_t id)
{
    grow(&o->ids, &o->cap, o->n + 1, sizeof *o->ids);
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
        int rc = rx_match(re, s, n, pos, 0, c->md, &ms, &me);
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
            sb_add(out, rep, rep_len);
        else
            sb_add(out, s + c->mr[i].s, c->mr[i].e - c->mr[i].s);
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

/* Normalizes s[0..n) into c->norm. Returns -1 on a regex engine error. */
static int normalize(ectx *c, const char *s, size_t n)
{
    const cg_tokenizer *t = c->t;
    sbuf *cur = &c->norm, *tmp = &c->tmp;
    cur->n = 0;
    sb_add(cur, s, n);
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
            cg_buf_init(&d, 0);
            cg_status st = cg_unicode_normalize(cur->p, cur->n, form[z->kind], &d);
            if (st == CG_OK) sb_add(tmp, d.data, d.len);
            cg_buf_free(&d);
            if (st != CG_OK) return -1;
            break;
        }
        case NZ_PREPEND:
            if (cur->n == 0) continue;
            sb_add(tmp, z->str, z->str_len);
            sb_add(tmp, cur->p, cur->n);
            break;
        case NZ_REPLACE:
            if (replace_all(c, z->re, cur->p, cur->n, z->str, z->str_len, tmp) < 0) return -1;
            break;
        }
        cur->n = 0;
        sb_add(cur, tmp->p, tmp->n);
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
            if (p->add_prefix_space && (n == 0 || s[0] != ' ')) sb_add(w, " ", 1);
            sb_add(w, s, n);
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
                grow(&out->v, &out->cap, out->n + 1, sizeof *out->v);
                grow(&out->buf.p, &out->buf.cap, out->buf.n + 2 * (e - a) + 1, 1);
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
                sb_add(w, rep, rl);
            for (size_t j = 0; j < n; j++) {
                if (s[j] == ' ')
                    sb_add(w, rep, rl);
                else
                    sb_add(w, s + j, 1);
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
    grow(&c->hp, &c->chp, c->nhp + 1, sizeof *c->hp);
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
    grow(&c->sy, &c->csy, c->nsy + 1, sizeof *c->sy);
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
            if (t->cs_prefix && i > 0) sb_add(k, t->cs_prefix, t->cs_prefix_len);
            sb_add(k, s + i, l);
            if (t->eow_suffix && i + l == n) sb_add(k, t->eow_suffix, t->eow_suffix_len);
            key = k->p;
            kl = k->n;
        }
        i += l;
        int32_t id = smap_get(&t->model_vocab, key, kl);
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
        int32_t id = smap_get(&t->model_vocab, s, n);
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
            grow(&c->out->ids, &c->out->cap, c->out->n + e->nids, sizeof *c->out->ids);
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

static void trie_insert(trie *tr, const char *s, size_t n, int32_t tok)
{
    if (!tr->n) {
        grow(&tr->v, &tr->cap, 1, sizeof *tr->v);
        tr->v[tr->n++] = (trie_node){NO_ID, NO_ID, -1, 0};
    }
    uint32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        uint32_t ch = tr->v[cur].child;
        while (ch != NO_ID && tr->v[ch].byte != b)
            ch = tr->v[ch].sibling;
        if (ch == NO_ID) {
            grow(&tr->v, &tr->cap, tr->n + 1, sizeof *tr->v);
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
    return rx_match(t->word_rx, s, n, i, PCRE2_ANCHORED, c->md, &ms, &me) == 1;
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
        grow(out, cap, *nout + 2, sizeof **out);
        if (start_off < ms) (*out)[(*nout)++] = (seg){start_off, ms, -1};
        (*out)[(*nout)++] = (seg){ms, me, k};
        start_off = me;
    }
    if (start_off < n) {
        grow(out, cap, *nout + 1, sizeof **out);
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
        if (normalize(&c, text + s1[i].s, s1[i].e - s1[i].s) < 0) goto fail;
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
            grow(&out->ids, &out->cap, out->n + k, sizeof *out->ids);
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
    sb_free(&c.tmp);
    sb_free(&c.norm);
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
    grow(&out->ids, &out->cap, out->n + len + 1, sizeof *out->ids);
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
    int hi = hexval(s[3]), lo = hexval(s[4]);
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
            sb_add(&pend, &ch, 1);
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
    sb_free(&pend);
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
        grow(&out->v, &out->cap, out->n + 1, sizeof *out->v);
        span sp = {(uint32_t)out->buf.n, 0, false};
        for (size_t j = 0; j < n;) {
            size_t l;
            uint32_t cp = u8dec(s + j, &l);
            if (cp == d->ch) {
                if (!(i == 0 && d->scheme != PS_NEVER)) sb_add(&out->buf, " ", 1);
            } else
                sb_add(&out->buf, s + j, l);
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
            sb_add(out, s, n);
            return;
        }
        char b = (char)bl_byte[cp];
        sb_add(out, &b, 1);
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
    sb_free(&raw);
    sb_free(&fixed);
}

static void dc_fuse(plist *in, plist *out)
{
    pl_reset(out);
    sbuf all = {0};
    for (size_t i = 0; i < in->n; i++)
        sb_add(&all, in->buf.p + in->v[i].off, in->v[i].len);
    pl_add(out, all.p ? all.p : "", all.n, false);
    sb_free(&all);
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
            if (i) sb_add(&res, " ", 1);
            sb_add(&res, a.buf.p + a.v[i].off, a.v[i].len);
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
            sb_add(&res, in->buf.p + in->v[i].off, in->v[i].len);
    }
    if (t->clean_up && res.n) clean_up(&res);
    st = cg_buf_append(out, res.p ? res.p : "", res.n);
out:
    sb_free(&res);
    pl_free(&a);
    pl_free(&b);
    free(c.mr);
    free(c.kr);
    sb_free(&c.tmp);
    if (c.md) pcre2_match_data_free(c.md);
    return st;
}

/* The per-token stream bytes: the decoder chain on one token, with the steps that only make
 * sense for a whole text (Strip, Metaspace's first-token rule, lossy UTF-8) left out. */
static int stream_bytes(const cg_tokenizer *t, ectx *c, const char *s, size_t n, sbuf *out)
{
    out->n = 0;
    sb_add(out, s, n);
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
                    sb_add(&w, " ", 1);
                else
                    sb_add(&w, out->p + j, l);
                j += l;
            }
            break;
        case DC_BYTEFALLBACK: {
            int b = byte_token(out->p, out->n);
            if (b < 0)
                sb_add(&w, out->p, out->n);
            else {
                char ch = (char)b;
                sb_add(&w, &ch, 1);
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
        sb_add(out, w.p ? w.p : "", w.n);
    }
    sb_free(&w);
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
    int32_t k = smap_get(&t->added_map, s, n);
    if (k >= 0) return t->added[k].id;
    return smap_get(&t->model_vocab, s, n);
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

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */

typedef struct ld {
    const char *file; /* shown in messages */
    char *err;
    size_t errlen;
    cg_tokenizer *t;
} ld;

static cg_status fail(ld *L, cg_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static cg_status fail(ld *L, cg_status st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cg_seterr(L->err, L->errlen, "%s: %s", L->file, msg);
    return st;
}

static const char *jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* An optional boolean: absent or null gives def. */
static cg_status get_bool(ld *L, const json_t *o, const char *key, const char *path, bool def,
                          bool *out)
{
    const json_t *v = json_object_get(o, key);
    *out = def;
    if (!v || json_is_null(v)) return CG_OK;
    if (!json_is_boolean(v))
        return fail(L, CG_E_VALUE, "%s.%s must be a boolean, not %s", path, key, jtype(v));
    *out = json_is_true(v);
    return CG_OK;
}

/* An optional string: absent or null gives NULL (an error when required). */
static cg_status get_str(ld *L, const json_t *o, const char *key, const char *path, bool required,
                         const char **out, size_t *len)
{
    const json_t *v = json_object_get(o, key);
    *out = NULL;
    if (len) *len = 0;
    if (!v || json_is_null(v)) {
        if (required) return fail(L, CG_E_VALUE, "%s.%s is missing", path, key);
        return CG_OK;
    }
    if (!json_is_string(v))
        return fail(L, CG_E_VALUE, "%s.%s must be a string, not %s", path, key, jtype(v));
    *out = json_string_value(v);
    if (len) *len = json_string_length(v);
    return CG_OK;
}

/* A one-character string field (Metaspace's replacement, Strip's content). */
static cg_status get_char(ld *L, const json_t *o, const char *key, const char *path, uint32_t *cp)
{
    const char *s;
    size_t n;
    cg_status st = get_str(L, o, key, path, true, &s, &n);
    if (st != CG_OK) return st;
    size_t l = n ? u8len((unsigned char)s[0]) : 0;
    if (n == 0 || l != n)
        return fail(L, CG_E_VALUE, "%s.%s must be exactly one character", path, key);
    *cp = u8dec(s, &l);
    return CG_OK;
}

static cg_status get_type(ld *L, const json_t *o, const char *path, const char **type)
{
    if (!json_is_object(o))
        return fail(L, CG_E_VALUE, "%s must be an object, not %s", path, jtype(o));
    return get_str(L, o, "type", path, true, type, NULL);
}

/* A {"String": s} or {"Regex": r} pattern. */
static cg_status get_pattern(ld *L, const json_t *o, const char *path, pcre2_code **re)
{
    const json_t *p = json_object_get(o, "pattern");
    if (!p) return fail(L, CG_E_VALUE, "%s.pattern is missing", path);
    if (!json_is_object(p) || json_object_size(p) != 1)
        return fail(L, CG_E_VALUE, "%s.pattern must be {\"String\": ...} or {\"Regex\": ...}",
                    path);
    const json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    const json_t *v = s ? s : r;
    if (!v || !json_is_string(v))
        return fail(L, CG_E_VALUE, "%s.pattern must be {\"String\": ...} or {\"Regex\": ...}",
                    path);
    char why[256];
    cg_status st;
    *re = rx_compile(json_string_value(v), json_string_length(v), s != NULL, why, sizeof why, &st);
    if (!*re)
        return fail(L, st, "%s.pattern.%s '%s' %s", path, s ? "String" : "Regex",
                    json_string_value(v), why);
    return CG_OK;
}

/* A name of a JSON enumeration and the kind it stands for. */
typedef struct named_kind {
    const char *name;
    int kind;
} named_kind;

/* The kind named s in tab[0, n), -1 if none is. */
static int kind_named(const named_kind *tab, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(tab[i].name, s)) return tab[i].kind;
    return -1;
}

typedef cg_status (*step_loader)(ld *L, const json_t *o, const char *path);

/* How every step of the pipeline (normalizer, pre-tokenizer, decoder, post-processor) starts:
 * *type is NULL when there is no step (o missing or null), else o's type. A "Sequence" is
 * loaded here: each entry of its list o[list_key] through load, at path.list_key[i]. */
static cg_status load_step_type(ld *L, const json_t *o, const char *path, const char *list_key,
                                step_loader load, const char **type)
{
    *type = NULL;
    if (!o || json_is_null(o)) return CG_OK;
    cg_status st = get_type(L, o, path, type);
    if (st != CG_OK || strcmp(*type, "Sequence")) return st;
    const json_t *list = json_object_get(o, list_key);
    if (!json_is_array(list)) return fail(L, CG_E_VALUE, "%s.%s must be an array", path, list_key);
    for (size_t i = 0; i < json_array_size(list); i++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.%s[%zu]", path, list_key, i);
        st = load(L, json_array_get(list, i), sub);
        if (st != CG_OK) return st;
    }
    return CG_OK;
}

/* A Replace step (normalizer or decoder): its pattern, and a copy of its content. */
static cg_status get_replace(ld *L, const json_t *o, const char *path, pcre2_code **re,
                             char **content, size_t *len)
{
    const char *s;
    size_t n;
    cg_status st = get_str(L, o, "content", path, true, &s, &n);
    if (st != CG_OK || (st = get_pattern(L, o, path, re)) != CG_OK) return st;
    *content = cg_strndup(s, n);
    *len = n;
    return CG_OK;
}

/* A Metaspace step (pre-tokenizer or decoder): its replacement character and prepend_scheme
 * (always when absent), which add_prefix_space must agree with. */
static cg_status get_metaspace(ld *L, const json_t *o, const char *path, uint32_t *repl,
                               prepend_scheme *scheme)
{
    cg_status st;
    if ((st = get_char(L, o, "replacement", path, repl)) != CG_OK) return st;
    const char *sch;
    if ((st = get_str(L, o, "prepend_scheme", path, false, &sch, NULL)) != CG_OK) return st;
    *scheme = PS_ALWAYS;
    if (sch && !strcmp(sch, "first"))
        *scheme = PS_FIRST;
    else if (sch && !strcmp(sch, "never"))
        *scheme = PS_NEVER;
    else if (sch && strcmp(sch, "always"))
        return fail(L, CG_E_VALUE, "%s.prepend_scheme '%s' is not always, first or never", path,
                    sch);
    bool aps;
    if ((st = get_bool(L, o, "add_prefix_space", path, true, &aps)) != CG_OK) return st;
    if (!aps && *scheme != PS_NEVER)
        return fail(L, CG_E_VALUE, "%s.add_prefix_space false does not match prepend_scheme", path);
    return CG_OK;
}

static cg_status load_normalizer(ld *L, const json_t *o, const char *path)
{
    cg_tokenizer *t = L->t;
    const char *type;
    cg_status st = load_step_type(L, o, path, "normalizers", load_normalizer, &type);
    if (st != CG_OK || !type || !strcmp(type, "Sequence")) return st;
    static const named_kind forms[] = {
        {"NFC", NZ_NFC}, {"NFD", NZ_NFD}, {"NFKC", NZ_NFKC}, {"NFKD", NZ_NFKD}};
    nz_step z = {0};
    int form = kind_named(forms, CG_ARRAY_LEN(forms), type);
    if (form >= 0)
        z.kind = (nz_kind)form;
    else if (!strcmp(type, "Prepend")) {
        const char *s;
        size_t n;
        st = get_str(L, o, "prepend", path, true, &s, &n);
        if (st != CG_OK) return st;
        z.kind = NZ_PREPEND;
        z.str = cg_strndup(s, n);
        z.str_len = n;
    } else if (!strcmp(type, "Replace")) {
        st = get_replace(L, o, path, &z.re, &z.str, &z.str_len);
        if (st != CG_OK) return st;
        z.kind = NZ_REPLACE;
    } else
        return fail(L, CG_E_UNSUPPORTED, "%s.type '%s' is not supported", path, type);
    t->nz = cg_realloc(t->nz, (t->n_nz + 1) * sizeof *t->nz);
    t->nz[t->n_nz++] = z;
    return CG_OK;
}

/* tokenizers' GPT-2 split pattern, used by ByteLevel with use_regex. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static cg_status load_pretok(ld *L, const json_t *o, const char *path)
{
    cg_tokenizer *t = L->t;
    const char *type;
    cg_status st = load_step_type(L, o, path, "pretokenizers", load_pretok, &type);
    if (st != CG_OK || !type || !strcmp(type, "Sequence")) return st;
    pt_step p = {0};
    if (!strcmp(type, "ByteLevel")) {
        p.kind = PT_BYTELEVEL;
        if ((st = get_bool(L, o, "add_prefix_space", path, true, &p.add_prefix_space)) != CG_OK ||
            (st = get_bool(L, o, "use_regex", path, true, &p.use_regex)) != CG_OK)
            return st;
        if (p.use_regex) {
            char why[256];
            p.re = rx_compile(gpt2_pattern, sizeof gpt2_pattern - 1, false, why, sizeof why, &st);
            if (!p.re) return fail(L, CG_E_INTERNAL, "%s: the GPT-2 pattern %s", path, why);
        }
    } else if (!strcmp(type, "Split")) {
        p.kind = PT_SPLIT;
        static const named_kind behaviors[] = {{"Removed", BEH_REMOVED},
                                               {"Isolated", BEH_ISOLATED},
                                               {"MergedWithPrevious", BEH_MERGED_PREV},
                                               {"MergedWithNext", BEH_MERGED_NEXT},
                                               {"Contiguous", BEH_CONTIGUOUS}};
        const char *b;
        if ((st = get_str(L, o, "behavior", path, true, &b, NULL)) != CG_OK) return st;
        int beh = kind_named(behaviors, CG_ARRAY_LEN(behaviors), b);
        if (beh < 0)
            return fail(L, CG_E_VALUE, "%s.behavior '%s' is not a split behavior", path, b);
        p.beh = (behavior)beh;
        if ((st = get_bool(L, o, "invert", path, false, &p.invert)) != CG_OK) return st;
        if ((st = get_pattern(L, o, path, &p.re)) != CG_OK) return st;
    } else if (!strcmp(type, "Metaspace")) {
        p.kind = PT_METASPACE;
        if ((st = get_metaspace(L, o, path, &p.repl, &p.scheme)) != CG_OK) return st;
        if ((st = get_bool(L, o, "split", path, true, &p.split)) != CG_OK) return st;
    } else if (!strcmp(type, "Digits")) {
        p.kind = PT_DIGITS;
        if ((st = get_bool(L, o, "individual_digits", path, false, &p.individual)) != CG_OK)
            return st;
    } else
        return fail(L, CG_E_UNSUPPORTED, "%s.type '%s' is not supported", path, type);
    t->pt = cg_realloc(t->pt, (t->n_pt + 1) * sizeof *t->pt);
    t->pt[t->n_pt++] = p;
    return CG_OK;
}

static cg_status load_decoder(ld *L, const json_t *o, const char *path)
{
    cg_tokenizer *t = L->t;
    const char *type;
    cg_status st = load_step_type(L, o, path, "decoders", load_decoder, &type);
    if (st != CG_OK || !type) return st;
    t->has_decoder = true;
    if (!strcmp(type, "Sequence")) return CG_OK;
    static const named_kind plain[] = {
        {"ByteLevel", DC_BYTELEVEL}, {"ByteFallback", DC_BYTEFALLBACK}, {"Fuse", DC_FUSE}};
    dc_step d = {0};
    int kind = kind_named(plain, CG_ARRAY_LEN(plain), type);
    if (kind >= 0)
        d.kind = (dc_kind)kind;
    else if (!strcmp(type, "Metaspace")) {
        d.kind = DC_METASPACE;
        if ((st = get_metaspace(L, o, path, &d.ch, &d.scheme)) != CG_OK) return st;
    } else if (!strcmp(type, "Replace")) {
        d.kind = DC_REPLACE;
        if ((st = get_replace(L, o, path, &d.re, &d.str, &d.str_len)) != CG_OK) return st;
    } else if (!strcmp(type, "Strip")) {
        d.kind = DC_STRIP;
        if ((st = get_char(L, o, "content", path, &d.ch)) != CG_OK) return st;
        const char *keys[2] = {"start", "stop"};
        size_t *dst[2] = {&d.start, &d.stop};
        for (int k = 0; k < 2; k++) {
            const json_t *v = json_object_get(o, keys[k]);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 20)
                return fail(L, CG_E_VALUE, "%s.%s must be a non-negative integer", path, keys[k]);
            *dst[k] = (size_t)json_integer_value(v);
        }
    } else
        return fail(L, CG_E_UNSUPPORTED, "%s.type '%s' is not supported", path, type);
    t->dc = cg_realloc(t->dc, (t->n_dc + 1) * sizeof *t->dc);
    t->dc[t->n_dc++] = d;
    return CG_OK;
}

/* Post-processors: the single-sequence template is flattened into t->tmpl (ids, -1 = $A). */
static cg_status load_post(ld *L, const json_t *o, const char *path)
{
    cg_tokenizer *t = L->t;
    const char *type;
    cg_status st = load_step_type(L, o, path, "processors", load_post, &type);
    if (st != CG_OK || !type || !strcmp(type, "Sequence")) return st;
    if (!strcmp(type, "ByteLevel")) return CG_OK; /* offsets only; ids unchanged */
    if (strcmp(type, "TemplateProcessing"))
        return fail(L, CG_E_UNSUPPORTED, "%s.type '%s' is not supported", path, type);
    const json_t *single = json_object_get(o, "single"),
                 *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single)) return fail(L, CG_E_VALUE, "%s.single must be an array", path);
    if (specials && !json_is_object(specials))
        return fail(L, CG_E_VALUE, "%s.special_tokens must be an object", path);
    int32_t *nt = NULL;
    size_t nn = 0, cap = 0, seqs = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *it = json_array_get(single, i);
        const json_t *sp = json_object_get(it, "SpecialToken"),
                     *sq = json_object_get(it, "Sequence");
        const json_t *id = json_object_get(sp ? sp : sq, "id");
        if (!json_is_object(it) || json_object_size(it) != 1 || !(sp || sq) ||
            !json_is_string(id)) {
            free(nt);
            return fail(L, CG_E_VALUE,
                        "%s.single[%zu] must be {\"SpecialToken\": {\"id\": ...}} or "
                        "{\"Sequence\": {\"id\": ...}}",
                        path, i);
        }
        if (sq) {
            if (strcmp(json_string_value(id), "A")) {
                free(nt);
                return fail(L, CG_E_VALUE,
                            "%s.single[%zu] names sequence '%s'; a single template has only A",
                            path, i, json_string_value(id));
            }
            seqs++;
            /* an earlier template is wrapped by this one */
            size_t k = t->n_tmpl ? t->n_tmpl : 1;
            grow(&nt, &cap, nn + k, sizeof *nt);
            if (t->n_tmpl)
                memcpy(nt + nn, t->tmpl, k * sizeof *nt);
            else
                nt[nn] = -1;
            nn += k;
            continue;
        }
        const json_t *def = specials ? json_object_get(specials, json_string_value(id)) : NULL;
        const json_t *ids = json_object_get(def, "ids");
        if (!json_is_array(ids)) {
            free(nt);
            return fail(L, CG_E_VALUE,
                        "%s.single[%zu]: special token '%s' is not in %s.special_tokens", path, i,
                        json_string_value(id), path);
        }
        for (size_t k = 0; k < json_array_size(ids); k++) {
            const json_t *v = json_array_get(ids, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= t->n_ids || t->str_off[json_integer_value(v)] == NO_ID) {
                free(nt);
                return fail(L, CG_E_VALUE, "%s.special_tokens['%s'].ids[%zu] is not a token id",
                            path, json_string_value(id), k);
            }
            grow(&nt, &cap, nn + 1, sizeof *nt);
            nt[nn++] = (int32_t)json_integer_value(v);
        }
    }
    if (seqs != 1) {
        free(nt);
        return fail(L, CG_E_VALUE, "%s.single must hold the sequence A exactly once", path);
    }
    free(t->tmpl);
    t->tmpl = nt;
    t->n_tmpl = nn;
    return CG_OK;
}

/* Sets the id -> string entry of id (the vocabulary may have holes). */
static void set_str(cg_tokenizer *t, int32_t id, const char *s, size_t n)
{
    t->str_off[id] = (uint32_t)t->strs.n;
    t->str_len[id] = (uint32_t)n;
    sb_add(&t->strs, s, n);
}

/* model.vocab into t->model_vocab: token -> id, every id given once and the ids dense (a
 * few huge ids must not make the id tables gigabytes). *max_id: the highest id. */
static cg_status load_vocab(ld *L, const json_t *m, int32_t *max_id)
{
    cg_tokenizer *t = L->t;
    const json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return fail(L, CG_E_VALUE, "model.vocab must be an object");
    const char *key;
    const json_t *val;
    *max_id = -1;
    json_object_foreach((json_t *)vocab, key, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= (1 << 30))
            return fail(L, CG_E_VALUE, "model.vocab['%s'] must be an id (0 .. 2^30)", key);
        if (json_integer_value(val) > *max_id) *max_id = (int32_t)json_integer_value(val);
    }
    /* id tables are dense arrays: a few huge ids must not make us allocate gigabytes (added
     * tokens follow the model's ids, so they cannot stray) */
    if ((size_t)(*max_id + 1) > 2 * json_object_size(vocab) + 1024)
        return fail(L, CG_E_VALUE,
                    "model.vocab: id %d is far beyond its %zu tokens (ids must be dense)", *max_id,
                    json_object_size(vocab));
    size_t nv = (size_t)(*max_id + 1);
    int32_t *seen = cg_malloc((nv ? nv : 1) * sizeof *seen);
    memset(seen, 0xFF, (nv ? nv : 1) * sizeof *seen);
    void *it = json_object_iter((json_t *)vocab);
    for (; it; it = json_object_iter_next((json_t *)vocab, it)) {
        const char *k = json_object_iter_key(it);
        size_t kl = json_object_iter_key_len(it);
        int32_t id = (int32_t)json_integer_value(json_object_iter_value(it));
        if (seen[id] >= 0) {
            free(seen);
            return fail(L, CG_E_VALUE,
                        "model.vocab: id %d is given to two tokens ('%s' and another)", id, k);
        }
        seen[id] = 1;
        smap_put(&t->model_vocab, k, kl, id);
    }
    free(seen);
    return CG_OK;
}

/* The BPE options: fuse_unk, byte_fallback, ignore_merges, unk_token (which must be in the
 * vocabulary), the continuing-subword prefix and end-of-word suffix; and the ids of the
 * <0xXX> byte tokens, where the vocabulary has them. */
static cg_status load_bpe_options(ld *L, const json_t *m)
{
    cg_tokenizer *t = L->t;
    const char *s;
    size_t sl;
    cg_status st;
    if ((st = get_bool(L, m, "fuse_unk", "model", false, &t->fuse_unk)) != CG_OK ||
        (st = get_bool(L, m, "byte_fallback", "model", false, &t->byte_fallback)) != CG_OK ||
        (st = get_bool(L, m, "ignore_merges", "model", false, &t->ignore_merges)) != CG_OK)
        return st;
    t->unk_id = -1;
    if ((st = get_str(L, m, "unk_token", "model", false, &s, &sl)) != CG_OK) return st;
    if (s) {
        t->unk_id = smap_get(&t->model_vocab, s, sl);
        if (t->unk_id < 0)
            return fail(L, CG_E_VALUE, "model.unk_token '%s' is not in model.vocab", s);
    }
    if ((st = get_str(L, m, "continuing_subword_prefix", "model", false, &s, &sl)) != CG_OK)
        return st;
    if (s && sl) {
        t->cs_prefix = cg_strndup(s, sl);
        t->cs_prefix_len = sl;
    }
    if ((st = get_str(L, m, "end_of_word_suffix", "model", false, &s, &sl)) != CG_OK) return st;
    if (s && sl) {
        t->eow_suffix = cg_strndup(s, sl);
        t->eow_suffix_len = sl;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = smap_get(&t->model_vocab, name, 6);
    }
    return CG_OK;
}

/* The two tokens of merges[i] e: a pair ["a", "b"] when the list holds pairs (tuples), else
 * a string "a b". *skip is set for a "#version" line, which is no merge. */
static cg_status merge_tokens(ld *L, const json_t *e, size_t i, bool tuples, const char **a,
                              size_t *al, const char **b, size_t *bl, bool *skip)
{
    *skip = false;
    if (tuples) {
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(json_array_get(e, 0)) ||
            !json_is_string(json_array_get(e, 1)))
            return fail(L, CG_E_VALUE,
                        "model.merges[%zu] must be a pair of strings like the others", i);
        *a = json_string_value(json_array_get(e, 0));
        *al = json_string_length(json_array_get(e, 0));
        *b = json_string_value(json_array_get(e, 1));
        *bl = json_string_length(json_array_get(e, 1));
        return CG_OK;
    }
    if (!json_is_string(e))
        return fail(L, CG_E_VALUE, "model.merges[%zu] must be a string \"a b\" like the others", i);
    const char *x = json_string_value(e);
    size_t xl = json_string_length(e);
    if (xl >= 8 && !memcmp(x, "#version", 8)) {
        *skip = true;
        return CG_OK;
    }
    const char *sp = memchr(x, ' ', xl);
    if (!sp || memchr(sp + 1, ' ', xl - (size_t)(sp + 1 - x)))
        return fail(L, CG_E_VALUE,
                    "model.merges[%zu] '%s' is not two tokens separated by one space", i, x);
    *a = x;
    *al = (size_t)(sp - x);
    *b = sp + 1;
    *bl = xl - *al - 1;
    return CG_OK;
}

/* Adds merges[i], a + b, with its rank: both tokens and their concatenation (b without the
 * continuing-subword prefix) must be in the vocabulary. cat is scratch space. */
static cg_status add_merge(ld *L, sbuf *cat, size_t i, const char *a, size_t al, const char *b,
                           size_t bl, uint32_t rank)
{
    cg_tokenizer *t = L->t;
    int32_t ia = smap_get(&t->model_vocab, a, al), ib = smap_get(&t->model_vocab, b, bl);
    if (ia < 0 || ib < 0)
        return fail(L, CG_E_VALUE, "model.merges[%zu]: '%.*s' is not in model.vocab", i,
                    (int)(ia < 0 ? al : bl), ia < 0 ? a : b);
    if (bl < t->cs_prefix_len)
        return fail(L, CG_E_VALUE,
                    "model.merges[%zu]: '%.*s' is shorter than continuing_subword_prefix", i,
                    (int)bl, b);
    cat->n = 0;
    sb_add(cat, a, al);
    sb_add(cat, b + t->cs_prefix_len, bl - t->cs_prefix_len);
    int32_t ic = smap_get(&t->model_vocab, cat->p, cat->n);
    if (ic < 0)
        return fail(L, CG_E_VALUE, "model.merges[%zu]: the merged token '%s' is not in model.vocab",
                    i, cat->p);
    pmap_put(&t->merges, (uint32_t)ia, (uint32_t)ib, rank, (uint32_t)ic);
    return CG_OK;
}

/* model.merges into t->merges, ranked in their order. */
static cg_status load_merges(ld *L, const json_t *m)
{
    cg_tokenizer *t = L->t;
    const json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges)) return fail(L, CG_E_VALUE, "model.merges must be an array");
    pmap_init(&t->merges, json_array_size(merges));
    bool tuples = json_array_size(merges) && json_is_array(json_array_get(merges, 0));
    sbuf cat = {0};
    uint32_t rank = 0;
    cg_status st = CG_OK;
    for (size_t i = 0; i < json_array_size(merges) && st == CG_OK; i++) {
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        bool skip;
        st = merge_tokens(L, json_array_get(merges, i), i, tuples, &a, &al, &b, &bl, &skip);
        if (st == CG_OK && !skip) st = add_merge(L, &cat, i, a, al, b, bl, rank++);
    }
    sb_free(&cat);
    return st;
}

/* The BPE model: vocab, merges, unk/byte fallback options. Fills t->model_vocab; ids of the
 * model go up to *max_id. */
static cg_status load_model(ld *L, const json_t *m, int32_t *max_id)
{
    if (!json_is_object(m)) return fail(L, CG_E_VALUE, "model is missing or not an object");
    const char *type;
    cg_status st = get_str(L, m, "type", "model", false, &type, NULL);
    if (st != CG_OK) return st;
    if (type && strcmp(type, "BPE"))
        return fail(L, CG_E_UNSUPPORTED, "model.type '%s' is not supported (only BPE)", type);
    if (!type && !json_object_get(m, "merges"))
        return fail(L, CG_E_UNSUPPORTED, "model has no type and no merges: only BPE is supported");
    const json_t *drop = json_object_get(m, "dropout");
    if (drop && !json_is_null(drop) && !(json_is_number(drop) && json_number_value(drop) == 0.0))
        return fail(L, CG_E_UNSUPPORTED,
                    "model.dropout must be null: BPE dropout is not supported");
    if ((st = load_vocab(L, m, max_id)) != CG_OK || (st = load_bpe_options(L, m)) != CG_OK)
        return st;
    return load_merges(L, m);
}

/* added_tokens: ids as tokenizers assigns them (the model's id for a token it has, else the
 * next free id after the model's vocabulary); a file whose ids say otherwise is refused. */
static cg_status load_added(ld *L, const json_t *list, int32_t *max_id)
{
    cg_tokenizer *t = L->t;
    if (!list || json_is_null(list)) return CG_OK;
    if (!json_is_array(list)) return fail(L, CG_E_VALUE, "added_tokens must be an array");
    size_t n = json_array_size(list);
    t->added = cg_calloc(n ? n : 1, sizeof *t->added);
    int32_t model_size = (int32_t)t->model_vocab.n, amax = -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(list, i);
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        if (!json_is_object(o)) return fail(L, CG_E_VALUE, "%s must be an object", path);
        added_tok a = {0};
        const char *s;
        size_t sl;
        cg_status st;
        if ((st = get_str(L, o, "content", path, true, &s, &sl)) != CG_OK) return st;
        if (sl == 0) return fail(L, CG_E_VALUE, "%s.content is empty", path);
        const json_t *idv = json_object_get(o, "id");
        if (!json_is_integer(idv) || json_integer_value(idv) < 0 ||
            json_integer_value(idv) >= (1 << 30))
            return fail(L, CG_E_VALUE, "%s.id must be an id (0 .. 2^30)", path);
        if ((st = get_bool(L, o, "special", path, false, &a.special)) != CG_OK ||
            (st = get_bool(L, o, "lstrip", path, false, &a.lstrip)) != CG_OK ||
            (st = get_bool(L, o, "rstrip", path, false, &a.rstrip)) != CG_OK ||
            (st = get_bool(L, o, "single_word", path, false, &a.single_word)) != CG_OK ||
            (st = get_bool(L, o, "normalized", path, !a.special, &a.normalized)) != CG_OK)
            return st;
        int32_t want = (int32_t)json_integer_value(idv), id;
        int32_t dup = smap_get(&t->added_map, s, sl);
        if (dup >= 0) {
            if (t->added[dup].id != want)
                return fail(L, CG_E_VALUE, "%s: '%s' is listed again with another id (%d, was %d)",
                            path, s, want, t->added[dup].id);
            continue;
        }
        id = smap_get(&t->model_vocab, s, sl);
        if (id < 0)
            id = amax < 0                                  ? model_size
                 : (amax >= model_size || model_size == 0) ? amax + 1
                                                           : model_size;
        if (id != want)
            return fail(
                L, CG_E_VALUE,
                "%s: '%s' has id %d, but tokenizers would give it %d (ids must follow the model's "
                "vocabulary in order)",
                path, s, want, id);
        if (id > amax) amax = id;
        if (id > *max_id) *max_id = id;
        a.id = id;
        a.content = cg_strndup(s, sl);
        a.len = sl;
        smap_put(&t->added_map, s, sl, (int32_t)t->n_added);
        t->added[t->n_added++] = a;
    }
    return CG_OK;
}

static cg_status read_file(ld *L, const char *path, char **buf, size_t *len, bool optional)
{
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (optional && errno == ENOENT) return CG_OK;
        return fail(L, CG_E_IO, "cannot open: %s", strerror(errno));
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return fail(L, CG_E_IO, "not a regular file");
    }
    if ((size_t)sb.st_size > CG_TOKENIZER_MAX_FILE) {
        fclose(f);
        return fail(L, CG_E_TOO_LARGE, "%lld bytes is larger than the %zu MiB allowed",
                    (long long)sb.st_size, CG_TOKENIZER_MAX_FILE >> 20);
    }
    char *b = cg_malloc((size_t)sb.st_size + 1);
    size_t got = fread(b, 1, (size_t)sb.st_size, f);
    bool bad = ferror(f);
    fclose(f);
    if (bad || got != (size_t)sb.st_size) {
        free(b);
        return fail(L, CG_E_IO, "read error");
    }
    b[got] = '\0';
    *buf = b;
    *len = got;
    return CG_OK;
}

static cg_status parse_json(ld *L, const char *buf, size_t len, size_t flags, json_t **out)
{
    json_error_t je;
    *out = json_loadb(buf, len, flags, &je);
    if (!*out)
        return fail(L, CG_E_JSON, "invalid JSON at line %d column %d: %s", je.line, je.column,
                    je.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return fail(L, CG_E_JSON, "the top level must be an object");
    }
    return CG_OK;
}

/* A token setting of tokenizer_config.json: a string, {"content": ...} or null (none);
 * when the key is absent *id is left as it is. */
static cg_status config_token(ld *L, const json_t *cfg, const char *key, int32_t *id)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v) return CG_OK;
    if (json_is_null(v)) {
        *id = -1;
        return CG_OK;
    }
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v))
        return fail(L, CG_E_VALUE, "%s must be a string, an object with \"content\", or null", key);
    int32_t k = cg_tokenizer_token_id(L->t, json_string_value(v));
    if (k < 0)
        return fail(L, CG_E_VALUE, "%s '%s' is not in the vocabulary", key, json_string_value(v));
    *id = k;
    return CG_OK;
}

/* transformers makes the tokens that tokenizer_config.json names (bos_token, eos_token, ...,
 * additional_special_tokens) special: skipped by decode with skip_special, and matched in the
 * text like any special token even when tokenizer.json only has them in the model's vocabulary.
 * A named token that is in neither is refused (transformers would add a new id the model does
 * not have). */
static cg_status config_special(ld *L, const json_t *v, const char *what)
{
    cg_tokenizer *t = L->t;
    if (!v || json_is_null(v)) return CG_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v))
        return fail(L, CG_E_VALUE, "%s must be a string, an object with \"content\", or null",
                    what);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0) return fail(L, CG_E_VALUE, "%s is empty", what);
    int32_t k = smap_get(&t->added_map, s, n);
    if (k >= 0) {
        t->special[t->added[k].id] = 1;
        return CG_OK;
    }
    int32_t id = smap_get(&t->model_vocab, s, n);
    if (id < 0) return fail(L, CG_E_VALUE, "%s '%s' is not in the vocabulary", what, s);
    t->added = cg_realloc(t->added, (t->n_added + 1) * sizeof *t->added);
    t->added[t->n_added] =
        (added_tok){.id = id, .content = cg_strndup(s, n), .len = n, .special = true};
    smap_put(&t->added_map, s, n, (int32_t)t->n_added);
    trie_insert(&t->raw_trie, s, n, (int32_t)t->n_added);
    t->n_added++;
    t->special[id] = 1;
    return CG_OK;
}

static cg_status load_config(ld *L, const json_t *cfg)
{
    cg_tokenizer *t = L->t;
    cg_status st;
    if ((st = config_token(L, cfg, "bos_token", &t->bos)) != CG_OK ||
        (st = config_token(L, cfg, "eos_token", &t->eos)) != CG_OK ||
        (st = get_bool(L, cfg, "clean_up_tokenization_spaces", "tokenizer_config", false,
                       &t->clean_up)) != CG_OK)
        return st;
    static const char *const named[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                        "pad_token", "cls_token", "mask_token"};
    for (size_t i = 0; i < CG_ARRAY_LEN(named); i++)
        if ((st = config_special(L, json_object_get(cfg, named[i]), named[i])) != CG_OK) return st;
    const json_t *extra = json_object_get(cfg, "additional_special_tokens");
    if (extra && !json_is_null(extra) && !json_is_array(extra))
        return fail(L, CG_E_VALUE, "additional_special_tokens must be an array");
    for (size_t i = 0; i < json_array_size(extra); i++) {
        char what[64];
        snprintf(what, sizeof what, "additional_special_tokens[%zu]", i);
        if ((st = config_special(L, json_array_get(extra, i), what)) != CG_OK) return st;
    }
    const json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct))
        t->chat_template = cg_strdup(json_string_value(ct));
    else if (json_is_array(ct)) {
        for (size_t i = 0; i < json_array_size(ct); i++) {
            const json_t *e = json_array_get(ct, i);
            const json_t *nm = json_object_get(e, "name"), *tp = json_object_get(e, "template");
            if (!json_is_string(nm) || !json_is_string(tp))
                return fail(L, CG_E_VALUE, "chat_template[%zu] must have string name and template",
                            i);
            if (!strcmp(json_string_value(nm), "default"))
                t->chat_template = cg_strdup(json_string_value(tp));
        }
    } else if (ct && !json_is_null(ct))
        return fail(L, CG_E_VALUE, "chat_template must be a string or a list of {name, template}");

    /* transformers rebuilds the template from add_bos_token / add_eos_token: always for the
     * Llama and Gemma tokenizer classes (BOS on by default), else when either is set. */
    const json_t *cls = json_object_get(cfg, "tokenizer_class");
    const char *c = json_is_string(cls) ? json_string_value(cls) : "";
    bool llama = !strncmp(c, "LlamaTokenizer", 14) || !strncmp(c, "CodeLlamaTokenizer", 18) ||
                 !strncmp(c, "GemmaTokenizer", 14);
    /* add_prefix_space: transformers' GPT-2 tokenizer sets it on the ByteLevel pre-tokenizer;
     * the Llama ones rebuild the whole tokenizer from tokenizer.model, which we cannot do */
    const json_t *aps = json_object_get(cfg, "add_prefix_space");
    if (aps && !json_is_null(aps)) {
        if (!json_is_boolean(aps))
            return fail(L, CG_E_VALUE, "add_prefix_space must be a boolean, not %s", jtype(aps));
        if (llama)
            return fail(
                L, CG_E_UNSUPPORTED,
                "add_prefix_space makes transformers rebuild a %s from tokenizer.model; only "
                "tokenizer.json is supported",
                c);
        if (!strncmp(c, "GPT2Tokenizer", 13))
            for (size_t i = 0; i < t->n_pt; i++)
                if (t->pt[i].kind == PT_BYTELEVEL) t->pt[i].add_prefix_space = json_is_true(aps);
    }
    bool add_bos, add_eos;
    if ((st = get_bool(L, cfg, "add_bos_token", "tokenizer_config", llama, &add_bos)) != CG_OK ||
        (st = get_bool(L, cfg, "add_eos_token", "tokenizer_config", false, &add_eos)) != CG_OK)
        return st;
    if (llama || add_bos || add_eos) {
        if (add_bos && t->bos < 0)
            return fail(L, CG_E_VALUE, "add_bos_token is set but bos_token is not");
        if (add_eos && t->eos < 0)
            return fail(L, CG_E_VALUE, "add_eos_token is set but eos_token is not");
        free(t->tmpl);
        t->tmpl = cg_malloc(3 * sizeof *t->tmpl);
        t->n_tmpl = 0;
        if (add_bos) t->tmpl[t->n_tmpl++] = t->bos;
        t->tmpl[t->n_tmpl++] = -1;
        if (add_eos) t->tmpl[t->n_tmpl++] = t->eos;
    }
    return CG_OK;
}

/* The tries of added tokens: those with normalized=false are searched in the raw text, the
 * others (their content normalized) in the normalized pieces. */
static cg_status build_added(ld *L)
{
    cg_tokenizer *t = L->t;
    ectx c = {.t = t};
    bool any_word = false;
    for (size_t i = 0; i < t->n_added; i++) {
        added_tok *a = &t->added[i];
        any_word |= a->single_word;
        if (!a->normalized) {
            trie_insert(&t->raw_trie, a->content, a->len, (int32_t)i);
            continue;
        }
        c.md = c.md ? c.md : pcre2_match_data_create(1, NULL);
        if (normalize(&c, a->content, a->len) < 0) {
            pcre2_match_data_free(c.md);
            sb_free(&c.norm);
            sb_free(&c.tmp);
            free(c.mr);
            return fail(L, CG_E_INTERNAL, "added_tokens: normalizing '%s' failed", a->content);
        }
        if (c.norm.n) trie_insert(&t->norm_trie, c.norm.p, c.norm.n, (int32_t)i);
        /* tokenizers gives such a token its normalized content as its string (id -> token),
         * while the content as written still finds its id (token -> id) */
        set_str(t, a->id, c.norm.p ? c.norm.p : "", c.norm.n);
    }
    if (c.md) pcre2_match_data_free(c.md);
    sb_free(&c.norm);
    sb_free(&c.tmp);
    free(c.mr);
    if (any_word) {
        static const char w[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";
        int ec;
        PCRE2_SIZE eo;
        t->word_rx =
            pcre2_compile((PCRE2_SPTR)w, sizeof w - 1, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
        if (!t->word_rx) return fail(L, CG_E_INTERNAL, "cannot compile the word class");
    }
    return CG_OK;
}

/* Stream bytes of every id, computed once. */
static cg_status build_stream_bytes(ld *L)
{
    cg_tokenizer *t = L->t;
    t->sb_off = cg_malloc((size_t)t->n_ids * sizeof *t->sb_off);
    t->sb_len = cg_calloc((size_t)t->n_ids, sizeof *t->sb_len);
    ectx c = {.t = t};
    c.md = pcre2_match_data_create(1, NULL);
    sbuf one = {0};
    cg_status st = CG_OK;
    for (int32_t id = 0; id < t->n_ids; id++) {
        t->sb_off[id] = (uint32_t)t->sbytes.n;
        if (t->str_off[id] == NO_ID) continue;
        if (stream_bytes(t, &c, t->strs.p + t->str_off[id], t->str_len[id], &one) < 0) {
            st = fail(L, CG_E_INTERNAL, "decoding token %d failed", id);
            break;
        }
        t->sb_len[id] = (uint32_t)one.n;
        sb_add(&t->sbytes, one.p ? one.p : "", one.n);
    }
    sb_free(&one);
    sb_free(&c.tmp);
    free(c.mr);
    pcre2_match_data_free(c.md);
    return st;
}

static cg_tokenizer *tok_alloc(void)
{
    pthread_once(&bl_once, bl_init);
    cg_tokenizer *t = cg_calloc(1, sizeof *t);
    t->bos = t->eos = t->unk_id = -1;
    return t;
}

static cg_status load(ld *L, const char *json_path, const char *dir)
{
    cg_tokenizer *t = L->t;
    char *buf = NULL;
    size_t len;
    json_t *root = NULL, *cfg = NULL;
    char *cfg_path = NULL, *tpl_path = NULL;
    cg_status st = read_file(L, json_path, &buf, &len, false);
    if (st != CG_OK) goto out;
    st = parse_json(L, buf, len, 0, &root);
    cg_free(&buf);
    if (st != CG_OK) goto out;

    /* "truncation" and "padding" are ignored, as transformers ignores them unless a call asks
     * for truncation or padding. */
    int32_t max_id = -1;
    if ((st = load_model(L, json_object_get(root, "model"), &max_id)) != CG_OK) goto out;
    if ((st = load_added(L, json_object_get(root, "added_tokens"), &max_id)) != CG_OK) goto out;
    t->n_ids = max_id + 1;
    t->str_off = cg_malloc((size_t)(t->n_ids ? t->n_ids : 1) * sizeof *t->str_off);
    memset(t->str_off, 0xFF, (size_t)(t->n_ids ? t->n_ids : 1) * sizeof *t->str_off);
    t->str_len = cg_calloc((size_t)(t->n_ids ? t->n_ids : 1), sizeof *t->str_len);
    t->special = cg_calloc((size_t)(t->n_ids ? t->n_ids : 1), 1);
    for (size_t i = 0; i < t->model_vocab.n; i++) {
        const smap_ent *e = &t->model_vocab.ent[i];
        set_str(t, e->val, t->model_vocab.keys.p + e->off, e->len);
    }
    for (size_t i = 0; i < t->n_added; i++) {
        set_str(t, t->added[i].id, t->added[i].content, t->added[i].len);
        t->special[t->added[i].id] = t->added[i].special;
    }
    if ((st = load_normalizer(L, json_object_get(root, "normalizer"), "normalizer")) != CG_OK ||
        (st = load_pretok(L, json_object_get(root, "pre_tokenizer"), "pre_tokenizer")) != CG_OK ||
        (st = load_post(L, json_object_get(root, "post_processor"), "post_processor")) != CG_OK ||
        (st = load_decoder(L, json_object_get(root, "decoder"), "decoder")) != CG_OK)
        goto out;
    if ((st = build_added(L)) != CG_OK) goto out;
    if (t->n_tmpl > 1 && t->tmpl[0] >= 0 && t->special[t->tmpl[0]]) t->bos = t->tmpl[0];

    /* tokenizer_config.json and chat_template.jinja beside tokenizer.json (optional) */
    if (asprintf(&cfg_path, "%s/tokenizer_config.json", dir) < 0 ||
        asprintf(&tpl_path, "%s/chat_template.jinja", dir) < 0)
        abort();
    L->file = cfg_path;
    if ((st = read_file(L, cfg_path, &buf, &len, true)) != CG_OK) goto out;
    if (buf) {
        /* model_max_length is often 1e30 written as an integer */
        if ((st = parse_json(L, buf, len, JSON_DECODE_INT_AS_REAL, &cfg)) != CG_OK ||
            (st = load_config(L, cfg)) != CG_OK)
            goto out;
        cg_free(&buf);
    }
    if (!t->chat_template) {
        L->file = tpl_path;
        if ((st = read_file(L, tpl_path, &buf, &len, true)) != CG_OK) goto out;
        if (buf) {
            t->chat_template = buf;
            buf = NULL;
        }
    }
    t->adds_bos = t->bos >= 0 && t->n_tmpl > 1 && t->tmpl[0] == t->bos;
    L->file = json_path;
    if ((st = build_stream_bytes(L)) != CG_OK) goto out;
    t->cache = cg_calloc(CACHE_SHARDS, sizeof *t->cache);
    for (int i = 0; i < CACHE_SHARDS; i++)
        pthread_mutex_init(&t->cache[i].lock, NULL);
out:
    free(buf);
    free(cfg_path);
    free(tpl_path);
    json_decref(root);
    json_decref(cfg);
    return st;
}

cg_status cg_tokenizer_new(const char *path, cg_tokenizer **out, char *err, size_t errlen)
{
    *out = NULL;
    struct stat sb;
    char *json_path = NULL, *dir = NULL;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        dir = cg_strdup(path);
        if (asprintf(&json_path, "%s/tokenizer.json", path) < 0) abort();
    } else {
        json_path = cg_strdup(path);
        const char *slash = strrchr(path, '/');
        dir = slash ? cg_strndup(path, (size_t)(slash - path)) : cg_strdup(".");
        if (slash == path) {
            free(dir);
            dir = cg_strdup("/");
        }
    }
    ld L = {json_path, err, errlen, tok_alloc()};
    cg_status st = load(&L, json_path, dir);
    free(json_path);
    free(dir);
    if (st != CG_OK) {
        cg_tokenizer_free(&L.t);
        return st;
    }
    *out = L.t;
    return CG_OK;
}

cg_status cg_tokenizer_new_bytes(int32_t bos_id, int32_t eos_id, cg_tokenizer **out, char *err,
                                 size_t errlen)
{
    *out = NULL;
    if (bos_id < 256 || eos_id < 256 || bos_id == eos_id || bos_id >= (1 << 30) ||
        eos_id >= (1 << 30)) {
        cg_seterr(err, errlen,
                  "byte tokenizer: BOS (%d) and EOS (%d) must be distinct ids above 255", bos_id,
                  eos_id);
        return CG_E_VALUE;
    }
    cg_tokenizer *t = tok_alloc();
    t->bytes = true;
    t->bos = bos_id;
    t->eos = eos_id;
    t->adds_bos = true;
    t->n_ids = (bos_id > eos_id ? bos_id : eos_id) + 1;
    *out = t;
    return CG_OK;
}

void cg_tokenizer_free(cg_tokenizer **tp)
{
    cg_tokenizer *t = *tp;
    if (!t) return;
    free(t->str_off);
    free(t->str_len);
    sb_free(&t->strs);
    free(t->sb_off);
    free(t->sb_len);
    sb_free(&t->sbytes);
    free(t->special);
    smap_free(&t->model_vocab);
    smap_free(&t->added_map);
    pmap_free(&t->merges);
    free(t->cs_prefix);
    free(t->eow_suffix);
    if (t->cache) {
        for (int i = 0; i < CACHE_SHARDS; i++) {
            for (int k = 0; k < CACHE_SLOTS; k++)
                free(t->cache[i].slot[k]);
            pthread_mutex_destroy(&t->cache[i].lock);
        }
        free(t->cache);
    }
    for (size_t i = 0; i < t->n_nz; i++) {
        free(t->nz[i].str);
        pcre2_code_free(t->nz[i].re);
    }
    free(t->nz);
    for (size_t i = 0; i < t->n_pt; i++)
        pcre2_code_free(t->pt[i].re);
    free(t->pt);
    for (size_t i = 0; i < t->n_dc; i++) {
        free(t->dc[i].str);
        pcre2_code_free(t->dc[i].re);
    }
    free(t->dc);
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    free(t->raw_trie.v);
    free(t->norm_trie.v);
    pcre2_code_free(t->word_rx);
    free(t->tmpl);
    free(t->chat_template);
    free(t);
    *tp = NULL;
}
