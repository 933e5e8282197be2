/* Check suite for the reference model: generator + loader round trip, dtypes, rope styles,
 * determinism, rejection of damaged files, forward consistency (batched vs incremental, split
 * prefill, strict chunk vs remap), greedy decoding, tokenizer and sampling. */
#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/model/model.h"
#include "worker/model/model_impl.h"
#include "worker/model/safetensors.h"
#include "base/base.h"
#include "tests/harness/harness.h"

#define ERRLEN 512

/* ---- helpers ---- */

static uint8_t *read_all(const char *path, size_t *len)
{
    ck_assert_msg(access(path, R_OK) == 0, "cannot open %s", path);
    return (uint8_t *)th_read_file(path, len);
}

static void write_all(const char *path, const void *p, size_t n)
{
    ck_assert_int_eq(th_write_bytes(path, p, n), 0);
}

static void join(char *out, size_t n, const char *dir, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

static cg_model_gen_params small_params(void)
{
    cg_model_gen_params p = cg_model_gen_default_params();
    p.n_layers = 2;
    p.dim = 64;
    p.n_heads = 4;
    p.n_kv_heads = 2;
    p.hidden_dim = 128;
    p.max_pos = 4096;
    return p;
}

static void gen(const char *dir, cg_model_gen_params p)
{
    char err[ERRLEN] = "";
    cg_status st = cg_model_generate(dir, p, err, sizeof err);
    ck_assert_msg(st == CG_OK, "generate: %s (%s)", cg_status_name(st), err);
}

static cg_model *load(const char *dir)
{
    char err[ERRLEN] = "";
    cg_model *m = NULL;
    cg_status st = cg_model_open(dir, &m, err, sizeof err);
    ck_assert_msg(st == CG_OK, "load %s: %s (%s)", dir, cg_status_name(st), err);
    ck_assert_ptr_nonnull(m);
    return m;
}

static const char *PROMPT =
    "You are a careful assistant. The quarterly report for 2024 shows revenue growth in all "
    "regions, with the strongest gains in Europe.";

/* Plain causal prefill of text (with BOS) into a fresh kv; returns the kv, logits in out. */
static cg_kv *prefill(const cg_model *m, const char *text, float *logits, uint32_t *n_out)
{
    size_t len = strlen(text);
    int32_t *tok = cg_malloc((len + 1) * sizeof *tok);
    uint32_t n = th_tok_into(m, text, len, 1, tok);
    cg_kv *kv = cg_kv_new(m, n + 64);
    ck_assert_ptr_nonnull(kv);
    cg_attn_span sp = {0, n, 0, 0};
    ck_assert_int_eq(cg_model_forward(m, kv, tok, n, 0, 0, &sp, 1, logits), CG_OK);
    free(tok);
    if (n_out) *n_out = n;
    return kv;
}

static double max_abs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static int32_t argmax_f(const float *x, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* ---- generator + loader ---- */

/* What a generated model's config.json must say. */
typedef struct geometry {
    const char *model_id;
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, max_pos;
    cg_rope_style rope_style;
} geometry;

static void assert_geometry(const cg_model *m, const geometry *g)
{
    const cg_model_config *c = cg_model_cfg(m);
    ck_assert_str_eq(c->model_id, g->model_id);
    ck_assert_int_eq(c->dim, g->dim);
    ck_assert_int_eq(c->hidden_dim, g->hidden_dim);
    ck_assert_int_eq(c->n_layers, g->n_layers);
    ck_assert_int_eq(c->n_heads, g->n_heads);
    ck_assert_int_eq(c->n_kv_heads, g->n_kv_heads);
    ck_assert_int_eq(c->head_dim, g->head_dim);
    ck_assert_int_eq(c->max_pos, g->max_pos);
    ck_assert_int_eq(c->rope_style, g->rope_style);
    ck_assert_int_eq(cg_model_rope(m).style, g->rope_style);
}

START_TEST(test_generate_load_defaults)
{
    char *dir = th_mkdtemp("test_model");
    gen(dir, cg_model_gen_default_params());
    cg_model *m = load(dir);
    const cg_model_config *c = cg_model_cfg(m);
    static const geometry def = {"chunkgate-tiny", 256, 768, 4, 8, 4, 32, 32768, CG_ROPE_HALF};
    assert_geometry(m, &def);
    ck_assert_int_eq(c->vocab_size, 258);
    ck_assert(c->rope_theta == 10000.0);
    ck_assert(fabsf(c->norm_eps - 1e-5f) < 1e-9f);
    ck_assert_int_eq(c->tie_embeddings, 0);
    ck_assert_int_eq(c->bos_id, 256);
    ck_assert_int_eq(c->n_eos, 1);
    ck_assert_int_eq(c->eos_ids[0], 257);
    ck_assert_str_eq(c->dtype, "f32");
    cg_rope r = cg_model_rope(m);
    ck_assert_int_eq(r.head_dim, 32);
    ck_assert(r.theta == 10000.0);
    ck_assert_int_eq(r.style, CG_ROPE_HALF);
    cg_model_close(&m);
    ck_assert_ptr_null(m);
    cg_model_close(&m); /* NULL is accepted */
    th_rmdtemp(dir);
}
END_TEST

START_TEST(test_generate_load_custom)
{
    char *dir = th_mkdtemp("test_model");
    cg_model_gen_params p = small_params();
    p.rope_style = CG_ROPE_INTERLEAVED;
    p.model_id = "tiny-interleaved";
    p.max_pos = 1000;
    gen(dir, p);
    cg_model *m = load(dir);
    static const geometry custom = {"tiny-interleaved", 64, 128, 2, 4, 2, 16, 1000,
                                    CG_ROPE_INTERLEAVED};
    assert_geometry(m, &custom);
    cg_model_close(&m);

    /* invalid generator parameters are refused, nothing crashes */
    char err[ERRLEN];
    cg_model_gen_params bad = small_params();
    bad.n_heads = 3;
    ck_assert_int_eq(cg_model_generate(dir, bad, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "n_heads"));
    bad = small_params();
    bad.dtype = "f8";
    ck_assert_int_eq(cg_model_generate(dir, bad, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "dtype"));
    th_rmdtemp(dir);
}
END_TEST

/* Both rope styles load from the same weights (same seed) and give different logits. */
START_TEST(test_rope_styles)
{
    char *d1 = th_mkdtemp("test_model"), *d2 = th_mkdtemp("test_model");
    cg_model_gen_params p = small_params();
    gen(d1, p);
    p.rope_style = CG_ROPE_INTERLEAVED;
    gen(d2, p);
    cg_model *a = load(d1), *b = load(d2);
    ck_assert_int_eq(cg_model_cfg(a)->rope_style, CG_ROPE_HALF);
    ck_assert_int_eq(cg_model_cfg(b)->rope_style, CG_ROPE_INTERLEAVED);
    float la[258], lb[258];
    cg_kv *ka = prefill(a, PROMPT, la, NULL), *kb = prefill(b, PROMPT, lb, NULL);
    ck_assert(max_diff(la, lb, 258) > 1e-3 * max_abs(la, 258));
    cg_kv_free(&ka);
    cg_kv_free(&kb);
    ck_assert_ptr_null(ka);
    cg_model_close(&a);
    cg_model_close(&b);
    th_rmdtemp(d1);
    th_rmdtemp(d2);
}
END_TEST

START_TEST(test_determinism)
{
    char *d1 = th_mkdtemp("test_model"), *d2 = th_mkdtemp("test_model"),
         *d3 = th_mkdtemp("test_model");
    char p1[4096], p2[4096], p3[4096];
    cg_model_gen_params p = small_params();
    p.seed = 42;
    gen(d1, p);
    gen(d2, p);
    p.seed = 43;
    gen(d3, p);
    join(p1, sizeof p1, d1, "model.safetensors");
    join(p2, sizeof p2, d2, "model.safetensors");
    join(p3, sizeof p3, d3, "model.safetensors");
    ck_assert_uint_eq(th_file_fnv1a(p1), th_file_fnv1a(p2));
    ck_assert_uint_ne(th_file_fnv1a(p1), th_file_fnv1a(p3));
    join(p1, sizeof p1, d1, "config.json");
    join(p2, sizeof p2, d2, "config.json");
    ck_assert_uint_eq(th_file_fnv1a(p1), th_file_fnv1a(p2));
    th_rmdtemp(d1);
    th_rmdtemp(d2);
    th_rmdtemp(d3);
}
END_TEST

/* f16 and bf16 files hold the f32 weights rounded; the forward stays close. */
START_TEST(test_dtypes)
{
    char *d[3];
    const char *names[3] = {"f32", "f16", "bf16"};
    cg_model *m[3];
    float lg[3][258];
    /* relative bounds: bf16 keeps 8 mantissa bits, f16 11 */
    const double weight_tol[3] = {0, 1.0 / 2048, 1.0 / 256};
    const double logit_tol[3] = {0, 0.01, 0.05};
    char path[4096], err[ERRLEN];
    cg_st_file *sf[3];
    for (int i = 0; i < 3; i++) {
        d[i] = th_mkdtemp("test_model");
        cg_model_gen_params p = cg_model_gen_default_params();
        p.dtype = names[i];
        gen(d[i], p);
        m[i] = load(d[i]);
        ck_assert_str_eq(cg_model_cfg(m[i])->dtype, names[i]);
        cg_kv *kv = prefill(m[i], PROMPT, lg[i], NULL);
        cg_kv_free(&kv);
        join(path, sizeof path, d[i], "model.safetensors");
        ck_assert_int_eq(cg_st_open(path, &sf[i], err, sizeof err), CG_OK);
    }
    const cg_st_tensor *t0 = cg_st_find(sf[0], "model.layers.1.mlp.up_proj.weight");
    ck_assert_ptr_nonnull(t0);
    ck_assert_int_eq(t0->dtype, CG_ST_F32);
    float *w0 = cg_malloc(t0->numel * 4), *w = cg_malloc(t0->numel * 4);
    ck_assert_int_eq(cg_st_to_f32(t0, w0), CG_OK);
    for (int i = 1; i < 3; i++) {
        const cg_st_tensor *t = cg_st_find(sf[i], "model.layers.1.mlp.up_proj.weight");
        ck_assert_int_eq(t->dtype, i == 1 ? CG_ST_F16 : CG_ST_BF16);
        ck_assert_uint_eq(t->nbytes, t0->numel * 2);
        ck_assert_int_eq(cg_st_to_f32(t, w), CG_OK);
        for (size_t j = 0; j < t0->numel; j++)
            ck_assert_msg(fabs((double)w[j] - w0[j]) <= weight_tol[i] * fabs(w0[j]) + 1e-7,
                          "%s weight %zu: %g vs %g", names[i], j, w[j], w0[j]);
        double rel = max_diff(lg[0], lg[i], 258) / max_abs(lg[0], 258);
        fprintf(stderr, "test_dtypes: %s logits max rel diff vs f32 %.2e\n", names[i], rel);
        ck_assert_msg(rel < logit_tol[i], "%s logits differ by %g", names[i], rel);
        ck_assert(rel > 0); /* the weights really were rounded */
        ck_assert_int_eq(argmax_f(lg[0], 258), argmax_f(lg[i], 258));
    }
    free(w0);
    free(w);
    for (int i = 0; i < 3; i++) {
        cg_st_close(&sf[i]);
        cg_model_close(&m[i]);
        th_rmdtemp(d[i]);
    }
}
END_TEST

/* A header whose length puts the data at an odd address: 16-bit matrices are copied to f32
 * (the kernels read whole elements), with the same logits. */
START_TEST(test_odd_data_offset)
{
    const char *names[2] = {"f16", "bf16"};
    for (int i = 0; i < 2; i++) {
        char *d = th_mkdtemp("test_model"), path[4096];
        cg_model_gen_params p = cg_model_gen_default_params();
        p.dtype = names[i];
        gen(d, p);
        float lg[2][258];
        cg_model *m = load(d);
        ck_assert_int_ne(m->layers[0].wq.dtype, CG_DTYPE_F32);
        cg_kv *kv = prefill(m, PROMPT, lg[0], NULL);
        cg_kv_free(&kv);
        cg_model_close(&m);
        /* one more space at the header's end */
        join(path, sizeof path, d, "model.safetensors");
        size_t n;
        uint8_t *b = read_all(path, &n), *o = cg_malloc(n + 1);
        uint64_t hl;
        memcpy(&hl, b, 8);
        memcpy(o + 8, b + 8, hl);
        o[8 + hl] = ' ';
        memcpy(o + 9 + hl, b + 8 + hl, n - 8 - hl);
        hl++;
        memcpy(o, &hl, 8);
        write_all(path, o, n + 1);
        free(b);
        free(o);
        m = load(d);
        ck_assert_int_eq(m->layers[0].wq.dtype, CG_DTYPE_F32);
        kv = prefill(m, PROMPT, lg[1], NULL);
        cg_kv_free(&kv);
        cg_model_close(&m);
        double rel = max_diff(lg[0], lg[1], 258) / max_abs(lg[0], 258);
        ck_assert_msg(rel < 1e-4, "%s: logits differ by %g", names[i], rel);
        th_rmdtemp(d);
    }
}
END_TEST

START_TEST(test_half_conversions)
{
    ck_assert(cg_f16_to_f32(0x3c00) == 1.0f);
    ck_assert(cg_f16_to_f32(0xc000) == -2.0f);
    ck_assert(cg_f16_to_f32(0x7bff) == 65504.0f);
    ck_assert(cg_f16_to_f32(0x0001) == 0x1p-24f);
    ck_assert(isinf(cg_f16_to_f32(0x7c00)));
    ck_assert(isnan(cg_f16_to_f32(0x7e00)));
    ck_assert_uint_eq(cg_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(cg_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(cg_f32_to_f16(65520.0f), 0x7c00);
    ck_assert_uint_eq(cg_f32_to_f16(0x1p-24f), 0x0001);
    ck_assert_uint_eq(cg_f32_to_f16(0x1p-26f), 0x0000); /* below half of the smallest subnormal */
    ck_assert_uint_eq(cg_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
    ck_assert_uint_eq(cg_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    ck_assert_uint_eq(cg_f32_to_bf16(1.0f), 0x3f80);
    ck_assert(cg_bf16_to_f32(0xbf80) == -1.0f);
    ck_assert_uint_eq(cg_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
    /* every f16 value survives f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = cg_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        ck_assert_uint_eq(cg_f32_to_f16(f), h);
    }
}
END_TEST

/* ---- damaged files ---- */

typedef void (*header_edit)(json_t *header);

/* Rewrites dir/model.safetensors with its header passed through edit; the data section is
 * kept as is (offsets are relative to it). */
static void rewrite_header(const char *dir, header_edit edit)
{
    char path[4096];
    join(path, sizeof path, dir, "model.safetensors");
    size_t n;
    uint8_t *b = read_all(path, &n);
    uint64_t hl;
    memcpy(&hl, b, 8);
    json_t *h = json_loadb((const char *)b + 8, hl, 0, NULL);
    ck_assert_ptr_nonnull(h);
    edit(h);
    char *text = json_dumps(h, JSON_COMPACT);
    size_t tl = strlen(text);
    uint64_t nl = tl;
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    fwrite(&nl, 8, 1, fp);
    fwrite(text, 1, tl, fp);
    fwrite(b + 8 + hl, 1, n - 8 - hl, fp);
    ck_assert_int_eq(fclose(fp), 0);
    free(text);
    json_decref(h);
    free(b);
}

typedef void (*config_edit)(json_t *config);

static void rewrite_config(const char *dir, config_edit edit)
{
    char path[4096];
    join(path, sizeof path, dir, "config.json");
    json_t *c = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(c);
    edit(c);
    ck_assert_int_eq(json_dump_file(c, path, JSON_INDENT(2)), 0);
    json_decref(c);
}

static void expect_fail(const char *dir, cg_status want, const char *needle)
{
    char err[ERRLEN] = "";
    cg_model *m = NULL;
    cg_status st = cg_model_open(dir, &m, err, sizeof err);
    ck_assert_msg(st == want, "want %s, got %s (%s)", cg_status_name(want), cg_status_name(st),
                  err);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, needle) != NULL, "message '%s' lacks '%s'", err, needle);
}

static void drop_up_proj(json_t *h)
{
    json_object_del(h, "model.layers.1.mlp.up_proj.weight");
}
static void swap_k_shape(json_t *h)
{
    json_t *t =
        json_object_get(json_object_get(h, "model.layers.0.self_attn.k_proj.weight"), "shape");
    json_int_t a = json_integer_value(json_array_get(t, 0)),
               b = json_integer_value(json_array_get(t, 1));
    json_array_set_new(t, 0, json_integer(b));
    json_array_set_new(t, 1, json_integer(a));
}
static void unknown_dtype(json_t *h)
{
    json_object_set_new(json_object_get(h, "model.norm.weight"), "dtype", json_string("Q7"));
}
static void int_dtype(json_t *h)
{
    json_object_set_new(json_object_get(h, "model.norm.weight"), "dtype", json_string("I32"));
}
static void overlap_offsets(json_t *h)
{
    json_t *a = json_object_get(json_object_get(h, "model.norm.weight"), "data_offsets");
    json_t *b = json_object_get(json_object_get(h, "lm_head.weight"), "data_offsets");
    json_int_t len =
        json_integer_value(json_array_get(a, 1)) - json_integer_value(json_array_get(a, 0));
    json_int_t b0 = json_integer_value(json_array_get(b, 0));
    json_array_set_new(a, 0, json_integer(b0));
    json_array_set_new(a, 1, json_integer(b0 + len));
}
static void negative_offset(json_t *h)
{
    json_t *a = json_object_get(json_object_get(h, "model.norm.weight"), "data_offsets");
    json_array_set_new(a, 0, json_integer(-4));
}
static void offsets_past_end(json_t *h)
{
    json_t *a = json_object_get(json_object_get(h, "lm_head.weight"), "data_offsets");
    json_array_set_new(a, 1, json_integer(json_integer_value(json_array_get(a, 1)) + 4096));
}
static void string_shape(json_t *h)
{
    json_object_set_new(json_object_get(h, "model.norm.weight"), "shape", json_string("64"));
}
static void rope_dynamic(json_t *c)
{
    json_object_set_new(c, "rope_scaling",
                        json_pack("{s:s,s:f}", "type", "dynamic", "factor", 2.0));
}
static void rope_yarn(json_t *c)
{
    json_object_set_new(c, "rope_scaling",
                        json_pack("{s:s,s:f}", "rope_type", "yarn", "factor", 4.0));
}
static void rope_longrope(json_t *c)
{
    json_object_set_new(c, "rope_scaling",
                        json_pack("{s:s,s:f}", "rope_type", "longrope", "factor", 4.0));
}
static void heads_7(json_t *c)
{
    json_object_del(c, "head_dim");
    json_object_set_new(c, "num_attention_heads", json_integer(7));
}
static void kv_heads_3(json_t *c)
{
    json_object_set_new(c, "num_key_value_heads", json_integer(3));
}
static void odd_head_dim(json_t *c)
{
    json_object_set_new(c, "head_dim", json_integer(15));
}
static void no_hidden(json_t *c)
{
    json_object_del(c, "hidden_size");
}
static void string_layers(json_t *c)
{
    json_object_set_new(c, "num_hidden_layers", json_string("2"));
}
static void bad_rope_style(json_t *c)
{
    json_object_set_new(c, "rope_style", json_string("neox2"));
}
static void big_bos(json_t *c)
{
    json_object_set_new(c, "bos_token_id", json_integer(100000));
}
static void fewer_layers(json_t *c)
{
    json_object_set_new(c, "num_hidden_layers", json_integer(1));
}
static void wider(json_t *c)
{
    json_object_set_new(c, "hidden_size", json_integer(1 << 16));
    json_object_set_new(c, "intermediate_size", json_integer(1 << 20));
    json_object_set_new(c, "vocab_size", json_integer(1 << 24));
}
static void attn_bias(json_t *c)
{
    json_object_set_new(c, "attention_bias", json_true());
}

/* transformers 5's form: rope_theta and the scaling in rope_parameters */
static void params_yarn(json_t *c)
{
    json_object_del(c, "rope_theta");
    json_object_set_new(
        c, "rope_parameters",
        json_pack("{s:s,s:f,s:f}", "rope_type", "yarn", "factor", 4.0, "rope_theta", 500000.0));
}
static void params_theta_differs(json_t *c)
{
    json_object_set_new(c, "rope_theta", json_real(10000.0));
    json_object_set_new(c, "rope_parameters",
                        json_pack("{s:s,s:f}", "rope_type", "default", "rope_theta", 500000.0));
}
static void params_per_layer(json_t *c)
{
    json_object_set_new(c, "rope_parameters",
                        json_pack("{s:{s:s,s:f}}", "full_attention", "rope_type", "default",
                                  "rope_theta", 10000.0));
}
static void llama3_no_fields(json_t *c)
{
    json_object_set_new(c, "rope_scaling",
                        json_pack("{s:s,s:f}", "rope_type", "llama3", "factor", 8.0));
}
static void yarn_truncate_string(json_t *c)
{
    json_object_set_new(
        c, "rope_scaling",
        json_pack("{s:s,s:f,s:s}", "rope_type", "yarn", "factor", 4.0, "truncate", "no"));
}
static void yarn_no_truncate(json_t *c)
{
    json_object_set_new(
        c, "rope_scaling",
        json_pack("{s:s,s:f,s:b}", "rope_type", "yarn", "factor", 4.0, "truncate", 0));
}
static void params_theta_only(json_t *c)
{
    json_object_set_new(c, "rope_parameters", json_pack("{s:f}", "rope_theta", 10000.0));
}
static void attn_bias_one(json_t *c)
{
    json_object_set_new(c, "attention_bias", json_integer(1));
}

static char *fresh_small(void)
{
    char *dir = th_mkdtemp("test_model");
    gen(dir, small_params());
    return dir;
}

START_TEST(test_bad_safetensors)
{
    char path[4096];
    size_t n;
    uint8_t *b;
    struct {
        header_edit edit;
        cg_status st;
        const char *needle;
    } hcases[] = {
        {drop_up_proj, CG_E_MISSING, "model.layers.1.mlp.up_proj.weight"},
        {swap_k_shape, CG_E_VALUE,
         "model.layers.0.self_attn.k_proj.weight' has shape [64, 32], expected [32, 64]"},
        {unknown_dtype, CG_E_VALUE, "unknown dtype 'Q7'"},
        {int_dtype, CG_E_UNSUPPORTED, "dtype I32"},
        {overlap_offsets, CG_E_VALUE, "overlap"},
        {negative_offset, CG_E_VALUE, "data_offsets"},
        {offsets_past_end, CG_E_VALUE, "beyond"},
        {string_shape, CG_E_TYPE, "shape"},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(hcases); i++) {
        char *dir = fresh_small();
        rewrite_header(dir, hcases[i].edit);
        expect_fail(dir, hcases[i].st, hcases[i].needle);
        th_rmdtemp(dir);
    }

    /* truncated: the last tensor's bytes run past the end */
    char *dir = fresh_small();
    join(path, sizeof path, dir, "model.safetensors");
    ck_assert_int_eq(truncate(path, 5000), 0);
    expect_fail(dir, CG_E_VALUE, "truncated");
    /* shorter than the length prefix */
    ck_assert_int_eq(truncate(path, 5), 0);
    expect_fail(dir, CG_E_VALUE, "too short");
    th_rmdtemp(dir);

    /* header length beyond the file, and beyond the 100 MB limit */
    dir = fresh_small();
    join(path, sizeof path, dir, "model.safetensors");
    b = read_all(path, &n);
    uint64_t hl = n;
    memcpy(b, &hl, 8);
    write_all(path, b, n);
    expect_fail(dir, CG_E_VALUE, "exceeds the file size");
    hl = UINT64_MAX;
    memcpy(b, &hl, 8);
    write_all(path, b, n);
    expect_fail(dir, CG_E_VALUE, "exceeds the file size");
    free(b);
    th_rmdtemp(dir);

    /* bad JSON in the header; a header that is JSON but not an object */
    dir = fresh_small();
    join(path, sizeof path, dir, "model.safetensors");
    b = read_all(path, &n);
    b[8] = 'x';
    write_all(path, b, n);
    expect_fail(dir, CG_E_JSON, "not valid JSON");
    memcpy(&hl, b, 8);
    memset(b + 8, ' ', hl);
    memcpy(b + 8, "[1, 2]", 6);
    write_all(path, b, n);
    expect_fail(dir, CG_E_TYPE, "not a JSON object");
    free(b);
    /* missing file */
    unlink(path);
    expect_fail(dir, CG_E_IO, "model.safetensors");
    th_rmdtemp(dir);
}
END_TEST

START_TEST(test_bad_config)
{
    struct {
        config_edit edit;
        cg_status st;
        const char *needle;
    } cases[] = {
        {rope_dynamic, CG_E_UNSUPPORTED, "rope_scaling 'dynamic'"},
        {rope_longrope, CG_E_UNSUPPORTED, "rope_scaling 'longrope'"},
        {rope_yarn, CG_OK, "yarn"}, /* static per-frequency scaling: remap stays exact */
        {heads_7, CG_E_VALUE, "num_attention_heads 7 does not divide hidden_size 64"},
        {kv_heads_3, CG_E_VALUE, "num_key_value_heads 3 does not divide"},
        {odd_head_dim, CG_E_VALUE, "head_dim 15 must be even"},
        {no_hidden, CG_E_MISSING, "hidden_size"},
        {string_layers, CG_E_TYPE, "num_hidden_layers"},
        {bad_rope_style, CG_E_VALUE, "rope_style"},
        {big_bos, CG_E_VALUE, "bos_token_id"},
        /* a tensor the configured model does not use may be one it needs: refused */
        {fewer_layers, CG_E_UNSUPPORTED, "model.layers.1.input_layernorm.weight' is not used"},
        {wider, CG_E_VALUE, "model.embed_tokens.weight' has shape"},
        {attn_bias, CG_E_UNSUPPORTED, "attention_bias"},
        /* a flag Python would take as true is not read as false */
        {attn_bias_one, CG_E_TYPE, "'attention_bias' must be true or false"},
        {params_yarn, CG_OK, "yarn"},
        {params_theta_only, CG_OK, "none"},
        {params_theta_differs, CG_E_VALUE, "differ"},
        {params_per_layer, CG_E_UNSUPPORTED, "per layer type"},
        {llama3_no_fields, CG_E_MISSING, "'rope_scaling.low_freq_factor' is required"},
        {yarn_truncate_string, CG_E_TYPE, "'rope_scaling.truncate' must be true or false"},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(cases); i++) {
        char *dir = fresh_small();
        rewrite_config(dir, cases[i].edit);
        if (cases[i].st == CG_OK) {
            cg_model *m = load(dir);
            ck_assert_str_eq(cg_model_cfg(m)->rope_scaling, cases[i].needle);
            cg_model_close(&m);
        } else {
            expect_fail(dir, cases[i].st, cases[i].needle);
        }
        th_rmdtemp(dir);
    }
    /* rope_parameters' theta is the one used; yarn without truncation keeps fractional
     * correction dims, as transformers does */
    const config_edit edits[] = {rope_yarn, params_yarn, yarn_no_truncate};
    double f[3][2];
    for (size_t i = 0; i < CG_ARRAY_LEN(edits); i++) {
        char *d = fresh_small();
        rewrite_config(d, edits[i]);
        cg_model *m = load(d);
        f[i][0] = m->cfg.rope_theta;
        f[i][1] = 0;
        for (int k = 0; k < m->cfg.head_dim / 2; k++)
            f[i][1] += m->cfg.inv_freq[k];
        cg_model_close(&m);
        th_rmdtemp(d);
    }
    ck_assert_double_eq(f[1][0], 500000.0);
    ck_assert_double_ne(f[0][0], 500000.0);
    ck_assert_msg(f[2][1] != f[0][1], "truncate false changed no frequency");
    char path[4096];
    char *dir = fresh_small();
    join(path, sizeof path, dir, "config.json");
    write_all(path, "{\"hidden_size\": 64,", 19);
    expect_fail(dir, CG_E_JSON, "config.json: not valid JSON");
    write_all(path, "[64]", 4);
    expect_fail(dir, CG_E_TYPE, "config.json: not a JSON object");
    unlink(path);
    expect_fail(dir, CG_E_IO, "config.json");
    th_rmdtemp(dir);
    expect_fail("/nonexistent/cg-model", CG_E_IO, "config.json");
}
END_TEST

/* Opens the model in dir: 1 when it loads, 0 when it is refused with a message and no model. */
static int loads_or_refuses(const char *dir)
{
    char err[ERRLEN] = "";
    cg_model *m = NULL;
    if (cg_model_open(dir, &m, err, sizeof err) == CG_OK) {
        cg_model_close(&m);
        return 1;
    }
    ck_assert_ptr_null(m);
    ck_assert(err[0] != '\0');
    return 0;
}

/* Random damage to the header and random truncation: any status, never a crash (ASan build). */
START_TEST(test_fuzz_header)
{
    char *dir = fresh_small(), path[4096];
    join(path, sizeof path, dir, "model.safetensors");
    size_t n;
    uint8_t *orig = read_all(path, &n), *b = cg_malloc(n);
    uint64_t hl;
    memcpy(&hl, orig, 8);
    uint64_t s = 12345;
    int ok = 0;
    for (int it = 0; it < 300; it++) {
        memcpy(b, orig, n);
        size_t len = n;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int flips = 1 + (int)((s >> 33) % 4);
        for (int f = 0; f < flips; f++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)((s >> 20) % (8 + hl));
            b[at] = (uint8_t)(s >> 56);
        }
        if (it % 5 == 0) len = (size_t)((s >> 7) % n);
        write_all(path, b, len);
        ok += loads_or_refuses(dir);
    }
    fprintf(stderr, "test_fuzz_header: %d of 300 damaged files still loaded\n", ok);

    /* structured damage: valid JSON with edge values in shapes, offsets and dtypes */
    static const json_int_t edge[] = {
        0,         1,        -1, 2, 63, 64, 65, 4096, 1 << 20, INT32_MAX, (json_int_t)1 << 40,
        INT64_MAX, INT64_MIN};
    static const char *const dts[] = {"F32", "F16", "BF16", "I8", "F64", "", "f32", "BOOL"};
    json_t *h0 = json_loadb((const char *)orig + 8, hl, 0, NULL);
    ck_assert_ptr_nonnull(h0);
    const char *names[64];
    size_t nn = 0;
    const char *key;
    json_t *val;
    json_object_foreach(h0, key, val) if (nn < 64 && strcmp(key, "__metadata__")) names[nn++] = key;
    ok = 0;
    for (int it = 0; it < 300; it++) {
        json_t *h = json_deep_copy(h0);
        for (int f = 0; f < 1 + it % 3; f++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            json_t *t = json_object_get(h, names[(s >> 33) % nn]);
            int what = (int)((s >> 13) % 4);
            json_int_t e = edge[(s >> 45) % CG_ARRAY_LEN(edge)];
            if (what == 0)
                json_object_set_new(t, "dtype", json_string(dts[(s >> 50) % CG_ARRAY_LEN(dts)]));
            else if (what == 1)
                json_array_set_new(json_object_get(t, "shape"), (s >> 40) % 2, json_integer(e));
            else if (what == 2)
                json_array_set_new(json_object_get(t, "data_offsets"), (s >> 40) % 2,
                                   json_integer(e));
            else
                json_array_append_new(json_object_get(t, "shape"), json_integer(e));
        }
        char *text = json_dumps(h, JSON_COMPACT);
        uint64_t tl = strlen(text);
        FILE *fp = fopen(path, "wb");
        fwrite(&tl, 8, 1, fp);
        fwrite(text, 1, tl, fp);
        fwrite(orig + 8 + hl, 1, n - 8 - hl, fp);
        fclose(fp);
        free(text);
        json_decref(h);
        ok += loads_or_refuses(dir);
    }
    fprintf(stderr, "test_fuzz_header: %d of 300 structurally damaged files still loaded\n", ok);
    json_decref(h0);
    free(orig);
    free(b);
    th_rmdtemp(dir);
}
END_TEST

/* ---- independent reference ----
 * A plain double-precision Llama forward written from the HF formulas (LlamaRMSNorm,
 * rotate_half RoPE or GPT-J interleaved pairs, repeat_kv, causal softmax, SwiGLU), reading the
 * weights straight from the file. It shares no code with model.c, remap.c or attn.c. */

static double *ref_tensor(cg_st_file *sf, const char *name)
{
    const cg_st_tensor *t = cg_st_find(sf, name);
    ck_assert_msg(t != NULL, "reference: missing %s", name);
    float *f = cg_malloc(t->numel * sizeof(float));
    ck_assert_int_eq(cg_st_to_f32(t, f), CG_OK);
    double *d = cg_malloc(t->numel * sizeof(double));
    for (size_t i = 0; i < t->numel; i++)
        d[i] = f[i];
    free(f);
    return d;
}

static void ref_rmsnorm(double *out, const double *x, const double *w, int dim, double eps)
{
    double ss = 0;
    for (int i = 0; i < dim; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / dim + eps);
    for (int i = 0; i < dim; i++)
        out[i] = w[i] * (x[i] * r);
}

/* y[out] = W[out][in] x[in] */
static void ref_linear(double *y, const double *w, const double *x, int out, int in)
{
    for (int o = 0; o < out; o++) {
        double a = 0;
        for (int i = 0; i < in; i++)
            a += w[(size_t)o * in + i] * x[i];
        y[o] = a;
    }
}

static void ref_rope(double *v, int hd, int pos, double theta, int interleaved)
{
    for (int i = 0; i < hd / 2; i++) {
        double inv = 1.0 / pow(theta, 2.0 * i / hd), a = pos * inv, c = cos(a), s = sin(a);
        int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + hd / 2;
        double x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * c - x1 * s;
        v[i1] = x1 * c + x0 * s;
    }
}

/* Last-token logits of a causal forward over tok[0..n) at positions 0..n-1. */
static void ref_forward(const char *dir, const cg_model_config *c, const int32_t *tok, int n,
                        float *logits)
{
    char path[4096], err[ERRLEN], nm[128];
    join(path, sizeof path, dir, "model.safetensors");
    cg_st_file *sf = NULL;
    ck_assert_int_eq(cg_st_open(path, &sf, err, sizeof err), CG_OK);
    const int D = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, H = c->hidden_dim;
    const int Q = nh * hd, KV = nkv * hd, V = c->vocab_size;
    double *emb = ref_tensor(sf, "model.embed_tokens.weight");
    double *x = cg_calloc((size_t)n * D, sizeof(double)), *h = cg_malloc(D * sizeof(double));
    double *q = cg_malloc((size_t)n * Q * sizeof(double)),
           *k = cg_malloc((size_t)n * KV * sizeof(double));
    double *v = cg_malloc((size_t)n * KV * sizeof(double)), *att = cg_malloc(Q * sizeof(double));
    double *o = cg_malloc(D * sizeof(double)), *g = cg_malloc(H * sizeof(double)),
           *u = cg_malloc(H * sizeof(double));
    double *p = cg_malloc(n * sizeof(double));
    for (int t = 0; t < n; t++)
        for (int i = 0; i < D; i++)
            x[(size_t)t * D + i] = emb[(size_t)tok[t] * D + i];
    for (int l = 0; l < c->n_layers; l++) {
#define W(suffix) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), ref_tensor(sf, nm))
        double *ln1 = W("input_layernorm.weight"), *wq = W("self_attn.q_proj.weight");
        double *wk = W("self_attn.k_proj.weight"), *wv = W("self_attn.v_proj.weight");
        double *wo = W("self_attn.o_proj.weight"), *ln2 = W("post_attention_layernorm.weight");
        double *wg = W("mlp.gate_proj.weight"), *wu = W("mlp.up_proj.weight"),
               *wd = W("mlp.down_proj.weight");
#undef W
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(h, x + (size_t)t * D, ln1, D, c->norm_eps);
            ref_linear(q + (size_t)t * Q, wq, h, Q, D);
            ref_linear(k + (size_t)t * KV, wk, h, KV, D);
            ref_linear(v + (size_t)t * KV, wv, h, KV, D);
            for (int hh = 0; hh < nh; hh++)
                ref_rope(q + (size_t)t * Q + hh * hd, hd, t, c->rope_theta,
                         c->rope_style == CG_ROPE_INTERLEAVED);
            for (int hh = 0; hh < nkv; hh++)
                ref_rope(k + (size_t)t * KV + hh * hd, hd, t, c->rope_theta,
                         c->rope_style == CG_ROPE_INTERLEAVED);
        }
        for (int t = 0; t < n; t++) {
            for (int hh = 0; hh < nh; hh++) {
                int kh = hh / (nh / nkv); /* repeat_kv */
                const double *qv = q + (size_t)t * Q + hh * hd;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += qv[i] * k[(size_t)j * KV + kh * hd + i];
                    p[j] = d / sqrt((double)hd);
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= t; j++)
                    sum += (p[j] = exp(p[j] - mx));
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int j = 0; j <= t; j++)
                        a += p[j] / sum * v[(size_t)j * KV + kh * hd + i];
                    att[hh * hd + i] = a;
                }
            }
            ref_linear(o, wo, att, D, Q);
            double *xr = x + (size_t)t * D;
            for (int i = 0; i < D; i++)
                xr[i] += o[i];
            ref_rmsnorm(h, xr, ln2, D, c->norm_eps);
            ref_linear(g, wg, h, H, D);
            ref_linear(u, wu, h, H, D);
            for (int i = 0; i < H; i++)
                g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_linear(o, wd, g, D, H);
            for (int i = 0; i < D; i++)
                xr[i] += o[i];
        }
        free(ln1), free(wq), free(wk), free(wv), free(wo), free(ln2), free(wg), free(wu), free(wd);
    }
    double *fn = ref_tensor(sf, "model.norm.weight");
    double *head = c->tie_embeddings ? emb : ref_tensor(sf, "lm_head.weight");
    double *lg = cg_malloc(V * sizeof(double));
    ref_rmsnorm(h, x + (size_t)(n - 1) * D, fn, D, c->norm_eps);
    ref_linear(lg, head, h, V, D);
    for (int i = 0; i < V; i++)
        logits[i] = (float)lg[i];
    if (head != emb) free(head);
    free(fn), free(lg), free(emb), free(x), free(h), free(q), free(k), free(v), free(att), free(o);
    free(g), free(u), free(p);
    cg_st_close(&sf);
}

/* The C forward (BLAS, the RoPE and attention kernels, blocks) equals the reference, for both
 * rope styles and grouped-query attention. */
START_TEST(test_reference_forward)
{
    for (int style = 0; style < 2; style++) {
        char *dir = th_mkdtemp("test_model");
        cg_model_gen_params p = small_params();
        p.rope_style = style ? CG_ROPE_INTERLEAVED : CG_ROPE_HALF;
        p.seed = 5;
        gen(dir, p);
        cg_model *m = load(dir);
        const cg_model_config *c = cg_model_cfg(m);
        const char *text = "Positions matter: 0123456789 abcdefghij";
        int32_t tok[64];
        uint32_t n = th_tok_into(m, text, strlen(text), 1, tok);
        float got[258], want[258];
        cg_kv *kv = cg_kv_new(m, n);
        cg_attn_span sp = {0, n, 0, 0};
        ck_assert_int_eq(cg_model_forward(m, kv, tok, n, 0, 0, &sp, 1, got), CG_OK);
        ref_forward(dir, c, tok, (int)n, want);
        double rd = max_diff(got, want, 258) / max_abs(want, 258);
        fprintf(stderr, "test_reference_forward: %s rope, %u tokens, rel diff %.2e\n",
                cg_rope_style_name(c->rope_style), n, rd);
        ck_assert_msg(rd < 1e-4, "%s: rel diff %g", cg_rope_style_name(c->rope_style), rd);
        cg_kv_free(&kv);
        cg_model_close(&m);
        th_rmdtemp(dir);
    }
}
END_TEST

/* ---- forward ---- */

static cg_model *g_model; /* the default tiny model, shared by the forward tests */
static char *g_dir;

static void forward_setup(void)
{
    g_dir = th_mkdtemp("test_model");
    gen(g_dir, cg_model_gen_default_params());
    g_model = load(g_dir);
}

static void forward_teardown(void)
{
    cg_model_close(&g_model);
    th_rmdtemp(g_dir);
}

static double rel_diff(const float *a, const float *b, int n)
{
    return max_diff(a, b, (size_t)n) / max_abs(a, (size_t)n);
}

START_TEST(test_prefill_vs_incremental)
{
    const cg_model *m = g_model;
    int V = cg_model_cfg(m)->vocab_size;
    float *full = cg_malloc(V * sizeof(float)), *inc = cg_malloc(V * sizeof(float));
    uint32_t n;
    cg_kv *ka = prefill(m, PROMPT, full, &n);
    int32_t tok[256];
    ck_assert_uint_eq(th_tok_into(m, PROMPT, strlen(PROMPT), 1, tok), n);
    cg_kv *kb = cg_kv_new(m, n);
    for (uint32_t i = 0; i < n; i++) {
        cg_attn_span sp = {i, 1, 0, 0};
        ck_assert_int_eq(cg_model_forward(m, kb, tok + i, 1, i, i, &sp, 1, i + 1 == n ? inc : NULL),
                         CG_OK);
    }
    double rd = rel_diff(full, inc, V);
    fprintf(stderr, "test_prefill_vs_incremental: %u tokens, rel diff %.2e\n", n, rd);
    ck_assert_msg(rd < 1e-4, "rel diff %g", rd);
    /* the caches agree too */
    const cg_model_config *c = cg_model_cfg(m);
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++) {
            size_t cnt = (size_t)n * c->head_dim;
            ck_assert(max_diff(cg_kv_k(ka, l, h), cg_kv_k(kb, l, h), cnt) <=
                      1e-3 * max_abs(cg_kv_k(ka, l, h), cnt));
            ck_assert(max_diff(cg_kv_v(ka, l, h), cg_kv_v(kb, l, h), cnt) <=
                      1e-3 * max_abs(cg_kv_v(ka, l, h), cnt));
        }
    cg_kv_free(&ka);
    cg_kv_free(&kb);
    free(full);
    free(inc);
}
END_TEST

/* Deterministic pseudo-text of n tokens (bytes 32..126). */
static void pseudo_tokens(int32_t *t, uint32_t n, uint64_t seed)
{
    for (uint32_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = 32 + (int32_t)((seed >> 33) % 95);
    }
}

/* Prefill in one call equals two calls split at k, also across the internal block size. */
START_TEST(test_split_prefill)
{
    const cg_model *m = g_model;
    int V = cg_model_cfg(m)->vocab_size;
    const uint32_t ns[2] = {90, 1500}, ks[2] = {31, 1100};
    for (int c = 0; c < 2; c++) {
        uint32_t n = ns[c], k = ks[c];
        int32_t *tok = cg_malloc(n * sizeof *tok);
        pseudo_tokens(tok, n, 7 + c);
        float *one = cg_malloc(V * sizeof(float)), *two = cg_malloc(V * sizeof(float));
        cg_kv *ka = cg_kv_new(m, n), *kb = cg_kv_new(m, n);
        cg_attn_span all = {0, n, 0, 0}, s1 = {0, k, 0, 0}, s2 = {k, n - k, 0, 0};
        ck_assert_int_eq(cg_model_forward(m, ka, tok, n, 0, 0, &all, 1, one), CG_OK);
        ck_assert_int_eq(cg_model_forward(m, kb, tok, k, 0, 0, &s1, 1, NULL), CG_OK);
        ck_assert_int_eq(cg_model_forward(m, kb, tok + k, n - k, k, k, &s2, 1, two), CG_OK);
        double rd = rel_diff(one, two, V);
        fprintf(stderr, "test_split_prefill: n=%u k=%u rel diff %.2e\n", n, k, rd);
        ck_assert_msg(rd < 1e-4, "n=%u: rel diff %g", n, rd);
        cg_kv_free(&ka);
        cg_kv_free(&kb);
        free(one);
        free(two);
        free(tok);
    }
}
END_TEST

/* DESIGN §6 at model level: a strict chunk computed alone at virtual position 0 and then
 * re-rotated to offset a has the K and V of the same chunk inside a full forward under the
 * strict mask (system causal, chunk isolated, question sees all). */
START_TEST(test_strict_chunk_remap)
{
    const cg_model *m = g_model;
    const cg_model_config *c = cg_model_cfg(m);
    int V = c->vocab_size;
    const uint32_t a = 40, len = 70, q = 25, n = a + len + q;
    int32_t tok[135];
    pseudo_tokens(tok, n, 99);
    cg_kv *full = cg_kv_new(m, n), *alone = cg_kv_new(m, len);
    cg_attn_span spans[3] = {{0, a, 0, 0}, {a, len, a, 0}, {a + len, q, 0, 0}};
    float *lf = cg_malloc(V * sizeof(float));
    ck_assert_int_eq(cg_model_forward(m, full, tok, n, 0, 0, spans, 3, lf), CG_OK);
    cg_attn_span sa = {0, len, 0, 0};
    ck_assert_int_eq(cg_model_forward(m, alone, tok + a, len, 0, 0, &sa, 1, NULL), CG_OK);
    cg_rope r = cg_model_rope(m);
    size_t cnt = (size_t)len * c->head_dim;
    float *rot = cg_malloc(cnt * sizeof(float));
    double worst_k = 0, worst_v = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++) {
            cg_remap_rope(&r, cg_kv_k(alone, l, h), rot, len, a);
            const float *fk = cg_kv_k(full, l, h) + (size_t)a * c->head_dim;
            const float *fv = cg_kv_v(full, l, h) + (size_t)a * c->head_dim;
            worst_k = fmax(worst_k, max_diff(rot, fk, cnt) / max_abs(fk, cnt));
            worst_v = fmax(worst_v, max_diff(cg_kv_v(alone, l, h), fv, cnt) / max_abs(fv, cnt));
        }
    fprintf(stderr, "test_strict_chunk_remap: K rel diff %.2e, V rel diff %.2e\n", worst_k,
            worst_v);
    ck_assert(worst_k < 1e-4);
    ck_assert(worst_v < 1e-4);
    /* and the mask matters: the same chunk under plain causal attention differs */
    cg_kv *causal = cg_kv_new(m, n);
    cg_attn_span sc = {0, n, 0, 0};
    float *lc = cg_malloc(V * sizeof(float));
    ck_assert_int_eq(cg_model_forward(m, causal, tok, n, 0, 0, &sc, 1, lc), CG_OK);
    cnt = (size_t)len * c->head_dim;
    ck_assert(max_diff(cg_kv_v(causal, 1, 0) + (size_t)a * c->head_dim,
                       cg_kv_v(full, 1, 0) + (size_t)a * c->head_dim, cnt) > 1e-3);
    ck_assert(rel_diff(lf, lc, V) > 1e-3);
    cg_kv_free(&full);
    cg_kv_free(&alone);
    cg_kv_free(&causal);
    free(rot);
    free(lf);
    free(lc);
}
END_TEST

START_TEST(test_forward_rejects)
{
    const cg_model *m = g_model;
    cg_kv *kv = cg_kv_new(m, 16);
    ck_assert_uint_eq(cg_kv_cap(kv), 16);
    int32_t tok[20];
    pseudo_tokens(tok, 20, 1);
    cg_attn_span s20 = {0, 20, 0, 0}, s4 = {0, 4, 0, 0}, s4b = {14, 4, 0, 0}, s3 = {0, 3, 0, 0};
    cg_attn_span bad_own = {0, 4, 2, 3};
    ck_assert_int_eq(cg_model_forward(m, kv, tok, 20, 0, 0, &s20, 1, NULL), CG_E_VALUE); /* > cap */
    ck_assert_int_eq(cg_model_forward(m, kv, tok, 4, 14, 0, &s4b, 1, NULL), CG_E_VALUE); /* slots */
    ck_assert_int_eq(cg_model_forward(m, kv, tok, 4, 0, 32766, &s4, 1, NULL),
                     CG_E_VALUE); /* max_pos */
    ck_assert_int_eq(cg_model_forward(m, kv, tok, 4, 0, -1, &s4, 1, NULL), CG_E_VALUE);
    ck_assert_int_eq(cg_model_forward(m, kv, tok, 4, 0, 0, &s3, 1, NULL), CG_E_VALUE); /* spans */
    ck_assert_int_eq(cg_model_forward(m, kv, tok, 4, 0, 0, &bad_own, 1, NULL), CG_E_VALUE);
    ck_assert_int_eq(cg_model_forward(m, kv, tok, 0, 0, 0, &s4, 0, NULL), CG_E_VALUE);
    tok[2] = 258;
    ck_assert_int_eq(cg_model_forward(m, kv, tok, 4, 0, 0, &s4, 1, NULL), CG_E_VALUE); /* token */
    tok[2] = -1;
    ck_assert_int_eq(cg_model_forward(m, kv, tok, 4, 0, 0, &s4, 1, NULL), CG_E_VALUE);
    tok[2] = 65;
    ck_assert_int_eq(cg_model_forward(m, kv, tok, 4, 0, 32764, &s4, 1, NULL),
                     CG_OK); /* last positions */
    cg_kv_free(&kv);
    ck_assert_ptr_null(cg_kv_new(m, 0));
}
END_TEST

/* Greedy decoding of 32 tokens; also returns the top1-top2 margins seen. */
static void greedy(const cg_model *m, const char *prompt, int32_t *out, int steps, double *gaps,
                   double *scales)
{
    int V = cg_model_cfg(m)->vocab_size;
    float *lg = cg_malloc(V * sizeof(float));
    uint32_t n;
    cg_kv *kv = prefill(m, prompt, lg, &n);
    cg_sampler s = {0.0f, 1.0f, 0};
    for (int i = 0; i < steps; i++) {
        int32_t t1 = argmax_f(lg, V);
        float top2 = -INFINITY;
        for (int j = 0; j < V; j++)
            if (j != t1 && lg[j] > top2) top2 = lg[j];
        if (gaps) gaps[i] = lg[t1] - top2;
        if (scales) {
            double mean = 0, var = 0;
            for (int j = 0; j < V; j++)
                mean += lg[j];
            mean /= V;
            for (int j = 0; j < V; j++)
                var += (lg[j] - mean) * (lg[j] - mean);
            scales[i] = sqrt(var / V);
        }
        out[i] = cg_sample(&s, lg, V);
        ck_assert_int_eq(out[i], t1);
        cg_attn_span sp = {n, 1, 0, 0};
        ck_assert_int_eq(cg_model_forward(m, kv, &out[i], 1, n, n, &sp, 1, lg), CG_OK);
        n++;
    }
    cg_kv_free(&kv);
    free(lg);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

START_TEST(test_greedy_decode)
{
    const cg_model *m = g_model;
    const char *prompts[] = {PROMPT, "Hello", "What changed in 2024?", "# # doc", "a"};
    enum { STEPS = 32, NP = 5 };
    double gaps[NP * STEPS], scales[NP * STEPS];
    int eos = 0;
    for (int p = 0; p < NP; p++) {
        int32_t a[STEPS], b[STEPS];
        greedy(m, prompts[p], a, STEPS, gaps + p * STEPS, scales + p * STEPS);
        greedy(m, prompts[p], b, STEPS, NULL, NULL);
        ck_assert_mem_eq(a, b, sizeof a);
        char text[STEPS + 1];
        size_t tl = 0;
        int ne = 0;
        for (int i = 0; i < STEPS; i++) {
            ne += a[i] == cg_model_cfg(m)->eos_ids[0];
            ck_assert_int_ne(a[i], cg_model_cfg(m)->bos_id);
            tl += cg_tok_decode(m, a[i], text + tl);
        }
        text[tl] = 0;
        ck_assert_int_lt(ne, STEPS);
        eos += ne;
        fprintf(stderr, "test_greedy_decode: '%s' -> %zu bytes, %d EOS\n", prompts[p], tl, ne);
    }
    double rel[NP * STEPS];
    for (int i = 0; i < NP * STEPS; i++)
        rel[i] = gaps[i] / scales[i];
    qsort(gaps, NP * STEPS, sizeof(double), cmp_double);
    qsort(rel, NP * STEPS, sizeof(double), cmp_double);
    qsort(scales, NP * STEPS, sizeof(double), cmp_double);
    fprintf(stderr,
            "test_greedy_decode: top1-top2 margin over %d steps: min %.3f, p10 %.3f, median %.3f; "
            "logit std median %.3f; margin/std min %.4f median %.3f; EOS %d\n",
            NP * STEPS, gaps[0], gaps[NP * STEPS / 10], gaps[NP * STEPS / 2],
            scales[NP * STEPS / 2], rel[0], rel[NP * STEPS / 2], eos);
    /* the head is sharp: the typical margin is far above float rounding of the logits */
    ck_assert(rel[NP * STEPS / 2] > 0.05);
    ck_assert(gaps[NP * STEPS / 10] > 1e-3 * scales[NP * STEPS / 2]);
}
END_TEST

/* ---- tokenizer and sampling ---- */

START_TEST(test_tokenizer)
{
    const cg_model *m = g_model;
    char text[256], back[256];
    for (int i = 0; i < 256; i++)
        text[i] = (char)i;
    int32_t tok[257];
    ck_assert_uint_eq(th_tok_into(m, text, 256, 1, tok), 257);
    ck_assert_int_eq(tok[0], 256);
    size_t bl = 0;
    for (int i = 0; i < 257; i++) {
        ck_assert_int_eq(i ? tok[i] : 256, i ? i - 1 : 256);
        bl += cg_tok_decode(m, tok[i], back + bl);
    }
    ck_assert_uint_eq(bl, 256);
    ck_assert_mem_eq(text, back, 256);
    ck_assert_uint_eq(th_tok_into(m, "ab", 2, 0, tok), 2);
    ck_assert_int_eq(tok[0], 'a');
    ck_assert_uint_eq(cg_tok_decode(m, 257, back), 0);
    ck_assert_uint_eq(cg_tok_decode(m, -5, back), 0);
    ck_assert_uint_eq(cg_tok_decode(m, 1000, back), 0);
}
END_TEST

START_TEST(test_sampling)
{
    enum { V = 50 };
    float base[V], lg[V];
    for (int i = 0; i < V; i++)
        base[i] = (float)((i * 37) % 11) * 0.3f;
    base[23] = 5.0f;
    /* greedy */
    cg_sampler g = {0.0f, 1.0f, 1};
    memcpy(lg, base, sizeof lg);
    ck_assert_int_eq(cg_sample(&g, lg, V), 23);
    g.temperature = -1.0f;
    memcpy(lg, base, sizeof lg);
    ck_assert_int_eq(cg_sample(&g, lg, V), 23);
    /* seeded: reproducible, and the seed matters */
    int32_t a[200], b[200], c[200];
    cg_sampler sa = {1.5f, 0.95f, 42}, sb = {1.5f, 0.95f, 42}, sc = {1.5f, 0.95f, 43};
    int differ = 0, non_top = 0;
    for (int i = 0; i < 200; i++) {
        memcpy(lg, base, sizeof lg);
        a[i] = cg_sample(&sa, lg, V);
        memcpy(lg, base, sizeof lg);
        b[i] = cg_sample(&sb, lg, V);
        memcpy(lg, base, sizeof lg);
        c[i] = cg_sample(&sc, lg, V);
        differ += a[i] != c[i];
        non_top += a[i] != 23;
        ck_assert(a[i] >= 0 && a[i] < V);
    }
    ck_assert_mem_eq(a, b, sizeof a);
    ck_assert_int_gt(differ, 0);
    ck_assert_int_gt(non_top, 0);
    /* tiny top_p keeps only the top token */
    cg_sampler st = {1.0f, 1e-6f, 7};
    for (int i = 0; i < 100; i++) {
        memcpy(lg, base, sizeof lg);
        ck_assert_int_eq(cg_sample(&st, lg, V), 23);
    }
    /* the frequencies follow softmax: logits {0, ln 3} -> p(1) = 0.75 */
    cg_sampler sf = {1.0f, 1.0f, 9};
    int ones = 0;
    for (int i = 0; i < 20000; i++) {
        float two[2] = {0.0f, logf(3.0f)};
        ones += cg_sample(&sf, two, 2);
    }
    ck_assert_msg(fabs(ones / 20000.0 - 0.75) < 0.02, "p(1) = %g", ones / 20000.0);
    /* top_p 0.5 over {0.5, 0.3, 0.2}: the smallest prefix reaching 0.5 is the top token alone */
    cg_sampler sp = {1.0f, 0.5f, 11};
    for (int i = 0; i < 200; i++) {
        float three[3] = {logf(0.3f), logf(0.5f), logf(0.2f)};
        ck_assert_int_eq(cg_sample(&sp, three, 3), 1);
    }
    /* top_p 0.75 keeps {0.5, 0.3}: index 2 never appears, both others do */
    cg_sampler s8 = {1.0f, 0.75f, 12};
    int seen[3] = {0, 0, 0};
    for (int i = 0; i < 2000; i++) {
        float three[3] = {logf(0.3f), logf(0.5f), logf(0.2f)};
        seen[cg_sample(&s8, three, 3)]++;
    }
    ck_assert_int_eq(seen[2], 0);
    ck_assert_int_gt(seen[0], 500);
    ck_assert_int_gt(seen[1], 1000);
}
END_TEST

/* ---- --quant ---- */

/* Teacher-forced logits of every row of text, vocab each, into a new buffer. */
static float *all_logits(const cg_model *m, const char *text, uint32_t *n_out)
{
    const int V = cg_model_cfg(m)->vocab_size;
    size_t n0 = 0;
    int32_t *tok = cg_tok_encode(m, text, strlen(text), 1, &n0);
    const uint32_t n = (uint32_t)n0;
    ck_assert_uint_gt(n, 0);
    cg_kv *kv = cg_kv_new(m, n);
    cg_attn_span sp = {0, n, 0, 0};
    float *lg = cg_malloc((size_t)n * (size_t)V * sizeof(float));
    cg_fwd_seq q = {.kv = kv, .tokens = tok, .n = n, .spans = &sp, .n_spans = 1, .row_logits = lg};
    ck_assert_int_eq(cg_model_forward_batch(m, &q, 1, CG_FWD_PREFILL, NULL), CG_OK);
    cg_kv_free(&kv);
    free(tok);
    *n_out = n;
    return lg;
}

/* KL(p || q) of softmax(a) and softmax(b), in nats. */
static double kl_rows(const float *a, const float *b, int V)
{
    double ma = -INFINITY, mb = -INFINITY, za = 0, zb = 0, kl = 0;
    for (int i = 0; i < V; i++)
        ma = fmax(ma, a[i]), mb = fmax(mb, b[i]);
    for (int i = 0; i < V; i++)
        za += exp(a[i] - ma), zb += exp(b[i] - mb);
    for (int i = 0; i < V; i++) {
        const double la = a[i] - ma - log(za), lb = b[i] - mb - log(zb);
        kl += exp(la) * (la - lb);
    }
    return kl;
}

static int argmax(const float *a, int V)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (a[i] > a[best]) best = i;
    return best;
}

/* The logits at q8 and q4 stay within the quantisation error measured against the 16-bit
 * path, with room above what was measured on this model (random weights, spread evenly, and
 * spiky logits: mean KL 1.4e-3 nats at q8, max 1.0e-2, top-1 agreement 121/125; 0.41 at q4,
 * max 2.6, 81/125: 4-bit error is 16x the 8-bit one, and KL grows as its square); q8 closer
 * than q4; the
 * model reports its dtype and holds fewer bytes; a geometry the blocks do not fit, and an
 * unknown quantisation, are refused with the tensor named. */
START_TEST(test_quant_logits)
{
    char *dir = th_mkdtemp("test_model");
    cg_model_gen_params p = cg_model_gen_default_params();
    p.dtype = "f16";
    p.seed = 3;
    gen(dir, p);
    const char *text = "The quarterly report shows revenue growth in all regions, with the "
                       "strongest gains in Europe; costs fell in the second half.";
    cg_model *m16 = load(dir);
    uint32_t n = 0, n2 = 0;
    const int V = cg_model_cfg(m16)->vocab_size;
    float *ref = all_logits(m16, text, &n);
    double kl_mean[3] = {0};
    for (int qi = 1; qi <= 2; qi++) {
        char err[ERRLEN] = "";
        cg_model *mq = NULL;
        ck_assert_int_eq(cg_model_open_quant(dir, (cg_quant)qi, &mq, err, sizeof err), CG_OK);
        ck_assert_str_eq(cg_model_cfg(mq)->dtype, qi == 1 ? "q8_0" : "q4_0");
        ck_assert_uint_lt(cg_model_weight_bytes(mq),
                          cg_model_weight_bytes(m16) * (qi == 1 ? 6 : 4) / 10);
        float *lg = all_logits(mq, text, &n2);
        ck_assert_uint_eq(n, n2);
        double kmax = 0;
        int agree = 0;
        for (uint32_t t = 0; t < n; t++) {
            const double k = kl_rows(ref + (size_t)t * V, lg + (size_t)t * V, V);
            kl_mean[qi] += k / n;
            kmax = fmax(kmax, k);
            agree += argmax(ref + (size_t)t * V, V) == argmax(lg + (size_t)t * V, V);
        }
        fprintf(stderr, "test_quant_logits: %s mean KL %.3e, max %.3e, top-1 agreement %d/%u\n",
                cg_quant_name((cg_quant)qi), kl_mean[qi], kmax, agree, n);
        ck_assert_double_gt(kl_mean[qi], 0); /* the weights were quantised */
        ck_assert_double_lt(kl_mean[qi], (qi == 1 ? 1e-2 : 1.0));
        ck_assert_double_lt(kmax, (qi == 1 ? 5e-2 : 6.0));
        ck_assert_int_ge(agree * 20, ((int)n * (qi == 1 ? 18 : 11)));
        free(lg);
        cg_model_close(&mq);
    }
    ck_assert_double_lt(kl_mean[1], kl_mean[2]);
    free(ref);
    cg_model_close(&m16);
    th_rmdtemp(dir);

    /* Llama 2's preset: 344 hidden features fit neither block size */
    char *d2 = th_mkdtemp("test_model");
    ck_assert_int_eq(cg_model_gen_preset("llama2", &p), CG_OK);
    gen(d2, p);
    for (int qi = 1; qi <= 3; qi++) {
        char err[ERRLEN] = "";
        cg_model *mq = NULL;
        cg_status st = cg_model_open_quant(d2, (cg_quant)qi, &mq, err, sizeof err);
        ck_assert_ptr_null(mq);
        if (qi == 3) {
            ck_assert_int_eq(st, CG_E_VALUE);
            continue;
        }
        ck_assert_int_eq(st, CG_E_UNSUPPORTED);
        ck_assert_msg(strstr(err, "mlp.down_proj.weight") && strstr(err, "344"), "%s", err);
    }
    th_rmdtemp(d2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model");
    th_case(s, "io", 0,
            TH_TESTS(test_generate_load_defaults, test_generate_load_custom, test_rope_styles,
                     test_determinism, test_dtypes, test_half_conversions, test_bad_safetensors,
                     test_bad_config, test_odd_data_offset, test_fuzz_header,
                     test_reference_forward, test_quant_logits));
    TCase *tc =
        th_case(s, "forward", 0,
                TH_TESTS(test_prefill_vs_incremental, test_split_prefill, test_strict_chunk_remap,
                         test_forward_rejects, test_greedy_decode, test_tokenizer, test_sampling));
    tcase_add_unchecked_fixture(tc, forward_setup, forward_teardown);
    return th_run(s, CK_FORK_GETENV);
}
