/* Deterministic model generator: writes config.json + model.safetensors (or shards + index) in
 * the HF layout, for the tiny byte-level model and for random-weight checkpoints with the real
 * geometry of Llama, Qwen2 and Qwen3 models. Weights come from a seeded splitmix64 stream per
 * tensor mapped to a uniform distribution with the wanted standard deviation (no libm in the
 * draw, so the bytes do not depend on the C library). */
#include "worker/model/model.h"

#include <dirent.h>
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
/* Real-architecture presets: logits with this standard deviation over a vocabulary of 32k to
 * 152k tokens give next-token distributions that are neither flat nor one-hot (measured with
 * tests/ref/hf_forward.py on random prompts: median top-1 probability 0.12 to 0.19, from 0.03
 * to 0.95 across positions; entropy around 5 nats). */
#define REAL_LOGIT_STD 4.0
/* RMSNorm weights (input, post-attention, final, q_norm, k_norm) scatter around 1 with this
 * standard deviation, so a loader that ignores one of them gives different numbers. */
#define REAL_NORM_STD 0.1
/* Qwen2's q/k/v biases. */
#define REAL_BIAS_STD 0.3
/* Standard deviation of the attention scores (see tensor_list). */
#define REAL_ATTN_SHARP 3.0
/* Values are generated and written in pieces of this many elements (rows rounded). */
#define GEN_PIECE (1u << 20)

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
        .arch = "LlamaForCausalLM",
        .rope_theta = 10000.0,
        .norm_eps = 1e-5,
        .bos_id = GEN_BOS,
        .eos_ids = {GEN_EOS},
        .n_eos = 1,
    };
    return p;
}

/* ---- presets ---- */

static const char *const preset_names[] = {"tiny",  "llama3",       "llama2",     "qwen2",
                                           "qwen3", "qwen2.5-0.5b", "qwen2.5-7b", NULL};

const char *const *cg_model_gen_preset_names(void)
{
    return preset_names;
}

/* What a real-architecture preset sets on top of the defaults. */
typedef struct gen_preset {
    const char *name, *arch, *model_id, *dtype, *rope_scaling;
    int n_layers, dim, n_heads, n_kv_heads, head_dim, hidden_dim;
    int vocab_size, max_pos, tie_embeddings;
    double rope_theta, norm_eps;
    int bos_id, eos_ids[CG_GEN_MAX_EOS], n_eos;
} gen_preset;

/* Qwen2.5 and Qwen3: the vocabulary padded to 151936, tied embeddings, RoPE base 1e6, their
 * BOS and EOS, bf16. */
#define QWEN_IDS                                                                                   \
    .rope_theta = 1000000.0, .norm_eps = 1e-6, .bos_id = 151643, .eos_ids = {151645}, .n_eos = 1,  \
    .dtype = "bf16"
#define QWEN_CONVENTIONS .vocab_size = 151936, .tie_embeddings = 1, QWEN_IDS

/* In preset_names' order, after "tiny" (the defaults). */
static const gen_preset presets[] = {
    /* Llama 3.1: GQA, untied, llama3 RoPE scaling (factor 8, original context 8192), BOS
     * <|begin_of_text|>, EOS list as in the Instruct config. head_dim written as Llama 3.2
     * configs do. With head_dim 32 and theta 500000 the llama3 rule leaves high frequencies
     * alone, divides low ones by the factor and smooths the band between. */
    {.name = "llama3",
     .arch = "LlamaForCausalLM",
     .n_layers = 2,
     .dim = 128,
     .n_heads = 4,
     .n_kv_heads = 2,
     .head_dim = 32,
     .hidden_dim = 384,
     .vocab_size = 128256,
     .max_pos = 131072,
     .rope_theta = 500000.0,
     .norm_eps = 1e-5,
     .rope_scaling = "llama3",
     .bos_id = 128000,
     .eos_ids = {128001, 128008, 128009},
     .n_eos = 3,
     .dtype = "bf16",
     .model_id = "chunkgate-llama3"},
    /* Llama 2: multi-head attention, SentencePiece vocabulary, f16, no rope_theta key. */
    {.name = "llama2",
     .arch = "LlamaForCausalLM",
     .n_layers = 2,
     .dim = 128,
     .n_heads = 4,
     .n_kv_heads = 4,
     .hidden_dim = 344,
     .vocab_size = 32000,
     .max_pos = 4096,
     .rope_theta = 0,
     .norm_eps = 1e-5,
     .bos_id = 1,
     .eos_ids = {2},
     .n_eos = 1,
     .dtype = "f16",
     .model_id = "chunkgate-llama2"},
    /* Qwen2.5: q/k/v biases. */
    {.name = "qwen2",
     .arch = "Qwen2ForCausalLM",
     .n_layers = 2,
     .dim = 128,
     .n_heads = 4,
     .n_kv_heads = 2,
     .hidden_dim = 352,
     .max_pos = 32768,
     QWEN_CONVENTIONS,
     .model_id = "chunkgate-qwen2"},
    /* Qwen3: q_norm/k_norm, head_dim 64 != hidden_size / heads = 32. */
    {.name = "qwen3",
     .arch = "Qwen3ForCausalLM",
     .n_layers = 2,
     .dim = 128,
     .n_heads = 4,
     .n_kv_heads = 2,
     .head_dim = 64,
     .hidden_dim = 384,
     .max_pos = 40960,
     QWEN_CONVENTIONS,
     .model_id = "chunkgate-qwen3"},
    /* The full Qwen2.5-0.5B geometry. */
    {.name = "qwen2.5-0.5b",
     .arch = "Qwen2ForCausalLM",
     .n_layers = 24,
     .dim = 896,
     .n_heads = 14,
     .n_kv_heads = 2,
     .hidden_dim = 4864,
     .max_pos = 32768,
     QWEN_CONVENTIONS,
     .model_id = "chunkgate-qwen2.5-0.5b"},
    /* The full Qwen2.5-7B geometry (about 15 GB at 16 bits): untied, a larger vocabulary. */
    {.name = "qwen2.5-7b",
     .arch = "Qwen2ForCausalLM",
     .n_layers = 28,
     .dim = 3584,
     .n_heads = 28,
     .n_kv_heads = 4,
     .hidden_dim = 18944,
     .max_pos = 32768,
     .vocab_size = 152064,
     .tie_embeddings = 0,
     QWEN_IDS,
     .model_id = "chunkgate-qwen2.5-7b"},
};
_Static_assert(CG_ARRAY_LEN(presets) + 2 == CG_ARRAY_LEN(preset_names),
               "one row per preset but tiny");

cg_status cg_model_gen_preset(const char *name, cg_model_gen_params *out)
{
    cg_model_gen_params p = cg_model_gen_default_params();
    if (!name || !strcmp(name, "tiny")) {
        *out = p;
        return CG_OK;
    }
    const gen_preset *g = NULL;
    for (size_t i = 0; i < CG_ARRAY_LEN(presets) && !g; i++)
        if (!strcmp(name, presets[i].name)) g = &presets[i];
    if (!g) return CG_E_VALUE;
    p.arch = g->arch;
    p.model_id = g->model_id;
    p.dtype = g->dtype;
    p.rope_scaling = g->rope_scaling;
    p.n_layers = g->n_layers;
    p.dim = g->dim;
    p.n_heads = g->n_heads;
    p.n_kv_heads = g->n_kv_heads;
    p.head_dim = g->head_dim;
    p.hidden_dim = g->hidden_dim;
    p.vocab_size = g->vocab_size;
    p.max_pos = g->max_pos;
    p.tie_embeddings = g->tie_embeddings;
    p.rope_theta = g->rope_theta;
    p.norm_eps = g->norm_eps;
    p.bos_id = g->bos_id;
    memcpy(p.eos_ids, g->eos_ids, sizeof p.eos_ids);
    p.n_eos = g->n_eos;
    *out = p;
    return CG_OK;
}

/* ---- random values ---- */

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
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    uint64_t s = seed ^ h;
    return splitmix64(&s);
}

/* Uniform on [-a, a) with a = std * sqrt(3), i.e. standard deviation std; continues stream s. */
static void fill_uniform(float *x, size_t n, double std, uint64_t *s)
{
    double a = std * sqrt(3.0);
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(s) >> 11) * 0x1p-53;
        x[i] = (float)(a * (2.0 * u - 1.0));
    }
}

/* Rounds to bf16 and flushes magnitudes below f16's smallest normal (2^-14) to zero: the
 * result is exact in f32, bf16 and f16 (weights stay far below f16's maximum). */
static float snap16(float x)
{
    float y = cg_bf16_to_f32(cg_f32_to_bf16(x));
    return fabsf(y) < 0x1p-14f ? 0.0f : y;
}

/* ---- checks ---- */

typedef struct scaling {
    char type[16]; /* "" = none */
    double factor;
} scaling;

static int parse_scaling(const char *s, scaling *out)
{
    memset(out, 0, sizeof *out);
    if (!s || !*s || !strcmp(s, "none")) return 0;
    const char *colon = strchr(s, ':');
    size_t n = colon ? (size_t)(colon - s) : strlen(s);
    if (n == 0 || n >= sizeof out->type) return -1;
    memcpy(out->type, s, n);
    out->type[n] = '\0';
    if (strcmp(out->type, "linear") && strcmp(out->type, "yarn") && strcmp(out->type, "llama3") &&
        strcmp(out->type, "dynamic"))
        return -1;
    if (!colon) {
        if (strcmp(out->type, "llama3")) return -1; /* only llama3 has a default factor */
        out->factor = 8.0;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    out->factor = strtod(colon + 1, &end);
    if (errno || end == colon + 1 || *end || !isfinite(out->factor) || out->factor < 1.0 ||
        out->factor > 1024.0)
        return -1;
    return 0;
}

/* The architecture named name (its class name, as config.json writes it): 1, or 0. */
static int arch_of(const char *name, cg_arch *out)
{
    for (cg_arch a = CG_ARCH_LLAMA; a <= CG_ARCH_QWEN3; a++)
        if (!strcmp(name, cg_arch_name(a))) {
            *out = a;
            return 1;
        }
    return 0;
}

static cg_status check_params(const cg_model_gen_params *p, cg_st_dtype *dt, cg_arch *arch,
                              scaling *sc, char *err, size_t errlen)
{
    const char *bad = NULL;
    int hd = p->head_dim ? p->head_dim : (p->n_heads > 0 ? p->dim / p->n_heads : 0);
    int V = p->vocab_size ? p->vocab_size : GEN_VOCAB;
    *arch = CG_ARCH_LLAMA;
    if (p->n_layers < 1 || p->n_layers > 256)
        bad = "n_layers must be in [1, 256]";
    else if (p->dim < 2 || p->dim > 8192)
        bad = "dim must be in [2, 8192]";
    else if (p->n_heads < 1 || (!p->head_dim && p->dim % p->n_heads))
        bad = "n_heads must divide dim";
    else if (p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads)
        bad = "n_kv_heads must divide n_heads";
    else if (p->head_dim < 0 || p->head_dim > 1024)
        bad = "head_dim must be in [0, 1024]";
    else if (hd % 2)
        bad = "head_dim must be even";
    else if (!p->vocab_size && p->head_dim && p->head_dim != p->dim / p->n_heads)
        bad = "the tiny model has head_dim = dim / n_heads";
    else if (p->hidden_dim < 1 || p->hidden_dim > 65536)
        bad = "hidden_dim must be in [1, 65536]";
    else if (p->max_pos < 1)
        bad = "max_pos must be positive";
    else if (p->vocab_size < 0 || p->vocab_size > (1 << 22))
        bad = "vocab_size must be in [0, 2^22]";
    else if (p->rope_style != CG_ROPE_HALF && p->rope_style != CG_ROPE_INTERLEAVED)
        bad = "unknown rope_style";
    else if (p->vocab_size && p->rope_style != CG_ROPE_HALF)
        bad = "real architectures use the HF rope pairing (rope_style half)";
    else if (cg_st_dtype_parse(p->dtype ? p->dtype : "f32", dt) != 0)
        bad = "dtype must be f32, f16 or bf16";
    else if (!p->model_id || !p->model_id[0] ||
             strlen(p->model_id) >= sizeof(((cg_model_config *)0)->model_id))
        bad = "model_id must be 1 to 127 bytes";
    else if (!(p->rope_theta >= 0) || !isfinite(p->rope_theta))
        bad = "rope_theta must be >= 0 (0: omitted)";
    else if (!(p->norm_eps > 0) || p->norm_eps > 1)
        bad = "norm_eps must be in (0, 1]";
    else if (p->n_eos < 1 || p->n_eos > CG_GEN_MAX_EOS)
        bad = "n_eos must be in [1, 4]";
    else if (p->bos_id < 0 || p->bos_id >= V)
        bad = "bos_id must be inside the vocabulary";
    else if (p->shards < 0 || p->shards > 99999)
        bad = "shards must be in [0, 99999]";
    else if (parse_scaling(p->rope_scaling, sc) != 0)
        bad = "rope_scaling must be none, linear:F, yarn:F, llama3, llama3:F or dynamic:F with F "
              "in [1, 1024]";
    else if (sc->type[0] && !strcmp(sc->type, "yarn") && p->max_pos * sc->factor > 1e9)
        bad = "max_pos * yarn factor is too large";
    for (int i = 0; !bad && i < p->n_eos; i++)
        if (p->eos_ids[i] < 0 || p->eos_ids[i] >= V) bad = "eos ids must be inside the vocabulary";
    if (!bad && p->vocab_size) {
        if (!p->arch)
            bad = "arch is required with a vocabulary";
        else if (!arch_of(p->arch, arch))
            bad = "arch must be LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM";
    }
    if (bad) {
        cg_seterr(err, errlen, "generate: %s", bad);
        return CG_E_VALUE;
    }
    return CG_OK;
}

/* ---- files ---- */

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

/* Dumps j to dir/name through a temporary file and a rename. */
static cg_status dump_json(const char *dir, const char *name, json_t *j, size_t flags, char *err,
                           size_t errlen)
{
    char path[4200], tmp[4220];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(j, tmp, flags);
    if (rc != 0 || rename(tmp, path) != 0) {
        cg_seterr(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        return CG_E_IO;
    }
    return CG_OK;
}

static const char *torch_dtype(cg_st_dtype dt)
{
    return dt == CG_ST_F32 ? "float32" : dt == CG_ST_F16 ? "float16" : "bfloat16";
}

static json_t *scaling_json(const scaling *sc, int max_pos)
{
    if (!sc->type[0]) return json_null();
    json_t *r = json_object();
    json_object_set_new(r, "factor", json_real(sc->factor));
    if (!strcmp(sc->type, "llama3")) {
        json_object_set_new(r, "high_freq_factor", json_real(4.0));
        json_object_set_new(r, "low_freq_factor", json_real(1.0));
        json_object_set_new(r, "original_max_position_embeddings", json_integer(8192));
    } else if (!strcmp(sc->type, "yarn")) {
        json_object_set_new(r, "original_max_position_embeddings", json_integer(max_pos));
    }
    json_object_set_new(r, "rope_type", json_string(sc->type));
    return r;
}

/* The tiny model's config: unchanged since the first generator (its bytes are pinned). */
static cg_status write_tiny_config(const char *dir, const cg_model_gen_params *p, cg_st_dtype dt,
                                   const scaling *sc, char *err, size_t errlen)
{
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
    json_object_set_new(c, "rope_scaling", scaling_json(sc, p->max_pos));
    json_object_set_new(c, "rope_style", json_string(cg_rope_style_name(p->rope_style)));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-5));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "vocab_size", json_integer(GEN_VOCAB));
    json_object_set_new(c, "bos_token_id", json_integer(GEN_BOS));
    json_object_set_new(c, "eos_token_id", json_integer(GEN_EOS));
    json_object_set_new(c, "torch_dtype", json_string(torch_dtype(dt)));
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);
    json_object_set_new(c, "chunkgate_generator_seed", json_string(seed)); /* a u64: as text */
    cg_status st =
        dump_json(dir, "config.json", c, JSON_INDENT(2) | JSON_REAL_PRECISION(10), err, errlen);
    json_decref(c);
    return st;
}

/* config.json as transformers writes it for the architecture (keys sorted). */
static cg_status write_real_config(const char *dir, const cg_model_gen_params *p, cg_st_dtype dt,
                                   cg_arch arch, const scaling *sc, char *err, size_t errlen)
{
    static const char *types[] = {"llama", "qwen2", "qwen3"};
    int yarn = !strcmp(sc->type, "yarn");
    /* With yarn, max_position_embeddings is the extended context (original * factor), so
     * every transformers version derives the same factor from it. */
    long long max_pos = yarn ? (long long)((double)p->max_pos * sc->factor) : p->max_pos;
    json_t *c = json_object();
    json_object_set_new(c, "_name_or_path", json_string(p->model_id));
    json_object_set_new(c, "architectures", json_pack("[s]", p->arch));
    json_object_set_new(c, "model_type", json_string(types[arch]));
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    if (arch != CG_ARCH_QWEN2) json_object_set_new(c, "attention_bias", json_false());
    if (arch == CG_ARCH_LLAMA) {
        json_object_set_new(c, "mlp_bias", json_false());
        json_object_set_new(c, "pretraining_tp", json_integer(1));
    } else {
        json_object_set_new(c, "max_window_layers", json_integer(p->n_layers));
        json_object_set_new(c, "use_sliding_window", json_false());
        json_object_set_new(c, "sliding_window",
                            arch == CG_ARCH_QWEN2 ? json_integer(max_pos) : json_null());
    }
    json_object_set_new(c, "bos_token_id", json_integer(p->bos_id));
    if (p->n_eos == 1) {
        json_object_set_new(c, "eos_token_id", json_integer(p->eos_ids[0]));
    } else {
        json_t *e = json_array();
        for (int i = 0; i < p->n_eos; i++)
            json_array_append_new(e, json_integer(p->eos_ids[i]));
        json_object_set_new(c, "eos_token_id", e);
    }
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(p->dim));
    if (p->head_dim) json_object_set_new(c, "head_dim", json_integer(p->head_dim));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "intermediate_size", json_integer(p->hidden_dim));
    json_object_set_new(c, "max_position_embeddings", json_integer(max_pos));
    json_object_set_new(c, "num_attention_heads", json_integer(p->n_heads));
    json_object_set_new(c, "num_hidden_layers", json_integer(p->n_layers));
    json_object_set_new(c, "num_key_value_heads", json_integer(p->n_kv_heads));
    json_object_set_new(c, "rms_norm_eps", json_real(p->norm_eps));
    json_object_set_new(c, "rope_scaling", scaling_json(sc, p->max_pos));
    if (p->rope_theta > 0) json_object_set_new(c, "rope_theta", json_real(p->rope_theta));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(p->tie_embeddings));
    json_object_set_new(c, "torch_dtype", json_string(torch_dtype(dt)));
    json_object_set_new(c, "transformers_version", json_string("4.51.3"));
    json_object_set_new(c, "use_cache", json_true());
    json_object_set_new(c, "vocab_size", json_integer(p->vocab_size));
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);
    json_object_set_new(c, "chunkgate_generator_seed", json_string(seed));
    cg_status st =
        dump_json(dir, "config.json", c, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(10),
                  err, errlen);
    json_decref(c);
    return st;
}

/* ---- tokenizer ---- */

/* The id of token text in tokenizer.json (added tokens first, then the model vocabulary), or -1. */
static long long token_id(json_t *tok, const char *text)
{
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(tok, "added_tokens"), i, a)
    {
        const char *c = json_string_value(json_object_get(a, "content"));
        if (c && !strcmp(c, text) && json_is_integer(json_object_get(a, "id")))
            return json_integer_value(json_object_get(a, "id"));
    }
    json_t *v = json_object_get(json_object_get(json_object_get(tok, "model"), "vocab"), text);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* tokenizer_config.json names special tokens as a string, an AddedToken object or null. */
static const char *special_text(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static cg_status copy_file(const char *src, const char *dir, const char *name, char *err,
                           size_t errlen)
{
    char path[4200], tmp[4220], buf[65536];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cg_status st = CG_E_IO;
    FILE *in = fopen(src, "rb"), *out = NULL;
    if (!in) {
        cg_seterr(err, errlen, "%s: cannot open: %s", src, strerror(errno));
        return CG_E_IO;
    }
    if (!(out = fopen(tmp, "wb"))) {
        cg_seterr(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) break;
    if (ferror(in) || ferror(out)) {
        cg_seterr(err, errlen, "%s: copy failed: %s", path, strerror(errno));
        goto out;
    }
    int rc = fclose(out);
    out = NULL;
    if (rc != 0 || rename(tmp, path) != 0) {
        cg_seterr(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        goto out;
    }
    st = CG_OK;
out:
    if (out) fclose(out);
    if (st != CG_OK) unlink(tmp);
    fclose(in);
    return st;
}

/* Checks tokenizer.json + tokenizer_config.json in src against the model (every token id
 * inside the vocabulary, BOS equal to bos_id, EOS among the eos ids), then copies both. */
static cg_status copy_tokenizer(const char *src, const char *dir, const cg_model_gen_params *p,
                                char *err, size_t errlen)
{
    cg_status st = CG_E_VALUE;
    char tpath[4200], cpath[4200];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", src);
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", src);
    json_error_t je;
    json_t *tok = json_load_file(tpath, 0, &je), *cfg = NULL;
    if (!tok) {
        cg_seterr(err, errlen, "%s: %s", tpath, je.text);
        return CG_E_IO;
    }
    /* model_max_length can exceed 64 bits (1e30 in Llama configs): read integers as reals. */
    if (!(cfg = json_load_file(cpath, JSON_DECODE_INT_AS_REAL, &je))) {
        cg_seterr(err, errlen, "%s: %s", cpath, je.text);
        st = CG_E_IO;
        goto out;
    }
    long long max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(json_object_get(tok, "model"), "vocab"), key,
                        v) if (json_is_integer(v)) max_id = CG_MAX(max_id, json_integer_value(v));
    size_t i;
    json_array_foreach(json_object_get(tok, "added_tokens"), i,
                       v) if (json_is_integer(json_object_get(v, "id"))) max_id =
        CG_MAX(max_id, json_integer_value(json_object_get(v, "id")));
    int V = p->vocab_size ? p->vocab_size : GEN_VOCAB;
    if (max_id < 0) {
        cg_seterr(err, errlen, "%s: no vocabulary found", tpath);
        goto out;
    }
    if (max_id >= V) {
        cg_seterr(err, errlen, "%s: token id %lld does not fit the model's vocabulary of %d", tpath,
                  max_id, V);
        goto out;
    }
    const char *bos = special_text(cfg, "bos_token"), *eos = special_text(cfg, "eos_token");
    if (bos && token_id(tok, bos) != p->bos_id) {
        cg_seterr(err, errlen, "%s: bos_token %s is id %lld, the model's BOS is %d", cpath, bos,
                  token_id(tok, bos), p->bos_id);
        goto out;
    }
    if (eos) {
        long long id = token_id(tok, eos);
        int found = 0;
        for (int k = 0; k < p->n_eos; k++)
            found |= id == p->eos_ids[k];
        if (!found) {
            cg_seterr(err, errlen, "%s: eos_token %s is id %lld, not one of the model's EOS ids",
                      cpath, eos, id);
            goto out;
        }
    }
    if ((st = copy_file(tpath, dir, "tokenizer.json", err, errlen)) != CG_OK) goto out;
    st = copy_file(cpath, dir, "tokenizer_config.json", err, errlen);
out:
    json_decref(tok);
    json_decref(cfg);
    return st;
}

/* ---- tensors ---- */

typedef enum { W_ONES, W_NORM, W_EMBED, W_PROJ, W_BIAS, W_HEAD } wkind;

typedef struct gen_tensor {
    char name[96];
    int64_t d0, d1; /* d1 == 0: 1-D */
    wkind kind;
    double std;
    double mean; /* W_NORM: values scatter around this */
} gen_tensor;

static size_t numel_of(const gen_tensor *t)
{
    return (size_t)t->d0 * (size_t)(t->d1 ? t->d1 : 1);
}

/* The tensor list in HF state-dict order, with their initial scales. Caller frees. */
static gen_tensor *tensor_list(const cg_model_gen_params *p, cg_arch arch, size_t *count)
{
    const int tiny = p->vocab_size == 0;
    const int64_t D = p->dim, H = p->hidden_dim, V = tiny ? GEN_VOCAB : p->vocab_size;
    const int64_t hd = p->head_dim ? p->head_dim : p->dim / p->n_heads;
    const int64_t Q = p->n_heads * hd, KV = p->n_kv_heads * hd;
    const wkind norm = tiny ? W_ONES : W_NORM;
    size_t n = 0, cap = 3 + 14 * (size_t)p->n_layers;
    gen_tensor *ts = cg_calloc(cap, sizeof *ts);
#define ADD(kind_, d0_, d1_, std_, ...)                                                            \
    do {                                                                                           \
        snprintf(ts[n].name, sizeof ts[n].name, __VA_ARGS__);                                      \
        ts[n].kind = kind_;                                                                        \
        ts[n].d0 = d0_;                                                                            \
        ts[n].d1 = d1_;                                                                            \
        ts[n].std = std_;                                                                          \
        ts[n].mean = 1.0;                                                                          \
        n++;                                                                                       \
    } while (0)
    /* Projections get std 1/sqrt(fan_in), so every activation keeps a scale near 1. A tied
     * embedding doubles as the head, so it gets the head's scale (the first RMSNorm rescales
     * its rows anyway). In the real architectures q_proj (Qwen3: q_norm) is ATTN_SHARP times
     * larger, so attention scores have a standard deviation near ATTN_SHARP: each position
     * attends to a few earlier tokens instead of averaging all of them, which would give
     * every position of a deep model the same next-token distribution. */
    const double sharp = tiny ? 1.0 : REAL_ATTN_SHARP;
    double embed_std = tiny ? 1.0 : p->tie_embeddings ? REAL_LOGIT_STD / sqrt((double)D) : 1.0;
    ADD(W_EMBED, V, D, embed_std, "model.embed_tokens.weight");
    for (int l = 0; l < p->n_layers; l++) {
        ADD(norm, D, 0, REAL_NORM_STD, "model.layers.%d.input_layernorm.weight", l);
        ADD(W_PROJ, Q, D, (arch == CG_ARCH_QWEN3 ? 1.0 : sharp) / sqrt((double)D),
            "model.layers.%d.self_attn.q_proj.weight", l);
        if (arch == CG_ARCH_QWEN2)
            ADD(W_BIAS, Q, 0, REAL_BIAS_STD, "model.layers.%d.self_attn.q_proj.bias", l);
        ADD(W_PROJ, KV, D, 1.0 / sqrt((double)D), "model.layers.%d.self_attn.k_proj.weight", l);
        if (arch == CG_ARCH_QWEN2)
            ADD(W_BIAS, KV, 0, REAL_BIAS_STD, "model.layers.%d.self_attn.k_proj.bias", l);
        ADD(W_PROJ, KV, D, 1.0 / sqrt((double)D), "model.layers.%d.self_attn.v_proj.weight", l);
        if (arch == CG_ARCH_QWEN2)
            ADD(W_BIAS, KV, 0, REAL_BIAS_STD, "model.layers.%d.self_attn.v_proj.bias", l);
        ADD(W_PROJ, D, Q, 1.0 / sqrt((double)Q), "model.layers.%d.self_attn.o_proj.weight", l);
        if (arch == CG_ARCH_QWEN3) {
            ADD(W_NORM, hd, 0, REAL_NORM_STD * sharp, "model.layers.%d.self_attn.q_norm.weight", l);
            ts[n - 1].mean = sharp;
            ADD(W_NORM, hd, 0, REAL_NORM_STD, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        ADD(norm, D, 0, REAL_NORM_STD, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(W_PROJ, H, D, 1.0 / sqrt((double)D), "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(W_PROJ, H, D, 1.0 / sqrt((double)D), "model.layers.%d.mlp.up_proj.weight", l);
        ADD(W_PROJ, D, H, 1.0 / sqrt((double)H), "model.layers.%d.mlp.down_proj.weight", l);
    }
    ADD(norm, D, 0, REAL_NORM_STD, "model.norm.weight");
    if (tiny || !p->tie_embeddings)
        ADD(W_HEAD, V, D, (tiny ? GEN_LOGIT_STD : REAL_LOGIT_STD) / sqrt((double)D),
            "lm_head.weight");
#undef ADD
    *count = n;
    return ts;
}

/* Generates tensor t in pieces and writes it as dt. */
static cg_status write_tensor(FILE *fp, cg_st_dtype dt, const gen_tensor *t,
                              const cg_model_gen_params *p, float *buf)
{
    const int tiny = p->vocab_size == 0;
    const size_t numel = numel_of(t), row = (size_t)(t->d1 ? t->d1 : 1);
    const size_t piece = CG_MAX(row, GEN_PIECE / row * row);
    uint64_t s = stream_seed(p->seed, t->name);
    for (size_t off = 0; off < numel; off += piece) {
        size_t k = CG_MIN(piece, numel - off);
        if (t->kind == W_ONES) {
            for (size_t j = 0; j < k; j++)
                buf[j] = 1.0f;
        } else {
            fill_uniform(buf, k, t->std, &s);
            if (t->kind == W_NORM)
                for (size_t j = 0; j < k; j++)
                    buf[j] += (float)t->mean;
        }
        if (tiny && t->kind == W_HEAD) {
            for (size_t j = 0; j < k; j++) {
                size_t r = (off + j) / row;
                if (r == GEN_BOS || r == GEN_EOS) buf[j] *= (float)GEN_SPECIAL_ROW_SCALE;
            }
        }
        if (!tiny)
            for (size_t j = 0; j < k; j++)
                buf[j] = snap16(buf[j]);
        if (cg_st_write_data(fp, dt, buf, k) != CG_OK) return CG_E_IO;
    }
    return CG_OK;
}

static int is_shard_name(const char *s)
{
    unsigned a, b;
    int end = 0;
    return sscanf(s, "model-%5u-of-%5u.safetensors%n", &a, &b, &end) == 2 && end > 0 && !s[end];
}

/* Removes weight files of the layout not being written, so a loader never sees both. */
static void remove_other_layout(const char *dir, int sharded)
{
    char path[4200];
    if (sharded) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        unlink(path);
        return;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    unlink(path);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_shard_name(e->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

/* Writes tensors [a, b) of ts into dir/name. */
static cg_status write_file(const char *dir, const char *name, const gen_tensor *ts, size_t a,
                            size_t b, cg_st_dtype dt, const cg_model_gen_params *p, float *buf,
                            char *err, size_t errlen)
{
    cg_status st = CG_OK;
    char path[4200], tmp[4220];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cg_st_spec *specs = cg_calloc(b - a, sizeof *specs);
    for (size_t i = a; i < b; i++) {
        specs[i - a].name = ts[i].name;
        specs[i - a].dtype = dt;
        specs[i - a].ndim = ts[i].d1 ? 2 : 1;
        specs[i - a].shape[0] = ts[i].d0;
        specs[i - a].shape[1] = ts[i].d1;
    }
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        cg_seterr(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        st = CG_E_IO;
        goto out;
    }
    if ((st = cg_st_write_header(fp, specs, b - a, err, errlen)) != CG_OK) goto out;
    for (size_t i = a; i < b; i++) {
        if (write_tensor(fp, dt, &ts[i], p, buf) != CG_OK) {
            cg_seterr(err, errlen, "%s: write error: %s", tmp, strerror(errno));
            st = CG_E_IO;
            goto out;
        }
    }
    int rc = fclose(fp);
    fp = NULL;
    if (rc != 0) {
        cg_seterr(err, errlen, "%s: write error: %s", tmp, strerror(errno));
        st = CG_E_IO;
        goto out;
    }
    if (rename(tmp, path) != 0) {
        cg_seterr(err, errlen, "%s: cannot rename: %s", path, strerror(errno));
        st = CG_E_IO;
        goto out;
    }
out:
    if (fp) fclose(fp);
    if (st != CG_OK) unlink(tmp);
    free(specs);
    return st;
}

cg_status cg_model_generate(const char *dir, cg_model_gen_params p, char *err, size_t errlen)
{
    cg_status st = CG_OK;
    cg_st_dtype dt = CG_ST_F32;
    cg_arch arch = CG_ARCH_LLAMA;
    scaling sc;
    gen_tensor *ts = NULL;
    float *buf = NULL;
    json_t *index = NULL;
    if (!p.dtype) p.dtype = "f32";
    if ((st = check_params(&p, &dt, &arch, &sc, err, errlen)) != CG_OK) goto out;
    if ((st = mkdir_p(dir, err, errlen)) != CG_OK) goto out;
    if (p.tokenizer_dir && p.tokenizer_dir[0] &&
        (st = copy_tokenizer(p.tokenizer_dir, dir, &p, err, errlen)) != CG_OK)
        goto out;
    st = p.vocab_size ? write_real_config(dir, &p, dt, arch, &sc, err, errlen)
                      : write_tiny_config(dir, &p, dt, &sc, err, errlen);
    if (st != CG_OK) goto out;

    size_t n = 0;
    ts = tensor_list(&p, arch, &n);
    size_t maxrow = 1;
    for (size_t i = 0; i < n; i++)
        maxrow = CG_MAX(maxrow, (size_t)(ts[i].d1 ? ts[i].d1 : 1));
    buf = cg_malloc((GEN_PIECE + maxrow) * sizeof(float));
    const int shards = p.shards > 1 ? p.shards : 1;
    if ((size_t)shards > n) {
        cg_seterr(err, errlen, "generate: %d shards for %zu tensors", shards, n);
        st = CG_E_VALUE;
        goto out;
    }
    remove_other_layout(dir, shards > 1);
    if (shards == 1) {
        st = write_file(dir, "model.safetensors", ts, 0, n, dt, &p, buf, err, errlen);
        goto out;
    }
    /* Contiguous groups in state-dict order, cut where the running byte count passes k/N of
     * the total, each group non-empty (as save_pretrained's max_shard_size split would). */
    size_t total = 0, esz = cg_st_dtype_size(dt);
    for (size_t i = 0; i < n; i++)
        total += numel_of(&ts[i]) * esz;
    index = json_object();
    json_t *map = json_object();
    json_object_set_new(index, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total));
    json_object_set_new(index, "weight_map", map);
    size_t a = 0, run = 0;
    for (int k = 1; k <= shards; k++) {
        size_t b = a + 1;
        run += numel_of(&ts[a]) * esz;
        size_t goal = (size_t)((double)total * k / shards);
        while (b < n && (size_t)(n - b) > (size_t)(shards - k) &&
               run + numel_of(&ts[b]) * esz / 2 <= goal) {
            run += numel_of(&ts[b]) * esz;
            b++;
        }
        if (k == shards) {
            for (; b < n; b++)
                run += numel_of(&ts[b]) * esz;
        }
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k, shards);
        if ((st = write_file(dir, name, ts, a, b, dt, &p, buf, err, errlen)) != CG_OK) goto out;
        for (size_t i = a; i < b; i++)
            json_object_set_new(map, ts[i].name, json_string(name));
        a = b;
    }
    st = dump_json(dir, "model.safetensors.index.json", index, JSON_INDENT(2) | JSON_SORT_KEYS, err,
                   errlen);
out:
    json_decref(index);
    free(buf);
    free(ts);
    return st;
}
