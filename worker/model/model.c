/* Llama-architecture forward pass on the CPU (RMSNorm, RoPE, grouped-query attention, SwiGLU,
 * CBLAS), its loader for HF-style config.json + model.safetensors, the per-head KV buffer and
 * sampling. */
#include "worker/model/model.h"

#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "worker/model/safetensors.h"
#include "base/base.h"

/* Tokens per pass through the layers. Bounds the scratch memory of a long prefill, and is big
 * enough that sgemm runs near its peak. Splitting the rows of a span is exact: a query row's
 * visible keys depend only on its own slot. */
#define FWD_BLOCK 1024u
#define CONFIG_MAX_BYTES (1u << 20)

typedef struct layer_w {
    const float *attn_norm, *wq, *wk, *wv, *wo; /* wq [q_dim][dim], wk/wv [kv_dim][dim], wo [dim][q_dim] */
    const float *ffn_norm, *w_gate, *w_up, *w_down; /* gate/up [hidden][dim], down [dim][hidden] */
} layer_w;

struct cg_model {
    cg_model_config cfg;
    void *arena;          /* every weight, f32, 64-byte aligned tensors */
    const float *embed;   /* [vocab][dim] */
    const float *norm;    /* [dim] */
    const float *lm_head; /* [vocab][dim], == embed when tied */
    layer_w *layers;
};

struct cg_kv {
    uint32_t cap;
    int n_layers, n_kv_heads, head_dim;
    void *raw;
    float *data; /* [layer][K,V][kv head][cap][head_dim] */
};

/* ---- config.json ---- */

/* Reads an integer field. Absent or null: *out = def, or CG_E_MISSING when required. */
static cg_status cfg_int(json_t *root, const char *key, int required, long long def, long long lo,
                         long long hi, int *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) {
            cg_seterr(err, errlen, "config.json: required field '%s' is missing", key);
            return CG_E_MISSING;
        }
        *out = (int)def;
        return CG_OK;
    }
    if (!json_is_integer(v)) {
        cg_seterr(err, errlen, "config.json: '%s' must be an integer", key);
        return CG_E_TYPE;
    }
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        cg_seterr(err, errlen, "config.json: '%s' = %lld is out of range [%lld, %lld]", key, x, lo, hi);
        return CG_E_VALUE;
    }
    *out = (int)x;
    return CG_OK;
}

static cg_status cfg_num(json_t *root, const char *key, double def, double lo, double hi,
                         double *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return CG_OK;
    }
    if (!json_is_number(v)) {
        cg_seterr(err, errlen, "config.json: '%s' must be a number", key);
        return CG_E_TYPE;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        cg_seterr(err, errlen, "config.json: '%s' = %g is out of range [%g, %g]", key, x, lo, hi);
        return CG_E_VALUE;
    }
    *out = x;
    return CG_OK;
}

static cg_status cfg_bool(json_t *root, const char *key, int def, int *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return CG_OK;
    }
    if (!json_is_boolean(v)) {
        cg_seterr(err, errlen, "config.json: '%s' must be true or false", key);
        return CG_E_TYPE;
    }
    *out = json_is_true(v);
    return CG_OK;
}

/* bos/eos ids: an integer, or (newer HF configs) an array whose first entry is used. */
static cg_status cfg_token(json_t *root, const char *key, int def, int vocab, int *out, char *err,
                           size_t errlen)
{
    json_t *v = json_object_get(root, key);
    if (json_is_array(v)) v = json_array_get(v, 0);
    if (!v || json_is_null(v)) {
        *out = def;
    } else if (!json_is_integer(v)) {
        cg_seterr(err, errlen, "config.json: '%s' must be an integer", key);
        return CG_E_TYPE;
    } else if (json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
        cg_seterr(err, errlen, "config.json: '%s' = %lld is outside the vocabulary of %d", key,
               (long long)json_integer_value(v), vocab);
        return CG_E_VALUE;
    } else {
        *out = (int)json_integer_value(v);
    }
    if (*out < 0 || *out >= vocab) {
        cg_seterr(err, errlen, "config.json: default '%s' %d is outside the vocabulary of %d", key, def,
               vocab);
        return CG_E_VALUE;
    }
    return CG_OK;
}

static cg_status read_small_file(const char *path, size_t max, char **out, size_t *len, char *err,
                                 size_t errlen)
{
    cg_status st = CG_OK;
    char *buf = NULL;
    FILE *fp = fopen(path, "rb");
    struct stat sb;
    *out = NULL;
    if (!fp) {
        cg_seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return CG_E_IO;
    }
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        cg_seterr(err, errlen, "%s: not a regular file", path);
        st = CG_E_IO;
        goto out;
    }
    if ((uint64_t)sb.st_size > max) {
        cg_seterr(err, errlen, "%s: %lld bytes is larger than the limit of %zu", path,
               (long long)sb.st_size, max);
        st = CG_E_VALUE;
        goto out;
    }
    buf = cg_malloc((size_t)sb.st_size + 1);
    *len = fread(buf, 1, (size_t)sb.st_size, fp);
    if (ferror(fp)) {
        cg_seterr(err, errlen, "%s: read error", path);
        st = CG_E_IO;
        goto out;
    }
    buf[*len] = '\0';
    *out = buf;
    buf = NULL;
out:
    free(buf);
    fclose(fp);
    return st;
}

static const char *base_name(const char *dir, char *tmp, size_t tmplen)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/') s--;
    snprintf(tmp, tmplen, "%.*s", (int)(n - s), dir + s);
    return tmp;
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        st = (x);                                                                                  \
        if (st != CG_OK) goto out;                                                                 \
    } while (0)

static cg_status parse_config(const char *dir, cg_model_config *c, char *err, size_t errlen)
{
    cg_status st = CG_OK;
    char path[4096], *text = NULL;
    size_t len = 0;
    json_t *root = NULL;
    memset(c, 0, sizeof *c);
    snprintf(path, sizeof path, "%s/config.json", dir);
    TRY(read_small_file(path, CONFIG_MAX_BYTES, &text, &len, err, errlen));
    json_error_t jerr;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        cg_seterr(err, errlen, "config.json: not valid JSON: %s (line %d)", jerr.text, jerr.line);
        st = CG_E_JSON;
        goto out;
    }
    if (!json_is_object(root)) {
        cg_seterr(err, errlen, "config.json: not a JSON object");
        st = CG_E_TYPE;
        goto out;
    }

    /* Scaling schemes change RoPE angles (some depending on the sequence length); remapping
     * cached K by a plain R(p - v) would then be wrong, so they are refused (DESIGN §6). */
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        const char *kind = NULL;
        if (json_is_object(rs)) {
            kind = json_string_value(json_object_get(rs, "rope_type"));
            if (!kind) kind = json_string_value(json_object_get(rs, "type"));
        }
        cg_seterr(err, errlen,
               "config.json: rope_scaling '%.40s' is not supported (only unscaled RoPE; scaled "
               "angles cannot be remapped by position delta)",
               kind ? kind : "?");
        st = CG_E_UNSUPPORTED;
        goto out;
    }
    static const char *const bias_keys[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < CG_ARRAY_LEN(bias_keys); i++) {
        if (json_is_true(json_object_get(root, bias_keys[i]))) {
            cg_seterr(err, errlen, "config.json: '%s' = true is not supported (no bias tensors)",
                   bias_keys[i]);
            st = CG_E_UNSUPPORTED;
            goto out;
        }
    }

    TRY(cfg_int(root, "hidden_size", 1, 0, 1, 1 << 16, &c->dim, err, errlen));
    TRY(cfg_int(root, "intermediate_size", 1, 0, 1, 1 << 20, &c->hidden_dim, err, errlen));
    TRY(cfg_int(root, "num_hidden_layers", 1, 0, 1, 4096, &c->n_layers, err, errlen));
    TRY(cfg_int(root, "num_attention_heads", 1, 0, 1, 4096, &c->n_heads, err, errlen));
    TRY(cfg_int(root, "num_key_value_heads", 0, c->n_heads, 1, 4096, &c->n_kv_heads, err, errlen));
    TRY(cfg_int(root, "vocab_size", 1, 0, 256, 1 << 24, &c->vocab_size, err, errlen));
    TRY(cfg_int(root, "max_position_embeddings", 0, 2048, 1, 1 << 30, &c->max_pos, err, errlen));
    json_t *hd = json_object_get(root, "head_dim");
    if (!hd || json_is_null(hd)) {
        if (c->dim % c->n_heads) {
            cg_seterr(err, errlen,
                   "config.json: num_attention_heads %d does not divide hidden_size %d", c->n_heads,
                   c->dim);
            st = CG_E_VALUE;
            goto out;
        }
        c->head_dim = c->dim / c->n_heads;
    } else {
        TRY(cfg_int(root, "head_dim", 1, 0, 1, 4096, &c->head_dim, err, errlen));
    }
    if (c->head_dim % 2) {
        cg_seterr(err, errlen, "config.json: head_dim %d is odd; RoPE needs pairs", c->head_dim);
        st = CG_E_VALUE;
        goto out;
    }
    if (c->n_heads % c->n_kv_heads) {
        cg_seterr(err, errlen,
               "config.json: num_key_value_heads %d does not divide num_attention_heads %d",
               c->n_kv_heads, c->n_heads);
        st = CG_E_VALUE;
        goto out;
    }
    TRY(cfg_num(root, "rope_theta", 10000.0, 1.0, 1e12, &c->rope_theta, err, errlen));
    double eps;
    TRY(cfg_num(root, "rms_norm_eps", 1e-6, 1e-12, 0.1, &eps, err, errlen));
    c->norm_eps = (float)eps;
    TRY(cfg_bool(root, "tie_word_embeddings", 0, &c->tie_embeddings, err, errlen));
    TRY(cfg_token(root, "bos_token_id", 256, c->vocab_size, &c->bos_id, err, errlen));
    TRY(cfg_token(root, "eos_token_id", 257, c->vocab_size, &c->eos_id, err, errlen));

    json_t *rst = json_object_get(root, "rope_style");
    c->rope_style = CG_ROPE_HALF;
    if (rst && !json_is_null(rst)) {
        const char *s = json_string_value(rst);
        if (s && !strcmp(s, "interleaved")) {
            c->rope_style = CG_ROPE_INTERLEAVED;
        } else if (!s || strcmp(s, "half")) {
            cg_seterr(err, errlen, "config.json: rope_style must be \"half\" or \"interleaved\"");
            st = s ? CG_E_VALUE : CG_E_TYPE;
            goto out;
        }
    }

    const char *keys[] = {"model_id", "_name_or_path"}, *id = NULL;
    for (size_t i = 0; i < CG_ARRAY_LEN(keys) && !id; i++) {
        json_t *v = json_object_get(root, keys[i]);
        if (v && !json_is_null(v) && !json_is_string(v)) {
            cg_seterr(err, errlen, "config.json: '%s' must be a string", keys[i]);
            st = CG_E_TYPE;
            goto out;
        }
        if (json_string_length(v) > 0) id = json_string_value(v);
    }
    char tmp[sizeof c->model_id + 1];
    if (!id) id = base_name(dir, tmp, sizeof tmp);
    if (strlen(id) >= sizeof c->model_id || !id[0]) {
        cg_seterr(err, errlen, "config.json: model id must be 1 to %zu bytes", sizeof c->model_id - 1);
        st = CG_E_VALUE;
        goto out;
    }
    snprintf(c->model_id, sizeof c->model_id, "%s", id);
out:
    json_decref(root);
    free(text);
    return st;
}

/* ---- weights ---- */

typedef struct wspec {
    char name[96];
    int64_t d0, d1; /* d1 == 0: 1-D */
    const float **dst;
} wspec;

static void add_spec(wspec *w, size_t *n, const char *name, int64_t d0, int64_t d1, const float **dst)
{
    snprintf(w[*n].name, sizeof w[*n].name, "%s", name);
    w[*n].d0 = d0;
    w[*n].d1 = d1;
    w[*n].dst = dst;
    (*n)++;
}

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

cg_status cg_model_open(const char *dir, cg_model **out, char *err, size_t errlen)
{
    cg_status st = CG_OK;
    cg_model *m = cg_calloc(1, sizeof *m);
    cg_st_file *sf = NULL;
    wspec *ws = NULL;
    char path[4096];
    *out = NULL;
    if (err && errlen) err[0] = '\0';
    TRY(parse_config(dir, &m->cfg, err, errlen));
    cg_model_config *c = &m->cfg;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    TRY(cg_st_open(path, &sf, err, errlen));

    int64_t D = c->dim, V = c->vocab_size, H = c->hidden_dim;
    int64_t Q = (int64_t)c->n_heads * c->head_dim, KV = (int64_t)c->n_kv_heads * c->head_dim;
    size_t n = 0, cap = 3 + 9 * (size_t)c->n_layers;
    ws = cg_calloc(cap, sizeof *ws);
    m->layers = cg_calloc((size_t)c->n_layers, sizeof *m->layers);
    add_spec(ws, &n, "model.embed_tokens.weight", V, D, &m->embed);
    for (int l = 0; l < c->n_layers; l++) {
        layer_w *L = &m->layers[l];
        char nm[96];
#define LSPEC(suffix, d0, d1, field)                                                               \
    snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix);                                      \
    add_spec(ws, &n, nm, d0, d1, &L->field)
        LSPEC("input_layernorm.weight", D, 0, attn_norm);
        LSPEC("self_attn.q_proj.weight", Q, D, wq);
        LSPEC("self_attn.k_proj.weight", KV, D, wk);
        LSPEC("self_attn.v_proj.weight", KV, D, wv);
        LSPEC("self_attn.o_proj.weight", D, Q, wo);
        LSPEC("post_attention_layernorm.weight", D, 0, ffn_norm);
        LSPEC("mlp.gate_proj.weight", H, D, w_gate);
        LSPEC("mlp.up_proj.weight", H, D, w_up);
        LSPEC("mlp.down_proj.weight", D, H, w_down);
#undef LSPEC
    }
    add_spec(ws, &n, "model.norm.weight", D, 0, &m->norm);
    if (!c->tie_embeddings) add_spec(ws, &n, "lm_head.weight", V, D, &m->lm_head);

    /* Check every tensor before allocating, so the file's own size bounds the allocation and
     * a config claiming huge dimensions fails on the first missing or short tensor. */
    size_t total = 0;
    const char *dtype = NULL;
    for (size_t i = 0; i < n; i++) {
        const cg_st_tensor *t = cg_st_find(sf, ws[i].name);
        int ndim = ws[i].d1 ? 2 : 1;
        if (!t) {
            cg_seterr(err, errlen, "model.safetensors: missing tensor '%s'", ws[i].name);
            st = CG_E_MISSING;
            goto out;
        }
        if (t->ndim != ndim || t->shape[0] != ws[i].d0 || (ndim == 2 && t->shape[1] != ws[i].d1)) {
            char got[64] = "", want[48];
            size_t gl = 0;
            for (int d = 0; d < t->ndim && gl < sizeof got - 24; d++)
                gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s%lld", d ? ", " : "",
                                       (long long)t->shape[d]);
            if (ndim == 2) snprintf(want, sizeof want, "%lld, %lld", (long long)ws[i].d0, (long long)ws[i].d1);
            else snprintf(want, sizeof want, "%lld", (long long)ws[i].d0);
            cg_seterr(err, errlen, "model.safetensors: tensor '%s' has shape [%s], expected [%s]",
                   ws[i].name, got, want);
            st = CG_E_VALUE;
            goto out;
        }
        if (t->dtype == CG_ST_OTHER) {
            cg_seterr(err, errlen,
                   "model.safetensors: tensor '%s' has dtype %s; supported are F32, F16, BF16",
                   ws[i].name, t->dtype_str);
            st = CG_E_UNSUPPORTED;
            goto out;
        }
        if (!dtype) dtype = t->dtype == CG_ST_F32 ? "f32" : t->dtype == CG_ST_F16 ? "f16" : "bf16";
        total += round16(t->numel);
    }
    snprintf(c->dtype, sizeof c->dtype, "%s", dtype);

    /* One aligned arena for all weights: the file is unmapped after load, so a file changed
     * on disk later cannot fault the worker, and sgemm gets 64-byte aligned rows. */
    m->arena = cg_malloc(total * sizeof(float) + 64);
    float *p = (float *)(((uintptr_t)m->arena + 63) & ~(uintptr_t)63);
    for (size_t i = 0; i < n; i++) {
        const cg_st_tensor *t = cg_st_find(sf, ws[i].name);
        if (cg_st_to_f32(t, p) != CG_OK) {
            st = CG_E_UNSUPPORTED; /* unreachable: dtypes checked above */
            goto out;
        }
        *ws[i].dst = p;
        p += round16(t->numel);
    }
    if (c->tie_embeddings) m->lm_head = m->embed;
    /* Process-wide: every BLAS call runs on its calling thread, and the cores are shared out
     * by OpenMP only (see matmul and the attention kernel). */
    openblas_set_num_threads(1);
    *out = m;
    m = NULL;
out:
    cg_st_close(&sf);
    free(ws);
    cg_model_close(&m);
    return st;
}

void cg_model_close(cg_model **pm)
{
    cg_model *m = *pm;
    if (!m) return;
    free(m->arena);
    free(m->layers);
    free(m);
    *pm = NULL;
}

const cg_model_config *cg_model_cfg(const cg_model *m) { return &m->cfg; }

cg_rope cg_model_rope(const cg_model *m)
{
    cg_rope r = {m->cfg.head_dim, m->cfg.rope_theta, m->cfg.rope_style};
    return r;
}

/* ---- KV buffer ---- */

cg_kv *cg_kv_new(const cg_model *m, uint32_t cap_tokens)
{
    const cg_model_config *c = &m->cfg;
    size_t floats;
    if (!cap_tokens ||
        __builtin_mul_overflow((size_t)cap_tokens * (size_t)c->head_dim,
                               (size_t)c->n_layers * 2 * (size_t)c->n_kv_heads, &floats) ||
        floats > SIZE_MAX / 8)
        return NULL;
    cg_kv *kv = cg_calloc(1, sizeof *kv);
    kv->cap = cap_tokens;
    kv->n_layers = c->n_layers;
    kv->n_kv_heads = c->n_kv_heads;
    kv->head_dim = c->head_dim;
    /* calloc: pages are mapped lazily, so a large capacity costs only what is used */
    kv->raw = cg_calloc(floats * sizeof(float) + 64, 1);
    kv->data = (float *)(((uintptr_t)kv->raw + 63) & ~(uintptr_t)63);
    return kv;
}

void cg_kv_free(cg_kv **pkv)
{
    if (!*pkv) return;
    free((*pkv)->raw);
    cg_free(pkv);
}

uint32_t cg_kv_cap(const cg_kv *kv) { return kv->cap; }

static float *kv_plane(cg_kv *kv, int layer, int which, int head)
{
    size_t plane = (size_t)kv->cap * (size_t)kv->head_dim;
    return kv->data + (((size_t)layer * 2 + (size_t)which) * (size_t)kv->n_kv_heads + (size_t)head) * plane;
}

float *cg_kv_k(cg_kv *kv, int layer, int head) { return kv_plane(kv, layer, 0, head); }
float *cg_kv_v(cg_kv *kv, int layer, int head) { return kv_plane(kv, layer, 1, head); }

void cg_kv_copy_slots(cg_kv *dst, cg_kv *src, uint32_t n)
{
    const size_t bytes = (size_t)n * (size_t)src->head_dim * sizeof(float);
    for (int l = 0; l < src->n_layers; l++)
        for (int h = 0; h < src->n_kv_heads; h++) {
            memcpy(cg_kv_k(dst, l, h), cg_kv_k(src, l, h), bytes);
            memcpy(cg_kv_v(dst, l, h), cg_kv_v(src, l, h), bytes);
        }
}

/* ---- forward ---- */

/* y[n][out] = x[n][in] * W^T with W [out][in] row-major (the HF layout).
 * The two cores are used through OpenMP, like the attention kernel: rows (tokens) are split
 * between the threads, or the output features for a single token, and each part is one
 * single-threaded BLAS call. Mixing OpenBLAS's own thread pool with OpenMP regions makes the
 * two runtimes' idle spinning fight for the same two cores. */
static void matmul(const float *x, int n, int in, const float *w, int out, float *y)
{
    /* below ~1M multiply-adds (e.g. a decode step of a small model) the fork/join costs more
     * than the second core gains */
    const int par = (size_t)n * out * in >= ((size_t)1 << 20);
#pragma omp parallel if (par)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        if (n == 1) {
            int a = (int)((int64_t)out * t / nt), b = (int)((int64_t)out * (t + 1) / nt);
            if (b > a)
                cblas_sgemv(CblasRowMajor, CblasNoTrans, b - a, in, 1.0f, w + (size_t)a * in, in,
                            x, 1, 0.0f, y + a, 1);
        } else {
            int a = (int)((int64_t)n * t / nt), b = (int)((int64_t)n * (t + 1) / nt);
            if (b > a)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b - a, out, in, 1.0f,
                            x + (size_t)a * in, in, w, in, 0.0f, y + (size_t)a * out, out);
        }
    }
}

/* Elementwise work is small next to the products; it goes parallel only for long blocks. */
#define PAR_ELEMS ((size_t)1 << 16)

static void rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps)
{
#pragma omp parallel for if ((size_t)n * dim >= PAR_ELEMS) schedule(static)
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * dim;
        float *o = out + (size_t)t * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float r = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) o[i] = xr[i] * r * w[i];
    }
}

static void add_into(float *x, const float *y, size_t n)
{
#pragma omp parallel for if (n >= PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* SiLU gate times up: g = g * sigmoid(g) * u. libm's expf is a scalar call and was an eighth
 * of a short prefill, so exp is computed here 4 lanes at a time: x = k*ln2 + r, Cephes'
 * polynomial for e^r, 2^k built in the exponent bits; max error 1.4 ulp over the clamped range
 * [-87, 88] (beyond it the sigmoid is 0 or 1 to float precision anyway). */
#define EXP_LO -87.0f
#define EXP_HI 88.0f
#define EXP_POLY(p, r)                                                                             \
    p = 1.9875691500e-4f, p = p * r + 1.3981999507e-3f, p = p * r + 8.3334519073e-3f,              \
    p = p * r + 4.1665795894e-2f, p = p * r + 1.6666665459e-1f, p = p * r + 5.0000001201e-1f

static inline float exp_scalar(float x)
{
    x = x > EXP_LO ? x : EXP_LO;
    x = x < EXP_HI ? x : EXP_HI;
    float k = (x * 1.44269504089f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - k * 0.693359375f + k * 2.12194440e-4f, p;
    EXP_POLY(p, r);
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, 4);
    return p * two_k;
}

static void swiglu_range(float *g, const float *u, size_t a, size_t b)
{
    size_t i = a;
#ifdef __SSE2__
    const __m128 lo = _mm_set1_ps(EXP_LO), hi = _mm_set1_ps(EXP_HI), one = _mm_set1_ps(1.0f);
    const __m128 magic = _mm_set1_ps(12582912.0f);
    for (; i + 4 <= b; i += 4) {
        __m128 gv = _mm_loadu_ps(g + i);
        __m128 x = _mm_min_ps(_mm_max_ps(_mm_sub_ps(_mm_setzero_ps(), gv), lo), hi);
        __m128 k = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(1.44269504089f)), magic), magic);
        __m128 r = _mm_add_ps(_mm_sub_ps(x, _mm_mul_ps(k, _mm_set1_ps(0.693359375f))),
                              _mm_mul_ps(k, _mm_set1_ps(2.12194440e-4f)));
        __m128 p = _mm_set1_ps(1.9875691500e-4f);
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.3981999507e-3f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(8.3334519073e-3f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(4.1665795894e-2f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.6666665459e-1f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(5.0000001201e-1f));
        p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, r), r), r), one);
        __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(k), _mm_set1_epi32(127)), 23);
        __m128 ex = _mm_mul_ps(p, _mm_castsi128_ps(e));
        __m128 out = _mm_mul_ps(_mm_div_ps(gv, _mm_add_ps(one, ex)), _mm_loadu_ps(u + i));
        _mm_storeu_ps(g + i, out);
    }
#endif
    for (; i < b; i++) g[i] = g[i] / (1.0f + exp_scalar(-g[i])) * u[i];
}

static void swiglu(float *g, const float *u, size_t n)
{
    const int par = n >= PAR_ELEMS / 4;
#pragma omp parallel if (par)
    {
        size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        /* split at multiples of 4 so the vector loop covers all but the tail */
        size_t a = (n * t / nt) & ~(size_t)3, b = t + 1 == nt ? n : (n * (t + 1) / nt) & ~(size_t)3;
        swiglu_range(g, u, a, b);
    }
}

/* Checks that spans list slots [slot0, slot0+n) in order and that every key they expose lies
 * before the query. */
static int spans_valid(const cg_attn_span *s, size_t ns, uint32_t slot0, uint32_t n)
{
    uint64_t next = slot0;
    for (size_t i = 0; i < ns; i++) {
        if (s[i].q_start != next || s[i].q_len == 0 || s[i].prefix > s[i].own_start ||
            s[i].own_start > s[i].q_start)
            return 0;
        next += s[i].q_len;
    }
    return next == (uint64_t)slot0 + n;
}

/* The part of spans covering query slots [lo, lo+len). */
static size_t clip_spans(const cg_attn_span *s, size_t ns, uint32_t lo, uint32_t len, cg_attn_span *out)
{
    size_t k = 0;
    uint64_t hi = (uint64_t)lo + len;
    for (size_t i = 0; i < ns; i++) {
        uint64_t a = s[i].q_start, b = a + s[i].q_len;
        if (b <= lo || a >= hi) continue;
        out[k] = s[i];
        out[k].q_start = (uint32_t)CG_MAX(a, lo);
        out[k].q_len = (uint32_t)(CG_MIN(b, hi) - out[k].q_start);
        k++;
    }
    return k;
}

cg_status cg_model_forward(const cg_model *m, cg_kv *kv, const int32_t *tokens, uint32_t n,
                           uint32_t slot0, int64_t pos0, const cg_attn_span *spans,
                           size_t n_spans, float *logits_last)
{
    const cg_model_config *c = &m->cfg;
    if (!n || !tokens || !spans || !kv || kv->n_layers != c->n_layers || kv->n_kv_heads != c->n_kv_heads ||
        kv->head_dim != c->head_dim)
        return CG_E_VALUE;
    if ((uint64_t)slot0 + n > kv->cap || pos0 < 0 || pos0 > c->max_pos || n > c->max_pos - pos0)
        return CG_E_VALUE;
    if (!spans_valid(spans, n_spans, slot0, n)) return CG_E_VALUE;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size) return CG_E_VALUE;

    const int D = c->dim, H = c->hidden_dim, hd = c->head_dim;
    const int nh = c->n_heads, nkv = c->n_kv_heads, Q = nh * hd, KVd = nkv * hd;
    const uint32_t B = CG_MIN(n, FWD_BLOCK);
    const cg_rope rope = cg_model_rope(m);
    float *x = cg_malloc((size_t)B * D * sizeof(float));
    float *xb = cg_malloc((size_t)B * CG_MAX(D, Q) * sizeof(float));
    float *q = cg_malloc((size_t)B * Q * sizeof(float));
    float *att = cg_malloc((size_t)B * Q * sizeof(float));
    float *k = cg_malloc((size_t)B * KVd * sizeof(float));
    float *v = cg_malloc((size_t)B * KVd * sizeof(float));
    float *g = cg_malloc((size_t)B * H * sizeof(float));
    float *u = cg_malloc((size_t)B * H * sizeof(float));
    cg_attn_span *sub = cg_malloc(n_spans * sizeof *sub);

    for (uint32_t b0 = 0; b0 < n; b0 += B) {
        const uint32_t nb = CG_MIN(B, n - b0);
        const uint32_t s0 = slot0 + b0;
        const size_t ns = clip_spans(spans, n_spans, s0, nb, sub);
        for (uint32_t t = 0; t < nb; t++)
            memcpy(x + (size_t)t * D, m->embed + (size_t)tokens[b0 + t] * D, (size_t)D * sizeof(float));
        for (int l = 0; l < c->n_layers; l++) {
            const layer_w *L = &m->layers[l];
            rmsnorm(xb, x, L->attn_norm, (int)nb, D, c->norm_eps);
            matmul(xb, (int)nb, D, L->wq, Q, q);
            matmul(xb, (int)nb, D, L->wk, KVd, k);
            matmul(xb, (int)nb, D, L->wv, KVd, v);
            cg_rope_apply(&rope, q, nb, nh, pos0 + b0);
            cg_rope_apply(&rope, k, nb, nkv, pos0 + b0);
            for (int h = 0; h < nkv; h++) {
                float *kp = cg_kv_k(kv, l, h) + (size_t)s0 * hd, *vp = cg_kv_v(kv, l, h) + (size_t)s0 * hd;
                for (uint32_t t = 0; t < nb; t++) {
                    memcpy(kp + (size_t)t * hd, k + (size_t)t * KVd + (size_t)h * hd, (size_t)hd * sizeof(float));
                    memcpy(vp + (size_t)t * hd, v + (size_t)t * KVd + (size_t)h * hd, (size_t)hd * sizeof(float));
                }
            }
            cg_attn_kv akv = {cg_kv_k(kv, l, 0), cg_kv_v(kv, l, 0), (size_t)kv->cap * hd, nkv, hd};
            cg_attn_forward(&akv, nh, sub, ns, q, att);
            matmul(att, (int)nb, Q, L->wo, D, xb);
            add_into(x, xb, (size_t)nb * D);
            rmsnorm(xb, x, L->ffn_norm, (int)nb, D, c->norm_eps);
            matmul(xb, (int)nb, D, L->w_gate, H, g);
            matmul(xb, (int)nb, D, L->w_up, H, u);
            swiglu(g, u, (size_t)nb * H);
            matmul(g, (int)nb, H, L->w_down, D, xb);
            add_into(x, xb, (size_t)nb * D);
        }
        if (logits_last && b0 + nb == n) {
            rmsnorm(xb, x + (size_t)(nb - 1) * D, m->norm, 1, D, c->norm_eps);
            matmul(xb, 1, D, m->lm_head, c->vocab_size, logits_last);
        }
    }
    free(x);
    free(xb);
    free(q);
    free(att);
    free(k);
    free(v);
    free(g);
    free(u);
    free(sub);
    return CG_OK;
}

/* ---- sampling ---- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i]))) best = i;
    return best;
}

typedef struct prob_ix {
    float p;
    int32_t i;
} prob_ix;

static int cmp_prob_desc(const void *a, const void *b)
{
    const prob_ix *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i; /* ties by index: the order is deterministic */
}

int32_t cg_sample(cg_sampler *s, float *logits, int vocab_size)
{
    if (vocab_size <= 1) return 0;
    int32_t top = argmax(logits, vocab_size);
    if (!(s->temperature > 0.0f) || !isfinite(logits[top])) return top;
    /* softmax(logits / T) in place, then draw from the smallest prefix of the sorted
     * distribution whose mass reaches top_p (always at least the top token) */
    double sum = 0, inv_t = 1.0 / s->temperature, mx = logits[top];
    for (int i = 0; i < vocab_size; i++) {
        double e = isnan(logits[i]) ? 0.0 : exp(((double)logits[i] - mx) * inv_t);
        logits[i] = (float)e;
        sum += e;
    }
    double u = (double)(splitmix64(&s->rng) >> 11) * 0x1p-53;
    float top_p = s->top_p > 0.0f && s->top_p < 1.0f ? s->top_p : 1.0f;
    if (top_p >= 1.0f) {
        double r = u * sum, acc = 0;
        for (int i = 0; i < vocab_size; i++) {
            acc += logits[i];
            if (r < acc) return i;
        }
        return top;
    }
    prob_ix *pi = cg_malloc((size_t)vocab_size * sizeof *pi);
    for (int i = 0; i < vocab_size; i++) pi[i] = (prob_ix){(float)(logits[i] / sum), i};
    qsort(pi, (size_t)vocab_size, sizeof *pi, cmp_prob_desc);
    int keep = 0;
    double mass = 0;
    while (keep < vocab_size && (keep == 0 || mass < top_p)) mass += pi[keep++].p;
    double r = u * mass, acc = 0;
    int32_t pick = pi[0].i;
    for (int i = 0; i < keep; i++) {
        acc += pi[i].p;
        if (r < acc) {
            pick = pi[i].i;
            break;
        }
    }
    free(pi);
    return pick;
}
