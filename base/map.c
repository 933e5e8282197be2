/* The one hash map (base/map.h): chains of intrusive nodes in a power-of-two bucket array. */
#include "base/map.h"

#include <stdint.h>
#include <string.h>

#include "base/base.h"

/* Buckets of the first table, allocated by the first add (the pool's and the disk tier's own
 * tables started at this size too). */
#define FIRST_BUCKETS 64

void cg_map_init(cg_map *m, ptrdiff_t key_off, size_t key_len)
{
    *m = (cg_map){.key_off = key_off, .key_len = key_len};
}

void cg_map_free(cg_map *m)
{
    cg_free(&m->buckets);
    m->n_buckets = m->n = 0;
}

static const void *key_of(const cg_map *m, const cg_map_node *node)
{
    return (const char *)node + m->key_off;
}

/* 64-bit words folded with multiply and xor-shift, then MurmurHash3's finalizer: every key
 * byte moves the low bits that pick the bucket. */
static uint64_t hash_bytes(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ len;
    while (len > 0) {
        uint64_t w = 0;
        size_t k = len < sizeof w ? len : sizeof w;
        memcpy(&w, p, k);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        p += k;
        len -= k;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static cg_map_node **bucket_of(const cg_map *m, const void *key)
{
    return &m->buckets[hash_bytes(key, m->key_len) & (m->n_buckets - 1)];
}

cg_map_node *cg_map_find(const cg_map *m, const void *key)
{
    if (m->n == 0) return NULL;
    for (cg_map_node *e = *bucket_of(m, key); e; e = e->next)
        if (memcmp(key_of(m, e), key, m->key_len) == 0) return e;
    return NULL;
}

/* Moves every entry into a table of n_buckets buckets. */
static void rehash(cg_map *m, size_t n_buckets)
{
    cg_map_node **old = m->buckets;
    size_t old_n = m->n_buckets;
    m->buckets = cg_calloc(n_buckets, sizeof *m->buckets);
    m->n_buckets = n_buckets;
    for (size_t i = 0; i < old_n; i++) {
        for (cg_map_node *e = old[i], *next; e; e = next) {
            next = e->next;
            cg_map_node **b = bucket_of(m, key_of(m, e));
            e->next = *b;
            *b = e;
        }
    }
    free(old);
}

void cg_map_add(cg_map *m, cg_map_node *node)
{
    if (m->n + 1 > m->n_buckets) rehash(m, m->n_buckets ? m->n_buckets * 2 : FIRST_BUCKETS);
    cg_map_node **b = bucket_of(m, key_of(m, node));
    node->next = *b;
    *b = node;
    m->n++;
}

void cg_map_remove(cg_map *m, cg_map_node *node)
{
    if (m->n == 0) return;
    for (cg_map_node **pp = bucket_of(m, key_of(m, node)); *pp; pp = &(*pp)->next) {
        if (*pp == node) {
            *pp = node->next;
            node->next = NULL;
            m->n--;
            return;
        }
    }
}

cg_map_iter cg_map_iter_start(const cg_map *m)
{
    return (cg_map_iter){.m = m};
}

cg_map_node *cg_map_iter_next(cg_map_iter *it)
{
    while (!it->next && it->bucket < it->m->n_buckets)
        it->next = it->m->buckets[it->bucket++];
    cg_map_node *e = it->next;
    if (e) it->next = e->next;
    return e;
}
