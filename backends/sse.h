/* Incremental Server-Sent Events parser (WHATWG "event stream" interpretation) with capped
 * line and event sizes, for relaying an upstream's SSE answer event by event.
 *
 * Feed it bytes as they arrive, split anywhere (inside a line, between CR and LF); it calls
 * back once per complete event block, i.e. per run of lines ended by a blank line. Lines end
 * with CRLF, LF or CR. A leading UTF-8 BOM is skipped. "field: value" loses one space after
 * the colon; a line without a colon is a field with an empty value; a line starting with ':'
 * is a comment. Fields other than event/data/id/retry are ignored. An unfinished block at the
 * end of the input is dropped (cg_sse_finish reports it). The parser allocates only when it
 * is created and when a line or event outgrows its buffers, never beyond the caps. */
#ifndef CG_SSE_H
#define CG_SSE_H

#include <stddef.h>
#include "base/status.h"

typedef struct cg_sse_parser cg_sse_parser;

/* One event block. Every pointer is borrowed and valid only during the callback. */
typedef struct cg_sse_event {
    const char *event; /* the "event" field, "" when absent */
    size_t event_len;
    const char *data; /* the "data" lines joined by '\n' (no trailing '\n'); "" when none */
    size_t data_len;
    int has_data;   /* 1 when the block had at least one "data" line */
    const char *id; /* the "id" field of this block, "" when absent */
    size_t id_len;
    int has_id;
    long long retry;   /* the "retry" field when all digits, else -1 */
    size_t n_comments; /* comment lines in the block */
    const char *raw;   /* the block's exact bytes, its blank line included: relaying raw
                          reproduces the upstream byte for byte */
    size_t raw_len;
} cg_sse_event;

/* Called once per complete block, including blocks of comments only. */
typedef void (*cg_sse_event_fn)(void *arg, const cg_sse_event *ev);

typedef struct cg_sse_params {
    size_t max_line;  /* longest line in bytes without its end; default 1 MiB */
    size_t max_event; /* largest block in raw bytes; default 4 MiB */
} cg_sse_params;

cg_sse_params cg_sse_default_params(void);

/* New parser; the caller owns it (cg_sse_free). Caps of 0 take the defaults. */
cg_sse_parser *cg_sse_new(cg_sse_params p);
/* Frees the parser and sets *p to NULL; accepts NULL. */
void cg_sse_free(cg_sse_parser **p);

/* Parses buf[0..len) (borrowed), calling fn(arg, ev) for each block it completes.
 * Returns CG_OK, or CG_E_TOO_LARGE when a line or a block exceeds its cap; after an error
 * the parser refuses all further input with the same status. */
cg_status cg_sse_feed(cg_sse_parser *p, const char *buf, size_t len, cg_sse_event_fn fn,
                      void *arg) CG_WUR;

/* Ends the input. Returns 1 when an unfinished block (bytes after the last blank line) was
 * dropped, else 0. The parser is then reset for a new stream. */
int cg_sse_finish(cg_sse_parser *p);

/* Events completed since the parser was created or last finished. */
size_t cg_sse_events(const cg_sse_parser *p);

#endif
