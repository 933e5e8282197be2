/* config.json of a checkpoint (worker/model/config.h). */
#include "worker/model/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"

#define CONFIG_MAX_BYTES (1u << 20)

static const char *const ARCH_NAMES[] = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                         "Qwen3ForCausalLM"};

const char *cg_arch_name(cg_arch a)
{
    return (unsigned)a < CG_ARRAY_LEN(ARCH_NAMES) ? ARCH_NAMES[a] : "unknown";
}

/* ---- typed fields ---- */

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
        cg_seterr(err, errlen, "config.json: '%s' = %lld is out of range [%lld, %lld]", key, x, lo,
                  hi);
        return CG_E_VALUE;
    }
    *out = (int)x;
    return CG_OK;
}

/* Reads a number field of obj (named where for messages); absent or null: def. */
static cg_status cfg_num(json_t *obj, const char *where, const char *key, double def, double lo,
                         double hi, double *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return CG_OK;
    }
    if (!json_is_number(v)) {
        cg_seterr(err, errlen, "config.json: '%s%s' must be a number", where, key);
        return CG_E_TYPE;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        cg_seterr(err, errlen, "config.json: '%s%s' = %g is out of range [%g, %g]", where, key, x,
                  lo, hi);
        return CG_E_VALUE;
    }
    *out = x;
    return CG_OK;
}

/* Reads a boolean field of obj (named where for messages); absent or null: def. */
static cg_status cfg_bool(json_t *obj, const char *where, const char *key, int def, int *out,
                          char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return CG_OK;
    }
    if (!json_is_boolean(v)) {
        cg_seterr(err, errlen, "config.json: '%s%s' must be true or false", where, key);
        return CG_E_TYPE;
    }
    *out = json_is_true(v);
    return CG_OK;
}

/* One token id inside the vocabulary. */
static cg_status token_id(json_t *v, const char *key, int vocab, int *out, char *err, size_t errlen)
{
    if (!json_is_integer(v)) {
        cg_seterr(err, errlen, "config.json: '%s' must be an integer or a list of integers", key);
        return CG_E_TYPE;
    }
    if (json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
        cg_seterr(err, errlen, "config.json: '%s' = %lld is outside the vocabulary of %d", key,
                  (long long)json_integer_value(v), vocab);
        return CG_E_VALUE;
    }
    *out = (int)json_integer_value(v);
    return CG_OK;
}

/* bos_token_id: an id, the first of a list, or absent (-1). */
static cg_status read_bos(json_t *root, cg_model_config *c, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, "bos_token_id");
    if (json_is_array(v)) v = json_array_get(v, 0);
    c->bos_id = -1;
    if (!v || json_is_null(v)) return CG_OK;
    return token_id(v, "bos_token_id", c->vocab_size, &c->bos_id, err, errlen);
}

/* eos_token_id: an id or a list of ids (instruct models stop at several). */
static cg_status read_eos(json_t *root, cg_model_config *c, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, "eos_token_id");
    c->n_eos = 0;
    if (!v || json_is_null(v)) return CG_OK;
    if (!json_is_array(v))
        return token_id(v, "eos_token_id", c->vocab_size, &c->eos_ids[c->n_eos++], err, errlen);
    if (json_array_size(v) > CG_MODEL_MAX_EOS) {
        cg_seterr(err, errlen, "config.json: 'eos_token_id' lists more than %d ids",
                  CG_MODEL_MAX_EOS);
        return CG_E_VALUE;
    }
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        cg_status st =
            token_id(e, "eos_token_id", c->vocab_size, &c->eos_ids[c->n_eos++], err, errlen);
        if (st != CG_OK) return st;
    }
    return CG_OK;
}

/* ---- the file ---- */

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
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/')
        s--;
    snprintf(tmp, tmplen, "%.*s", (int)(n - s), dir + s);
    return tmp;
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        st = (x);                                                                                  \
        if (st != CG_OK) return st;                                                                \
    } while (0)

/* "architectures": exactly one of the supported classes. */
static cg_status read_arch(json_t *root, cg_model_config *c, char *err, size_t errlen)
{
    json_t *a = json_object_get(root, "architectures");
    if (!json_is_array(a) || json_array_size(a) != 1 || !json_is_string(json_array_get(a, 0))) {
        cg_seterr(err, errlen,
                  "config.json: 'architectures' must list one architecture (supported: "
                  "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)");
        return a ? CG_E_TYPE : CG_E_MISSING;
    }
    const char *name = json_string_value(json_array_get(a, 0));
    for (size_t i = 0; i < CG_ARRAY_LEN(ARCH_NAMES); i++)
        if (!strcmp(name, ARCH_NAMES[i])) {
            c->arch = (cg_arch)i;
            return CG_OK;
        }
    cg_seterr(err, errlen,
              "config.json: architecture '%.80s' is not supported (supported: LlamaForCausalLM, "
              "Qwen2ForCausalLM, Qwen3ForCausalLM)",
              name);
    return CG_E_UNSUPPORTED;
}

/* Fields that would change the computation in ways this worker does not implement. */
static cg_status refuse_unsupported(json_t *root, const cg_model_config *c, char *err,
                                    size_t errlen)
{
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (json_object_get(root, "hidden_act") && (!act || strcmp(act, "silu"))) {
        cg_seterr(err, errlen, "config.json: 'hidden_act' = '%.40s' is not supported (only silu)",
                  act ? act : "?");
        return CG_E_UNSUPPORTED;
    }
    double prf = 1.0;
    cg_status st = cfg_num(root, "", "partial_rotary_factor", 1.0, 0.0, 1.0, &prf, err, errlen);
    if (st != CG_OK) return st;
    if (prf != 1.0) {
        cg_seterr(err, errlen, "config.json: 'partial_rotary_factor' = %g is not supported", prf);
        return CG_E_UNSUPPORTED;
    }
    /* Qwen2's configs name a sliding window but do not use it unless use_sliding_window is
     * true; Mistral's is in use whenever it is set. */
    json_t *sw = json_object_get(root, "sliding_window");
    int use_sw = c->arch == CG_ARCH_LLAMA && sw && !json_is_null(sw);
    if (c->arch != CG_ARCH_LLAMA &&
        (st = cfg_bool(root, "", "use_sliding_window", 0, &use_sw, err, errlen)) != CG_OK)
        return st;
    if (use_sw) {
        cg_seterr(err, errlen,
                  "config.json: a sliding attention window is not supported ('sliding_window' / "
                  "'use_sliding_window')");
        return CG_E_UNSUPPORTED;
    }
    static const char *const bias_keys[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < CG_ARRAY_LEN(bias_keys); i++) {
        int bias;
        if ((st = cfg_bool(root, "", bias_keys[i], 0, &bias, err, errlen)) != CG_OK) return st;
        if (bias) {
            cg_seterr(err, errlen,
                      "config.json: '%s' = true is not supported for %s (only Qwen2's q/k/v "
                      "biases are)",
                      bias_keys[i], cg_arch_name(c->arch));
            return CG_E_UNSUPPORTED;
        }
    }
    return CG_OK;
}

static cg_status read_geometry(json_t *root, cg_model_config *c, char *err, size_t errlen)
{
    cg_status st;
    TRY(cfg_int(root, "hidden_size", 1, 0, 1, 1 << 16, &c->dim, err, errlen));
    TRY(cfg_int(root, "intermediate_size", 1, 0, 1, 1 << 20, &c->hidden_dim, err, errlen));
    TRY(cfg_int(root, "num_hidden_layers", 1, 0, 1, 4096, &c->n_layers, err, errlen));
    TRY(cfg_int(root, "num_attention_heads", 1, 0, 1, 4096, &c->n_heads, err, errlen));
    TRY(cfg_int(root, "num_key_value_heads", 0, c->n_heads, 1, 4096, &c->n_kv_heads, err, errlen));
    TRY(cfg_int(root, "vocab_size", 1, 0, 2, 1 << 24, &c->vocab_size, err, errlen));
    TRY(cfg_int(root, "max_position_embeddings", 0, 2048, 1, 1 << 30, &c->max_pos, err, errlen));
    json_t *hd = json_object_get(root, "head_dim");
    if (!hd || json_is_null(hd)) {
        if (c->dim % c->n_heads) {
            cg_seterr(err, errlen,
                      "config.json: num_attention_heads %d does not divide hidden_size %d",
                      c->n_heads, c->dim);
            return CG_E_VALUE;
        }
        c->head_dim = c->dim / c->n_heads;
    } else {
        TRY(cfg_int(root, "head_dim", 1, 0, 1, CG_MODEL_MAX_HEAD_DIM, &c->head_dim, err, errlen));
    }
    if (c->head_dim % 2 || c->head_dim > CG_MODEL_MAX_HEAD_DIM) {
        cg_seterr(err, errlen, "config.json: head_dim %d must be even and at most %d", c->head_dim,
                  CG_MODEL_MAX_HEAD_DIM);
        return CG_E_VALUE;
    }
    if (c->n_heads % c->n_kv_heads) {
        cg_seterr(err, errlen,
                  "config.json: num_key_value_heads %d does not divide num_attention_heads %d",
                  c->n_kv_heads, c->n_heads);
        return CG_E_VALUE;
    }
    double eps;
    TRY(cfg_num(root, "", "rms_norm_eps", 1e-6, 1e-12, 0.1, &eps, err, errlen));
    c->norm_eps = (float)eps;
    /* transformers' default for these three architectures is untied */
    TRY(cfg_bool(root, "", "tie_word_embeddings", 0, &c->tie_embeddings, err, errlen));
    TRY(read_bos(root, c, err, errlen));
    return read_eos(root, c, err, errlen);
}

/* ---- RoPE ---- */

/* yarn: the number of rotations' dimension (vLLM's and transformers' formula). */
static double yarn_dim(double rotations, int dim, double base, double max_pos)
{
    return (dim * log(max_pos / (rotations * 2 * M_PI))) / (2 * log(base));
}

static double yarn_mscale(double scale, double mscale)
{
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* YaRN (arXiv 2309.00071) as vLLM and transformers compute it: frequencies below the
 * correction range are interpolated (divided by factor), above it extrapolated (kept), a
 * linear ramp between; cos and sin carry the attention factor. */
static cg_status rope_yarn(json_t *rs, const char *w, cg_model_config *c, double factor, char *err,
                           size_t errlen)
{
    double orig, beta_fast, beta_slow, af, ms, ms_all;
    int truncate;
    cg_status st;
    TRY(cfg_num(rs, w, "original_max_position_embeddings", c->max_pos, 1, 1e9, &orig, err, errlen));
    TRY(cfg_num(rs, w, "beta_fast", 32, 1e-6, 1e6, &beta_fast, err, errlen));
    TRY(cfg_num(rs, w, "beta_slow", 1, 1e-6, 1e6, &beta_slow, err, errlen));
    TRY(cfg_num(rs, w, "attention_factor", 0, 0, 1e3, &af, err, errlen));
    TRY(cfg_num(rs, w, "mscale", 0, 0, 1e3, &ms, err, errlen));
    TRY(cfg_num(rs, w, "mscale_all_dim", 0, 0, 1e3, &ms_all, err, errlen));
    TRY(cfg_bool(rs, w, "truncate", 1, &truncate, err, errlen));
    if (af <= 0)
        af = ms > 0 && ms_all > 0 ? yarn_mscale(factor, ms) / yarn_mscale(factor, ms_all)
                                  : yarn_mscale(factor, 1.0);
    const int d = c->head_dim, h = d / 2;
    /* the correction range in whole dims, unless truncate is false (gpt-oss) */
    double lo = yarn_dim(beta_fast, d, c->rope_theta, orig);
    double hi = yarn_dim(beta_slow, d, c->rope_theta, orig);
    if (truncate) lo = floor(lo), hi = ceil(hi);
    lo = lo < 0 ? 0 : lo;
    hi = hi > d - 1 ? d - 1 : hi;
    if (lo == hi) hi += 0.001; /* no singular ramp */
    for (int i = 0; i < h; i++) {
        double extra = pow(c->rope_theta, -2.0 * i / d), inter = extra / factor;
        double ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double keep = 1 - ramp; /* the extrapolation share */
        c->inv_freq[i] = inter * (1 - keep) + extra * keep;
    }
    c->attn_factor = af;
    return CG_OK;
}

/* Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth blend between. */
static cg_status rope_llama3(json_t *rs, const char *w, cg_model_config *c, double factor,
                             char *err, size_t errlen)
{
    double lf, hf, orig;
    cg_status st;
    /* required, as transformers requires them */
    static const char *const need[] = {"low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    for (size_t i = 0; i < CG_ARRAY_LEN(need); i++) {
        json_t *v = json_object_get(rs, need[i]);
        if (!v || json_is_null(v)) {
            cg_seterr(err, errlen, "config.json: '%s%s' is required for llama3", w, need[i]);
            return CG_E_MISSING;
        }
    }
    TRY(cfg_num(rs, w, "low_freq_factor", 1, 1e-9, 1e9, &lf, err, errlen));
    TRY(cfg_num(rs, w, "high_freq_factor", 4, 1e-9, 1e9, &hf, err, errlen));
    TRY(cfg_num(rs, w, "original_max_position_embeddings", 8192, 1, 1e9, &orig, err, errlen));
    if (hf <= lf) {
        cg_seterr(err, errlen,
                  "config.json: rope_scaling.high_freq_factor must exceed "
                  "low_freq_factor");
        return CG_E_VALUE;
    }
    const double low_wl = orig / lf, high_wl = orig / hf;
    for (int i = 0; i < c->head_dim / 2; i++) {
        double f = c->inv_freq[i], wl = 2 * M_PI / f;
        if (wl > low_wl) {
            f /= factor;
        } else if (wl >= high_wl) {
            double s = (orig / wl - lf) / (hf - lf);
            f = (1 - s) * f / factor + s * f;
        }
        c->inv_freq[i] = f;
    }
    return CG_OK;
}

/* rope_theta, the pairing, and rope_scaling turned into per-frequency rates. Scaling that
 * depends on the sequence length cannot be remapped by a position delta (DESIGN §6).
 * transformers 5 writes rope_theta and the scaling as one object, rope_parameters; either
 * form is read, and both at once must agree. */
static cg_status read_rope(json_t *root, cg_model_config *c, char *err, size_t errlen)
{
    cg_status st;
    json_t *rp = json_object_get(root, "rope_parameters");
    json_t *rs = json_object_get(root, "rope_scaling");
    const char *w = "rope_scaling.";
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp) ||
            (!json_object_get(rp, "rope_type") && !json_object_get(rp, "rope_theta"))) {
            cg_seterr(err, errlen,
                      "config.json: 'rope_parameters' must be an object with rope_type and "
                      "rope_theta (RoPE parameters per layer type are not supported)");
            return CG_E_UNSUPPORTED;
        }
        if (rs && !json_is_null(rs)) {
            const char *k;
            json_t *v;
            bool same = json_is_object(rs);
            json_object_foreach(rs, k, v) same = same && json_equal(v, json_object_get(rp, k));
            if (!same) {
                cg_seterr(err, errlen,
                          "config.json: 'rope_scaling' says what 'rope_parameters' does not");
                return CG_E_VALUE;
            }
        }
        double top, in;
        TRY(cfg_num(root, "", "rope_theta", NAN, 1.0, 1e12, &top, err, errlen));
        TRY(cfg_num(rp, "rope_parameters.", "rope_theta", NAN, 1.0, 1e12, &in, err, errlen));
        if (!isnan(top) && !isnan(in) && top != in) {
            cg_seterr(err, errlen,
                      "config.json: 'rope_theta' %g and 'rope_parameters.rope_theta' "
                      "%g differ",
                      top, in);
            return CG_E_VALUE;
        }
        c->rope_theta = !isnan(in) ? in : !isnan(top) ? top : 10000.0;
        rs = rp;
        w = "rope_parameters.";
    } else {
        TRY(cfg_num(root, "", "rope_theta", 10000.0, 1.0, 1e12, &c->rope_theta, err, errlen));
    }
    for (int i = 0; i < c->head_dim / 2; i++)
        c->inv_freq[i] = pow(c->rope_theta, -2.0 * i / c->head_dim);
    c->attn_factor = 1.0;
    snprintf(c->rope_scaling, sizeof c->rope_scaling, "none");
    json_t *rst = json_object_get(root, "rope_style");
    c->rope_style = CG_ROPE_HALF;
    if (rst && !json_is_null(rst)) {
        const char *s = json_string_value(rst);
        if (s && !strcmp(s, "interleaved")) {
            c->rope_style = CG_ROPE_INTERLEAVED;
        } else if (!s || strcmp(s, "half")) {
            cg_seterr(err, errlen, "config.json: rope_style must be \"half\" or \"interleaved\"");
            return s ? CG_E_VALUE : CG_E_TYPE;
        }
    }
    if (!rs || json_is_null(rs)) return CG_OK;
    const char *kind = NULL;
    if (json_is_object(rs)) {
        kind = json_string_value(json_object_get(rs, "rope_type"));
        if (!kind) kind = json_string_value(json_object_get(rs, "type"));
        /* rope_parameters with rope_theta alone: transformers' default rope_type */
        if (!kind && rs == rp && !json_object_get(rs, "rope_type")) kind = "default";
    }
    if (!kind) {
        cg_seterr(err, errlen, "config.json: '%.*s' must be an object with a rope_type",
                  (int)strlen(w) - 1, w);
        return CG_E_TYPE;
    }
    if (!strcmp(kind, "default")) return CG_OK;
    double factor;
    if (strcmp(kind, "linear") && strcmp(kind, "llama3") && strcmp(kind, "yarn")) {
        cg_seterr(err, errlen,
                  "config.json: %.*s '%.40s' is not supported: it depends on the "
                  "sequence length, so cached K cannot be moved by a position delta (supported: "
                  "linear, llama3, yarn)",
                  (int)strlen(w) - 1, w, kind);
        return CG_E_UNSUPPORTED;
    }
    TRY(cfg_num(rs, w, "factor", NAN, 1.0, 1e6, &factor, err, errlen));
    if (isnan(factor)) {
        cg_seterr(err, errlen, "config.json: '%sfactor' is required for %s", w, kind);
        return CG_E_MISSING;
    }
    snprintf(c->rope_scaling, sizeof c->rope_scaling, "%s", kind);
    if (!strcmp(kind, "linear")) {
        for (int i = 0; i < c->head_dim / 2; i++)
            c->inv_freq[i] /= factor;
        return CG_OK;
    }
    return !strcmp(kind, "llama3") ? rope_llama3(rs, w, c, factor, err, errlen)
                                   : rope_yarn(rs, w, c, factor, err, errlen);
}

static cg_status read_model_id(json_t *root, const char *dir, cg_model_config *c, char *err,
                               size_t errlen)
{
    const char *keys[] = {"model_id", "_name_or_path"}, *id = NULL;
    for (size_t i = 0; i < CG_ARRAY_LEN(keys) && !id; i++) {
        json_t *v = json_object_get(root, keys[i]);
        if (v && !json_is_null(v) && !json_is_string(v)) {
            cg_seterr(err, errlen, "config.json: '%s' must be a string", keys[i]);
            return CG_E_TYPE;
        }
        if (json_string_length(v) > 0) id = json_string_value(v);
    }
    char tmp[sizeof c->model_id + 1];
    if (!id) id = base_name(dir, tmp, sizeof tmp);
    if (strlen(id) >= sizeof c->model_id || !id[0]) {
        cg_seterr(err, errlen, "config.json: model id must be 1 to %zu bytes",
                  sizeof c->model_id - 1);
        return CG_E_VALUE;
    }
    snprintf(c->model_id, sizeof c->model_id, "%s", id);
    return CG_OK;
}

cg_status cg_model_config_read(const char *dir, cg_model_config *c, char *err, size_t errlen)
{
    char path[4096], *text = NULL;
    size_t len = 0;
    json_t *root = NULL;
    memset(c, 0, sizeof *c);
    snprintf(path, sizeof path, "%s/config.json", dir);
    cg_status st = read_small_file(path, CONFIG_MAX_BYTES, &text, &len, err, errlen);
    if (st != CG_OK) return st;
    json_error_t jerr;
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root || !json_is_object(root)) {
        if (root)
            cg_seterr(err, errlen, "config.json: not a JSON object");
        else
            cg_seterr(err, errlen, "config.json: not valid JSON: %s (line %d)", jerr.text,
                      jerr.line);
        json_decref(root);
        return root ? CG_E_TYPE : CG_E_JSON;
    }
    st = cg_model_config_parse(root, dir, c, err, errlen);
    json_decref(root);
    return st;
}

cg_status cg_model_config_parse(json_t *root, const char *dir, cg_model_config *c, char *err,
                                size_t errlen)
{
    memset(c, 0, sizeof *c);
    cg_status st = read_arch(root, c, err, errlen);
    if (st == CG_OK) st = refuse_unsupported(root, c, err, errlen);
    if (st == CG_OK) st = read_geometry(root, c, err, errlen);
    if (st == CG_OK) st = read_rope(root, c, err, errlen);
    if (st == CG_OK) st = read_model_id(root, dir, c, err, errlen);
    c->qkv_bias = c->arch == CG_ARCH_QWEN2;
    c->qk_norm = c->arch == CG_ARCH_QWEN3;
    return st;
}

cg_rope cg_model_config_rope(const cg_model_config *c)
{
    cg_rope r = {c->head_dim, c->rope_theta, c->rope_style, c->inv_freq, c->attn_factor};
    return r;
}

int cg_model_config_is_eos(const cg_model_config *c, int32_t id)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return 1;
    return 0;
}
