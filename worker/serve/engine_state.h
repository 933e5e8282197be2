/* The assembly engine's state, shared by its files: engine.c (lifetime, tables, export),
 * assemble.c (building an assembly) and complete.c (decoding). Not a public interface. */
#ifndef CG_ENGINE_STATE_H
#define CG_ENGINE_STATE_H

#include <pthread.h>

#include "worker/serve/engine.h"
#include "worker/serve/live.h"
#include "worker/serve/sched.h"
#include "worker/store/tiers.h"

struct cg_engine {
    const cg_model *m;
    cg_engine_params p;
    cg_tiers *tiers;
    cg_live *live;
    cg_sched *sched; /* runs every forward pass */
    /* The counters of cg_engine_stats that the engine itself keeps (the tiers and the live
     * table keep theirs); never held while computing. */
    pthread_mutex_t smu;
    cg_engine_stats stats;
};

/* Adds a finished request's counts to the engine's (under smu). */
void cg_engine_count(cg_engine *e, const cg_engine_stats *add);

#endif
