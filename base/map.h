/* A chained hash map of intrusive entries (khash's role in h2o, shaped like base/list.h): a
 * struct joins a map through a cg_map_node member and carries its own fixed-size key, which the
 * map finds at a fixed distance from the node; CG_MAP_ENTRY goes back from the node to the
 * struct. Keys are compared byte for byte (a key type with padding needs it zeroed) and hashed
 * by the map, so they need not be uniform (chunk keys are, hex ids are not). Entries never move: a
 * pointer to one stays valid until its owner frees it. The table doubles when it holds as many
 * entries as buckets and never shrinks. Not locked: the owner's mutex covers the map and its
 * entries. */
#ifndef CG_MAP_H
#define CG_MAP_H

#include <stddef.h>

typedef struct cg_map_node {
    struct cg_map_node *next; /* bucket chain */
} cg_map_node;

typedef struct cg_map {
    cg_map_node **buckets; /* n_buckets chains (a power of two); NULL until the first add */
    size_t n_buckets, n;
    ptrdiff_t key_off; /* from an entry's node to its key */
    size_t key_len;
} cg_map;

/* The struct of type whose member node (not NULL) is. */
#define CG_MAP_ENTRY(node, type, member) ((type *)(void *)((char *)(node)-offsetof(type, member)))

/* Makes m an empty map of entries whose key lies key_off bytes after their node (negative:
 * before it) and is key_len bytes long. CG_MAP_INIT says it with the struct's member names. */
void cg_map_init(cg_map *m, ptrdiff_t key_off, size_t key_len);
#define CG_MAP_INIT(m, type, node_member, key_member)                                              \
    cg_map_init((m),                                                                               \
                (ptrdiff_t)offsetof(type, key_member) - (ptrdiff_t)offsetof(type, node_member),    \
                sizeof(((type *)0)->key_member))
/* Frees the buckets and leaves m empty (still initialised). The entries are the owner's: free
 * them first, through an iteration. */
void cg_map_free(cg_map *m);

/* The entry whose key equals key (key_len bytes, borrowed), or NULL. */
cg_map_node *cg_map_find(const cg_map *m, const void *key);
/* Adds node, whose key must be set and not be in m already (callers find first). The entry
 * stays the caller's; m only links it. */
void cg_map_add(cg_map *m, cg_map_node *node);
/* Takes node out of m; a node that is not in m is left alone. */
void cg_map_remove(cg_map *m, cg_map_node *node);

static inline size_t cg_map_count(const cg_map *m)
{
    return m->n;
}

/* Visits every entry once, in no particular order:
 *     cg_map_iter it = cg_map_iter_start(&m);
 *     for (cg_map_node *n; (n = cg_map_iter_next(&it));) ...
 * The loop may remove (and free) the entry it was just given, but must not add entries or
 * remove others. */
typedef struct cg_map_iter {
    const cg_map *m;
    size_t bucket;     /* next bucket to start */
    cg_map_node *next; /* next entry in the current chain */
} cg_map_iter;
cg_map_iter cg_map_iter_start(const cg_map *m);
/* The next entry, or NULL when all were visited. */
cg_map_node *cg_map_iter_next(cg_map_iter *it);

#endif
