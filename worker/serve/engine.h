/* The reference worker's assembly engine: tokenizes segments on their own, computes missing
 * chunks at virtual positions and stores them in the KV pool, remaps hits to their offsets,
 * prefills the question under the segment mask, and decodes from the assembled KV. With a
 * disk tier, chunks evicted from RAM are spilled to disk and read back on a later hit; with a
 * remote tier (Redis), chunks computed by any worker sharing it are read back from there.
 * DESIGN §5-§8, §16. */
#ifndef CG_ENGINE_H
#define CG_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "worker/store/disk.h"
#include "base/remote.h"
#include "worker/store/events.h"
#include "worker/store/tiers.h"
#include "worker/model/model.h"
#include "worker/serve/sched.h"
#include "cache/key.h"
#include "kv/pool.h"
#include "cache/split.h"
#include "base/status.h"
#include "base/tier.h"

typedef struct cg_engine cg_engine;

typedef struct cg_engine_params {
    size_t pool_bytes;        /* KV pool capacity; default 256 MiB */
    uint32_t block_tokens;    /* pool block size in tokens; default 16 */
    uint64_t assembly_ttl_ms; /* an unconsumed assembly is released after this; default 60000 */
    size_t max_assemblies;    /* live assemblies at once; default 64 (more -> CG_E_UNAVAILABLE) */
    uint32_t reserve_tokens;  /* decode room allocated with an assembly; default 512 */
    /* Freed assembly KV buffers kept for the next assemblies (each saves the next one the page
     * faults of a fresh buffer), at most this many bytes of capacity in all; 0 = none.
     * Default 1 GiB. */
    size_t spare_kv_bytes;
    /* Disk tier (worker/store/disk.h) below the RAM pool: a chunk evicted from RAM is
     * written there, a pool miss looks there. disk_bytes 0 (default) = no disk tier. */
    size_t disk_bytes;
    const char *disk_dir; /* required with disk_bytes; borrowed for cg_engine_open */
    int disk_sync;        /* cg_disk_params.sync; default 0 */
    /* Disk write-behind: every computed chunk is queued for the disk tier at once (so a crash
     * loses at most the chunks still queued), at most this many chunks / bytes; 0 chunks =
     * off (RAM evictions still spill). Default 64 chunks, 64 MiB. Needs a disk tier. */
    size_t disk_write_behind;
    size_t disk_write_behind_bytes;
    /* The shared remote tier (base/remote.h), looked up after the disk; computed
     * chunks are written to it in the background. Borrowed: it must outlive the engine.
     * Default NULL. */
    cg_remote *remote;
    /* Chunk events (worker/store/events.h): every change of where a chunk is. Borrowed: it
     * must outlive the engine. Default NULL (none). */
    cg_events *events;
    /* The scheduler (worker/serve/sched.h): decoding sequences stepped together, admitted
     * requests beyond them, rows per prefill piece, prefill rows between decode steps, rows per
     * background piece (the quality canary). Default cg_sched_default_params(). */
    cg_sched_params sched;
    /* Monotonic milliseconds, read at the start and the end of an assemble: its ttl runs from
     * when it is ready (the now given to cg_engine_assemble plus the time it computed).
     * Default cg_now_ms; NULL counts the ttl from now (tests that set every time by hand). */
    uint64_t (*now_ms)(void);
} cg_engine_params;

cg_engine_params cg_engine_default_params(void);

/* Creates an engine over model (borrowed: it must outlive the engine) with a pool of
 * params.pool_bytes and, when params.disk_bytes > 0, the disk tier in params.disk_dir (its
 * chunks from an earlier run are hits again). Returns CG_E_VALUE when the pool or the disk
 * cannot hold one block, or the statuses of cg_disk_open (CG_E_UNSUPPORTED: the directory
 * holds another model's KV; CG_E_CONFLICT: another process uses it; CG_E_IO). Caller frees
 * with cg_engine_close. */
cg_status cg_engine_open(const cg_model *model, cg_engine_params params, cg_engine **out) CG_WUR;
/* Releases every live assembly, the pool and the engine; NULL-safe, sets *e to NULL. */
void cg_engine_close(cg_engine **e);

const cg_model *cg_engine_model(const cg_engine *e);
/* The engine's pool, for inventory and stats (borrowed; it has its own lock). */
cg_pool *cg_engine_pool(cg_engine *e);
/* The engine's disk tier (borrowed; it has its own lock), or NULL without one. */
cg_disk *cg_engine_disk(cg_engine *e);
cg_engine_params cg_engine_get_params(const cg_engine *e);

/* How assemble computes. Only CG_PATH_CACHED touches the pool; the others are references
 * for tests and benches, and still return a normal assembly that can be decoded. */
typedef enum {
    CG_PATH_CACHED,    /* the product: pool hits remapped, misses computed and stored */
    CG_PATH_BYPASS,    /* the same two-stage computation, every segment a miss, no pool */
    CG_PATH_REFERENCE, /* ONE forward over all tokens at true positions, spans of cg_attn_plan */
    CG_PATH_CAUSAL,    /* ONE plain causal forward over all tokens (no segment mask) */
} cg_engine_path;

/* One input segment (all borrowed for the call). */
typedef struct cg_engine_seg {
    cg_role role;
    const char *text;
    size_t len;
    const cg_key *key; /* optional: checked against the key the engine computes */
} cg_engine_seg;

typedef struct cg_assemble_req {
    const cg_engine_seg *segs; /* system (first only), chunks, question (last only) */
    size_t n_segs;
    cg_mode mode;
    const char *salt; /* cache_salt, borrowed; may be NULL */
    size_t salt_len;
    uint32_t recompute_prefix_tokens; /* EPIC LegoLink: first k tokens of each chunk */
    /* CacheBlend's selective recompute, r in [0, 1] (else CG_E_VALUE): after placing, the
     * round(r * N) of the N chunk tokens whose KV at an early layer deviates most from a
     * full-attention pass are recomputed in every layer with full causal attention, as one set
     * with the recompute_prefix_tokens tokens (their union). 0 (default): off, the prefix
     * tokens alone are recomputed; 1: every chunk token, a plain causal forward.
     * With r > 0 a prompt ending in a chunk also recomputes its last token (its logits). */
    float recompute_ratio;
    cg_select recompute_select; /* how recompute_ratio ranks the tokens; default deviation */
    /* 0 (default): the system segment gets the tokenizer's BOS, as a completion prompt does;
     * 1: it does not (a prompt rendered by a chat template writes its own). Other segments
     * never do. */
    int no_bos;
    /* 1: special tokens' text in the segments is plain text (split_special_tokens); a segment
     * it tokenizes differently is computed and never cached (keys cover text, the cache holds
     * the usual tokens), and in mode sys so are the chunks after such a system segment. */
    int split_special;
    /* Optional: asked while segments are tokenized and before each forward of the prompt
     * (each segment computed, the recomputation, the question); non-zero (the client left)
     * stops the request with CG_E_UNAVAILABLE. Segments computed before it stay stored. */
    int (*cancelled)(void *ud);
    void *cancel_ud;
    int64_t reserve_tokens; /* < 0: the engine's default */
    cg_engine_path path;    /* default CG_PATH_CACHED (0) */
    float *logits_out;      /* optional: receives vocab_size logits of the last token */
    /* 1: the caller decodes it at once (a completion's own "# #" prompt): not counted against
     * max_assemblies, which bounds the assemblies clients build and hold (/v1/assemble); the
     * completions' admission bounds these. */
    int internal;
    /* The tokens the caller will decode after the prompt (a completion's max_tokens, when it
     * is not clamped to the context): the prompt and these must fit the model's positions,
     * checked before anything is computed (CG_E_CONTEXT). 0: the prompt alone. */
    uint32_t decode_tokens;
} cg_assemble_req;

typedef struct cg_engine_seg_result {
    cg_key key;
    cg_role role;
    uint32_t offset, n_tokens;
    int hit;      /* 1: KV came from the cache (RAM pool, disk or remote tier) */
    int stored;   /* 1: a miss whose KV is now in the pool */
    cg_tier tier; /* with hit: where the KV came from (read back, then in RAM unless the pool
                     was full); on the wire, cg_tier_seg_name(hit, tier) */
} cg_engine_seg_result;

/* The outcome of an assemble. Owned by the caller: cg_assembly_info_free. */
typedef struct cg_assembly_info {
    char id[33];                /* 32 lowercase hex characters: 128 random bits */
    uint32_t n_tokens;          /* prompt tokens */
    uint32_t cached_tokens;     /* tokens of hit segments */
    uint32_t computed_tokens;   /* tokens run through the model (misses, recompute, question) */
    uint32_t recomputed_tokens; /* chunk tokens recomputed with full context (prefix + ratio) */
    uint64_t ttl_ms;
    cg_engine_seg_result *segs;
    size_t n_segs;
    /* Chunks that left RAM while this request stored or restored chunks, as they stand when
     * it returns: evicted = no longer held by this worker at all (no disk tier, disk full or
     * dropped from disk); spilled = moved to the disk tier (still a hit, tier "disk"). */
    cg_key *evicted;
    size_t n_evicted;
    cg_key *spilled;
    size_t n_spilled;
} cg_assembly_info;
void cg_assembly_info_free(cg_assembly_info *a);

/* Builds the KV of a request and keeps it as a live assembly until it is consumed by
 * cg_engine_complete, released, or expires (ttl from when it is ready: now plus the time the
 * call computed, measured with params.now_ms). The assembly holds pool
 * references to its chunks, so they are never evicted while it lives.
 * Checks: at least one segment; system only first, question only last; no empty text;
 * a given key must equal the computed one (CG_E_KEY_MISMATCH, nothing computed or stored);
 * more tokens than the model's max_pos -> CG_E_CONTEXT; too many live assemblies ->
 * CG_E_UNAVAILABLE. A full pool never fails the request: misses are then used unstored.
 * On success fills *out (caller frees with cg_assembly_info_free); on error *out is empty and
 * err (optional) names the problem. now: monotonic milliseconds. */
cg_status cg_engine_assemble(cg_engine *e, const cg_assemble_req *req, uint64_t now,
                             cg_assembly_info *out, char *err, size_t errlen) CG_WUR;

/* Releases a live assembly now. Returns CG_OK or CG_E_NOT_FOUND (unknown, expired, consumed). */
cg_status cg_engine_release(cg_engine *e, const char *assembly_id, uint64_t now) CG_WUR;
/* Releases assemblies whose ttl has passed; returns how many. Every engine call does it too. */
size_t cg_engine_reap(cg_engine *e, uint64_t now);
/* Live assemblies (after reaping at now). */
size_t cg_engine_live_assemblies(cg_engine *e, uint64_t now);

/* Streaming callback, on the caller's thread: one call per generated token with its record
 * (logprob and top entries when asked) and the bytes it adds to the text (special tokens add
 * none). Return non-zero to stop (the client left, a stop sequence matched). */
typedef int (*cg_token_fn)(void *ud, const cg_tok_rec *rec, const char *bytes, size_t len);

typedef struct cg_complete_req {
    const char *assembly_id; /* decode from this live assembly (consumed), or NULL: */
    const char *prompt;      /* plain prompt: tokenized whole (with the tokenizer's BOS unless
                                no_bos), one causal forward, no cache */
    size_t prompt_len;
    int no_bos;
    int split_special;          /* special tokens' text in the prompt is plain text */
    int (*cancelled)(void *ud); /* optional: as cg_assemble_req's, while the prompt is tokenized */
    void *cancel_ud;
    const int32_t *prompt_tokens; /* or a plain prompt given as token ids (used when set) */
    size_t n_prompt_tokens;
    int prompt_logprobs; /* -1: none; else a plain prompt's token logprobs with this many top
                            entries (echo) */
    float temperature;   /* <= 0: greedy */
    float top_p;         /* (0, 1]; 1 = off */
    uint64_t seed;
    uint32_t max_tokens; /* 0: no token, finish "length" */
    /* 1: max_tokens was not asked for, and is cut to the context left after the prompt; 0: a
     * prompt plus max_tokens beyond the context is CG_E_CONTEXT (never silently cut) */
    int clamp_max_tokens;
    int logprobs;         /* -1: none; else the top entries of each token's record (<= 20) */
    cg_token_fn on_token; /* optional */
    void *ud;
    /* 1: capture a quality probe (cg_complete_result.probe) when decoding from an assembly
     * built by cg_engine_assemble: the distributions the reused KV gave at the prompt's end
     * and after each of the first probe_tokens generated tokens. Costs a copy of the logits
     * per captured step; 0 (default) costs nothing. */
    int probe;
    uint32_t probe_tokens;
} cg_complete_req;

typedef struct cg_complete_result {
    char *text; /* raw generated bytes, NUL-terminated; caller frees */
    size_t text_len, text_cap;
    int32_t *tokens; /* generated tokens (EOS excluded); caller frees */
    size_t n_tokens;
    const char *finish_reason; /* "stop" (EOS or stopped by on_token) or "length"; static */
    /* The prompt's tokens, and with prompt_logprobs their logprobs (entry 0 NAN: nothing
     * precedes it) and top entries [n_prompt][prompt_top_k] of the distribution each was
     * drawn from (entry 0 unused). All owned. */
    int32_t *prompt_ids;
    size_t n_prompt;
    float *prompt_lp;
    int32_t *prompt_top_ids;
    float *prompt_top_lps;
    int prompt_top_k;
    int cancelled; /* on_token asked to stop */
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    uint32_t recomputed_tokens; /* of the assembly decoded (0 for a plain prompt) */
    struct cg_probe *probe;     /* with probe_tokens, from an assembly: owned (NULL otherwise) */
} cg_complete_result;
void cg_complete_result_free(cg_complete_result *r);

/* Decodes up to max_tokens from an assembly (which it consumes: released when done, also on
 * error) or from a plain prompt. Stops at EOS ("stop") or max_tokens ("length"). A prompt
 * plus max_tokens beyond the model's positions is CG_E_CONTEXT unless clamp_max_tokens.
 * The KV grows when decoding passes the assembly's reserve. Returns CG_E_NOT_FOUND for an
 * unknown or expired assembly, CG_E_CONTEXT when the plain prompt exceeds max_pos.
 * On success *out is filled (caller frees with cg_complete_result_free). */
/* CG_OK when n_prompt tokens and max_tokens more fit the model's max_pos positions; else
 * CG_E_CONTEXT with the message OpenAI and vLLM give (naming the prompt alone when it does not
 * fit by itself). Shared by the completion, the assemble that precedes it and a pull. */
cg_status cg_engine_fits(int max_pos, uint64_t n_prompt, uint64_t max_tokens, char *err,
                         size_t errlen) CG_WUR;
cg_status cg_engine_complete(cg_engine *e, const cg_complete_req *req, uint64_t now,
                             cg_complete_result *out, char *err, size_t errlen) CG_WUR;

/* ---- quality of reuse (DESIGN §15) ---- */

/* What a completion captured for a quality probe: the prompt and the next-token distributions
 * the reused KV gave at its end and after each generated token, with how the assembly was
 * built. Owned by whoever holds it: cg_probe_free. */
typedef struct cg_probe {
    int32_t *tokens; /* n_prompt prompt tokens, then the n_rows - 1 generated tokens fed */
    uint32_t n_prompt;
    uint32_t n_rows; /* distributions: the prompt's end, then one per generated token fed */
    float *logits;   /* [n_rows][vocab_size]: raw logits of the reused path */
    cg_mode mode;    /* the assembly's isolation mode and recompute settings */
    float recompute_ratio;
    cg_select recompute_select;
    uint32_t recompute_prefix_tokens, recomputed_tokens;
} cg_probe;
/* NULL-safe; sets *p to NULL. */
void cg_probe_free(cg_probe **p);

/* The comparison of a probe with a plain causal forward of the same tokens. */
typedef struct cg_quality {
    double kl;                /* mean over the compared positions of KL(full || reused), in nats */
    double kl_max;            /* the largest of them */
    double kl_first;          /* at the prompt's end (the first answer token's distribution) */
    uint32_t top1_agreed;     /* positions where both give the same most likely token */
    uint32_t tokens_compared; /* positions compared: the probe's n_rows */
} cg_quality;

/* Runs one plain causal forward without reuse over the probe's prompt and generated tokens
 * (teacher forcing) and compares its distributions at the same positions with the probe's:
 * KL(full || reused) and top-1 agreement. The forward runs on the scheduler's background
 * queue: it yields to every live request, so under load it waits. CG_E_UNAVAILABLE after
 * cg_engine_stop_background; CG_E_VALUE for a probe the model cannot hold. */
cg_status cg_engine_probe_compare(cg_engine *e, const cg_probe *p, cg_quality *out) CG_WUR;
/* For shutdown: background work (probe comparisons) queued or to come fails at once with
 * CG_E_UNAVAILABLE, so threads waiting on it can be joined. */
void cg_engine_stop_background(cg_engine *e);

/* Admission (the scheduler's): CG_OK, or CG_E_RATE_LIMIT when max_running + max_queue requests
 * are in the worker (force: count it but never refuse). Every CG_OK is paired with
 * cg_engine_leave. */
cg_status cg_engine_admit(cg_engine *e, int force) CG_WUR;
void cg_engine_leave(cg_engine *e);
/* The scheduler's counters. */
cg_sched_stats cg_engine_sched_stats(cg_engine *e);
/* The scheduler itself (borrowed), for its queue-time histograms. */
cg_sched *cg_engine_sched(cg_engine *e);

/* Per-head KV export, DESIGN §7 (the payload of kv/kvwire.h; the api adds its header):
 * for each KV head in [h0, h1], for each layer, K then V, each [tokens][head_dim]
 * little-endian f32. *out is malloc'd (caller frees), *len its bytes, *tokens the row count.
 * Chunk: a published pool chunk, or one on disk (read back into RAM first, like a hit; a
 * record failing its checksum is dropped and reported as CG_E_NOT_FOUND).
 * Assembly: its prompt KV as assembled (not consumed).
 * Returns CG_E_NOT_FOUND, or CG_E_VALUE for a bad head range. */
cg_status cg_engine_chunk_kv(cg_engine *e, const cg_key *key, int h0, int h1, void **out,
                             size_t *len, uint32_t *tokens) CG_WUR;
cg_status cg_engine_assembly_kv(cg_engine *e, const char *assembly_id, int h0, int h1, uint64_t now,
                                void **out, size_t *len, uint32_t *tokens) CG_WUR;

/* The logits of an assembly's last prompt token (vocab_size floats into out), its prompt
 * tokens and cached tokens; the assembly is not consumed. This is what a backend that pulls
 * the assembly's KV (worker/serve/kvpull.h) samples its first token from.
 * CG_E_NOT_FOUND when unknown, expired or consumed. */
cg_status cg_engine_assembly_logits(cg_engine *e, const char *assembly_id, uint64_t now, float *out,
                                    uint32_t *n_tokens, uint32_t *cached_tokens) CG_WUR;
/* 1 when assembly_id is a live assembly of this engine (after reaping at now). */
int cg_engine_has_assembly(cg_engine *e, const char *assembly_id, uint64_t now);

/* Makes a live assembly from KV built elsewhere (a backend that pulled it): *kv holds the
 * prompt's n_tokens (1 .. cg_kv_cap) in slots [0, n_tokens), logits the last prompt token's
 * vocab_size logits (copied). Takes *kv over (sets it to NULL), also on error. The assembly
 * holds no pool chunk and is decoded by cg_engine_complete like any other; cached_tokens is
 * reported in its usage. On CG_OK id_out holds its id. CG_E_VALUE for a bad n_tokens,
 * CG_E_UNAVAILABLE when max_assemblies are live. */
cg_status cg_engine_adopt(cg_engine *e, cg_kv **kv, uint32_t n_tokens, uint32_t cached_tokens,
                          const float *logits, uint64_t now, char id_out[33]) CG_WUR;

/* Removes a chunk from every tier (RAM pool and disk). CG_E_CONFLICT (nothing removed) when a
 * live assembly references it; CG_E_NOT_FOUND when no tier holds it. */
cg_status cg_engine_chunk_delete(cg_engine *e, const cg_key *key) CG_WUR;

/* Writes every chunk in RAM to the disk tier (already there: only its LRU position moves),
 * least recently used first, so that the most recent survive when the disk is smaller than
 * RAM. For a clean shutdown: after it, a restart with the same directory finds them all.
 * Returns the chunks on disk afterwards among those in RAM; 0 without a disk tier. */
size_t cg_engine_flush(cg_engine *e, uint64_t now);

/* Cumulative counters since create. */
typedef struct cg_engine_stats {
    uint64_t chunk_hits, chunk_misses; /* cacheable segments (system + chunks) */
    uint64_t tokens_reused;            /* prompt tokens taken from the pool */
    uint64_t tokens_computed;          /* prompt tokens not taken from the pool */
    uint64_t prefill_tokens;           /* tokens run through the model during prefill */
    uint64_t decode_tokens;            /* tokens generated */
    uint64_t evictions;                /* chunks evicted from RAM by inserts */
    uint64_t assemblies_created, assemblies_expired;
    uint64_t disk_hits;          /* cacheable segments served from the disk tier (in chunk_hits) */
    uint64_t restores;           /* chunks read back from disk and verified (assemble, export) */
    uint64_t restore_failures;   /* disk records that failed their checksum or read: misses */
    uint64_t spills;             /* RAM evictions written to disk (or already there) */
    uint64_t spill_failures;     /* RAM evictions the disk did not take: dropped */
    uint64_t assemblies_adopted; /* assemblies made from pulled KV (cg_engine_adopt) */
    size_t kv_spare_bytes;       /* gauge: capacity of the spare assembly KV buffers */
    uint64_t recomputed_tokens;  /* chunk tokens recomputed with full context */
    uint64_t rank_tokens;        /* chunk tokens run through the ranking pass of recompute_ratio */
    uint64_t remote_hits;        /* cacheable segments served from the remote tier (in
                                    chunk_hits) */
} cg_engine_stats;
cg_engine_stats cg_engine_get_stats(cg_engine *e);

/* The tiers' counters (remote reads, write-behind queues; see worker/store/tiers.h). */
cg_tiers_stats cg_engine_tier_stats(cg_engine *e);

/* Waits up to timeout_ms until the chunks stored so far have been written (or the write
 * failed) by the disk and remote write-behinds: CG_OK or CG_E_TIMEOUT. */
cg_status cg_engine_wait_writes(cg_engine *e, int timeout_ms) CG_WUR;

#endif
