/* Quality of reuse (worker/serve/engine.h, DESIGN §15): a probe captured while a request
 * decoded from reused KV is compared with one plain causal forward of the same tokens, run on
 * the scheduler's background queue so that it never delays live requests. */
#include "worker/serve/engine_state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

void cg_probe_free(cg_probe **pp)
{
    cg_probe *p = *pp;
    if (!p) return;
    free(p->tokens);
    free(p->logits);
    cg_free(pp);
}

/* log-softmax of n logits into out (double: the two distributions are often close, and KL
 * is a sum of small differences); returns the argmax. */
static int log_softmax(const float *lg, int n, double *out)
{
    int best = 0;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (lg[i] > mx) mx = lg[i], best = i;
    for (int i = 0; i < n; i++)
        sum += exp((double)lg[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++)
        out[i] = (double)lg[i] - lse;
    return best;
}

cg_status cg_engine_probe_compare(cg_engine *e, const cg_probe *p, cg_quality *out)
{
    const cg_model_config *c = cg_model_cfg(e->m);
    const size_t V = (size_t)c->vocab_size;
    memset(out, 0, sizeof *out);
    if (!p || !p->n_prompt || !p->n_rows) return CG_E_VALUE;
    const uint64_t n = (uint64_t)p->n_prompt + p->n_rows - 1;
    if (n > (uint64_t)c->max_pos) return CG_E_VALUE;
    cg_kv *kv = cg_kv_new(e->m, (uint32_t)n);
    float *full = cg_malloc((size_t)p->n_rows * V * sizeof(float));
    cg_attn_span span = {0, (uint32_t)n, 0, 0};
    cg_fwd_seq q = {.kv = kv,
                    .tokens = p->tokens,
                    .n = (uint32_t)n,
                    .spans = &span,
                    .n_spans = 1,
                    .row_logits = full,
                    .row_logits_from = p->n_prompt - 1};
    cg_status st = cg_sched_prefill_idle(e->sched, &q, NULL);
    cg_kv_free(&kv);
    if (st == CG_OK) {
        double *lf = cg_malloc(V * sizeof(double)), *lr = cg_malloc(V * sizeof(double));
        double sum = 0;
        for (uint32_t r = 0; r < p->n_rows; r++) {
            int tf = log_softmax(full + r * V, (int)V, lf);
            int tr = log_softmax(p->logits + r * V, (int)V, lr);
            double kl = 0;
            for (size_t i = 0; i < V; i++)
                kl += exp(lf[i]) * (lf[i] - lr[i]);
            kl = kl > 0 ? kl : 0; /* rounding of two equal distributions */
            sum += kl;
            out->kl_max = fmax(out->kl_max, kl);
            if (r == 0) out->kl_first = kl;
            out->top1_agreed += tf == tr;
        }
        out->tokens_compared = p->n_rows;
        out->kl = sum / p->n_rows;
        free(lf);
        free(lr);
    }
    free(full);
    return st;
}

void cg_engine_stop_background(cg_engine *e)
{
    cg_sched_stop_idle(e->sched);
}
