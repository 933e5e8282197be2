/* Loading a tokenizer: tokenizer.json (model, vocabulary, merges, added tokens, normalizer,
 * pre-tokenizer, post-processor and decoder), tokenizer_config.json (special tokens and the chat
 * template), the tables built from them, the tiny model's byte tokenizer, and freeing. */
#include "worker/model/tokenizer_impl.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */

typedef struct ld {
    const char *file; /* shown in messages */
    char *err;
    size_t errlen;
    cg_tokenizer *t;
    /* tokenizer_config.json's named templates have no single "default" (none, or two): the
     * worker cannot tell which one a chat renders, unless chat_template.jinja decides */
    const char *template_unclear;
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
    *re =
        tk_rx_compile(json_string_value(v), json_string_length(v), s != NULL, why, sizeof why, &st);
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

/* Refuses a step whose type the tokenizer does not implement. */
static cg_status unsupported_step(ld *L, const char *path, const char *type)
{
    return fail(L, CG_E_UNSUPPORTED, "%s.type '%s' is not supported", path, type);
}

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
        return unsupported_step(L, path, type);
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
            p.re =
                tk_rx_compile(gpt2_pattern, sizeof gpt2_pattern - 1, false, why, sizeof why, &st);
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
        return unsupported_step(L, path, type);
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
        return unsupported_step(L, path, type);
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
    if (strcmp(type, "TemplateProcessing")) return unsupported_step(L, path, type);
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
            tk_grow(&nt, &cap, nn + k, sizeof *nt);
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
            tk_grow(&nt, &cap, nn + 1, sizeof *nt);
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
    tk_sb_add(&t->strs, s, n);
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
        tk_smap_put(&t->model_vocab, k, kl, id);
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
        t->unk_id = tk_smap_get(&t->model_vocab, s, sl);
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
        t->byte_ids[b] = tk_smap_get(&t->model_vocab, name, 6);
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
    int32_t ia = tk_smap_get(&t->model_vocab, a, al), ib = tk_smap_get(&t->model_vocab, b, bl);
    if (ia < 0 || ib < 0)
        return fail(L, CG_E_VALUE, "model.merges[%zu]: '%.*s' is not in model.vocab", i,
                    (int)(ia < 0 ? al : bl), ia < 0 ? a : b);
    if (bl < t->cs_prefix_len)
        return fail(L, CG_E_VALUE,
                    "model.merges[%zu]: '%.*s' is shorter than continuing_subword_prefix", i,
                    (int)bl, b);
    cat->n = 0;
    tk_sb_add(cat, a, al);
    tk_sb_add(cat, b + t->cs_prefix_len, bl - t->cs_prefix_len);
    int32_t ic = tk_smap_get(&t->model_vocab, cat->p, cat->n);
    if (ic < 0)
        return fail(L, CG_E_VALUE, "model.merges[%zu]: the merged token '%s' is not in model.vocab",
                    i, cat->p);
    tk_pmap_put(&t->merges, (uint32_t)ia, (uint32_t)ib, rank, (uint32_t)ic);
    return CG_OK;
}

/* model.merges into t->merges, ranked in their order. */
static cg_status load_merges(ld *L, const json_t *m)
{
    cg_tokenizer *t = L->t;
    const json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges)) return fail(L, CG_E_VALUE, "model.merges must be an array");
    tk_pmap_init(&t->merges, json_array_size(merges));
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
    tk_sb_free(&cat);
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
        int32_t dup = tk_smap_get(&t->added_map, s, sl);
        if (dup >= 0) {
            if (t->added[dup].id != want)
                return fail(L, CG_E_VALUE, "%s: '%s' is listed again with another id (%d, was %d)",
                            path, s, want, t->added[dup].id);
            continue;
        }
        id = tk_smap_get(&t->model_vocab, s, sl);
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
        tk_smap_put(&t->added_map, s, sl, (int32_t)t->n_added);
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
    int32_t k = tk_smap_get(&t->added_map, s, n);
    if (k >= 0) {
        t->special[t->added[k].id] = 1;
        return CG_OK;
    }
    int32_t id = tk_smap_get(&t->model_vocab, s, n);
    if (id < 0) return fail(L, CG_E_VALUE, "%s '%s' is not in the vocabulary", what, s);
    t->added = cg_realloc(t->added, (t->n_added + 1) * sizeof *t->added);
    t->added[t->n_added] =
        (added_tok){.id = id, .content = cg_strndup(s, n), .len = n, .special = true};
    tk_smap_put(&t->added_map, s, n, (int32_t)t->n_added);
    tk_trie_insert(&t->raw_trie, s, n, (int32_t)t->n_added);
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
        /* named templates: the worker renders the one transformers uses without a name */
        for (size_t i = 0; i < json_array_size(ct); i++) {
            const json_t *e = json_array_get(ct, i);
            const json_t *nm = json_object_get(e, "name"), *tp = json_object_get(e, "template");
            if (!json_is_string(nm) || !json_is_string(tp))
                return fail(L, CG_E_VALUE, "chat_template[%zu] must have string name and template",
                            i);
            if (strcmp(json_string_value(nm), "default")) continue;
            if (t->chat_template) {
                L->template_unclear = "chat_template names two templates \"default\"";
                cg_free(&t->chat_template);
                break;
            }
            t->chat_template = cg_strdup(json_string_value(tp));
        }
        if (json_array_size(ct) && !t->chat_template && !L->template_unclear)
            L->template_unclear = "chat_template lists named templates and none is \"default\" "
                                  "(the one a chat request would render)";
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
            tk_trie_insert(&t->raw_trie, a->content, a->len, (int32_t)i);
            continue;
        }
        c.md = c.md ? c.md : pcre2_match_data_create(1, NULL);
        if (tk_normalize(&c, a->content, a->len) < 0) {
            pcre2_match_data_free(c.md);
            tk_sb_free(&c.norm);
            tk_sb_free(&c.tmp);
            free(c.mr);
            return fail(L, CG_E_INTERNAL, "added_tokens: normalizing '%s' failed", a->content);
        }
        if (c.norm.n) tk_trie_insert(&t->norm_trie, c.norm.p, c.norm.n, (int32_t)i);
        /* tokenizers gives such a token its normalized content as its string (id -> token),
         * while the content as written still finds its id (token -> id) */
        set_str(t, a->id, c.norm.p ? c.norm.p : "", c.norm.n);
    }
    if (c.md) pcre2_match_data_free(c.md);
    tk_sb_free(&c.norm);
    tk_sb_free(&c.tmp);
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
        if (tk_stream_bytes(t, &c, t->strs.p + t->str_off[id], t->str_len[id], &one) < 0) {
            st = fail(L, CG_E_INTERNAL, "decoding token %d failed", id);
            break;
        }
        t->sb_len[id] = (uint32_t)one.n;
        tk_sb_add(&t->sbytes, one.p ? one.p : "", one.n);
    }
    tk_sb_free(&one);
    tk_sb_free(&c.tmp);
    free(c.mr);
    pcre2_match_data_free(c.md);
    return st;
}

static pthread_once_t bl_once = PTHREAD_ONCE_INIT;

static cg_tokenizer *tok_alloc(void)
{
    pthread_once(&bl_once, tk_bl_init);
    cg_tokenizer *t = cg_calloc(1, sizeof *t);
    t->bos = t->eos = t->unk_id = -1;
    return t;
}

/* tokenizer.json's object: the model, the added tokens and the pipeline. */
static cg_status load_tokenizer_json(ld *L, json_t *root)
{
    cg_tokenizer *t = L->t;
    cg_status st;
    /* "truncation" and "padding" are ignored, as transformers ignores them unless a call asks
     * for truncation or padding. */
    int32_t max_id = -1;
    if ((st = load_model(L, json_object_get(root, "model"), &max_id)) != CG_OK) return st;
    if ((st = load_added(L, json_object_get(root, "added_tokens"), &max_id)) != CG_OK) return st;
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
        return st;
    if ((st = build_added(L)) != CG_OK) return st;
    if (t->n_tmpl > 1 && t->tmpl[0] >= 0 && t->special[t->tmpl[0]]) t->bos = t->tmpl[0];
    return CG_OK;
}

/* After tokenizer_config.json: the BOS flag, the stream bytes, the cache. */
static cg_status finish(ld *L)
{
    cg_tokenizer *t = L->t;
    t->adds_bos = t->bos >= 0 && t->n_tmpl > 1 && t->tmpl[0] == t->bos;
    cg_status st = build_stream_bytes(L);
    if (st != CG_OK) return st;
    t->cache = cg_calloc(CACHE_SHARDS, sizeof *t->cache);
    for (int i = 0; i < CACHE_SHARDS; i++)
        pthread_mutex_init(&t->cache[i].lock, NULL);
    return CG_OK;
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
    st = parse_json(L, buf, len, JSON_REJECT_DUPLICATES, &root);
    cg_free(&buf);
    if (st != CG_OK || (st = load_tokenizer_json(L, root)) != CG_OK) goto out;

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
    /* as transformers loads them, chat_template.jinja replaces the config's template */
    L->file = tpl_path;
    if ((st = read_file(L, tpl_path, &buf, &len, true)) != CG_OK) goto out;
    if (buf) {
        free(t->chat_template);
        t->chat_template = buf;
        buf = NULL;
    } else if (L->template_unclear) {
        L->file = cfg_path;
        st = fail(L, CG_E_VALUE, "%s", L->template_unclear);
        goto out;
    }
    L->file = json_path;
    st = finish(L);
out:
    free(buf);
    free(cfg_path);
    free(tpl_path);
    json_decref(root);
    json_decref(cfg);
    return st;
}

cg_status cg_tokenizer_new_json(json_t *tok, json_t *config, const char *label, cg_tokenizer **out,
                                char *err, size_t errlen)
{
    *out = NULL;
    ld L = {label, err, errlen, tok_alloc(), NULL};
    cg_status st = load_tokenizer_json(&L, tok);
    if (st == CG_OK && config) st = load_config(&L, config);
    if (st == CG_OK && L.template_unclear) st = fail(&L, CG_E_VALUE, "%s", L.template_unclear);
    if (st == CG_OK) st = finish(&L);
    if (st != CG_OK) {
        cg_tokenizer_free(&L.t);
        return st;
    }
    *out = L.t;
    return CG_OK;
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
    ld L = {json_path, err, errlen, tok_alloc(), NULL};
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
    tk_sb_free(&t->strs);
    free(t->sb_off);
    free(t->sb_len);
    tk_sb_free(&t->sbytes);
    free(t->special);
    tk_smap_free(&t->model_vocab);
    tk_smap_free(&t->added_map);
    tk_pmap_free(&t->merges);
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
