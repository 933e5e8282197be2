/* The client for Redis of both programs: the worker's remote KV tier (DESIGN §16) and the
 * chunk events worker and gateway exchange on a Redis Stream (§18). One Redis node (redis://)
 * or a Redis Cluster (redis+cluster://). The KV tier stores each chunk's KV per KV head under
 * "{model}@head:{h}@{key}". The values are opaque bytes here (the caller encodes and checks the
 * CGKV wire format); this module moves them: pipelined batch reads and writes grouped by node,
 * cluster slot routing with MOVED/ASK redirects, a bounded write-behind queue, per-node
 * connection pools, fail-fast reconnect backoff, a deadline on every call, and counters.
 * A reply of the wrong type or size is an error, never a crash; but RESP carries no request
 * ids, so whether a value belongs to its key is the caller's check (the CGKV header and
 * checksum). */
#ifndef CG_REMOTE_H
#define CG_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct cg_remote cg_remote;

/* Environment variable cg_remote_load_password reads when no password file is given. */
#define CG_REMOTE_PASSWORD_ENV "CHUNKGATE_WORKER_REMOTE_PASSWORD"
/* Longest password accepted (bytes). */
#define CG_REMOTE_PASSWORD_MAX 4096
/* Slots of a Redis Cluster. */
#define CG_REMOTE_SLOTS 16384
/* Enough for every per-head key cg_kvwire_head_key builds (model id of up to 255 bytes). */
#define CG_REMOTE_KEY_MAX 320
/* Most cluster nodes one client keeps track of. */
#define CG_REMOTE_MAX_NODES 256

typedef struct cg_remote_params {
    const char *url;          /* required: redis://host:port[/db] or redis+cluster://host:port;
                                 borrowed for cg_remote_open */
    const char *password;     /* NULL: no AUTH; borrowed for cg_remote_open (copied). Load it
                                 with cg_remote_load_password, never from the command line */
    int timeout_ms;           /* default 200: the most one call costs (connect, commands,
                                 redirects, map refresh), 1..600000; it must cover moving a
                                 chunk's values. Resolving a host name is not bounded by it
                                 (getaddrinfo): give addresses or use a local resolver */
    uint32_t ttl_s;           /* default 0: no TTL (memory policy belongs to Redis: maxmemory +
                                 allkeys-lru); else SET ... EX ttl_s */
    size_t queue_max_items;   /* default 256: write-behind items (chunks) queued or being written */
    size_t queue_max_bytes;   /* default 256 MiB: value bytes queued or being written */
    int backoff_min_ms;       /* default 100: first wait after a node fails before it is tried
                                 again; also the least time between two cluster map refreshes */
    int backoff_max_ms;       /* default 10000: cap of the doubling backoff */
    int conns_per_node;       /* default 4: connections per node, opened lazily, 1..64 */
    int max_redirects;        /* default 5: MOVED/ASK rounds one call follows, 0..16 */
    size_t value_max_bytes;   /* default 256 MiB: a reply value larger than this is refused
                                 (CG_E_BAD_GATEWAY) before it is buffered whole, and so are
                                 the replies of one call whose bytes through the parser (all
                                 but large bulk strings) pass value_max_bytes per reply */
    int drain_ms;             /* default 2000: cg_remote_close waits this long for the queue */
    size_t value_cache_bytes; /* default 64 MiB: buffers of large values (64 KiB and more) given
                                 back with cg_remote_values_free are kept for the next reads,
                                 up to this many bytes (no page faults for each read); 0: off */
    /* default NULL: called by the write-behind thread after each queued item was attempted,
     * with its n keys (borrowed for the call), the tag of cg_remote_put_async_tag and the
     * outcome of its batch (CG_OK: stored). It must not call back into the client's queue. */
    void (*on_written)(void *ud, size_t n, const char *const *keys, uint64_t tag, cg_status st);
    void *on_written_ud;
} cg_remote_params;

/* The defaults above; url is NULL. */
cg_remote_params cg_remote_default_params(void);

/* A parsed remote URL. */
typedef struct cg_remote_url {
    int cluster;    /* 1: redis+cluster:// */
    char host[256]; /* host name, IPv4 or IPv6 address (without brackets) */
    int port;       /* 1..65535 */
    int db;         /* database index (0 for a cluster) */
} cg_remote_url;

/* Parses and validates url strictly: "redis://host:port[/db]" (db 0..999999) or
 * "redis+cluster://host:port"; IPv6 hosts in brackets. Refuses other schemes (rediss:// is not
 * supported), user info or a password in the URL, a missing or out-of-range port, a database on
 * a cluster, and trailing characters. Returns CG_OK or CG_E_VALUE with a message in err
 * (errlen bytes, may be NULL). */
cg_status cg_remote_parse_url(const char *url, cg_remote_url *out, char *err, size_t errlen) CG_WUR;

/* Loads the Redis password: from the file at path when path is not NULL (one trailing newline
 * is dropped; empty, unreadable or longer than CG_REMOTE_PASSWORD_MAX is an error), otherwise
 * from the environment variable CG_REMOTE_PASSWORD_ENV (unset or empty: no password, *out =
 * NULL). On CG_OK *out is NULL or a string the caller gives back with cg_remote_free_password.
 * Returns CG_E_IO when the file cannot be read, CG_E_VALUE when its content is refused; err
 * describes it. */
cg_status cg_remote_load_password(const char *path, char **out, char *err, size_t errlen) CG_WUR;
/* Overwrites a password of cg_remote_load_password (or a copy of one) with zeros and frees it,
 * so that it does not outlive its use in freed memory; NULL is a no-op. */
void cg_remote_free_password(char *password);

/* Cluster slot of a key (0..16383): CRC16/XMODEM of the key, or of its hash tag (the bytes
 * between the first '{' and the next '}', when not empty) mod 16384. */
unsigned cg_remote_key_slot(const char *key, size_t len);

/* Opens a client. Validates the parameters (CG_E_VALUE with err), starts the write-behind
 * thread, then pings the server (a cluster: loads the slot map from the seed) within
 * timeout_ms. A refused password (or one missing) is CG_E_AUTH, a database index the server
 * refuses or a cluster URL for a server without cluster support (and the reverse) is
 * CG_E_VALUE: both fail the open with err saying why. A server that is down or slow does not:
 * the client opens, logs a warning, and connects later by itself. *out is owned by the caller:
 * cg_remote_close. */
cg_status cg_remote_open(cg_remote_params params, cg_remote **out, char *err, size_t errlen) CG_WUR;

/* Drains the write-behind queue for at most params.drain_ms (what is left is dropped and
 * counted in stats.queue_failed), stops the writer, closes every connection and frees r.
 * Accepts NULL / *r == NULL, sets *r to NULL. No other call on r may be running. */
void cg_remote_close(cg_remote **r);

/* One value read by cg_remote_get: data is malloc'd, NUL-terminated after len bytes, 16-byte
 * aligned. Give it back with cg_remote_values_free (which recycles large buffers); free(data)
 * is also correct. */
typedef struct cg_remote_value {
    char *data;
    size_t len;
    size_t cap_; /* private: size of a recyclable buffer, 0 for a plain one */
} cg_remote_value;

/* Reads n keys (NUL-terminated strings, borrowed), all or nothing: the commands are grouped by
 * node and pipelined, the nodes served in parallel, redirects followed. Returns CG_OK when
 * every key was found (out[i] = value of keys[i], owned by the caller); CG_E_NOT_FOUND when
 * at least one is missing (a miss: out is all NULL); otherwise out is all NULL and the status
 * says why: CG_E_UNAVAILABLE (a node is down or in its reconnect backoff: no connect attempt
 * is made before the backoff expires), CG_E_TIMEOUT (the call ran into timeout_ms),
 * CG_E_BAD_GATEWAY (a reply of the wrong type or size, a protocol error, too many redirects),
 * CG_E_AUTH (the password was refused), CG_E_VALUE (n == 0 or > 65536). Safe from many threads
 * at once. *elapsed_ns (may be NULL) receives the call's duration on every return. */
cg_status cg_remote_get(cg_remote *r, size_t n, const char *const *keys, cg_remote_value *out,
                        uint64_t *elapsed_ns) CG_WUR;
/* Releases the n values (r: the client that read them; NULL frees them without recycling) and
 * zeroes them. Safe from any thread while r is open. */
void cg_remote_values_free(cg_remote *r, cg_remote_value *v, size_t n);

/* Writes n values (vals[i] of lens[i] bytes, borrowed) under keys[i], pipelined and grouped
 * by node like cg_remote_get, with SET ... EX ttl_s when params.ttl_s > 0. Returns CG_OK when
 * every value was stored, else the first failure (some values may be stored): the statuses of
 * cg_remote_get, and CG_E_FULL when Redis is out of memory under a noeviction policy. */
cg_status cg_remote_set(cg_remote *r, size_t n, const char *const *keys, const void *const *vals,
                        const size_t *lens) CG_WUR;

/* Deletes n keys; *n_deleted (may be NULL) receives how many existed. */
cg_status cg_remote_del(cg_remote *r, size_t n, const char *const *keys, size_t *n_deleted) CG_WUR;

/* Runs one command (argv[0..argc), lens[i] bytes each, borrowed) on the node that serves the
 * slot of argv[key_arg], following MOVED/ASK. timeout_ms > 0 replaces params.timeout_ms for
 * this call (a blocking command such as XREAD BLOCK needs more than its block time).
 * CG_OK: *out is the reply (never an error reply), owned by the caller: cg_remote_reply_free;
 * otherwise *out is NULL and the statuses of cg_remote_get say why (an error reply is
 * CG_E_BAD_GATEWAY, CG_E_FULL or CG_E_AUTH). Safe from many threads at once; the reply is a
 * hiredis redisReply (include <hiredis/hiredis.h> to read it). */
struct redisReply;
cg_status cg_remote_command(cg_remote *r, int argc, const char *const *argv, const size_t *lens,
                            int key_arg, int timeout_ms, struct redisReply **out) CG_WUR;
/* One command of cg_remote_commands: argv[0..argc), lens[i] bytes each, borrowed; argv[key_arg]
 * picks the node. */
typedef struct cg_remote_cmd {
    int argc;
    const char *const *argv;
    const size_t *lens;
    int key_arg;
} cg_remote_cmd;
/* Runs n commands pipelined (one round trip per node), as cg_remote_command runs one. CG_OK
 * when every one succeeded: out[i] (out may be NULL: the replies are dropped) is its reply,
 * each freed with cg_remote_reply_free; otherwise the out[i] are NULL, and some commands may
 * have run (the caller must tolerate running a command twice when it retries). */
cg_status cg_remote_commands(cg_remote *r, size_t n, const cg_remote_cmd *cmds, int timeout_ms,
                             struct redisReply **out) CG_WUR;
/* Frees a reply of cg_remote_command; accepts *rep == NULL, sets *rep to NULL. */
void cg_remote_reply_free(struct redisReply **rep);

/* Health: PING every master (refreshing a cluster's slot map first when due). CG_OK when all
 * answered; otherwise the first failure. */
cg_status cg_remote_ping(cg_remote *r) CG_WUR;

/* Queues a write-behind of n values (one chunk's heads): keys and values are copied, the
 * background writer stores them with cg_remote_set's semantics. Never blocks on the network:
 * CG_OK when queued; CG_E_FULL when the queue is at queue_max_items or the values would pass
 * queue_max_bytes (the write is dropped and counted in stats.queue_drops); CG_E_VALUE for
 * n == 0 or a chunk larger than queue_max_bytes (also counted as a drop). */
cg_status cg_remote_put_async(cg_remote *r, size_t n, const char *const *keys,
                              const void *const *vals, const size_t *lens) CG_WUR;

/* The same, with a tag handed back to params.on_written. */
cg_status cg_remote_put_async_tag(cg_remote *r, size_t n, const char *const *keys,
                                  const void *const *vals, const size_t *lens, uint64_t tag) CG_WUR;

/* Waits until every write queued before the call has been attempted (written or failed),
 * for at most timeout_ms: CG_OK or CG_E_TIMEOUT. */
cg_status cg_remote_flush(cg_remote *r, int timeout_ms) CG_WUR;

/* Counters since open (monotonic) and gauges (now). */
typedef struct cg_remote_stats {
    uint64_t gets;          /* cg_remote_get calls */
    uint64_t hits;          /* ... that found every key */
    uint64_t misses;        /* ... that found a key missing */
    uint64_t bytes_read;    /* value bytes returned by hits */
    uint64_t sets;          /* values stored (sync and write-behind) */
    uint64_t bytes_written; /* value bytes stored */
    uint64_t dels;          /* keys deleted */
    uint64_t errors;        /* failed calls of any kind (get, set, del, ping, writer batches) */
    uint64_t errors_unavailable; /* ... CG_E_UNAVAILABLE: down, refused, in backoff */
    uint64_t errors_timeout;     /* ... CG_E_TIMEOUT */
    uint64_t errors_protocol;    /* ... CG_E_BAD_GATEWAY: wrong reply type/size, protocol */
    uint64_t errors_other;       /* ... anything else (CG_E_AUTH, CG_E_VALUE) */
    uint64_t fast_fails;         /* node uses refused during a backoff, without connecting */
    uint64_t queue_puts;         /* write-behind items queued */
    uint64_t queue_drops;        /* write-behind items dropped because the queue was full */
    uint64_t queue_failed;       /* queued items the writer could not store (or left at close) */
    uint64_t queue_depth;        /* gauge: items queued or being written */
    uint64_t queue_bytes;        /* gauge: value bytes queued or being written */
    uint64_t queue_writing;      /* gauge: items the writer is storing right now */
    uint64_t redirects_moved;    /* MOVED replies followed */
    uint64_t redirects_ask;      /* ASK replies followed */
    uint64_t connects;           /* connections established (handshake done) */
    uint64_t reconnects;         /* ... to a node whose previous attempt or connection failed */
    uint64_t connect_failures;   /* connection attempts that failed */
    uint64_t map_refreshes;      /* cluster slot maps loaded */
    uint64_t nodes;              /* gauge: nodes known (1 for a single node) */
} cg_remote_stats;

/* Snapshot of the counters (each read atomically; the set is not one instant). */
void cg_remote_stats_get(cg_remote *r, cg_remote_stats *out);

#endif
