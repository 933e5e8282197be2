/* Loading a checkpoint: the weights of config.json's architecture from one safetensors file or
 * a sharded set, checked tensor by tensor and kept mapped; the tokenizer; the per-head KV
 * buffer (worker/model/model.h). The forward pass is in forward.c, sampling in sample.c. */
#include "worker/model/model_impl.h"

#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <sys/stat.h>

#include "base/base.h"

#define MAX_SHARDS 4096

/* ---- the files: model.safetensors, or the shards an index names ---- */

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

#define INDEX_MAX_BYTES (64 << 20)

/* Opens one safetensors file and keeps it (mapped) in the model. */
static cg_status open_file(cg_model *m, const char *dir, const char *name, char *err, size_t errlen)
{
    char path[4096];
    if (strchr(name, '/') || !strcmp(name, "..")) {
        cg_seterr(err, errlen,
                  "model.safetensors.index.json: shard name '%.200s' is not a file "
                  "name in the model directory",
                  name);
        return CG_E_VALUE;
    }
    for (size_t i = 0; i < m->n_files; i++)
        if (!strcmp(m->file_names[i], name)) return CG_OK;
    if (m->n_files == MAX_SHARDS) {
        cg_seterr(err, errlen, "model.safetensors.index.json: more than %d shards", MAX_SHARDS);
        return CG_E_VALUE;
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cg_st_file *f = NULL;
    cg_status st = cg_st_open(path, &f, err, errlen);
    if (st != CG_OK) return st;
    m->files = cg_realloc(m->files, (m->n_files + 1) * sizeof *m->files);
    m->file_names = cg_realloc(m->file_names, (m->n_files + 1) * sizeof *m->file_names);
    m->files[m->n_files] = f;
    m->file_names[m->n_files++] = cg_strdup(name);
    return CG_OK;
}

/* The shard files of model.safetensors.index.json ("weight_map": tensor -> file). */
static cg_status open_shards(cg_model *m, const char *dir, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    /* a few hundred KiB for the largest checkpoints */
    struct stat sb;
    if (stat(path, &sb) == 0 && sb.st_size > INDEX_MAX_BYTES) {
        cg_seterr(err, errlen, "model.safetensors.index.json: %lld bytes, more than the %d allowed",
                  (long long)sb.st_size, INDEX_MAX_BYTES);
        return CG_E_VALUE;
    }
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        cg_seterr(err, errlen, "model.safetensors.index.json: not valid JSON: %s (line %d)",
                  jerr.text, jerr.line);
        return CG_E_JSON;
    }
    cg_status st = CG_OK;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0) {
        cg_seterr(err, errlen,
                  "model.safetensors.index.json: 'weight_map' must be a non-empty "
                  "object of tensor name -> file");
        st = CG_E_TYPE;
    }
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file)
    {
        if (st != CG_OK) break;
        if (!json_is_string(file)) {
            cg_seterr(err, errlen,
                      "model.safetensors.index.json: weight_map['%.100s'] must be "
                      "a file name",
                      name);
            st = CG_E_TYPE;
            break;
        }
        st = open_file(m, dir, json_string_value(file), err, errlen);
    }
    json_decref(root);
    return st;
}

static cg_status open_files(cg_model *m, const char *dir, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (file_exists(path)) return open_shards(m, dir, err, errlen);
    return open_file(m, dir, "model.safetensors", err, errlen);
}

/* The tensor called name in any of the files, and which file holds it. */
static const cg_st_tensor *find_tensor(const cg_model *m, const char *name, size_t *file)
{
    for (size_t i = 0; i < m->n_files; i++) {
        const cg_st_tensor *t = cg_st_find(m->files[i], name);
        if (t) {
            if (file) *file = i;
            return t;
        }
    }
    return NULL;
}

/* ---- the tensors of the architecture ---- */

static void want_mat(cg_wlist *l, const char *name, int64_t rows, int64_t cols, cg_weight *dst)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->v = cg_realloc(l->v, l->cap * sizeof *l->v);
    }
    cg_wspec *w = &l->v[l->n++];
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->d0 = rows;
    w->d1 = cols;
    w->mat = dst;
}

static void want_vec(cg_wlist *l, const char *name, int64_t n, float **dst)
{
    want_mat(l, name, n, 0, NULL);
    l->v[l->n - 1].vec = dst;
}

/* Every tensor of config's architecture, with its HF name and shape. */
static void list_tensors(cg_model *m, cg_wlist *l)
{
    const cg_model_config *c = &m->cfg;
    const int64_t D = c->dim, V = c->vocab_size, H = c->hidden_dim, hd = c->head_dim;
    const int64_t Q = (int64_t)c->n_heads * hd, KV = (int64_t)c->n_kv_heads * hd;
    char nm[96];
    want_mat(l, "model.embed_tokens.weight", V, D, &m->embed);
    for (int i = 0; i < c->n_layers; i++) {
        layer_w *L = &m->layers[i];
#define NAME(suffix) (snprintf(nm, sizeof nm, "model.layers.%d.%s", i, suffix), nm)
        want_vec(l, NAME("input_layernorm.weight"), D, &L->attn_norm);
        want_mat(l, NAME("self_attn.q_proj.weight"), Q, D, &L->wq);
        want_mat(l, NAME("self_attn.k_proj.weight"), KV, D, &L->wk);
        want_mat(l, NAME("self_attn.v_proj.weight"), KV, D, &L->wv);
        want_mat(l, NAME("self_attn.o_proj.weight"), D, Q, &L->wo);
        if (c->qkv_bias) {
            want_vec(l, NAME("self_attn.q_proj.bias"), Q, &L->bq);
            want_vec(l, NAME("self_attn.k_proj.bias"), KV, &L->bk);
            want_vec(l, NAME("self_attn.v_proj.bias"), KV, &L->bv);
        }
        if (c->qk_norm) {
            want_vec(l, NAME("self_attn.q_norm.weight"), hd, &L->q_norm);
            want_vec(l, NAME("self_attn.k_norm.weight"), hd, &L->k_norm);
        }
        want_vec(l, NAME("post_attention_layernorm.weight"), D, &L->ffn_norm);
        want_mat(l, NAME("mlp.gate_proj.weight"), H, D, &L->w_gate);
        want_mat(l, NAME("mlp.up_proj.weight"), H, D, &L->w_up);
        want_mat(l, NAME("mlp.down_proj.weight"), D, H, &L->w_down);
#undef NAME
    }
    want_vec(l, "model.norm.weight", D, &m->norm);
    if (!c->tie_embeddings) want_mat(l, "lm_head.weight", V, D, &m->lm_head);
}

static cg_dtype dtype_of(cg_st_dtype d)
{
    return d == CG_ST_F16 ? CG_DTYPE_F16 : d == CG_ST_BF16 ? CG_DTYPE_BF16 : CG_DTYPE_F32;
}

/* Checks one tensor against its spec: present, shape, dtype. */
static cg_status check_tensor(const cg_model *m, const cg_wspec *w, const cg_st_tensor **out,
                              char *err, size_t errlen)
{
    size_t fi = 0;
    const cg_st_tensor *t = find_tensor(m, w->name, &fi);
    int ndim = w->d1 ? 2 : 1;
    if (!t) {
        cg_seterr(err, errlen, "%s: missing tensor '%s'",
                  m->n_files == 1 ? m->file_names[0] : "the safetensors files", w->name);
        return CG_E_MISSING;
    }
    if (t->ndim != ndim || t->shape[0] != w->d0 || (ndim == 2 && t->shape[1] != w->d1)) {
        char got[64] = "";
        size_t gl = 0;
        for (int d = 0; d < t->ndim && gl < sizeof got - 24; d++)
            gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s%lld", d ? ", " : "",
                                   (long long)t->shape[d]);
        if (ndim == 2)
            cg_seterr(err, errlen, "%s: tensor '%s' has shape [%s], expected [%lld, %lld]",
                      m->file_names[fi], w->name, got, (long long)w->d0, (long long)w->d1);
        else
            cg_seterr(err, errlen, "%s: tensor '%s' has shape [%s], expected [%lld]",
                      m->file_names[fi], w->name, got, (long long)w->d0);
        return CG_E_VALUE;
    }
    if (t->dtype == CG_ST_OTHER) {
        cg_seterr(err, errlen, "%s: tensor '%s' has dtype %s; supported are F32, F16, BF16",
                  m->file_names[fi], w->name, t->dtype_str);
        return CG_E_UNSUPPORTED;
    }
    *out = t;
    return CG_OK;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A tensor the architecture does not use may be one it needs (a bias, a norm, a rotary table
 * another implementation reads): the checkpoint is refused rather than run without it. So is a
 * tensor in two shards: which copy a loader takes is a guess (transformers takes the last). */
static cg_status refuse_unused(const cg_model *m, const cg_wlist *l, char *err, size_t errlen)
{
    const char **wanted = cg_malloc((l->n ? l->n : 1) * sizeof *wanted);
    for (size_t k = 0; k < l->n; k++)
        wanted[k] = l->v[k].name;
    qsort(wanted, l->n, sizeof *wanted, by_name);
    cg_status st = CG_OK;
    for (size_t f = 0; f < m->n_files && st == CG_OK; f++)
        for (size_t i = 0; i < cg_st_count(m->files[f]) && st == CG_OK; i++) {
            const char *name = cg_st_at(m->files[f], i)->name;
            size_t first = f;
            find_tensor(m, name, &first);
            if (first != f) {
                cg_seterr(err, errlen, "tensor '%.120s' is in both %s and %s", name,
                          m->file_names[first], m->file_names[f]);
                st = CG_E_VALUE;
            } else if (!bsearch(&name, wanted, l->n, sizeof *wanted, by_name)) {
                cg_seterr(err, errlen,
                          "%s: tensor '%.120s' is not used by %s as configured "
                          "(tie_word_embeddings %s); refusing a checkpoint that may need it",
                          m->file_names[f], name, cg_arch_name(m->cfg.arch),
                          m->cfg.tie_embeddings ? "true" : "false");
                st = CG_E_UNSUPPORTED;
            }
        }
    free(wanted);
    return st;
}

/* A matrix the kernels cannot read in place: not at a multiple of its element size (the
 * safetensors header's length sets where the data starts). */
static int misaligned(const cg_st_tensor *t)
{
    return (uintptr_t)t->data % (t->dtype == CG_ST_F32 ? 4u : 2u) != 0;
}

/* Matrices stay where they are mapped (one not at a multiple of its element size is copied to
 * f32: the kernels need element alignment); vectors are copied to f32. */
static cg_status place_tensors(cg_model *m, const cg_wlist *l, char *err, size_t errlen)
{
    const cg_st_tensor **ts = cg_calloc(l->n, sizeof *ts);
    size_t copy_floats = 0;
    cg_status st = CG_OK;
    for (size_t i = 0; i < l->n && st == CG_OK; i++) {
        st = check_tensor(m, &l->v[i], &ts[i], err, errlen);
        if (st != CG_OK) break;
        if (l->v[i].vec || misaligned(ts[i])) copy_floats += (ts[i]->numel + 15) & ~(size_t)15;
    }
    if (st == CG_OK) st = refuse_unused(m, l, err, errlen);
    if (st != CG_OK) {
        free(ts);
        return st;
    }
    float *p = cg_alloc64(&m->arena, copy_floats * sizeof(float));
    for (size_t i = 0; i < l->n; i++) {
        const cg_st_tensor *t = ts[i];
        const cg_wspec *w = &l->v[i];
        m->weight_bytes += t->nbytes;
        if (w->vec || misaligned(t)) {
            if (cg_st_to_f32(t, p) != CG_OK) abort(); /* dtypes were checked */
            if (w->vec)
                *w->vec = p;
            else
                *w->mat = (cg_weight){
                    .data = p, .dtype = CG_DTYPE_F32, .rows = (int)w->d0, .cols = (int)w->d1};
            p += (t->numel + 15) & ~(size_t)15;
        } else {
            *w->mat = (cg_weight){.data = t->data,
                                  .dtype = dtype_of(t->dtype),
                                  .rows = (int)w->d0,
                                  .cols = (int)w->d1};
        }
    }
    const cg_st_tensor *q = ts[0]; /* the embedding: the checkpoint's dtype */
    snprintf(m->cfg.dtype, sizeof m->cfg.dtype, "%s",
             q->dtype == CG_ST_F32   ? "f32"
             : q->dtype == CG_ST_F16 ? "f16"
                                     : "bf16");
    free(ts);
    return CG_OK;
}

/* ---- the tokenizer ---- */

/* tokenizer.json, or the byte tokenizer of a byte vocabulary. The tokenizer's EOS joins the
 * config's stop ids. */
static cg_status open_tokenizer(cg_model *m, const char *dir, char *err, size_t errlen)
{
    cg_model_config *c = &m->cfg;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cg_status st;
    if (file_exists(path)) {
        st = cg_tokenizer_new(dir, &m->tok, err, errlen);
        if (st != CG_OK) return st;
        if (cg_tokenizer_vocab_size(m->tok) > c->vocab_size) {
            cg_seterr(err, errlen,
                      "tokenizer.json: %d token ids do not fit config.json's vocab_size %d",
                      (int)cg_tokenizer_vocab_size(m->tok), c->vocab_size);
            return CG_E_VALUE;
        }
    } else {
        if (c->vocab_size > 512 || c->bos_id < 256 || c->n_eos < 1 || c->eos_ids[0] < 256) {
            cg_seterr(err, errlen,
                      "%s/tokenizer.json is missing; only a byte vocabulary (at most 512 tokens, "
                      "BOS and EOS above 255) runs without one",
                      dir);
            return CG_E_MISSING;
        }
        st = cg_tokenizer_new_bytes(c->bos_id, c->eos_ids[0], &m->tok, err, errlen);
        if (st != CG_OK) return st;
    }
    cg_model_take_tokenizer_ids(c, m->tok);
    return CG_OK;
}

void cg_model_add_eos(cg_model_config *c, int64_t id)
{
    if (id >= 0 && id < c->vocab_size && !cg_model_config_is_eos(c, (int32_t)id) &&
        c->n_eos < CG_MODEL_MAX_EOS)
        c->eos_ids[c->n_eos++] = (int32_t)id;
}

void cg_model_take_tokenizer_ids(cg_model_config *c, const cg_tokenizer *t)
{
    cg_model_add_eos(c, cg_tokenizer_eos(t));
    if (c->bos_id < 0) c->bos_id = cg_tokenizer_bos(t);
}

const char *const cg_quant_names[] = {"none", "q8", "q4", NULL};

const char *cg_quant_name(cg_quant q)
{
    return (unsigned)q < CG_QUANT_COUNT ? cg_quant_names[q] : "unknown";
}

/* --quant: every matrix (embedding and LM head included) quantised into one arena; the files
 * are then unmapped, so the model holds only the quantised copy. */
static cg_status quantize_model(cg_model *m, const cg_wlist *l, cg_quant quant, char *err,
                                size_t errlen)
{
    const cg_dtype to = quant == CG_QUANT_Q8 ? CG_DTYPE_Q8_0 : CG_DTYPE_Q4_0;
    const int unit = quant == CG_QUANT_Q8 ? 32 : 64;
    size_t total = 0;
    for (size_t i = 0; i < l->n; i++) {
        const cg_weight *w = l->v[i].mat;
        if (!w) continue;
        if (w->dtype == CG_DTYPE_Q8_0 || w->dtype == CG_DTYPE_Q4_0) {
            cg_seterr(err, errlen,
                      "--quant %s: tensor '%s' is already quantised (%s); serve a quantised "
                      "checkpoint without --quant",
                      cg_quant_name(quant), l->v[i].name,
                      w->dtype == CG_DTYPE_Q8_0 ? "Q8_0" : "Q4_0");
            return CG_E_UNSUPPORTED;
        }
        if (w->cols % unit) {
            cg_seterr(err, errlen,
                      "--quant %s needs matrices whose in-features are a multiple of %d: tensor "
                      "'%s' has %d",
                      cg_quant_name(quant), unit, l->v[i].name, w->cols);
            return CG_E_UNSUPPORTED;
        }
        size_t ns = 0, nq = cg_matmul_quant_bytes(to, w->rows, w->cols, &ns);
        total += cg_qarena_bytes(nq, ns);
    }
    char *p = cg_alloc64(&m->qarena, total);
    m->weight_bytes = 0;
    for (size_t i = 0; i < l->n; i++) {
        cg_weight *w = l->v[i].mat;
        if (!w) {
            m->weight_bytes += (size_t)l->v[i].d0 * sizeof(float);
            continue;
        }
        size_t ns = 0, nq = cg_matmul_quant_bytes(to, w->rows, w->cols, &ns);
        uint16_t *sc;
        void *q = cg_qarena_take(&p, nq, ns, &sc);
        cg_weight qw;
        if (cg_matmul_quantize(w, to, q, sc, &qw) != CG_OK) {
            cg_seterr(err, errlen, "--quant %s: tensor '%s' holds Inf or NaN", cg_quant_name(quant),
                      l->v[i].name);
            return CG_E_VALUE;
        }
        *w = qw;
        m->weight_bytes += nq + ns * 2;
    }
    /* nothing points into the files any more (vectors were copied to f32) */
    for (size_t i = 0; i < m->n_files; i++)
        cg_st_close(&m->files[i]);
    cg_gguf_close(&m->gguf);
    snprintf(m->cfg.dtype, sizeof m->cfg.dtype, "%s", quant == CG_QUANT_Q8 ? "q8_0" : "q4_0");
    return CG_OK;
}

cg_status cg_model_open(const char *dir, cg_model **out, char *err, size_t errlen)
{
    return cg_model_open_quant(dir, CG_QUANT_NONE, out, err, errlen);
}

/* Bytes of matrix w's values, and of its scales. */
static size_t weight_bytes(const cg_weight *w, size_t *scale_bytes)
{
    const size_t n = (size_t)w->rows * (size_t)w->cols;
    size_t blocks = 0;
    *scale_bytes = 0;
    switch (w->dtype) {
    case CG_DTYPE_F32:
        return 4 * n;
    case CG_DTYPE_F16:
    case CG_DTYPE_BF16:
        return 2 * n;
    case CG_DTYPE_Q8:
        *scale_bytes = 4 * (size_t)w->rows;
        return n;
    default:;
        const size_t b = cg_matmul_quant_bytes(w->dtype, w->rows, w->cols, &blocks);
        *scale_bytes = 2 * blocks;
        return b;
    }
}

/* 17 samples of 64 bytes spread over p[0, n): a different checkpoint of the same shapes (other
 * training, another quantisation) differs in all of them, at a cost independent of the size. */
static void hash_samples(XXH3_state_t *h, const void *p, size_t n)
{
    const uint8_t *b = p;
    if (!b || !n) return;
    const size_t piece = n < 64 ? n : 64;
    for (size_t i = 0; i <= 16; i++)
        XXH3_64bits_update(h, b + (n - piece) / 16 * i, piece);
}

/* m->cfg.kv_model: the model id and a fingerprint of what decides the KV it computes: the
 * config's geometry and RoPE, each tensor's name, dtype and shape with samples of its bytes as
 * loaded (after --quant), the vectors whole, and the ids the tokenizer gives a probe text. */
static void fingerprint(cg_model *m, const cg_wlist *l)
{
    const cg_model_config *c = &m->cfg;
    XXH3_state_t *h = XXH3_createState();
    if (!h) abort();
    XXH3_64bits_reset(h);
    const int32_t geo[] = {(int32_t)c->arch,  c->vocab_size, c->dim,
                           c->hidden_dim,     c->n_layers,   c->n_heads,
                           c->n_kv_heads,     c->head_dim,   (int32_t)c->rope_style,
                           c->tie_embeddings, c->qkv_bias,   c->qk_norm};
    XXH3_64bits_update(h, geo, sizeof geo);
    XXH3_64bits_update(h, &c->norm_eps, sizeof c->norm_eps);
    XXH3_64bits_update(h, c->inv_freq, (size_t)(c->head_dim / 2) * sizeof *c->inv_freq);
    XXH3_64bits_update(h, &c->attn_factor, sizeof c->attn_factor);
    for (size_t i = 0; i < l->n; i++) {
        const cg_wspec *w = &l->v[i];
        XXH3_64bits_update(h, w->name, strlen(w->name) + 1);
        if (w->vec) {
            XXH3_64bits_update(h, *w->vec, (size_t)w->d0 * sizeof(float));
            continue;
        }
        const cg_weight *x = w->mat;
        const int32_t shape[] = {(int32_t)x->dtype, x->rows, x->cols};
        XXH3_64bits_update(h, shape, sizeof shape);
        size_t sb;
        hash_samples(h, x->data, weight_bytes(x, &sb));
        hash_samples(h, x->scale ? (const void *)x->scale : (const void *)x->bscale, sb);
    }
    static const char probe[] = "The quick brown fox, 1234 jumps: over the lazy dog. Ünïcödé "
                                "東京 <|im_start|><|endoftext|>";
    cg_tokens tk = {0};
    if (m->tok && cg_tokenizer_encode(m->tok, probe, sizeof probe - 1, 1, &tk) == CG_OK)
        XXH3_64bits_update(h, tk.ids, tk.n * sizeof *tk.ids);
    cg_tokens_free(&tk);
    const unsigned long long fp = (unsigned long long)XXH3_64bits_digest(h);
    XXH3_freeState(h);
    snprintf(m->cfg.kv_model, sizeof m->cfg.kv_model, "%s#%016llx", c->model_id, fp);
}

cg_status cg_model_open_quant(const char *dir, cg_quant quant, cg_model **out, char *err,
                              size_t errlen)
{
    cg_model *m = cg_calloc(1, sizeof *m);
    cg_wlist l = {0};
    *out = NULL;
    if (err && errlen) err[0] = '\0';
    const int gguf = cg_model_is_gguf(dir);
    cg_status st = gguf ? cg_gguf_model_open(m, dir, err, errlen)
                        : cg_model_config_read(dir, &m->cfg, err, errlen);
    if (st == CG_OK && !gguf) st = open_files(m, dir, err, errlen);
    if (st == CG_OK) {
        m->layers = cg_calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
        list_tensors(m, &l);
        st = gguf ? cg_gguf_place_tensors(m, &l, err, errlen) : place_tensors(m, &l, err, errlen);
    }
    if (st == CG_OK && (unsigned)quant >= CG_QUANT_COUNT) {
        cg_seterr(err, errlen, "unknown quantisation %d", (int)quant);
        st = CG_E_VALUE;
    }
    if (st == CG_OK && quant != CG_QUANT_NONE) st = quantize_model(m, &l, quant, err, errlen);
    if (st == CG_OK && !gguf) st = open_tokenizer(m, dir, err, errlen);
    if (st == CG_OK) fingerprint(m, &l);
    free(l.v);
    if (st != CG_OK) {
        cg_model_close(&m);
        return st;
    }
    if (m->cfg.tie_embeddings) m->lm_head = m->embed;
    /* Process-wide: every BLAS call runs on its calling thread, and the cores are shared out
     * by OpenMP only (see worker/model/matmul.h and the attention kernel). */
    openblas_set_num_threads(1);
    *out = m;
    return CG_OK;
}

void cg_model_close(cg_model **pm)
{
    cg_model *m = *pm;
    if (!m) return;
    for (size_t i = 0; i < m->n_files; i++) {
        cg_st_close(&m->files[i]); /* accepts one already closed (--quant) */
        free(m->file_names[i]);
    }
    free(m->files);
    free(m->file_names);
    cg_gguf_close(&m->gguf);
    cg_tokenizer_free(&m->tok);
    free(m->arena);
    free(m->qarena);
    free(m->layers);
    cg_free(pm);
}

const cg_model_config *cg_model_cfg(const cg_model *m)
{
    return &m->cfg;
}

const cg_tokenizer *cg_model_tokenizer(const cg_model *m)
{
    return m->tok;
}

cg_rope cg_model_rope(const cg_model *m)
{
    return cg_model_config_rope(&m->cfg);
}

size_t cg_model_weight_bytes(const cg_model *m)
{
    return m->weight_bytes;
}

/* ---- tokens ---- */

int32_t *cg_tok_encode(const cg_model *m, const char *text, size_t len, int add_bos, size_t *n)
{
    cg_tokens t = {0};
    *n = 0;
    if (cg_tokenizer_encode(m->tok, text, len, add_bos, &t) != CG_OK || !t.n) {
        cg_tokens_free(&t);
        return NULL;
    }
    *n = t.n;
    return t.ids; /* taken over from t */
}

size_t cg_tok_decode(const cg_model *m, int32_t t, char *out)
{
    size_t len = 0;
    if (cg_tokenizer_is_special(m->tok, t)) return 0;
    const char *b = cg_tokenizer_token_bytes(m->tok, t, &len);
    len = CG_MIN(len, (size_t)CG_TOKEN_MAX_BYTES);
    if (b && len) memcpy(out, b, len);
    return b ? len : 0;
}

/* ---- KV buffer ---- */

struct cg_kv {
    uint32_t cap;
    int n_layers, n_kv_heads, head_dim;
    size_t bytes; /* of data: cap slots of every plane */
    void *raw;
    float *data; /* [layer][K,V][kv head][cap][head_dim] */
};

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
    kv->bytes = floats * sizeof(float);
    /* calloc: pages are mapped lazily, so a large capacity costs only what is used */
    kv->raw = cg_calloc(kv->bytes + 64, 1);
    kv->data = (float *)(((uintptr_t)kv->raw + 63) & ~(uintptr_t)63);
    return kv;
}

void cg_kv_free(cg_kv **pkv)
{
    if (!*pkv) return;
    free((*pkv)->raw);
    cg_free(pkv);
}

uint32_t cg_kv_cap(const cg_kv *kv)
{
    return kv->cap;
}

size_t cg_kv_bytes(const cg_kv *kv)
{
    return kv->bytes;
}

int cg_kv_matches(const cg_kv *kv, const cg_model *m)
{
    return kv->n_layers == m->cfg.n_layers && kv->n_kv_heads == m->cfg.n_kv_heads &&
           kv->head_dim == m->cfg.head_dim;
}

static float *kv_plane(cg_kv *kv, int layer, int which, int head)
{
    size_t plane = (size_t)kv->cap * (size_t)kv->head_dim;
    return kv->data +
           (((size_t)layer * 2 + (size_t)which) * (size_t)kv->n_kv_heads + (size_t)head) * plane;
}

float *cg_kv_k(cg_kv *kv, int layer, int head)
{
    return kv_plane(kv, layer, 0, head);
}

float *cg_kv_v(cg_kv *kv, int layer, int head)
{
    return kv_plane(kv, layer, 1, head);
}

void cg_kv_copy_slots(cg_kv *dst, cg_kv *src, uint32_t n)
{
    const size_t bytes = (size_t)n * (size_t)src->head_dim * sizeof(float);
    for (int l = 0; l < src->n_layers; l++)
        for (int h = 0; h < src->n_kv_heads; h++) {
            memcpy(cg_kv_k(dst, l, h), cg_kv_k(src, l, h), bytes);
            memcpy(cg_kv_v(dst, l, h), cg_kv_v(src, l, h), bytes);
        }
}
