/* Tests of the incremental SSE parser (backends/sse.c): field rules, line ends, splits at
 * every byte boundary, BOM, caps, raw bytes, and a seeded random split-invariance check. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/sse.h"
#include "base/base.h"
#include "tests/harness/harness.h"

/* Collects events as one line of text each, and the raw bytes of all events. */
typedef struct sink {
    cg_buf text;
    cg_buf raw;
    int n;
} sink;

static void sink_init(sink *s)
{
    cg_buf_init_unbounded(&s->text);
    cg_buf_init_unbounded(&s->raw);
    s->n = 0;
}

static void sink_free(sink *s)
{
    cg_buf_free(&s->text);
    cg_buf_free(&s->raw);
}

static void collect(void *arg, const cg_sse_event *ev)
{
    sink *s = arg;
    cg_status st =
        cg_buf_printf(&s->text, "[E=%.*s|D%d=%.*s|I%d=%.*s|R=%lld|C=%zu]", (int)ev->event_len,
                      ev->event, ev->has_data, (int)ev->data_len, ev->data, ev->has_id,
                      (int)ev->id_len, ev->id, ev->retry, ev->n_comments);
    ck_assert_int_eq(st, CG_OK);
    ck_assert_int_eq(cg_buf_append(&s->raw, ev->raw, ev->raw_len), CG_OK);
    s->n++;
}

static const char *text_of(sink *s)
{
    return s->text.data ? s->text.data : "";
}

/* Parses input in one feed. */
static void parse_whole(const char *in, size_t len, sink *s)
{
    cg_sse_parser *p = cg_sse_new(cg_sse_default_params());
    ck_assert_int_eq(cg_sse_feed(p, in, len, collect, s), CG_OK);
    cg_sse_finish(p);
    cg_sse_free(&p);
    ck_assert_ptr_null(p);
}

/* A parser with the default parameters, feeding a sink. */
typedef struct feeder {
    sink s;
    cg_sse_parser *p;
} feeder;

static void feeder_open(feeder *f, cg_sse_params prm)
{
    sink_init(&f->s);
    f->p = cg_sse_new(prm);
}

/* Feeds n bytes; returns the parser's status. */
static cg_status feed(feeder *f, const char *d, size_t n)
{
    return cg_sse_feed(f->p, d, n, collect, &f->s);
}

/* Feeds n bytes; asserts the parser accepts them. */
static void feed_ok(feeder *f, const char *d, size_t n)
{
    ck_assert_int_eq(feed(f, d, n), CG_OK);
}

static void feeder_close(feeder *f)
{
    cg_sse_free(&f->p);
    sink_free(&f->s);
}

/* Parses in (len bytes) in one feed: asserts n events that read as text and, when raw is set,
 * raw bytes that reproduce the input. */
static void expect_events(const char *in, size_t len, int n, const char *text, int raw)
{
    sink s;
    sink_init(&s);
    parse_whole(in, len, &s);
    ck_assert_int_eq(s.n, n);
    ck_assert_str_eq(text_of(&s), text);
    if (raw) ck_assert_str_eq(s.raw.data, in);
    sink_free(&s);
}

/* One feed and the number of events the sink must hold after it. */
typedef struct piece {
    const char *d;
    int events;
} piece;

/* Feeds the pieces in turn to a parser with the default parameters, each accepted and followed
 * by its count of events: asserts the events read as text and their raw bytes as raw. */
static void expect_pieces(const piece *pieces, size_t n, const char *text, const char *raw)
{
    feeder f;
    feeder_open(&f, cg_sse_default_params());
    for (size_t i = 0; i < n; i++) {
        feed_ok(&f, pieces[i].d, strlen(pieces[i].d));
        ck_assert_msg(f.s.n == pieces[i].events, "after piece %zu: %d events, want %d", i, f.s.n,
                      pieces[i].events);
    }
    ck_assert_str_eq(text_of(&f.s), text);
    ck_assert_str_eq(f.s.raw.data, raw);
    feeder_close(&f);
}

START_TEST(basic_event)
{
    const char *in = "data: hello\n\n";
    expect_events(in, strlen(in), 1, "[E=|D1=hello|I0=|R=-1|C=0]", 1);
}
END_TEST

START_TEST(field_rules)
{
    /* one space after the colon is dropped, only one; a line without colon is a field with an
     * empty value; unknown fields are ignored; data lines join with '\n'. */
    const char *in =
        "event: add\nid: 7\nretry: 1500\ndata:  two\ndata\nfoo: bar\n: note\ndata:x\n\n";
    expect_events(in, strlen(in), 1, "[E=add|D1= two\n\nx|I1=7|R=1500|C=1]", 0);
}
END_TEST

START_TEST(data_empty_and_comment_only)
{
    const char *in = "data:\n\n: only a comment\n\n\n\n\nretry: 12a\n\n";
    /* blank lines that end no block produce nothing */
    expect_events(in, strlen(in), 3,
                  "[E=|D1=|I0=|R=-1|C=0][E=|D0=|I0=|R=-1|C=1][E=|D0=|I0=|R=-1|C=0]", 0);
}
END_TEST

START_TEST(line_endings)
{
    const char *in = "data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r";
    expect_events(in, strlen(in), 2, "[E=|D1=a\nb\nc|I0=|R=-1|C=0][E=|D1=d|I0=|R=-1|C=0]", 1);
}
END_TEST

START_TEST(id_with_nul_ignored)
{
    const char in[] = "id: a\0b\ndata: x\n\n";
    expect_events(in, sizeof in - 1, 1, "[E=|D1=x|I0=|R=-1|C=0]", 0);
}
END_TEST

/* Every split of the input into two feeds, and byte-by-byte feeding, give the same events as
 * one feed, and the raw bytes reproduce the input. */
START_TEST(every_split_point)
{
    const char *in = "\xEF\xBB\xBF"
                     "event: e1\r\ndata: {\"a\":1}\r\n\r\n: c\n\nid: 3\ndata: x\ndata: y\n\n"
                     "data: last\r\n\r\n";
    size_t len = strlen(in);
    sink whole;
    sink_init(&whole);
    parse_whole(in, len, &whole);
    ck_assert_int_eq(whole.n, 4);
    ck_assert_str_eq(whole.raw.data, in + 3); /* the BOM is not part of any event */
    feeder f;
    for (size_t cut = 0; cut <= len; cut++) {
        feeder_open(&f, cg_sse_default_params());
        feed_ok(&f, in, cut);
        feed_ok(&f, in + cut, len - cut);
        ck_assert_int_eq(cg_sse_finish(f.p), 0);
        ck_assert_msg(!strcmp(text_of(&f.s), text_of(&whole)), "cut at %zu: %s", cut,
                      text_of(&f.s));
        feeder_close(&f);
    }
    feeder_open(&f, cg_sse_default_params());
    for (size_t i = 0; i < len; i++)
        feed_ok(&f, in + i, 1);
    ck_assert_str_eq(text_of(&f.s), text_of(&whole));
    ck_assert_uint_eq(cg_sse_events(f.p), 4);
    feeder_close(&f);
    sink_free(&whole);
}
END_TEST

/* A block ended by CR dispatches at once; its LF arriving in the next feed is dropped rather
 * than starting the next block's raw bytes. */
START_TEST(crlf_split_at_block_end)
{
    static const piece p[] = {{"data: a\r\n\r", 1 /* not waiting for the LF */},
                              {"\ndata: b\n\n", 2}};
    expect_pieces(p, CG_ARRAY_LEN(p), "[E=|D1=a|I0=|R=-1|C=0][E=|D1=b|I0=|R=-1|C=0]",
                  "data: a\r\n\rdata: b\n\n");
}
END_TEST

START_TEST(bom_variants)
{
    /* A BOM split over three feeds is skipped: no event holds it. */
    static const piece split[] = {{"\xEF", 0},
                                  {"\xBB", 0},
                                  {"\xBF"
                                   "data: z\n\n",
                                   1}};
    expect_pieces(split, CG_ARRAY_LEN(split), "[E=|D1=z|I0=|R=-1|C=0]", "data: z\n\n");

    /* A BOM prefix that turns out not to be one is ordinary input: here it makes the field
     * name unknown, so the block has no data. */
    static const piece partial[] = {{"\xEF\xBB", 0}, {"data: z\n\ndata: ok\n\n", 2}};
    expect_pieces(partial, CG_ARRAY_LEN(partial), "[E=|D0=|I0=|R=-1|C=0][E=|D1=ok|I0=|R=-1|C=0]",
                  "\xEF\xBB"
                  "data: z\n\ndata: ok\n\n");

    /* Only the stream start may hold a BOM. */
    const char *in = "data: a\n\n\xEF\xBB\xBF"
                     "data: b\n\n";
    expect_events(in, strlen(in), 2, "[E=|D1=a|I0=|R=-1|C=0][E=|D0=|I0=|R=-1|C=0]", 0);
}
END_TEST

START_TEST(line_cap)
{
    cg_sse_params prm = {.max_line = 16, .max_event = 1024};
    feeder f;
    feeder_open(&f, prm);
    /* exactly 16 bytes is fine */
    feed_ok(&f, "data: 0123456789\n\n", 18);
    ck_assert_int_eq(f.s.n, 1);
    /* 17 bytes split across feeds is refused, and the parser stays failed */
    feed_ok(&f, "data: 01234", 11);
    ck_assert_int_eq(feed(&f, "567890", 6), CG_E_TOO_LARGE);
    ck_assert_int_eq(feed(&f, "\n\n", 2), CG_E_TOO_LARGE);
    ck_assert_int_eq(f.s.n, 1);
    /* finish resets it for a new stream */
    ck_assert_int_eq(cg_sse_finish(f.p), 1);
    feed_ok(&f, "data: ok\n\n", 10);
    ck_assert_int_eq(f.s.n, 2);
    feeder_close(&f);
}
END_TEST

START_TEST(event_cap)
{
    cg_sse_params prm = {.max_line = 64, .max_event = 40};
    feeder f;
    feeder_open(&f, prm);
    /* short lines, but the block grows past 40 bytes */
    cg_status st = CG_OK;
    for (int i = 0; i < 10 && st == CG_OK; i++)
        st = feed(&f, "data: abc\n", 10);
    ck_assert_int_eq(st, CG_E_TOO_LARGE);
    ck_assert_int_eq(f.s.n, 0);
    feeder_close(&f);
}
END_TEST

START_TEST(finish_drops_partial)
{
    feeder f;
    feeder_open(&f, cg_sse_default_params());
    feed_ok(&f, "data: a\n\ndata: cut", 18);
    ck_assert_int_eq(f.s.n, 1);
    ck_assert_int_eq(cg_sse_finish(f.p), 1);
    ck_assert_int_eq(f.s.n, 1);
    ck_assert_int_eq(cg_sse_finish(f.p), 0);
    feed_ok(&f, "data: new\n\n", 11);
    ck_assert_str_eq(text_of(&f.s), "[E=|D1=a|I0=|R=-1|C=0][E=|D1=new|I0=|R=-1|C=0]");
    feeder_close(&f);
    cg_sse_free(&f.p); /* NULL-safe */
}
END_TEST

/* Random inputs over a small alphabet rich in separators, fed in random pieces, give the same
 * events as one feed (seeded, so a failure reproduces). */
START_TEST(random_split_invariance)
{
    static const char alpha[] = "data: \r\n\n:eventid x";
    unsigned seed = 12345;
    for (int round = 0; round < 2000; round++) {
        char in[200];
        size_t len = (size_t)(rand_r(&seed) % (int)sizeof in);
        for (size_t i = 0; i < len; i++)
            in[i] = alpha[rand_r(&seed) % (int)(sizeof alpha - 1)];
        sink whole;
        sink_init(&whole);
        parse_whole(in, len, &whole);
        feeder parts;
        feeder_open(&parts, cg_sse_default_params());
        for (size_t at = 0; at < len;) {
            size_t n = 1 + (size_t)(rand_r(&seed) % 7);
            if (n > len - at) n = len - at;
            feed_ok(&parts, in + at, n);
            at += n;
        }
        ck_assert_msg(!strcmp(text_of(&whole), text_of(&parts.s)), "round %d differs", round);
        feeder_close(&parts);
        sink_free(&whole);
    }
}
END_TEST

int main(void)
{
    return th_run_tests("sse", "parser", 0,
                        TH_TESTS(basic_event, field_rules, data_empty_and_comment_only,
                                 line_endings, id_with_nul_ignored, every_split_point,
                                 crlf_split_at_block_end, bom_variants, line_cap, event_cap,
                                 finish_drops_partial, random_split_invariance));
}
