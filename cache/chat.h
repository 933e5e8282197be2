/* Chat rendering: OpenAI-style messages plus an optional documents[] array into one prompt of
 * segments (system, chunks, question) that cg_split_prompt splits back identically. DESIGN §3.
 * Plain C (no JSON types) so the rule can be unit-tested and fuzzed on its own. */
#ifndef CG_CHAT_H
#define CG_CHAT_H

#include <stddef.h>

#include "base/base.h"
#include "cache/split.h"

typedef struct cg_chat_msg {
    const char *role;    /* borrowed, NUL-terminated, non-empty: "system", "developer", "user",
                            "assistant", "tool", ... */
    const char *content; /* borrowed; may be NULL when content_len is 0 */
    size_t content_len;
} cg_chat_msg;

/* Renders msgs[0..n_msgs) and docs[0..n_docs) (borrowed byte strings of doc_lens[i] bytes)
 * into text_out, and the segments into segs_out as offsets into text_out->data.
 *
 * The rule (README "Chat requests"):
 *  - every message content and every document is split by p->separator into parts, each
 *    trimmed of ASCII whitespace; empty parts are dropped and counted in
 *    segs_out->empty_skipped (a content or document without a separator is one part);
 *  - the segment sequence is: the parts of all system/developer messages in order, then the
 *    documents' parts in order, then, for each other message in order, every part but its
 *    last; and finally one question segment: for each non-system message in order a line
 *    "<role>: <last part>\n" ("<role>:\n" when it has no part), then "assistant:";
 *  - roles are positional as in cg_split_prompt: first segment system, last question;
 *  - segments are joined by pad + separator + pad, pad being the first of ' ', '\n', '\t',
 *    '\r', '\f', '\v' that does not occur in the separator (none if all do).
 * Passthrough (segs_out->passthrough = 1, n = 0, text_out empty): no message content
 * contains the separator and n_docs is 0, or fewer than two segments result.
 *
 * text_out: caller-initialised buffer (its max caps the rendering); reset first.
 * segs_out: caller-owned result (zero-initialised before first use), reset first.
 * p: NULL means cg_split_default_params(). Limits of p apply to the rendered segments.
 * Returns CG_OK, CG_E_UTF8 (any role, content or document), CG_E_SEGMENTS,
 * CG_E_SEGMENT_SIZE, CG_E_TOO_LARGE (text_out->max), or CG_E_VALUE (empty separator, NULL
 * role, or a rendering that would not split back into the same segments, which only an
 * unusual separator or role can cause). On error text_out and segs_out are empty. */
cg_status cg_chat_render(const cg_chat_msg *msgs, size_t n_msgs, const char *const *docs,
                         const size_t *doc_lens, size_t n_docs, const cg_split_params *p,
                         cg_buf *text_out, cg_split_result *segs_out) CG_WUR;

/* 1 if role names a system message ("system" or "developer"), else 0. */
int cg_chat_is_system_role(const char *role);

#endif
