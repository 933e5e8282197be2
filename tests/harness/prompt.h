/* A prompt's engine segments held by value, for suites that link cg_test_engine and hand
 * prompts to cg_assemble (the segments' text stays borrowed). */
#ifndef CG_TEST_PROMPT_H
#define CG_TEST_PROMPT_H

#include <string.h>

#include "tests/harness/harness.h"
#include "worker/serve/engine.h"

#define TH_PROMPT_SEGS 8

typedef struct th_prompt {
    cg_engine_seg segs[TH_PROMPT_SEGS];
    size_t n;
} th_prompt;

/* The segments of th_engine_segs (sys, docs[order[0]], ..., docs[order[n - 1]], q; n + 2 at
 * most TH_PROMPT_SEGS), the unused ones zeroed. */
static inline th_prompt th_prompt_of(const char *sys, const char *const *docs, const int *order,
                                     size_t n, const char *q)
{
    th_prompt p;
    memset(&p, 0, sizeof p);
    p.n = th_engine_segs(p.segs, sys, docs, order, n, q);
    return p;
}

#endif
