/* Shared by fuzz_safetensors.c, fuzz_config.c and (the model check) fuzz_gguf.c: a tiny generated
 * model (1 layer, dim 32, bf16) written once into a temporary directory, the file the input
 * replaces, and the checks on the safetensors reader and on cg_model_open. Set CG_FUZZ_SEED_OUT=DIR
 * to also copy the generated config.json and model.safetensors there (how the seed corpora were
 * made). */
#ifndef CG_FUZZ_MODEL_H
#define CG_FUZZ_MODEL_H

#include <fcntl.h>
#include <jansson.h>
#include <omp.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/model/model.h"
#include "worker/model/safetensors.h"
#include "kv/attn.h"
#include "base/base.h"
#include "fuzz_common.h"

static char g_dir[256];  /* the model directory the loader reads */
static char g_gen[256];  /* the pristine generated model */
static char g_path[300]; /* the file each input is written to */

static inline void rm_model_dir(const char *dir)
{
    static const char *const names[] = {"config.json", "model.safetensors"};
    char p[320];
    for (size_t i = 0; i < CG_ARRAY_LEN(names); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

static inline void cleanup(void)
{
    rm_model_dir(g_dir);
    rm_model_dir(g_gen);
}

static inline void write_file(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) abort();
    const char *p = data;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k <= 0) abort();
        p += k;
        n -= (size_t)k;
    }
    close(fd);
}

static inline void *read_whole(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) abort();
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, fp) != (size_t)len) abort();
    fclose(fp);
    *n = (size_t)len;
    return buf;
}

static inline void copy_file(const char *from_dir, const char *to_dir, const char *name)
{
    char a[320], b[320];
    size_t n;
    snprintf(a, sizeof a, "%s/%s", from_dir, name);
    snprintf(b, sizeof b, "%s/%s", to_dir, name);
    void *buf = read_whole(a, &n);
    write_file(b, buf, n);
    free(buf);
}

/* Generates the model into g_gen, and g_dir holding a copy of the file that stays fixed;
 * inputs are then written to g_dir/fuzzed. */
static inline void model_setup(const char *fixed, const char *fuzzed)
{
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    char err[512];
    cg_log_init("fuzz_model", (cg_log_level)(CG_LOG_ERROR + 1));
    omp_set_num_threads(1); /* a 2-token forward: threads would only add noise */
    snprintf(g_gen, sizeof g_gen, "%s/cg_fuzz_gen_XXXXXX", tmp);
    snprintf(g_dir, sizeof g_dir, "%s/cg_fuzz_model_XXXXXX", tmp);
    if (!mkdtemp(g_gen) || !mkdtemp(g_dir)) abort();
    atexit(cleanup);
    cg_model_gen_params p = cg_model_gen_default_params();
    p.n_layers = 1;
    p.dim = 32;
    p.n_heads = 4;
    p.n_kv_heads = 2;
    p.hidden_dim = 64;
    p.max_pos = 256;
    p.dtype = "bf16";
    p.model_id = "fuzz-tiny";
    if (cg_model_generate(g_gen, p, err, sizeof err) != CG_OK) {
        fprintf(stderr, "fuzz: cannot generate the model: %s\n", err);
        abort();
    }
    copy_file(g_gen, g_dir, fixed);
    snprintf(g_path, sizeof g_path, "%s/%s", g_dir, fuzzed);
    const char *seed_out = getenv("CG_FUZZ_SEED_OUT");
    if (seed_out && *seed_out) {
        copy_file(g_gen, seed_out, "config.json");
        copy_file(g_gen, seed_out, "model.safetensors");
    }
}

static inline size_t ref_dtype_size(const char *s)
{
    static const struct {
        const char *name;
        size_t size;
    } t[] = {{"F32", 4},  {"F16", 2},     {"BF16", 2},    {"F64", 8},    {"I64", 8}, {"U64", 8},
             {"I32", 4},  {"U32", 4},     {"I16", 2},     {"U16", 2},    {"I8", 1},  {"U8", 1},
             {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}};
    for (size_t i = 0; i < CG_ARRAY_LEN(t); i++)
        if (!strcmp(s, t[i].name)) return t[i].size;
    return 0;
}

/* cg_st_open on the bytes just written to path, checked against the header parsed here. */
__attribute__((unused)) static void check_safetensors(const char *path, const uint8_t *data,
                                                      size_t size)
{
    cg_st_file *f = NULL;
    char err[512] = "";
    cg_status st = cg_st_open(path, &f, err, sizeof err);
    if (st != CG_OK) {
        FUZZ_CHECK(f == NULL && err[0] != '\0');
        FUZZ_CHECK(st == CG_E_VALUE || st == CG_E_JSON || st == CG_E_TYPE || st == CG_E_MISSING ||
                   st == CG_E_IO);
        return;
    }
    /* accepted: the header must really say what the reader made of it */
    uint64_t hl;
    FUZZ_CHECK(size >= 8);
    memcpy(&hl, data, 8);
    FUZZ_CHECK(hl <= size - 8);
    const uint8_t *sec = data + 8 + hl;
    size_t sec_len = size - 8 - (size_t)hl;
    json_t *hdr = json_loadb((const char *)data + 8, (size_t)hl, JSON_REJECT_DUPLICATES, NULL);
    FUZZ_CHECK(json_is_object(hdr));
    size_t n = cg_st_count(f), want_n = json_object_size(hdr);
    if (json_object_get(hdr, "__metadata__")) want_n--;
    FUZZ_CHECK(n == want_n);
    uint64_t *begin = calloc(n + 1, sizeof *begin), *end = calloc(n + 1, sizeof *end);
    if (!begin || !end) abort();
    for (size_t i = 0; i < n; i++) {
        const cg_st_tensor *t = cg_st_at(f, i);
        FUZZ_CHECK(t && t->name);
        if (i) FUZZ_CHECK(strcmp(cg_st_at(f, i - 1)->name, t->name) < 0);
        FUZZ_CHECK(cg_st_find(f, t->name) == t);
        json_t *e = json_object_get(hdr, t->name);
        FUZZ_CHECK(json_is_object(e));
        const char *ds = json_string_value(json_object_get(e, "dtype"));
        size_t es = ds ? ref_dtype_size(ds) : 0;
        FUZZ_CHECK(es && !strcmp(ds, t->dtype_str));
        json_t *shape = json_object_get(e, "shape");
        FUZZ_CHECK(json_is_array(shape) && json_array_size(shape) == (size_t)t->ndim);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            json_t *x = json_array_get(shape, (size_t)d);
            FUZZ_CHECK(json_is_integer(x) && json_integer_value(x) == t->shape[d] &&
                       t->shape[d] >= 0);
            numel *= (size_t)t->shape[d];
        }
        FUZZ_CHECK(numel == t->numel && t->nbytes == numel * es);
        json_t *off = json_object_get(e, "data_offsets");
        FUZZ_CHECK(json_is_array(off) && json_array_size(off) == 2);
        json_int_t b = json_integer_value(json_array_get(off, 0)),
                   en = json_integer_value(json_array_get(off, 1));
        FUZZ_CHECK(b >= 0 && en >= b && (uint64_t)en <= sec_len && (uint64_t)(en - b) == t->nbytes);
        begin[i] = (uint64_t)b;
        end[i] = (uint64_t)en;
        /* the tensor's bytes are the file's bytes at its offsets */
        FUZZ_CHECK(t->nbytes == 0 || memcmp(t->data, sec + b, t->nbytes) == 0);
        if (t->dtype != CG_ST_OTHER && t->numel <= (1u << 20)) {
            float *x = malloc(t->numel * sizeof(float) + 1);
            if (!x) abort();
            FUZZ_CHECK(cg_st_to_f32(t, x) == CG_OK);
            if (t->dtype == CG_ST_F32)
                FUZZ_CHECK(t->nbytes == 0 || memcmp(x, sec + b, t->nbytes) == 0);
            free(x);
        }
    }
    /* no two non-empty tensors share a byte */
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (begin[i] < end[i] && begin[j] < end[j])
                FUZZ_CHECK(end[i] <= begin[j] || end[j] <= begin[i]);
    free(begin);
    free(end);
    json_decref(hdr);
    cg_st_close(&f);
    FUZZ_CHECK(f == NULL);
}

/* A model a loader accepted: a consistent geometry, and a forward pass over the first n of
 * tok (at most max_pos of them) that succeeds. Closes m. */
static inline void check_opened_model(cg_model *m, const int32_t *tok, uint32_t n)
{
    const cg_model_config *c = cg_model_cfg(m);
    FUZZ_CHECK(c->dim >= 1 && c->n_layers >= 1 && c->n_heads >= 1 && c->n_kv_heads >= 1);
    FUZZ_CHECK(c->n_heads % c->n_kv_heads == 0 && c->head_dim % 2 == 0 && c->head_dim > 0);
    FUZZ_CHECK(c->max_pos >= 1 && c->vocab_size >= 1);
    FUZZ_CHECK(c->model_id[0] != '\0' && strlen(c->model_id) < sizeof c->model_id);
    if (n > (uint32_t)c->max_pos) n = (uint32_t)c->max_pos;
    cg_kv *kv = cg_kv_new(m, n);
    FUZZ_CHECK(kv != NULL);
    float *logits = malloc((size_t)c->vocab_size * sizeof(float));
    if (!logits) abort();
    cg_attn_span sp = {0, n, 0, 0};
    FUZZ_CHECK(cg_model_forward(m, kv, tok, n, 0, 0, &sp, 1, logits) == CG_OK);
    free(logits);
    cg_kv_free(&kv);
    cg_model_close(&m);
    FUZZ_CHECK(m == NULL);
}

/* cg_model_open on path: the model it accepted, or NULL once its refusal is checked to carry a
 * message. */
static inline cg_model *open_or_refused(const char *path)
{
    cg_model *m = NULL;
    char err[512] = "";
    if (cg_model_open(path, &m, err, sizeof err) == CG_OK) return m;
    FUZZ_CHECK(m == NULL && err[0] != '\0');
    return NULL;
}

/* cg_model_open on g_dir; a model it accepts must be consistent and run a forward pass. */
__attribute__((unused)) static void check_model(void)
{
    cg_model *m = open_or_refused(g_dir);
    if (!m) return;
    const cg_model_config *c = cg_model_cfg(m);
    FUZZ_CHECK(c->vocab_size >= 256 && c->bos_id >= 0 && c->bos_id < c->vocab_size);
    FUZZ_CHECK(c->n_eos >= 1 && c->eos_ids[0] >= 0 && c->eos_ids[0] < c->vocab_size);
    /* accepted against a 1-layer, dim-32 file, so the forward below is small */
    FUZZ_CHECK(c->n_layers == 1 && c->dim == 32);
    int32_t tok[2] = {c->bos_id, 'a'};
    check_opened_model(m, tok, 2);
}

#endif
