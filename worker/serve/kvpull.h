/* Backend role of chunkgate-worker (DESIGN §7, §8): pull an assembly's KV from the worker
 * that built it, head range by head range, with N tensor-parallel ranks (threads) that each
 * fetch exactly the KV heads they own with their own HTTP request, then decode it here.
 * Head ownership follows the seed design's put_step: with N <= KV heads each rank owns
 * KV heads / N consecutive heads; with N > KV heads, N / KV heads ranks share each head. */
#ifndef CG_KVPULL_H
#define CG_KVPULL_H

#include <stddef.h>
#include <stdint.h>

#include "worker/serve/engine.h"
#include "base/status.h"

/* The KV heads tensor-parallel rank `rank` of `tp` owns. */
typedef struct cg_tp_slice {
    int head0;   /* first KV head */
    int n_heads; /* consecutive heads from head0 (>= 1) */
    int leader;  /* 1: the first rank of the ranks sharing these heads (always 1 when
                    tp <= n_kv_heads) */
} cg_tp_slice;

/* Checks that tp ranks can split n_kv_heads: tp divides n_kv_heads, or n_kv_heads divides tp
 * (vLLM's rule; uneven splits would give ranks different head counts). CG_OK or CG_E_VALUE. */
cg_status cg_tp_check(int n_kv_heads, int tp) CG_WUR;
/* The slice of rank (0 <= rank < tp); tp must pass cg_tp_check. With tp > n_kv_heads,
 * put_step = tp / n_kv_heads and rank r owns head r / put_step. */
cg_tp_slice cg_tp_slice_of(int n_kv_heads, int tp, int rank);

typedef struct cg_kvpull_params {
    const char *worker;      /* base URL of the source worker, http:// or https://; borrowed */
    const char *assembly_id; /* the source's assembly, 32 lowercase hex; borrowed */
    int tp;                  /* tensor-parallel ranks; default 1 */
    long timeout_ms;         /* per HTTP request; default 30000 */
    int release;             /* 1 (default): DELETE the source assembly after pulling */
    const char *api_key;     /* sent as a bearer token (the source's --api-key); borrowed;
                                NULL = none */
    uint32_t decode_tokens;  /* the tokens the completion will decode (0: not checked): the
                                source's prompt and these must fit the positions, or the pull
                                stops with CG_E_CONTEXT after the logits, before any KV moves,
                                and the source keeps its assembly */
} cg_kvpull_params;

cg_kvpull_params cg_kvpull_default_params(void);

typedef struct cg_kvpull_result {
    char id[33];            /* the local assembly now live in the engine */
    uint32_t n_tokens;      /* prompt tokens pulled */
    uint32_t cached_tokens; /* the source's cached tokens (for usage) */
    int kv_requests;        /* KV requests made: one per rank */
    uint64_t kv_bytes;      /* KV body bytes received, all ranks */
    int released;           /* 1: the source answered the DELETE */
    double seconds;         /* wall time of the whole pull */
} cg_kvpull_result;

/* Pulls the source assembly into a new live assembly of e, which cg_engine_complete then
 * decodes (and consumes) like a local one:
 *   1. GET {worker}/v1/assemblies/{id}/logits: the last prompt token's logits (the first
 *      token is sampled from them, so no prompt token is recomputed) and the token counts;
 *   2. each rank r, on its own thread and connection, GETs
 *      {worker}/v1/assemblies/{id}/kv?heads=a-b for its slice and checks the CGKV header
 *      (model id, layers, head_dim, dtype, KV heads, tokens, head range) against e's model;
 *      the first rank of a slice writes its heads into the KV; the ranks sharing it check
 *      that their bytes are identical;
 *   3. DELETE {worker}/v1/assemblies/{id} (when p->release), whether the pull worked or not;
 *   4. cg_engine_adopt.
 * Returns CG_OK (res filled), CG_E_NOT_FOUND (unknown at the source), CG_E_VALUE (bad URL,
 * id or tp), CG_E_BAD_GATEWAY (the source's model or geometry differs from e's, or a reply is
 * malformed or ranks disagree), CG_E_UNAVAILABLE (cannot connect), CG_E_TIMEOUT, or
 * cg_engine_adopt's statuses. err (optional) names the problem. curl_global_init must have
 * been called by the program. now: monotonic ms (the local assembly's ttl starts there). */
cg_status cg_kvpull_assembly(cg_engine *e, const cg_kvpull_params *p, uint64_t now,
                             cg_kvpull_result *res, char *err, size_t errlen) CG_WUR;

/* Checks a source worker base URL: http:// or https://, at most 1024 bytes, printable ASCII
 * without spaces. 1 when acceptable. */
int cg_kvpull_url_ok(const char *url);
/* 1 when a and b name the same worker base URL: equal once a trailing "/", "/v1" or "/v1/" is
 * dropped from each (the gateway names workers by its normalised URL, an operator may write
 * either form). Case-sensitive, so an allow-list never matches more than it says. */
int cg_kvpull_url_same(const char *a, const char *b);

#endif
