/* A gateway request split into segments and keyed: the extension fields (chunk_separator,
 * chunk_mode, cache_salt, recompute_prefix_tokens, recompute_ratio, recompute_select,
 * quality_probe), the prompt or the chat rendering, and one key per cacheable segment
 * (cg_key_request). */
#ifndef CG_GW_SEGMENTS_H
#define CG_GW_SEGMENTS_H

#include <jansson.h>
#include "base/base.h"
#include "cache/key.h"
#include "cache/split.h"
#include "server/gwstate.h"

/* A request's segments after splitting and keying (a chat's rendering is in rendered, also
 * when it passes through). Keys exist for cacheable segments only
 * (system and chunk); n_keys of them, in prompt order. */
typedef struct cg_gw_segments {
    cg_split_result split;        /* segments, offsets into text */
    const char *text;             /* borrowed: the prompt string or the chat rendering */
    cg_buf rendered;              /* owns the chat rendering */
    const char *separator;        /* borrowed: the separator used (request's or --separator) */
    const char *tenant;           /* borrowed: the caller's tenant id, set before splitting; NULL
                                     when the request carries no API key */
    const char *salt;             /* the salt of the keys: cache_salt, or with a tenant
                                     "<tenant>" / "<tenant>:<cache_salt>"; NULL = none */
    char *salt_owned;             /* owned: the tenant form of salt */
    long long recompute;          /* recompute_prefix_tokens, -1 when absent */
    double recompute_ratio;       /* recompute_ratio, -1 when absent; both may come from the
                                     model's --recompute-default */
    const char *recompute_select; /* borrowed: "deviation" or "question"; NULL when absent */
    int quality_probe;            /* quality_probe: the answer carries chunk_cache.quality */
    cg_mode mode;
    int no_bos;      /* the worker must not add BOS: add_special_tokens false, or a chat rendered
                        with the model's template (which writes its own special tokens) */
    cg_key *keys;    /* owned; n_keys entries */
    size_t *key_seg; /* owned; the segment index of each key */
    size_t n_keys;
} cg_gw_segments;

void cg_gw_segments_init(cg_gw_segments *s);
void cg_gw_segments_free(cg_gw_segments *s);

/* Parses the extension fields shared by completions, chat and lookup (chunk_separator,
 * chunk_mode, cache_salt) and splits the request (prompt or messages + documents) into
 * segments with keys. out->tenant (may be NULL) must be set before: with a tenant, the salt is
 * always bound to it, so no cache_salt reaches another tenant's keys. chat: 1 for a chat
 * request. On failure returns the status and sets *param to the offending field and msg to a
 * message. */
cg_status cg_gw_segment_request(cg_gateway *g, json_t *body, const char *model, int chat,
                                cg_gw_segments *out, const char **param, char *msg,
                                size_t msglen) CG_WUR;

#endif
