/* Chat requests as JSON (OpenAI chat completions), shared by the gateway and the worker: the
 * messages and documents of a body as rows, the two renderings of a chat into one prompt (a
 * model's own chat template with the documents in the system message, DESIGN §13, or the
 * plain one-line-per-message form of models without a template), and the conversions between
 * the chat and completions shapes of requests and answers. */
#ifndef CG_CHATREQ_H
#define CG_CHATREQ_H

#include <jansson.h>
#include <stddef.h>

#include "base/base.h"
#include "base/status.h"
#include "cache/chat.h"
#include "cache/chat_template.h"

/* A chat body's messages and documents. Rows borrow their strings from the body (which must
 * outlive them), except content arrays of text parts, which are joined with '\n' into parts. */
typedef struct cg_chat_req {
    cg_chat_msg *msgs; /* owned rows */
    size_t n_msgs;
    cg_buf *parts;     /* owned: joined text parts, one buffer per message */
    const char **docs; /* owned array of borrowed strings */
    size_t *doc_lens;  /* owned */
    size_t n_docs;
    int non_text; /* a content part of another type (image, audio) was skipped */
} cg_chat_req;

/* Parses body's messages (required, non-empty; role a non-empty string; content a string or
 * an array of {type, ...} parts, and null or absent only for an assistant turn, as OpenAI
 * requires) and documents (optional array of strings) into
 * *out (zeroed first). On failure returns CG_E_MISSING / CG_E_TYPE / CG_E_VALUE, sets *param to
 * "messages" or "documents" and msg to a message; *out must still be freed. */
cg_status cg_chat_req_parse(json_t *body, cg_chat_req *out, const char **param, char *msg,
                            size_t msglen) CG_WUR;
/* Frees what r owns and zeroes it; accepts a zeroed r. */
void cg_chat_req_free(cg_chat_req *r);

/* The plain rendering without separators: one line "<role>: <text>" per message (text parts
 * only), then "assistant:". Appends to out (whose cap applies). */
cg_status cg_chat_req_render_flat(const cg_chat_req *r, cg_buf *out) CG_WUR;

/* A model's chat template with the strings of its special tokens, shared by reference (one
 * template may serve any number of renders at once). */
typedef struct cg_chat_model cg_chat_model;

/* Compiles src (a Jinja chat_template) with bos / eos (token strings, NULL when the model has
 * none). On success *out holds one reference. A template the renderer cannot run is refused:
 * CG_E_UNSUPPORTED or CG_E_VALUE with err saying "line:column: what". */
cg_status cg_chat_model_new(const char *src, const char *bos, const char *eos, cg_chat_model **out,
                            char *err, size_t errlen) CG_WUR;
/* Takes one more reference; returns m. */
cg_chat_model *cg_chat_model_ref(cg_chat_model *m);
/* Drops one reference (freeing on the last) and sets *m to NULL; accepts NULL. */
void cg_chat_model_unref(cg_chat_model **m);
/* The template's source (borrowed). */
const char *cg_chat_model_source(const cg_chat_model *m);

/* How one chat is rendered with a template. */
typedef struct cg_chat_render_opts {
    const char *separator;     /* joins the documents into the system message */
    int add_generation_prompt; /* the template's add_generation_prompt */
    const json_t *kwargs;      /* borrowed object or NULL: more template variables
                                  (chat_template_kwargs, e.g. enable_thinking) */
} cg_chat_render_opts;

/* Most keys chat_template_kwargs may have: each is a template variable, and real templates
 * read a handful (enable_thinking, tools); the cap bounds what one request costs. */
#define CG_CHAT_MAX_KWARGS 400

/* Checks chat_template_kwargs (borrowed, may be NULL): CG_OK, or CG_E_VALUE with msg (n bytes)
 * saying it has more than CG_CHAT_MAX_KWARGS keys. */
cg_status cg_chat_kwargs_check(const json_t *kwargs, char *msg, size_t n) CG_WUR;

/* Renders r with the model's template as apply_chat_template does, after putting the
 * documents into the system message (DESIGN §13): the first message with role "system" gets
 * " <sep> <doc>" for each document and a final " <sep> ", so each document is a segment of its
 * own and the rest of the rendering follows as the question; without a system message one is
 * put first holding "<sep> <doc> ... <sep> ". Messages reach the template as {role, content}
 * with content a string (or null). Appends to out. r->non_text is refused (CG_E_UNSUPPORTED):
 * a template rendering of text alone would silently drop the other parts. A template error
 * (raise_exception, roles that do not alternate) is CG_E_VALUE with err holding its message, as
 * are kwargs that cg_chat_kwargs_check refuses;
 * CG_E_TOO_LARGE when out's cap or the render bounds are crossed. */
cg_status cg_chat_model_render(const cg_chat_model *m, const cg_chat_req *r,
                               const cg_chat_render_opts *o, cg_buf *out, char *err,
                               size_t errlen) CG_WUR;

/* A completions request body for a chat request: model, prompt, the sampling fields that mean
 * the same in both APIs, max_completion_tokens (or max_tokens) as max_tokens, and chat
 * logprobs (logprobs: true, top_logprobs: k) as logprobs: k. New reference. */
json_t *cg_chat_as_completion(json_t *body, const char *prompt, size_t prompt_len);

/* Rewrites a text_completion answer obj (or one streamed chunk) in place as a chat.completion
 * (chat.completion.chunk when stream), logprobs included. first: the first streamed chunk,
 * whose delta carries the role. */
void cg_chat_answer_shape(json_t *obj, int stream, int first);

#endif
