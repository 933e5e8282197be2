/* An intrusive doubly linked list (h2o_linklist_t's role): a struct joins a list through a
 * cg_link member, and CG_LIST_ENTRY goes back from the link to the struct. Zeroed memory is an
 * empty list and an unlinked link. Not locked: the owner's mutex covers the list and its links. */
#ifndef CG_LIST_H
#define CG_LIST_H

#include <stddef.h>

typedef struct cg_link {
    struct cg_link *prev, *next;
} cg_link;

typedef struct cg_list {
    cg_link *head, *tail;
} cg_list;

/* The struct of type whose member link (not NULL) is. */
#define CG_LIST_ENTRY(link, type, member) ((type *)(void *)((char *)(link)-offsetof(type, member)))

static inline int cg_list_empty(const cg_list *l)
{
    return !l->head;
}

/* Puts e (unlinked) at the tail of l. */
static inline void cg_list_push_back(cg_list *l, cg_link *e)
{
    e->next = NULL;
    e->prev = l->tail;
    if (l->tail)
        l->tail->next = e;
    else
        l->head = e;
    l->tail = e;
}

/* Takes e off l and leaves it unlinked; an e that is not on l (unlinked) is left alone. */
static inline void cg_list_remove(cg_list *l, cg_link *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else if (l->head == e)
        l->head = e->next;
    else
        return;
    if (e->next)
        e->next->prev = e->prev;
    else
        l->tail = e->prev;
    e->prev = e->next = NULL;
}

/* Takes the head off l: NULL when l is empty. */
static inline cg_link *cg_list_pop_front(cg_list *l)
{
    cg_link *e = l->head;
    if (e) cg_list_remove(l, e);
    return e;
}

#endif
