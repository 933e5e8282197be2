/* The one hash map (base/map.h): entries are found by their key bytes wherever the key sits in
 * the struct; the table grows without moving entries; keys that share a bucket, or all but one
 * byte, stay apart; removal works at any place in a chain and leaves absent nodes alone; an
 * iteration visits every entry once and may remove the one it was given. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "tests/harness/harness.h"
#include "base/base.h"
#include "base/map.h"

/* Key after the node, as the pool's chunks and the disk tier's records have it. */
typedef struct item {
    cg_map_node node;
    uint8_t key[16];
    int value, seen;
} item;

/* Key before the node, as the live assemblies' ids are: a negative offset. */
typedef struct named {
    char id[33];
    cg_map_node node;
} named;

/* A map of items and the items it may hold: v[i] has value i and a key of its own. */
typedef struct items {
    cg_map m;
    item *v;
    size_t n;
} items;

static void key_of(uint32_t i, uint8_t out[16])
{
    uint64_t s = i, a = th_splitmix64(&s), b = th_splitmix64(&s);
    memcpy(out, &a, 8);
    memcpy(out + 8, &b, 8);
}

/* n items, none in the (empty) map yet. items_free gives them back. */
static items items_new(size_t n)
{
    items t = {.v = cg_calloc(n, sizeof *t.v), .n = n};
    CG_MAP_INIT(&t.m, item, node, key);
    for (size_t i = 0; i < n; i++) {
        key_of((uint32_t)i, t.v[i].key);
        t.v[i].value = (int)i;
    }
    return t;
}

static void items_free(items *t)
{
    cg_map_free(&t->m);
    cg_free(&t->v);
}

static void add_all(items *t)
{
    for (size_t i = 0; i < t->n; i++)
        cg_map_add(&t->m, &t->v[i].node);
}

static item *find(const items *t, const uint8_t key[16])
{
    cg_map_node *n = cg_map_find(&t->m, key);
    return n ? CG_MAP_ENTRY(n, item, node) : NULL;
}

/* Asserts that each of the first n items is found by its key, at its own address. */
static void expect_found(const items *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_ptr_eq(find(t, t->v[i].key), &t->v[i]);
}

static size_t longest_chain(const cg_map *m)
{
    size_t most = 0;
    for (size_t b = 0; b < m->n_buckets; b++) {
        size_t len = 0;
        for (cg_map_node *n = m->buckets[b]; n; n = n->next)
            len++;
        if (len > most) most = len;
    }
    return most;
}

START_TEST(insert_find_remove)
{
    items t = items_new(3);
    item stray = {0}; /* never added */
    key_of(99, stray.key);
    ck_assert_ptr_null(find(&t, t.v[0].key)); /* empty, no table yet */
    cg_map_remove(&t.m, &t.v[0].node);        /* absent: left alone */
    cg_map_iter it = cg_map_iter_start(&t.m);
    ck_assert_ptr_null(cg_map_iter_next(&it)); /* nothing to visit */
    ck_assert_uint_eq(cg_map_count(&t.m), 0);
    add_all(&t);
    ck_assert_uint_eq(cg_map_count(&t.m), 3);
    expect_found(&t, 3);
    ck_assert_ptr_null(find(&t, stray.key));
    cg_map_remove(&t.m, &stray.node); /* absent from a full table: left alone */
    ck_assert_uint_eq(cg_map_count(&t.m), 3);
    expect_found(&t, 3);
    cg_map_remove(&t.m, &t.v[1].node);
    ck_assert_uint_eq(cg_map_count(&t.m), 2);
    ck_assert_ptr_null(find(&t, t.v[1].key));
    ck_assert_ptr_eq(find(&t, t.v[0].key), &t.v[0]);
    ck_assert_ptr_eq(find(&t, t.v[2].key), &t.v[2]);
    cg_map_remove(&t.m, &t.v[1].node); /* removed twice: nothing changes */
    ck_assert_uint_eq(cg_map_count(&t.m), 2);
    cg_map_add(&t.m, &t.v[1].node); /* and back */
    expect_found(&t, 3);
    cg_map_free(&t.m);
    ck_assert_uint_eq(cg_map_count(&t.m), 0);
    ck_assert_ptr_null(find(&t, t.v[0].key));
    cg_map_add(&t.m, &t.v[2].node); /* usable again after free */
    ck_assert_ptr_eq(find(&t, t.v[2].key), &t.v[2]);
    items_free(&t);
}
END_TEST

START_TEST(growth_keeps_every_entry_in_place)
{
    items t = items_new(20000);
    size_t grew = 0, buckets = 0;
    for (size_t i = 0; i < t.n; i++) {
        cg_map_add(&t.m, &t.v[i].node);
        if (t.m.n_buckets != buckets) {
            ck_assert_uint_eq(t.m.n_buckets & (t.m.n_buckets - 1), 0); /* a power of two */
            ck_assert_uint_ge(t.m.n_buckets, cg_map_count(&t.m));
            buckets = t.m.n_buckets;
            grew++;
        }
        /* what was added before a growth is still found, at the same address */
        if (i % 997 == 0) expect_found(&t, i + 1);
    }
    ck_assert_uint_ge(grew, 8); /* 64 buckets doubled up past 20000 */
    ck_assert_uint_ge(t.m.n_buckets, t.n);
    ck_assert_uint_le(t.m.n_buckets, 2 * t.n);
    expect_found(&t, t.n);
    /* uniform keys spread: no chain is long at load factor up to 1 */
    ck_assert_uint_le(longest_chain(&t.m), 16);
    items_free(&t);
}
END_TEST

START_TEST(colliding_keys_stay_apart)
{
    /* 200 keys that differ in one byte only, the last: a hash of the first word alone would
     * put them all in one bucket. */
    items t = items_new(200);
    for (size_t i = 0; i < t.n; i++) {
        memset(t.v[i].key, 0xab, sizeof t.v[i].key);
        t.v[i].key[15] = (uint8_t)i;
    }
    add_all(&t);
    expect_found(&t, t.n);
    ck_assert_uint_le(longest_chain(&t.m), 12);

    /* Entries that do share a bucket: a chain of at least three, its middle, head and tail
     * removed in turn while the others stay found. */
    size_t b = 0;
    for (; b < t.m.n_buckets; b++)
        if (t.m.buckets[b] && t.m.buckets[b]->next && t.m.buckets[b]->next->next) break;
    ck_assert_uint_lt(b, t.m.n_buckets); /* 200 keys in 256 buckets: about a dozen chains do */
    item *chain[3];
    cg_map_node *n = t.m.buckets[b];
    for (int i = 0; i < 3; i++, n = n->next)
        chain[i] = CG_MAP_ENTRY(n, item, node);
    int order[3] = {1, 0, 2};
    for (int k = 0; k < 3; k++) {
        cg_map_remove(&t.m, &chain[order[k]]->node);
        ck_assert_ptr_null(find(&t, chain[order[k]]->key));
        for (int j = k + 1; j < 3; j++)
            ck_assert_ptr_eq(find(&t, chain[order[j]]->key), chain[order[j]]);
    }
    ck_assert_uint_eq(cg_map_count(&t.m), t.n - 3);
    items_free(&t);
}
END_TEST

START_TEST(iteration_visits_each_once_and_may_remove)
{
    items t = items_new(1000);
    add_all(&t);
    size_t visits = 0;
    cg_map_iter it = cg_map_iter_start(&t.m);
    for (cg_map_node *n; (n = cg_map_iter_next(&it));) {
        item *e = CG_MAP_ENTRY(n, item, node);
        e->seen++;
        visits++;
        if (e->value % 2) cg_map_remove(&t.m, n); /* the one just given */
    }
    ck_assert_uint_eq(visits, t.n);
    for (size_t i = 0; i < t.n; i++) {
        ck_assert_int_eq(t.v[i].seen, 1);
        ck_assert_ptr_eq(find(&t, t.v[i].key), i % 2 ? NULL : &t.v[i]);
    }
    ck_assert_uint_eq(cg_map_count(&t.m), t.n / 2);
    visits = 0;
    it = cg_map_iter_start(&t.m);
    for (cg_map_node *n; (n = cg_map_iter_next(&it));) {
        ck_assert_int_eq(CG_MAP_ENTRY(n, item, node)->value % 2, 0);
        visits++;
    }
    ck_assert_uint_eq(visits, t.n / 2);
    items_free(&t);
}
END_TEST

START_TEST(key_before_the_node)
{
    /* Hex ids share their alphabet: bytes far from uniform, and the key sits before the node. */
    enum { N = 300 };
    cg_map m;
    CG_MAP_INIT(&m, named, node, id);
    ck_assert_int_lt(m.key_off, 0);
    ck_assert_uint_eq(m.key_len, 33);
    named *v = cg_calloc(N, sizeof *v);
    for (int i = 0; i < N; i++) {
        snprintf(v[i].id, sizeof v[i].id, "%032x", i * 7919);
        cg_map_add(&m, &v[i].node);
    }
    for (int i = 0; i < N; i++) {
        char id[33];
        snprintf(id, sizeof id, "%032x", i * 7919);
        cg_map_node *n = cg_map_find(&m, id);
        ck_assert_ptr_nonnull(n);
        ck_assert_ptr_eq(CG_MAP_ENTRY(n, named, node), &v[i]);
    }
    ck_assert_ptr_null(cg_map_find(&m, "00000000000000000000000000000001"));
    ck_assert_uint_le(longest_chain(&m), 12);
    cg_map_free(&m);
    free(v);
}
END_TEST

int main(void)
{
    return th_run_tests("map", "core", 60,
                        TH_TESTS(insert_find_remove, growth_keeps_every_entry_in_place,
                                 colliding_keys_stay_apart,
                                 iteration_visits_each_once_and_may_remove, key_before_the_node));
}
