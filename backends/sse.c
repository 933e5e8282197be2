/* Incremental SSE parser: bytes in, one callback per complete event block. The current
 * block's raw bytes are the only copy of the input; lines are spans of it, so a line split
 * across feeds needs no extra buffer. */
#include "backends/sse.h"

#include <limits.h>
#include <string.h>
#include "base/base.h"

static const char BOM[] = "\xEF\xBB\xBF";

struct cg_sse_parser {
    cg_sse_params p;
    cg_buf raw;        /* bytes of the current block so far */
    size_t line_start; /* offset in raw of the current line */
    cg_buf data;       /* data lines, each followed by '\n' */
    cg_buf event, id;
    int has_data, has_id;
    long long retry;
    size_t n_comments;
    size_t n_lines; /* non-blank lines in the current block */
    int pending_cr; /* the previous byte was a CR: a following LF ends the same line */
    int drop_lf;    /* that CR ended a block already dispatched: drop the LF */
    int bom;        /* BOM bytes matched at the stream start; -1 once past it */
    size_t events;
    cg_status failed;
};

cg_sse_params cg_sse_default_params(void)
{
    cg_sse_params p;
    p.max_line = 1u << 20;
    p.max_event = 4u << 20;
    return p;
}

cg_sse_parser *cg_sse_new(cg_sse_params p)
{
    cg_sse_params d = cg_sse_default_params();
    cg_sse_parser *s = cg_calloc(1, sizeof *s);
    s->p.max_line = p.max_line ? p.max_line : d.max_line;
    s->p.max_event = p.max_event ? p.max_event : d.max_event;
    /* The line cap is enforced here, so the buffers only need the block cap, and event and
     * id, which hold one line's value, the line cap. */
    cg_buf_init(&s->raw, s->p.max_event);
    cg_buf_init(&s->data, s->p.max_event);
    cg_buf_init(&s->event, s->p.max_line);
    cg_buf_init(&s->id, s->p.max_line);
    s->retry = -1;
    return s;
}

void cg_sse_free(cg_sse_parser **pp)
{
    cg_sse_parser *s = *pp;
    if (!s) return;
    *pp = NULL;
    cg_buf_free(&s->raw);
    cg_buf_free(&s->data);
    cg_buf_free(&s->event);
    cg_buf_free(&s->id);
    free(s);
}

static void block_reset(cg_sse_parser *s)
{
    cg_buf_reset(&s->raw);
    cg_buf_reset(&s->data);
    cg_buf_reset(&s->event);
    cg_buf_reset(&s->id);
    s->line_start = 0;
    s->has_data = s->has_id = 0;
    s->retry = -1;
    s->n_comments = 0;
    s->n_lines = 0;
}

static int field_is(const char *name, size_t n, const char *want)
{
    return strlen(want) == n && memcmp(name, want, n) == 0;
}

/* Applies one non-blank line (borrowed from raw) to the current block. */
static cg_status process_line(cg_sse_parser *s, const char *line, size_t n)
{
    cg_status st = CG_OK;
    s->n_lines++;
    if (line[0] == ':') {
        s->n_comments++;
        return CG_OK;
    }
    const char *colon = memchr(line, ':', n);
    size_t name_len = colon ? (size_t)(colon - line) : n;
    const char *v = colon ? colon + 1 : line + n;
    size_t vn = (size_t)(line + n - v);
    if (vn && *v == ' ') {
        v++;
        vn--;
    }
    if (field_is(line, name_len, "data")) {
        s->has_data = 1;
        if ((st = cg_buf_append(&s->data, v, vn)) == CG_OK) st = cg_buf_append(&s->data, "\n", 1);
    } else if (field_is(line, name_len, "event")) {
        cg_buf_reset(&s->event);
        st = cg_buf_append(&s->event, v, vn);
    } else if (field_is(line, name_len, "id")) {
        if (!memchr(v, '\0', vn)) { /* the spec ignores ids containing NUL */
            cg_buf_reset(&s->id);
            st = cg_buf_append(&s->id, v, vn);
            s->has_id = 1;
        }
    } else if (field_is(line, name_len, "retry")) {
        long long r = 0;
        size_t i;
        for (i = 0; i < vn && v[i] >= '0' && v[i] <= '9'; i++) {
            if (r > (LLONG_MAX - 9) / 10) break; /* absurdly long: ignore the field */
            r = r * 10 + (v[i] - '0');
        }
        if (vn && i == vn) s->retry = r;
    }
    return st;
}

static void dispatch(cg_sse_parser *s, cg_sse_event_fn fn, void *arg)
{
    if (s->n_lines) {
        cg_sse_event ev;
        ev.event = s->event.len ? s->event.data : "";
        ev.event_len = s->event.len;
        ev.has_data = s->has_data;
        ev.data = s->data.len ? s->data.data : "";
        ev.data_len = s->data.len ? s->data.len - 1 : 0; /* the last '\n' is not data */
        ev.id = s->id.len ? s->id.data : "";
        ev.id_len = s->id.len;
        ev.has_id = s->has_id;
        ev.retry = s->retry;
        ev.n_comments = s->n_comments;
        ev.raw = s->raw.data;
        ev.raw_len = s->raw.len;
        s->events++;
        if (fn) fn(arg, &ev);
    }
    block_reset(s); /* a blank line ending no block leaves nothing behind */
}

/* Appends bytes of the current line or its terminator to the block, enforcing both caps. */
static cg_status take(cg_sse_parser *s, const char *p, size_t n, int is_line)
{
    if (is_line && s->raw.len - s->line_start + n > s->p.max_line) return CG_E_TOO_LARGE;
    return cg_buf_append(&s->raw, p, n);
}

static cg_status feed(cg_sse_parser *s, const char *buf, size_t len, cg_sse_event_fn fn, void *arg)
{
    cg_status st = CG_OK;
    size_t i = 0;
    while (i < len) {
        if (s->pending_cr) {
            int drop = s->drop_lf;
            s->pending_cr = s->drop_lf = 0;
            if (buf[i] == '\n') {
                if (!drop && (st = take(s, "\n", 1, 0)) != CG_OK) return st;
                s->line_start = s->raw.len;
                i++;
                continue;
            }
        }
        size_t j = i;
        while (j < len && buf[j] != '\n' && buf[j] != '\r')
            j++;
        if (j > i && (st = take(s, buf + i, j - i, 1)) != CG_OK) return st;
        if (j == len) break;

        size_t start = s->line_start, n = s->raw.len - start;
        if ((st = take(s, buf + j, 1, 0)) != CG_OK) return st;
        i = j + 1;
        if (buf[j] == '\r') {
            if (i < len && buf[i] == '\n') { /* CRLF in this buffer: keep it whole */
                if ((st = take(s, "\n", 1, 0)) != CG_OK) return st;
                i++;
            } else {
                s->pending_cr = 1;
            }
        }
        if (n) {
            if ((st = process_line(s, s->raw.data + start, n)) != CG_OK) return st;
            s->line_start = s->raw.len;
        } else {
            /* Dispatch now rather than wait for a possible LF: the event must not wait for
             * the upstream's next bytes. That LF is then dropped (the CR already ended the
             * line for any reader). */
            s->drop_lf = s->pending_cr;
            dispatch(s, fn, arg);
        }
    }
    return CG_OK;
}

cg_status cg_sse_feed(cg_sse_parser *s, const char *buf, size_t len, cg_sse_event_fn fn, void *arg)
{
    if (s->failed != CG_OK) return s->failed;
    if (s->bom >= 0) {
        /* Skip a UTF-8 BOM at the stream start, even when it arrives split across feeds. */
        size_t i = 0;
        while (i < len && s->bom < 3 && (unsigned char)buf[i] == (unsigned char)BOM[s->bom]) {
            s->bom++;
            i++;
        }
        if (s->bom == 3) {
            s->bom = -1;
        } else if (i == len) {
            return CG_OK; /* still a BOM prefix: wait for more */
        } else {
            /* Not a BOM after all: what matched so far is ordinary input. */
            int matched = s->bom;
            s->bom = -1;
            cg_status st = feed(s, BOM, (size_t)matched, fn, arg);
            if (st != CG_OK) return s->failed = st;
        }
        buf += i;
        len -= i;
    }
    cg_status st = feed(s, buf, len, fn, arg);
    if (st != CG_OK) s->failed = st;
    return st;
}

int cg_sse_finish(cg_sse_parser *s)
{
    int partial = s->raw.len > 0 || (s->bom > 0);
    block_reset(s);
    s->pending_cr = s->drop_lf = 0;
    s->bom = 0;
    s->events = 0;
    s->failed = CG_OK;
    return partial;
}

size_t cg_sse_events(const cg_sse_parser *s)
{
    return s->events;
}
