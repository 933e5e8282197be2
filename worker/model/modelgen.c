/* Deterministic tiny-model generator: writes config.json + model.safetensors in the HF Llama
 * layout the loader reads. Weights come from a seeded splitmix64 stream per tensor mapped to a
 * uniform distribution with the wanted standard deviation (no libm in the draw, so the bytes
 * do not depend on the C library). */
#include "worker/model/model.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/model/safetensors.h"
#include "base/base.h"

#define GEN_VOCAB 258 /* 256 bytes + BOS + EOS */
#define GEN_BOS 256
#define GEN_EOS 257
/* Output head scale: logits have a standard deviation of about this, so the top-1/top-2 gap
 * is typically several units and greedy decoding is stable under rounding differences
 * between the batched and the token-by-token paths. */
#define GEN_LOGIT_STD 8.0
/* BOS/EOS rows of the head are shrunk so EOS is rarely the argmax (32-token generations are
 * possible) and BOS is essentially never produced. */
#define GEN_SPECIAL_ROW_SCALE 0.25

cg_model_gen_params cg_model_gen_default_params(void)
{
    cg_model_gen_params p = {
        .seed = 1,
        .n_layers = 4,
        .dim = 256,
        .n_heads = 8,
        .n_kv_heads = 4,
        .hidden_dim = 768,
        .max_pos = 32768,
        .rope_style = CG_ROPE_HALF,
        .dtype = "f32",
        .model_id = "chunkgate-tiny",
    };
    return p;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One stream per tensor (seed mixed with the name), so a tensor's values do not depend on
 * which other tensors exist: changing n_layers keeps the embeddings. */
static uint64_t stream_seed(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    uint64_t s = seed ^ h;
    return splitmix64(&s);
}

/* Uniform on [-a, a) with a = std * sqrt(3), i.e. standard deviation std. */
static void fill_uniform(float *x, size_t n, double std, uint64_t seed, const char *name)
{
    uint64_t s = stream_seed(seed, name);
    double a = std * sqrt(3.0);
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(&s) >> 11) * 0x1p-53;
        x[i] = (float)(a * (2.0 * u - 1.0));
    }
}

static cg_status mkdir_p(const char *dir, char *err, size_t errlen)
{
    char tmp[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof tmp) {
        cg_seterr(err, errlen, "output directory path is empty or too long");
        return CG_E_VALUE;
    }
    memcpy(tmp, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (tmp[i] != '/' && tmp[i] != '\0') continue;
        char c = tmp[i];
        tmp[i] = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
            cg_seterr(err, errlen, "%s: cannot create directory: %s", tmp, strerror(errno));
            return CG_E_IO;
        }
        tmp[i] = c;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        cg_seterr(err, errlen, "%s: not a directory", dir);
        return CG_E_IO;
    }
    return CG_OK;
}

static cg_status check_params(const cg_model_gen_params *p, cg_st_dtype *dt, char *err, size_t errlen)
{
    const char *bad = NULL;
    if (p->n_layers < 1 || p->n_layers > 256) bad = "n_layers must be in [1, 256]";
    else if (p->dim < 2 || p->dim > 8192) bad = "dim must be in [2, 8192]";
    else if (p->n_heads < 1 || p->dim % p->n_heads) bad = "n_heads must divide dim";
    else if (p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads) bad = "n_kv_heads must divide n_heads";
    else if ((p->dim / p->n_heads) % 2) bad = "head_dim (dim / n_heads) must be even";
    else if (p->hidden_dim < 1 || p->hidden_dim > 65536) bad = "hidden_dim must be in [1, 65536]";
    else if (p->max_pos < 1) bad = "max_pos must be positive";
    else if (p->rope_style != CG_ROPE_HALF && p->rope_style != CG_ROPE_INTERLEAVED) bad = "unknown rope_style";
    else if (cg_st_dtype_parse(p->dtype ? p->dtype : "f32", dt) != 0) bad = "dtype must be f32, f16 or bf16";
    else if (!p->model_id || !p->model_id[0] || strlen(p->model_id) >= sizeof(((cg_model_config *)0)->model_id))
        bad = "model_id must be 1 to 127 bytes";
    if (bad) {
        cg_seterr(err, errlen, "generate: %s", bad);
        return CG_E_VALUE;
    }
    return CG_OK;
}

static cg_status write_config(const char *dir, const cg_model_gen_params *p, cg_st_dtype dt,
                              char *err, size_t errlen)
{
    char path[4200], tmp[4220];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const char *torch = dt == CG_ST_F32 ? "float32" : dt == CG_ST_F16 ? "float16" : "bfloat16";
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    json_object_set_new(c, "model_type", json_string("llama"));
    json_object_set_new(c, "_name_or_path", json_string(p->model_id));
    json_object_set_new(c, "model_id", json_string(p->model_id));
    json_object_set_new(c, "hidden_size", json_integer(p->dim));
    json_object_set_new(c, "intermediate_size", json_integer(p->hidden_dim));
    json_object_set_new(c, "num_hidden_layers", json_integer(p->n_layers));
    json_object_set_new(c, "num_attention_heads", json_integer(p->n_heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(p->n_kv_heads));
    json_object_set_new(c, "head_dim", json_integer(p->dim / p->n_heads));
    json_object_set_new(c, "max_position_embeddings", json_integer(p->max_pos));
    json_object_set_new(c, "rope_theta", json_real(10000.0));
    json_object_set_new(c, "rope_scaling", json_null());
    json_object_set_new(c, "rope_style", json_string(cg_rope_style_name(p->rope_style)));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-5));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "vocab_size", json_integer(GEN_VOCAB));
    json_object_set_new(c, "bos_token_id", json_integer(GEN_BOS));
    json_object_set_new(c, "eos_token_id", json_integer(GEN_EOS));
    json_object_set_new(c, "torch_dtype", json_string(torch));
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);
    json_object_set_new(c, "chunkgate_generator_seed", json_string(seed)); /* a u64: as text */
    int rc = json_dump_file(c, tmp, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    json_decref(c);
    if (rc != 0 || rename(tmp, path) != 0) {
        cg_seterr(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        return CG_E_IO;
    }
    return CG_OK;
}

typedef enum { W_ONES, W_EMBED, W_PROJ, W_HEAD } wkind;

typedef struct gen_tensor {
    char name[96];
    int64_t d0, d1; /* d1 == 0: 1-D */
    wkind kind;
    double std;
} gen_tensor;

cg_status cg_model_generate(const char *dir, cg_model_gen_params p, char *err, size_t errlen)
{
    cg_status st = CG_OK;
    cg_st_dtype dt = CG_ST_F32;
    gen_tensor *ts = NULL;
    cg_st_spec *specs = NULL;
    float *buf = NULL;
    FILE *fp = NULL;
    char path[4200], tmp[4220];
    tmp[0] = '\0';
    if (!p.dtype) p.dtype = "f32";
    if ((st = check_params(&p, &dt, err, errlen)) != CG_OK) goto out;
    if ((st = mkdir_p(dir, err, errlen)) != CG_OK) goto out;
    if ((st = write_config(dir, &p, dt, err, errlen)) != CG_OK) goto out;

    const int64_t D = p.dim, H = p.hidden_dim, V = GEN_VOCAB, hd = p.dim / p.n_heads;
    const int64_t Q = p.n_heads * hd, KV = p.n_kv_heads * hd;
    size_t n = 0, cap = 3 + 9 * (size_t)p.n_layers;
    ts = cg_calloc(cap, sizeof *ts);
#define ADD(kind_, d0_, d1_, std_, ...)                                                            \
    do {                                                                                           \
        snprintf(ts[n].name, sizeof ts[n].name, __VA_ARGS__);                                      \
        ts[n].kind = kind_;                                                                        \
        ts[n].d0 = d0_;                                                                            \
        ts[n].d1 = d1_;                                                                            \
        ts[n].std = std_;                                                                          \
        n++;                                                                                       \
    } while (0)
    /* Projections get std 1/sqrt(fan_in), so every activation keeps a scale near 1 and the
     * attention scores (after 1/sqrt(head_dim)) have a standard deviation near 1. */
    ADD(W_EMBED, V, D, 1.0, "model.embed_tokens.weight");
    for (int l = 0; l < p.n_layers; l++) {
        ADD(W_ONES, D, 0, 0.0, "model.layers.%d.input_layernorm.weight", l);
        ADD(W_PROJ, Q, D, 1.0 / sqrt((double)D), "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(W_PROJ, KV, D, 1.0 / sqrt((double)D), "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(W_PROJ, KV, D, 1.0 / sqrt((double)D), "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(W_PROJ, D, Q, 1.0 / sqrt((double)Q), "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(W_ONES, D, 0, 0.0, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(W_PROJ, H, D, 1.0 / sqrt((double)D), "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(W_PROJ, H, D, 1.0 / sqrt((double)D), "model.layers.%d.mlp.up_proj.weight", l);
        ADD(W_PROJ, D, H, 1.0 / sqrt((double)H), "model.layers.%d.mlp.down_proj.weight", l);
    }
    ADD(W_ONES, D, 0, 0.0, "model.norm.weight");
    ADD(W_HEAD, V, D, GEN_LOGIT_STD / sqrt((double)D), "lm_head.weight");
#undef ADD

    specs = cg_calloc(n, sizeof *specs);
    size_t maxel = 0;
    for (size_t i = 0; i < n; i++) {
        specs[i].name = ts[i].name;
        specs[i].dtype = dt;
        specs[i].ndim = ts[i].d1 ? 2 : 1;
        specs[i].shape[0] = ts[i].d0;
        specs[i].shape[1] = ts[i].d1;
        maxel = CG_MAX(maxel, (size_t)ts[i].d0 * (size_t)(ts[i].d1 ? ts[i].d1 : 1));
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fp = fopen(tmp, "wb");
    if (!fp) {
        cg_seterr(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        st = CG_E_IO;
        goto out;
    }
    if ((st = cg_st_write_header(fp, specs, n, err, errlen)) != CG_OK) goto out;
    buf = cg_malloc(maxel * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        size_t numel = (size_t)ts[i].d0 * (size_t)(ts[i].d1 ? ts[i].d1 : 1);
        if (ts[i].kind == W_ONES) {
            for (size_t j = 0; j < numel; j++) buf[j] = 1.0f;
        } else {
            fill_uniform(buf, numel, ts[i].std, p.seed, ts[i].name);
        }
        if (ts[i].kind == W_HEAD) {
            for (int64_t j = 0; j < D; j++) {
                buf[GEN_BOS * D + j] *= (float)GEN_SPECIAL_ROW_SCALE;
                buf[GEN_EOS * D + j] *= (float)GEN_SPECIAL_ROW_SCALE;
            }
        }
        if (cg_st_write_data(fp, dt, buf, numel) != CG_OK) {
            cg_seterr(err, errlen, "%s: write error: %s", tmp, strerror(errno));
            st = CG_E_IO;
            goto out;
        }
    }
    if (fclose(fp) != 0) {
        fp = NULL;
        cg_seterr(err, errlen, "%s: write error: %s", tmp, strerror(errno));
        st = CG_E_IO;
        goto out;
    }
    fp = NULL;
    if (rename(tmp, path) != 0) {
        cg_seterr(err, errlen, "%s: cannot rename: %s", path, strerror(errno));
        st = CG_E_IO;
        goto out;
    }
    tmp[0] = '\0';
out:
    if (fp) fclose(fp);
    if (tmp[0]) unlink(tmp);
    free(buf);
    free(specs);
    free(ts);
    return st;
}
