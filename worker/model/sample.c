/* Sampling of the next token: greedy, temperature and nucleus (top_p), seeded per request
 * (worker/model/model.h). */
#include "worker/model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i]))) best = i;
    return best;
}

typedef struct prob_ix {
    float p;
    int32_t i;
} prob_ix;

static int cmp_prob_desc(const void *a, const void *b)
{
    const prob_ix *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i; /* ties by index: the order is deterministic */
}

double cg_logprobs_top(const float *logits, int vocab, int k, int32_t *ids, float *lps)
{
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    for (int j = 0; j < k && j < vocab; j++) {
        int best = -1;
        for (int i = 0; i < vocab; i++) {
            if (best >= 0 && !(logits[i] > logits[best])) continue;
            int taken = 0;
            for (int t = 0; t < j && !taken; t++)
                taken = ids[t] == i;
            if (!taken) best = i;
        }
        ids[j] = best;
        lps[j] = (float)((double)logits[best] - lse);
    }
    return lse;
}

int32_t cg_sample_keep(cg_sampler *s, float *logits, int vocab_size, float *raw)
{
    float *copy = NULL;
    if (s->temperature > 0.0f) { /* sampling rewrites the logits into probabilities */
        copy = cg_malloc((size_t)vocab_size * sizeof(float));
        memcpy(copy, logits, (size_t)vocab_size * sizeof(float));
    }
    int32_t t = cg_sample(s, logits, vocab_size);
    *raw = copy ? copy[t] : logits[t];
    free(copy);
    return t;
}

int32_t cg_sample(cg_sampler *s, float *logits, int vocab_size)
{
    if (vocab_size <= 1) return 0;
    int32_t top = argmax(logits, vocab_size);
    if (!(s->temperature > 0.0f) || !isfinite(logits[top])) return top;
    /* softmax(logits / T) in place, then draw from the smallest prefix of the sorted
     * distribution whose mass reaches top_p (always at least the top token) */
    double sum = 0, inv_t = 1.0 / s->temperature, mx = logits[top];
    for (int i = 0; i < vocab_size; i++) {
        double e = isnan(logits[i]) ? 0.0 : exp(((double)logits[i] - mx) * inv_t);
        logits[i] = (float)e;
        sum += e;
    }
    double u = (double)(splitmix64(&s->rng) >> 11) * 0x1p-53;
    float top_p = s->top_p > 0.0f && s->top_p < 1.0f ? s->top_p : 1.0f;
    if (top_p >= 1.0f) {
        double r = u * sum, acc = 0;
        for (int i = 0; i < vocab_size; i++) {
            acc += logits[i];
            if (r < acc) return i;
        }
        return top;
    }
    prob_ix *pi = cg_malloc((size_t)vocab_size * sizeof *pi);
    for (int i = 0; i < vocab_size; i++)
        pi[i] = (prob_ix){(float)(logits[i] / sum), i};
    qsort(pi, (size_t)vocab_size, sizeof *pi, cmp_prob_desc);
    int keep = 0;
    double mass = 0;
    while (keep < vocab_size && (keep == 0 || mass < top_p))
        mass += pi[keep++].p;
    double r = u * mass, acc = 0;
    int32_t pick = pi[0].i;
    for (int i = 0; i < keep; i++) {
        acc += pi[i].p;
        if (r < acc) {
            pick = pi[i].i;
            break;
        }
    }
    free(pi);
    return pick;
}
