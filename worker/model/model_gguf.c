/* A GGUF checkpoint (llama.cpp's format) served as it is: the metadata becomes the config.json
 * and tokenizer.json a Hugging Face checkpoint would carry, and both go through the same
 * parsers and checks (worker/model/config.c, tokenizer_load.c); the tensors are mapped where
 * the worker can use them as they are (F32, F16, BF16) and repacked at load where its kernels
 * want another layout (Q8_0, Q4_0). Whatever the worker cannot run exactly (another
 * architecture, tensor type, tokenizer model or pre-tokenizer) is refused by name.
 *
 * Two things differ from a Hugging Face checkpoint: llama.cpp's converter permutes the rows of
 * a "llama" model's q and k so that RoPE rotates adjacent pairs, which the worker runs as
 * rope_style "interleaved"; and Llama 3's RoPE scaling arrives as the per-frequency divisors of
 * the tensor rope_freqs.weight. */
#include "worker/model/model_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"
#include "worker/model/tokenizer.h"

/* GGUF token types (llama.cpp's llama_token_type). */
enum {
    TOK_NORMAL = 1,
    TOK_UNKNOWN = 2,
    TOK_CONTROL = 3,
    TOK_USER = 4,
    TOK_UNUSED = 5,
    TOK_BYTE = 6
};

int cg_model_is_gguf(const char *path)
{
    struct stat sb;
    size_t n = strlen(path);
    return n > 5 && !strcmp(path + n - 5, ".gguf") && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ---- the config ---- */

static const struct {
    const char *gguf, *hf;
} archs[] = {
    {"llama", "LlamaForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},
};

/* "{arch}.suffix" as an integer; -1 when absent. */
static int64_t arch_int(const cg_gguf *g, const char *arch, const char *suffix)
{
    char key[128];
    int64_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return cg_gguf_get_int(g, key, &v) == 0 ? v : -1;
}

static int arch_float(const cg_gguf *g, const char *arch, const char *suffix, double *v)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return cg_gguf_get_float(g, key, v);
}

/* The model's name: general.name, else the file name without .gguf. */
static void model_name(const cg_gguf *g, const char *path, char *out, size_t n)
{
    size_t len = 0;
    const char *s = cg_gguf_get_str(g, "general.name", &len);
    json_t *probe = s && len && len < n ? json_stringn(s, len) : NULL; /* NULL: not UTF-8 */
    if (probe) {
        json_decref(probe);
        snprintf(out, n, "%.*s", (int)len, s);
        return;
    }
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, n, "%.*s", (int)(strlen(b) - 5), b);
    if (!(probe = json_string(out))) snprintf(out, n, "gguf-model");
    json_decref(probe);
}

/* The metadata the worker reads, by the kind of value it reads ('@' stands for "{arch}."). One
 * of another kind is refused by name rather than read as absent: the default put in its place
 * would run another model than the file describes. */
enum meta_kind { META_INT, META_NUM, META_STR };
static const struct {
    const char *key;
    enum meta_kind kind;
} metadata[] = {
    {"@context_length", META_INT},
    {"@embedding_length", META_INT},
    {"@block_count", META_INT},
    {"@feed_forward_length", META_INT},
    {"@attention.head_count", META_INT},
    {"@attention.head_count_kv", META_INT},
    {"@attention.key_length", META_INT},
    {"@attention.value_length", META_INT},
    {"@attention.layer_norm_rms_epsilon", META_NUM},
    {"@rope.dimension_count", META_INT},
    {"@rope.freq_base", META_NUM},
    {"@rope.scale_linear", META_NUM},
    {"@rope.scaling.type", META_STR},
    {"@rope.scaling.factor", META_NUM},
    {"@rope.scaling.original_context_length", META_INT},
    {"@vocab_size", META_INT},
    {"@expert_count", META_INT},
    {"tokenizer.ggml.model", META_STR},
    {"tokenizer.ggml.pre", META_STR},
    {"tokenizer.ggml.bos_token_id", META_INT},
    {"tokenizer.ggml.eos_token_id", META_INT},
    {"tokenizer.ggml.eot_token_id", META_INT},
    {"tokenizer.ggml.eom_token_id", META_INT},
    {"tokenizer.ggml.add_bos_token", META_INT},
    {"tokenizer.ggml.add_eos_token", META_INT},
    {"tokenizer.chat_template", META_STR},
};

/* The keys under {arch}.rope.scaling. that the worker reads or that change nothing; llama.cpp
 * reads more (attn_factor, the yarn_* corrections), which the worker does not apply. */
static const char *const rope_scaling_keys[] = {"type", "factor", "original_context_length",
                                                "finetuned"};

static cg_status check_metadata(const cg_gguf *g, const char *arch, const char *path, char *err,
                                size_t errlen)
{
    static const char *const want[] = {"an integer", "a finite number",
                                       "a string without NUL bytes"};
    for (size_t i = 0; i < CG_ARRAY_LEN(metadata); i++) {
        char key[128];
        const char *k = metadata[i].key;
        if (*k == '@')
            snprintf(key, sizeof key, "%s.%s", arch, k + 1);
        else
            snprintf(key, sizeof key, "%s", k);
        const cg_gguf_kv *kv = cg_gguf_find(g, key);
        if (!kv) continue;
        int64_t n;
        double d;
        size_t len = 0;
        const char *s;
        bool ok = false;
        switch (metadata[i].kind) {
        case META_INT:
            ok = cg_gguf_get_int(g, key, &n) == 0;
            break;
        case META_NUM:
            ok = cg_gguf_get_float(g, key, &d) == 0 && isfinite(d);
            break;
        case META_STR:
            s = cg_gguf_get_str(g, key, &len);
            ok = s && !memchr(s, 0, len);
            break;
        }
        if (!ok) {
            cg_seterr(err, errlen, "%s: %s must be %s", path, key, want[metadata[i].kind]);
            return CG_E_VALUE;
        }
    }
    char prefix[64];
    const size_t plen = (size_t)snprintf(prefix, sizeof prefix, "%s.rope.scaling.", arch);
    for (size_t i = 0; i < cg_gguf_n_kv(g); i++) {
        const char *key = cg_gguf_kv_at(g, i)->key;
        if (strncmp(key, prefix, plen)) continue;
        bool known = false;
        for (size_t k = 0; k < CG_ARRAY_LEN(rope_scaling_keys) && !known; k++)
            known = !strcmp(key + plen, rope_scaling_keys[k]);
        if (!known) {
            cg_seterr(err, errlen,
                      "%s: %.100s is not supported (the worker reads %stype, factor "
                      "and original_context_length)",
                      path, key, prefix);
            return CG_E_UNSUPPORTED;
        }
    }
    return CG_OK;
}

/* config.json as the metadata describes it; NULL with err
 * and *st set on a missing or refused key. */
static json_t *config_json(const cg_gguf *g, const char *path, const char **arch_out, cg_status *st,
                           char *err, size_t errlen)
{
    *st = CG_E_UNSUPPORTED;
    size_t alen = 0;
    const char *a = cg_gguf_get_str(g, "general.architecture", &alen);
    const char *arch = NULL, *hf = NULL;
    for (size_t i = 0; a && i < CG_ARRAY_LEN(archs); i++)
        if (alen == strlen(archs[i].gguf) && !memcmp(a, archs[i].gguf, alen))
            arch = archs[i].gguf, hf = archs[i].hf;
    if (!arch) {
        cg_seterr(err, errlen,
                  "%s: general.architecture '%.*s' is not supported (llama, qwen2, qwen3)", path,
                  a ? (int)CG_MIN(alen, (size_t)64) : 0, a ? a : "");
        return NULL;
    }
    *arch_out = arch;
    if ((*st = check_metadata(g, arch, path, err, errlen)) != CG_OK) return NULL;
    *st = CG_E_VALUE;
    static const char *const need[] = {"embedding_length", "block_count", "feed_forward_length",
                                       "attention.head_count", "context_length"};
    for (size_t i = 0; i < CG_ARRAY_LEN(need); i++)
        if (arch_int(g, arch, need[i]) < 1) {
            cg_seterr(err, errlen, "%s: %s.%s is missing or not a positive integer", path, arch,
                      need[i]);
            return NULL;
        }
    const int64_t experts = arch_int(g, arch, "expert_count");
    if (experts > 0) {
        cg_seterr(err, errlen,
                  "%s: %s.expert_count is %lld: mixture-of-experts models are not "
                  "supported",
                  path, arch, (long long)experts);
        *st = CG_E_UNSUPPORTED;
        return NULL;
    }
    const int64_t heads = arch_int(g, arch, "attention.head_count");
    const int64_t kv_heads = arch_int(g, arch, "attention.head_count_kv");
    const int64_t key_len = arch_int(g, arch, "attention.key_length");
    const int64_t val_len = arch_int(g, arch, "attention.value_length");
    const int64_t dim = arch_int(g, arch, "embedding_length");
    const int64_t head_dim = key_len > 0 ? key_len : dim / heads;
    if (val_len > 0 && val_len != head_dim) {
        cg_seterr(err, errlen,
                  "%s: %s.attention.value_length %lld differs from the key length "
                  "%lld; not supported",
                  path, arch, (long long)val_len, (long long)head_dim);
        *st = CG_E_UNSUPPORTED;
        return NULL;
    }
    const int64_t rot = arch_int(g, arch, "rope.dimension_count");
    if (rot > 0 && rot != head_dim) {
        cg_seterr(err, errlen,
                  "%s: %s.rope.dimension_count %lld rotates part of a head of %lld; "
                  "partial rotary embeddings are not supported",
                  path, arch, (long long)rot, (long long)head_dim);
        *st = CG_E_UNSUPPORTED;
        return NULL;
    }
    const cg_gguf_kv *tokens = cg_gguf_find(g, "tokenizer.ggml.tokens");
    int64_t vocab = arch_int(g, arch, "vocab_size");
    if (vocab < 1 && tokens) vocab = (int64_t)tokens->n;
    const cg_gguf_tensor *embd = cg_gguf_find_tensor(g, "token_embd.weight");
    if (vocab < 1 && embd && embd->ndim == 2) vocab = embd->ne[1];
    /* as llama.cpp: the norm's epsilon is required, RoPE's base defaults to 10000 */
    double eps, theta = 10000.0;
    if (arch_float(g, arch, "attention.layer_norm_rms_epsilon", &eps) != 0) {
        cg_seterr(err, errlen, "%s: %s.attention.layer_norm_rms_epsilon is missing", path, arch);
        return NULL;
    }
    arch_float(g, arch, "rope.freq_base", &theta);
    char name[128];
    model_name(g, path, name, sizeof name);
    json_t *c = json_pack(
        "{s:[s], s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, "
        "s:b}",
        "architectures", hf, "model_id", name, "hidden_act", "silu", "hidden_size", (json_int_t)dim,
        "num_hidden_layers", (json_int_t)arch_int(g, arch, "block_count"), "intermediate_size",
        (json_int_t)arch_int(g, arch, "feed_forward_length"), "num_attention_heads",
        (json_int_t)heads, "num_key_value_heads", (json_int_t)(kv_heads > 0 ? kv_heads : heads),
        "head_dim", (json_int_t)head_dim, "max_position_embeddings",
        (json_int_t)arch_int(g, arch, "context_length"), "vocab_size", (json_int_t)vocab,
        "rms_norm_eps", eps, "rope_theta", theta, "tie_word_embeddings",
        !cg_gguf_find_tensor(g, "output.weight"));
    if (!c) {
        cg_seterr(err, errlen, "%s: the metadata does not make a config", path);
        return NULL;
    }
    if (!strcmp(arch, "llama")) json_object_set_new(c, "rope_style", json_string("interleaved"));
    int64_t id;
    if (cg_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &id) == 0)
        json_object_set_new(c, "bos_token_id", json_integer(id));
    if (cg_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &id) == 0)
        json_object_set_new(c, "eos_token_id", json_integer(id));
    /* as llama.cpp reads it: the type defaults to linear, the factor (or its older name,
     * rope.scale_linear) to 1, and 0 means 1 */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    size_t slen = 6;
    const char *scaling = cg_gguf_get_str(g, key, &slen);
    if (!scaling) scaling = "linear", slen = 6;
    double factor = 0.0;
    if (arch_float(g, arch, "rope.scaling.factor", &factor) != 0)
        arch_float(g, arch, "rope.scale_linear", &factor);
    if (factor == 0.0) factor = 1.0;
    json_t *rs = NULL;
    if (slen == 6 && !memcmp(scaling, "linear", 6)) {
        if (factor != 1.0) rs = json_pack("{s:s, s:f}", "type", "linear", "factor", factor);
    } else if (slen == 4 && !memcmp(scaling, "yarn", 4)) {
        int64_t orig = arch_int(g, arch, "rope.scaling.original_context_length");
        rs = json_pack("{s:s, s:f, s:I}", "rope_type", "yarn", "factor", factor,
                       "original_max_position_embeddings",
                       (json_int_t)(orig > 0 ? orig : arch_int(g, arch, "context_length")));
    } else if (!(slen == 4 && !memcmp(scaling, "none", 4))) {
        cg_seterr(err, errlen, "%s: %s '%.*s' is not supported (none, linear, yarn)", path, key,
                  (int)CG_MIN(slen, (size_t)32), scaling);
        *st = CG_E_UNSUPPORTED;
        json_decref(c);
        return NULL;
    }
    if (rs && json_object_set_new(c, "rope_scaling", rs) != 0) {
        cg_seterr(err, errlen, "%s: the RoPE scaling does not make a config", path);
        json_decref(c);
        return NULL;
    }
    *st = CG_OK;
    return c;
}

/* Llama 3's scaling: theta_i divided by rope_freqs.weight[i]. */
static cg_status rope_freqs(const cg_gguf *g, const char *path, cg_model_config *c, char *err,
                            size_t errlen)
{
    const cg_gguf_tensor *t = cg_gguf_find_tensor(g, "rope_freqs.weight");
    if (!t) return CG_OK;
    if (t->type != CG_GGML_F32 || t->ndim != 1 || t->ne[0] != c->head_dim / 2) {
        cg_seterr(err, errlen, "%s: rope_freqs.weight must be F32 [%d]", path, c->head_dim / 2);
        return CG_E_VALUE;
    }
    if (strcmp(c->rope_scaling, "none")) {
        cg_seterr(err, errlen,
                  "%s: rope_freqs.weight and %s RoPE scaling together are not "
                  "supported",
                  path, c->rope_scaling);
        return CG_E_UNSUPPORTED;
    }
    for (int i = 0; i < c->head_dim / 2; i++) {
        float f;
        memcpy(&f, t->data + 4 * (size_t)i, 4);
        if (!(f > 0.0f) || f > 1e6f) {
            cg_seterr(err, errlen, "%s: rope_freqs.weight[%d] = %g is not a positive factor", path,
                      i, (double)f);
            return CG_E_VALUE;
        }
        c->inv_freq[i] /= f;
    }
    snprintf(c->rope_scaling, sizeof c->rope_scaling, "llama3");
    return CG_OK;
}

/* ---- the tokenizer ---- */

/* The pre-tokenizers llama.cpp names in tokenizer.ggml.pre, as the tokenizer.json files of the
 * same models write them (Qwen2 and Qwen3 normalise to NFC; Llama 3 skips the merges of a
 * word that is a whole token). */
#define QWEN2_RX                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_RX                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static json_t *split_then_bytes(const char *rx)
{
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type",
                     "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", rx,
                     "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space",
                     0, "trim_offsets", 0, "use_regex", 0);
}

/* pre_tokenizer and normalizer for tokenizer.ggml.pre, and whether a BOS starts a prompt when
 * tokenizer.ggml.add_bos_token does not say (llama.cpp's defaults: the Llama 3 family adds one,
 * and the files of older converters lack the key); -1 when the name is not one the worker
 * knows. */
static int pipeline(const char *pre, size_t n, json_t **pretok, json_t **norm, int *ignore_merges,
                    int *add_bos)
{
    *norm = NULL;
    *ignore_merges = 0;
    *add_bos = 0;
#define IS(s) (n == sizeof(s) - 1 && !memcmp(pre, s, n))
    if (!pre || IS("default") || IS("gpt2") || IS("gpt-2")) {
        *pretok = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                            "trim_offsets", 1, "use_regex", 1);
        return 0;
    }
    if (IS("qwen2")) {
        *pretok = split_then_bytes(QWEN2_RX);
        *norm = json_pack("{s:s}", "type", "NFC");
        return 0;
    }
    if (IS("llama-bpe") || IS("llama3") || IS("llama-v3")) {
        *pretok = split_then_bytes(LLAMA3_RX);
        *ignore_merges = 1;
        *add_bos = 1;
        return 0;
    }
#undef IS
    return -1;
}

/* Element i of a string array as a JSON string; NULL when it is not UTF-8 or holds a NUL byte
 * (a token's text is a key of the vocabulary, where a NUL would end it early and make it
 * another token's). */
static json_t *str_of(const cg_gguf_kv *kv, uint64_t i)
{
    size_t len;
    const char *s = cg_gguf_arr_str(kv, i, &len);
    return memchr(s, 0, len) ? NULL : json_stringn(s, len);
}

/* tokenizer.json and tokenizer_config.json as the metadata describes them. */
static cg_status tokenizer_json(const cg_gguf *g, const char *path, json_t **tok_out,
                                json_t **cfg_out, char *err, size_t errlen)
{
    size_t mlen = 0, plen = 0;
    const char *model = cg_gguf_get_str(g, "tokenizer.ggml.model", &mlen);
    if (!model || mlen != 4 || memcmp(model, "gpt2", 4)) {
        cg_seterr(err, errlen,
                  "%s: tokenizer.ggml.model '%.*s' is not supported from GGUF (gpt2: byte-level "
                  "BPE); serve the model's Hugging Face files instead",
                  path, model ? (int)CG_MIN(mlen, (size_t)32) : 0, model ? model : "");
        return CG_E_UNSUPPORTED;
    }
    const cg_gguf_kv *tokens = cg_gguf_find(g, "tokenizer.ggml.tokens");
    const cg_gguf_kv *types = cg_gguf_find(g, "tokenizer.ggml.token_type");
    const cg_gguf_kv *merges = cg_gguf_find(g, "tokenizer.ggml.merges");
    if (!tokens || tokens->type != CG_GGUF_ARRAY || tokens->atype != CG_GGUF_STRING || !tokens->n ||
        !merges || merges->type != CG_GGUF_ARRAY || merges->atype != CG_GGUF_STRING) {
        cg_seterr(err, errlen,
                  "%s: tokenizer.ggml.tokens (not empty) and tokenizer.ggml.merges must be "
                  "string arrays",
                  path);
        return CG_E_VALUE;
    }
    if (types && (types->type != CG_GGUF_ARRAY || types->n != tokens->n ||
                  (types->atype != CG_GGUF_I32 && types->atype != CG_GGUF_U32))) {
        cg_seterr(err, errlen,
                  "%s: tokenizer.ggml.token_type must be an integer array as long "
                  "as the tokens",
                  path);
        return CG_E_VALUE;
    }
    const char *pre = cg_gguf_get_str(g, "tokenizer.ggml.pre", &plen);
    json_t *pretok, *norm;
    int ignore_merges, bos_default;
    if (pipeline(pre, plen, &pretok, &norm, &ignore_merges, &bos_default) != 0) {
        cg_seterr(err, errlen,
                  "%s: tokenizer.ggml.pre '%.*s' is not supported (default, gpt2, "
                  "qwen2, llama-bpe, llama3, llama-v3)",
                  path, (int)CG_MIN(plen, (size_t)32), pre);
        return CG_E_UNSUPPORTED;
    }
    json_t *vocab = json_object(), *added = json_array(), *mlist = json_array();
    for (uint64_t i = 0; i < tokens->n; i++) {
        int64_t ty = types ? cg_gguf_arr_int(types, i) : TOK_NORMAL;
        if (ty == TOK_UNUSED) continue;
        json_t *s = str_of(tokens, i);
        if (!s) {
            cg_seterr(err, errlen,
                      "%s: tokenizer.ggml.tokens[%llu] is not UTF-8 text without NUL bytes", path,
                      (unsigned long long)i);
            goto not_utf8;
        }
        if (ty == TOK_CONTROL || ty == TOK_USER || ty == TOK_UNKNOWN)
            json_array_append_new(added, json_pack("{s:I, s:o, s:b, s:b, s:b, s:b, s:b}", "id",
                                                   (json_int_t)i, "content", s, "single_word", 0,
                                                   "lstrip", 0, "rstrip", 0, "normalized", 0,
                                                   "special", ty != TOK_USER));
        else
            json_object_set_new(vocab, json_string_value(s), json_integer((json_int_t)i));
        if (ty != TOK_CONTROL && ty != TOK_USER && ty != TOK_UNKNOWN) json_decref(s);
    }
    for (uint64_t i = 0; i < merges->n; i++) {
        json_t *s = str_of(merges, i);
        if (!s) {
            cg_seterr(err, errlen,
                      "%s: tokenizer.ggml.merges[%llu] is not UTF-8 text without NUL bytes", path,
                      (unsigned long long)i);
            goto not_utf8;
        }
        json_array_append_new(mlist, s);
    }
    json_t *tok =
        json_pack("{s:{s:s, s:o, s:o, s:b, s:b, s:b}, s:o, s:o, s:o, s:o, s:n}", "model", "type",
                  "BPE", "vocab", vocab, "merges", mlist, "fuse_unk", 0, "byte_fallback", 0,
                  "ignore_merges", ignore_merges, "added_tokens", added, "pre_tokenizer", pretok,
                  "normalizer", norm ? norm : json_null(), "decoder",
                  json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                            "trim_offsets", 0, "use_regex", 0),
                  "post_processor");
    json_t *cfg = json_object();
    static const struct {
        const char *id_key, *cfg_key;
    } specials[] = {{"tokenizer.ggml.bos_token_id", "bos_token"},
                    {"tokenizer.ggml.eos_token_id", "eos_token"}};
    for (size_t i = 0; i < CG_ARRAY_LEN(specials); i++) {
        int64_t id;
        if (cg_gguf_get_int(g, specials[i].id_key, &id) != 0) continue;
        if (id < 0 || (uint64_t)id >= tokens->n) {
            cg_seterr(err, errlen, "%s: %s %lld is not a token id", path, specials[i].id_key,
                      (long long)id);
            json_decref(tok);
            json_decref(cfg);
            return CG_E_VALUE;
        }
        json_t *s = str_of(tokens, (uint64_t)id);
        if (s) json_object_set_new(cfg, specials[i].cfg_key, s);
    }
    int64_t flag;
    json_object_set_new(cfg, "add_bos_token",
                        json_boolean(cg_gguf_get_int(g, "tokenizer.ggml.add_bos_token", &flag) == 0
                                         ? flag != 0
                                         : bos_default));
    json_object_set_new(
        cfg, "add_eos_token",
        json_boolean(cg_gguf_get_int(g, "tokenizer.ggml.add_eos_token", &flag) == 0 && flag));
    size_t tlen = 0;
    const char *tpl = cg_gguf_get_str(g, "tokenizer.chat_template", &tlen);
    json_t *tj = tpl ? json_stringn(tpl, tlen) : NULL;
    if (tpl && !tj) {
        cg_seterr(err, errlen, "%s: tokenizer.chat_template is not valid UTF-8", path);
        json_decref(tok);
        json_decref(cfg);
        return CG_E_VALUE;
    }
    if (tj) json_object_set_new(cfg, "chat_template", tj);
    *tok_out = tok;
    *cfg_out = cfg;
    return CG_OK;
not_utf8:
    json_decref(vocab);
    json_decref(added);
    json_decref(mlist);
    json_decref(pretok);
    json_decref(norm);
    return CG_E_VALUE;
}

/* A GGUF names one EOS; the checkpoint's generation config, which listed the others, is not in
 * it. As llama.cpp does, generation also ends at the end-of-turn and end-of-message ids and at
 * the control tokens that end a turn in the common chat formats. */
static void end_of_generation(const cg_gguf *g, cg_model_config *c)
{
    static const char *const keys[] = {"tokenizer.ggml.eot_token_id",
                                       "tokenizer.ggml.eom_token_id"};
    static const char *const texts[] = {"<|eot_id|>",   "<|eom_id|>",    "<|end_of_text|>",
                                        "<|im_end|>",   "<|endoftext|>", "<|end|>",
                                        "<end_of_turn>"};
    int64_t id;
    for (size_t i = 0; i < CG_ARRAY_LEN(keys); i++)
        if (cg_gguf_get_int(g, keys[i], &id) == 0) cg_model_add_eos(c, id);
    const cg_gguf_kv *tokens = cg_gguf_find(g, "tokenizer.ggml.tokens");
    const cg_gguf_kv *types = cg_gguf_find(g, "tokenizer.ggml.token_type");
    if (!tokens || !types) return;
    for (uint64_t i = 0; i < tokens->n; i++) {
        if (cg_gguf_arr_int(types, i) != TOK_CONTROL) continue;
        size_t len;
        const char *s = cg_gguf_arr_str(tokens, i, &len);
        for (size_t k = 0; k < CG_ARRAY_LEN(texts); k++)
            if (len == strlen(texts[k]) && !memcmp(s, texts[k], len))
                cg_model_add_eos(c, (int64_t)i);
    }
}

cg_status cg_gguf_model_open(cg_model *m, const char *path, char *err, size_t errlen)
{
    cg_status st = cg_gguf_open(path, &m->gguf, err, errlen);
    if (st != CG_OK) return st;
    const cg_gguf *g = m->gguf;
    const char *arch = NULL;
    json_t *cfg = config_json(g, path, &arch, &st, err, errlen);
    if (!cfg) return st;
    char msg[512] = "";
    st = cg_model_config_parse(cfg, path, &m->cfg, msg, sizeof msg);
    json_decref(cfg);
    if (st != CG_OK) {
        cg_seterr(err, errlen, "%s: metadata as config.json: %s", path, msg);
        return st;
    }
    if ((st = rope_freqs(g, path, &m->cfg, err, errlen)) != CG_OK) return st;
    json_t *tok = NULL, *tcfg = NULL;
    if ((st = tokenizer_json(g, path, &tok, &tcfg, err, errlen)) != CG_OK) return st;
    st = cg_tokenizer_new_json(tok, tcfg, path, &m->tok, err, errlen);
    json_decref(tok);
    json_decref(tcfg);
    if (st != CG_OK) return st;
    cg_model_config *c = &m->cfg;
    if (cg_tokenizer_vocab_size(m->tok) > c->vocab_size) {
        cg_seterr(err, errlen, "%s: %d token ids do not fit the vocabulary of %d", path,
                  (int)cg_tokenizer_vocab_size(m->tok), c->vocab_size);
        return CG_E_VALUE;
    }
    cg_model_take_tokenizer_ids(c, m->tok);
    end_of_generation(g, c);
    return CG_OK;
}

/* ---- the tensors ---- */

/* llama.cpp's name for a Hugging Face tensor name of the three architectures. */
static int gguf_name(const char *hf, char *out, size_t n)
{
    static const struct {
        const char *hf, *gguf;
    } per_layer[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    if (!strcmp(hf, "model.embed_tokens.weight")) return snprintf(out, n, "token_embd.weight");
    if (!strcmp(hf, "model.norm.weight")) return snprintf(out, n, "output_norm.weight");
    if (!strcmp(hf, "lm_head.weight")) return snprintf(out, n, "output.weight");
    int layer, used = 0;
    if (sscanf(hf, "model.layers.%d.%n", &layer, &used) == 1 && used > 0)
        for (size_t i = 0; i < CG_ARRAY_LEN(per_layer); i++)
            if (!strcmp(hf + used, per_layer[i].hf))
                return snprintf(out, n, "blk.%d.%s", layer, per_layer[i].gguf);
    return -1;
}

/* Q8_0 blocks (f16 d, 32 int8) -> the worker's values and scales. */
static void repack_q8(const uint8_t *src, size_t blocks, int8_t *q, uint16_t *sc)
{
    for (size_t b = 0; b < blocks; b++, src += 34) {
        memcpy(&sc[b], src, 2);
        memcpy(q + b * 32, src + 2, 32);
    }
}

/* Q4_0 blocks (f16 d, 16 bytes: element j in the low nibble of byte j, j + 16 in the high one)
 * -> the worker's pairs of blocks (byte i: column i of the pair's first block low, column i of
 * its second high). blocks is even (columns a multiple of 64). */
static void repack_q4(const uint8_t *src, size_t blocks, uint8_t *q, uint16_t *sc)
{
    for (size_t b = 0; b < blocks; b += 2, src += 36, q += 32) {
        const uint8_t *a = src + 2, *c = src + 20;
        memcpy(&sc[b], src, 2);
        memcpy(&sc[b + 1], src + 18, 2);
        for (int i = 0; i < 32; i++) {
            uint8_t lo = i < 16 ? a[i] & 15 : a[i - 16] >> 4;
            uint8_t hi = i < 16 ? c[i] & 15 : c[i - 16] >> 4;
            q[i] = (uint8_t)(lo | hi << 4);
        }
    }
}

static float to_f32(uint32_t type, const uint8_t *p, size_t i)
{
    uint16_t h;
    float f;
    switch (type) {
    case CG_GGML_F16:
        memcpy(&h, p + 2 * i, 2);
        return cg_f16_to_f32(h);
    case CG_GGML_BF16:
        memcpy(&h, p + 2 * i, 2);
        return cg_bf16_to_f32(h);
    default:
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
}

static const char *const LOADS = "F32, F16, BF16, Q8_0 and Q4_0";

/* "[a, b, ...]" of nd dims. */
static void dims_text(char *out, size_t n, const int64_t *ne, int nd)
{
    size_t at = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < nd && at < n; d++)
        at += (size_t)snprintf(out + at, n - at, "%s%lld", d ? ", " : "", (long long)ne[d]);
    if (at < n) snprintf(out + at, n - at, "]");
}

/* Finds and checks the tensor of spec w. */
static cg_status find(const cg_model *m, const cg_wspec *w, const cg_gguf_tensor **out, char *err,
                      size_t errlen)
{
    char name[96];
    if (gguf_name(w->name, name, sizeof name) < 0) {
        cg_seterr(err, errlen, "GGUF: no llama.cpp name for tensor '%s'", w->name);
        return CG_E_INTERNAL;
    }
    const cg_gguf_tensor *t = cg_gguf_find_tensor(m->gguf, name);
    if (!t) {
        cg_seterr(err, errlen, "GGUF: missing tensor '%s'", name);
        return CG_E_MISSING;
    }
    const int ndim = w->d1 ? 2 : 1;
    if (t->ndim != ndim || t->ne[0] != (w->d1 ? w->d1 : w->d0) ||
        (ndim == 2 && t->ne[1] != w->d0)) {
        char has[96], want[48];
        dims_text(has, sizeof has, t->ne, t->ndim);
        const int64_t ne[2] = {w->d1 ? w->d1 : w->d0, w->d0};
        dims_text(want, sizeof want, ne, ndim);
        cg_seterr(err, errlen, "GGUF: tensor '%s' has dims %s, expected %s (ne[0] first)", name,
                  has, want);
        return CG_E_VALUE;
    }
    int ok = t->type == CG_GGML_F32 || t->type == CG_GGML_F16 || t->type == CG_GGML_BF16 ||
             (w->mat && (t->type == CG_GGML_Q8_0 || t->type == CG_GGML_Q4_0));
    if (!ok) {
        cg_seterr(err, errlen, "GGUF: tensor '%s' has type %s; chunkgate-worker loads %s%s", name,
                  cg_gguf_type_name(t->type), LOADS, w->mat ? "" : " (vectors: not quantised)");
        return CG_E_UNSUPPORTED;
    }
    if (t->type == CG_GGML_Q4_0 && w->d1 % 64) {
        cg_seterr(err, errlen,
                  "GGUF: Q4_0 tensor '%s' has %lld columns; the worker's Q4_0 kernels "
                  "need a multiple of 64",
                  name, (long long)w->d1);
        return CG_E_UNSUPPORTED;
    }
    *out = t;
    return CG_OK;
}

/* Every tensor of the file is used, or the checkpoint is refused (it may need it). */
static cg_status refuse_unused(const cg_model *m, const cg_wlist *l, char *err, size_t errlen)
{
    for (size_t i = 0; i < cg_gguf_n_tensors(m->gguf); i++) {
        const char *name = cg_gguf_tensor_at(m->gguf, i)->name;
        int used = !strcmp(name, "rope_freqs.weight");
        char g[96];
        for (size_t k = 0; k < l->n && !used; k++)
            used = gguf_name(l->v[k].name, g, sizeof g) >= 0 && !strcmp(g, name);
        if (used) continue;
        cg_seterr(err, errlen,
                  "GGUF: tensor '%.120s' is not used by %s as configured; refusing a "
                  "checkpoint that may need it",
                  name, cg_arch_name(m->cfg.arch));
        return CG_E_UNSUPPORTED;
    }
    return CG_OK;
}

cg_status cg_gguf_place_tensors(cg_model *m, const cg_wlist *l, char *err, size_t errlen)
{
    const cg_gguf_tensor **ts = cg_calloc(l->n ? l->n : 1, sizeof *ts);
    size_t floats = 0, qbytes = 0;
    cg_status st = CG_OK;
    for (size_t i = 0; i < l->n && st == CG_OK; i++) {
        if ((st = find(m, &l->v[i], &ts[i], err, errlen)) != CG_OK) break;
        const cg_wspec *w = &l->v[i];
        if (w->vec) floats += ((size_t)w->d0 + 15) & ~(size_t)15;
        if (ts[i]->type == CG_GGML_Q8_0 || ts[i]->type == CG_GGML_Q4_0) {
            size_t ns = 0, nq = cg_matmul_quant_bytes(ts[i]->type == CG_GGML_Q8_0 ? CG_DTYPE_Q8_0
                                                                                  : CG_DTYPE_Q4_0,
                                                      (int)w->d0, (int)w->d1, &ns);
            qbytes += cg_qarena_bytes(nq, ns);
        }
    }
    if (st == CG_OK) st = refuse_unused(m, l, err, errlen);
    if (st != CG_OK) {
        free(ts);
        return st;
    }
    float *p = cg_alloc64(&m->arena, floats * sizeof(float));
    char *q = qbytes ? cg_alloc64(&m->qarena, qbytes) : NULL;
    for (size_t i = 0; i < l->n; i++) {
        const cg_gguf_tensor *t = ts[i];
        const cg_wspec *w = &l->v[i];
        if (w->vec) {
            for (int64_t k = 0; k < w->d0; k++)
                p[k] = to_f32(t->type, t->data, (size_t)k);
            *w->vec = p;
            p += ((size_t)w->d0 + 15) & ~(size_t)15;
            m->weight_bytes += (size_t)w->d0 * sizeof(float);
            cg_gguf_drop(m->gguf, t);
            continue;
        }
        cg_weight *mat = w->mat;
        *mat = (cg_weight){.data = t->data, .rows = (int)w->d0, .cols = (int)w->d1};
        if (t->type == CG_GGML_Q8_0 || t->type == CG_GGML_Q4_0) {
            const cg_dtype dt = t->type == CG_GGML_Q8_0 ? CG_DTYPE_Q8_0 : CG_DTYPE_Q4_0;
            size_t ns = 0, nq = cg_matmul_quant_bytes(dt, mat->rows, mat->cols, &ns);
            uint16_t *sc;
            void *blocks = cg_qarena_take(&q, nq, ns, &sc);
            if (dt == CG_DTYPE_Q8_0)
                repack_q8(t->data, ns, blocks, sc);
            else
                repack_q4(t->data, ns, blocks, sc);
            mat->data = blocks;
            mat->dtype = dt;
            mat->bscale = sc;
            m->weight_bytes += nq + ns * 2;
            cg_gguf_drop(m->gguf, t);
            continue;
        }
        mat->dtype = t->type == CG_GGML_F16    ? CG_DTYPE_F16
                     : t->type == CG_GGML_BF16 ? CG_DTYPE_BF16
                                               : CG_DTYPE_F32;
        m->weight_bytes += t->nbytes;
    }
    static const char *const names[] = {[CG_DTYPE_F32] = "f32",
                                        [CG_DTYPE_F16] = "f16",
                                        [CG_DTYPE_BF16] = "bf16",
                                        [CG_DTYPE_Q8_0] = "q8_0",
                                        [CG_DTYPE_Q4_0] = "q4_0"};
    snprintf(m->cfg.dtype, sizeof m->cfg.dtype, "%s", names[m->embed.dtype]);
    free(ts);
    return CG_OK;
}
