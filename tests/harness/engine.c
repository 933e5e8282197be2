/* Test harness, engine part: the answers of an in-process engine, the reference the
 * integration suites compare the worker's answers with. */
#include "tests/harness/harness.h"
#include "worker/serve/engine.h"
#include "worker/serve/text.h"
#include "worker/serve/worker_api.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t th_engine_segs(cg_engine_seg *segs, const char *sys, const char *const *docs,
                      const int *order, size_t n, const char *q)
{
    size_t k = 0;
    if (sys) segs[k++] = (cg_engine_seg){CG_ROLE_SYSTEM, sys, strlen(sys), NULL};
    for (size_t i = 0; i < n; i++) {
        const char *d = docs[order ? (size_t)order[i] : i];
        segs[k++] = (cg_engine_seg){CG_ROLE_CHUNK, d, strlen(d), NULL};
    }
    if (q) segs[k++] = (cg_engine_seg){CG_ROLE_QUESTION, q, strlen(q), NULL};
    return k;
}

void th_engine_assemble(cg_engine *e, const char *sys, const char *d1, const char *d2,
                        const char *q, int path, struct cg_assembly_info *info)
{
    const char *docs[2] = {d1, d2};
    cg_engine_seg s[4];
    cg_assemble_req ar = {.segs = s,
                          .n_segs = th_engine_segs(s, sys, docs, NULL, 2, q),
                          .mode = CG_MODE_STRICT,
                          .reserve_tokens = -1,
                          .path = (cg_engine_path)path};
    char err[512];
    cg_status st = cg_engine_assemble(e, &ar, 1, info, err, sizeof err);
    ck_assert_msg(st == CG_OK, "assemble: %s (%s)", cg_status_name(st), err);
}

char *th_engine_answer(cg_model *m, const char *sys, const char *d1, const char *d2, const char *q,
                       uint32_t max_tokens, int path)
{
    cg_engine *e = NULL;
    ck_assert_int_eq(cg_engine_open(m, cg_engine_default_params(), &e), CG_OK);
    cg_assembly_info info;
    th_engine_assemble(e, sys, d1, d2, q, path, &info);
    char err[512];
    cg_complete_req cr = {.assembly_id = info.id, .max_tokens = max_tokens};
    cg_complete_result res;
    ck_assert_int_eq(cg_engine_complete(e, &cr, 1, &res, err, sizeof err), CG_OK);
    cg_buf out;
    cg_buf_init_unbounded(&out);
    cg_utf8_sanitize(res.text, res.text_len, 1, &out);
    char *t = cg_strndup(out.data ? out.data : "", out.len);
    cg_buf_free(&out);
    cg_complete_result_free(&res);
    cg_assembly_info_free(&info);
    cg_engine_close(&e);
    return t;
}

cg_model *th_model_gen_open(const char *worker_bin, const char *dir, const char *const *extra)
{
    char err[512] = "";
    cg_model *m = NULL;
    if (th_gen_model(worker_bin, dir, extra) != 0) {
        fprintf(stderr, "generate-model failed; its log is %s/gen.log\n", th_root());
        return NULL;
    }
    if (cg_model_open(dir, &m, err, sizeof err) != CG_OK) {
        fprintf(stderr, "cannot load the model %s: %s\n", dir, err);
        return NULL;
    }
    return m;
}

uint32_t th_tok_into(const cg_model *m, const char *text, size_t len, int bos, int32_t *out)
{
    size_t n = 0;
    int32_t *ids = cg_tok_encode(m, text, len, bos, &n);
    if (n) memcpy(out, ids, n * sizeof *out);
    free(ids);
    return (uint32_t)n;
}

cg_model *th_model_open_or_generate(const char *dir, char tmp[TH_MODEL_TMP], char *err, size_t n)
{
    tmp[0] = '\0';
    if (!dir) {
        snprintf(tmp, TH_MODEL_TMP, "/tmp/cg_bench_model_XXXXXX");
        if (!mkdtemp(tmp)) {
            snprintf(err, n, "mkdtemp: %s", strerror(errno));
            tmp[0] = '\0';
            return NULL;
        }
        if (cg_model_generate(tmp, cg_model_gen_default_params(), err, n) != CG_OK) return NULL;
        dir = tmp;
    }
    cg_model *m = NULL;
    return cg_model_open(dir, &m, err, n) == CG_OK ? m : NULL;
}

cg_model *th_bench_model(const char *name, const char *dir, char tmp[TH_MODEL_TMP])
{
    char err[512];
    cg_model *m = th_model_open_or_generate(dir, tmp, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s: model: %s\n", name, err);
        exit(1);
    }
    const cg_model_config *c = cg_model_cfg(m);
    printf("model %s (%s): %d layers, dim %d, %d heads, %d kv heads, head_dim %d, vocab %d\n",
           c->model_id, cg_arch_name(c->arch), c->n_layers, c->dim, c->n_heads, c->n_kv_heads,
           c->head_dim, c->vocab_size);
    return m;
}

void th_bench_model_close(cg_model **m, const char tmp[TH_MODEL_TMP])
{
    cg_model_close(m);
    if (tmp[0]) th_rmrf(tmp);
}

void th_rag_make(th_rag_work *w, const char *tag, uint64_t *state)
{
    w->sys = th_words(TH_RAG_SYS_BYTES, "System: answer from the documents. ", state);
    w->sys2 = th_words(TH_RAG_SYS_BYTES, "System (changed): be terse, cite. ", state);
    w->q = th_words(TH_RAG_Q_BYTES, "Question: ", state);
    for (int d = 0; d < TH_RAG_DOCS; d++) {
        char pre[64];
        snprintf(pre, sizeof pre, "Document %s-%d. ", tag, d);
        w->docs[d] = th_words(TH_RAG_DOC_BYTES, pre, state);
    }
    static const int order[TH_RAG_DOCS] = {2, 0, 3, 1};
    const size_t n = TH_RAG_DOCS + 2;
    w->cold = cg_calloc(n, sizeof *w->cold);
    w->warm = cg_calloc(n, sizeof *w->warm);
    const char *const *docs = (const char *const *)w->docs;
    th_engine_segs(w->cold, w->sys, docs, NULL, TH_RAG_DOCS, w->q);
    th_engine_segs(w->warm, w->sys2, docs, order, TH_RAG_DOCS, w->q);
}

void th_rag_free(th_rag_work *w)
{
    free(w->sys);
    free(w->sys2);
    free(w->q);
    for (int d = 0; d < TH_RAG_DOCS; d++)
        free(w->docs[d]);
    free(w->cold);
    free(w->warm);
    memset(w, 0, sizeof *w);
}
