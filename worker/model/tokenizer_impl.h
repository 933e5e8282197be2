/* The tokenizer module's private header: the tokenizer's structure (vocabularies, merges, the
 * normalizer, pre-tokenizer and decoder chains, added tokens, the BPE cache) and the scratch
 * state of one encode, shared by its three files, with the functions they call across them.
 * Not a public interface: worker/model/tokenizer.h is.
 *
 *   tokenizer.c        the runtime: encode (added tokens, normalizer, pre-tokenizer, BPE,
 *                      post-processor) and decode, and the small containers they use
 *   tokenizer_load.c   the loader: tokenizer.json, tokenizer_config.json, the byte tokenizer
 *   tokenizer_regex.c  tokenizers' Oniguruma patterns rewritten for and run on PCRE2 */
#ifndef CG_TOKENIZER_IMPL_H
#define CG_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8

#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "worker/model/tokenizer.h"

#define NO_ID UINT32_MAX

/* ---- containers: byte strings, string -> id, (id, id) -> (rank, id) ---- */

/* A byte string under construction (no cap: these hold tokenizer-internal data). */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

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

typedef struct pent {
    uint64_t key; /* (a << 32 | b), UINT64_MAX when empty */
    uint64_t val; /* (rank << 32 | new_id) */
} pent;

typedef struct pmap {
    pent *v;
    size_t mask, n;
} pmap;

/* ---- the tokenizer's structure ---- */

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

/* ---- encoding: the scratch state of one call ---- */

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

/* ---- UTF-8 ---- */

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

/* ---- tokenizer.c: helpers, maps, byte-level alphabet, the encoder and decoder ---- */

/* Grows *p (elements of size sz, capacity *cap) to hold at least need elements. */
void tk_grow(void *pp, size_t *cap, size_t need, size_t sz);

void tk_sb_add(sbuf *b, const void *s, size_t n);

void tk_sb_free(sbuf *b);

/* Inserts or overwrites k -> v. */
void tk_smap_put(smap *m, const char *k, size_t n, int32_t v);

int32_t tk_smap_get(const smap *m, const char *k, size_t n);

void tk_smap_free(smap *m);

void tk_pmap_init(pmap *m, size_t expected);

/* Inserts or overwrites: a later merge of the same pair replaces the earlier rank, as the
 * HashMap that tokenizers collects the merges into does. */
void tk_pmap_put(pmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id);

void tk_pmap_free(pmap *m);

int tk_hexval(char ch);

void tk_bl_init(void);

/* Normalizes s[0..n) into c->norm. Returns -1 on a regex engine error. */
int tk_normalize(ectx *c, const char *s, size_t n);

void tk_trie_insert(trie *tr, const char *s, size_t n, int32_t tok);

/* The per-token stream bytes: the decoder chain on one token, with the steps that only make
 * sense for a whole text (Strip, Metaspace's first-token rule, lossy UTF-8) left out. */
int tk_stream_bytes(const cg_tokenizer *t, ectx *c, const char *s, size_t n, sbuf *out);

/* ---- tokenizer_regex.c: Oniguruma patterns on PCRE2 ---- */

/* Compiles a pattern (literal: a plain string to find). Returns NULL with a message in why and
 * *st CG_E_UNSUPPORTED (a construct refused by rx_rewrite) or CG_E_VALUE (does not compile). */
pcre2_code *tk_rx_compile(const char *pat, size_t n, bool literal, char *why, size_t whylen,
                          cg_status *st);

/* One match attempt from pos; returns 1 with [*s, *e) on a match, 0 on none, -1 on error. */
int tk_rx_match(const pcre2_code *re, const char *s, size_t n, size_t pos, uint32_t opts,
                pcre2_match_data *md, size_t *ms, size_t *me);

#endif
