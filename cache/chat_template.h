/* Chat templates: renders a model's Jinja chat_template (tokenizer_config.json) the way
 * Hugging Face's apply_chat_template does, with the semantics of @huggingface/jinja (the
 * renderer the parity tests compare against; see tests/ref/render.mjs). */
#ifndef CG_CHAT_TEMPLATE_H
#define CG_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "base/base.h"
#include "base/status.h"

typedef struct cg_chat_template cg_chat_template;

/* Bounds on one render. Messages come from clients, so every render is bounded in output,
 * memory, work and nesting; crossing a bound fails the render with CG_E_TOO_LARGE. */
typedef struct cg_chat_template_limits {
    size_t max_output;  /* bytes of rendered text, and of any one string value */
    size_t max_memory;  /* bytes one render may allocate for values and text, cumulatively */
    uint64_t max_steps; /* evaluation steps: nodes, loop iterations, 64-byte units of string work */
    unsigned max_depth; /* nesting of evaluation: blocks, expressions, macro calls, data depth */
} cg_chat_template_limits;

/* Defaults: 16 MiB output, 256 MiB memory, 20 M steps, depth 1000. */
cg_chat_template_limits cg_chat_template_default_limits(void);

/* Parses a template (src need not be NUL-terminated; it is copied). limits may be NULL for the
 * defaults; they are kept with the template. Anything the renderer does not implement (an
 * unknown statement, filter, test, method or function) is refused here with
 * CG_E_UNSUPPORTED, a syntax error with CG_E_VALUE, a template over 1 MiB with
 * CG_E_TOO_LARGE; err (may be NULL) then says "line:column: what". On success *out is a new
 * template the caller frees with cg_chat_template_free(). */
cg_status cg_chat_template_new(const char *src, size_t len, const cg_chat_template_limits *limits,
                               cg_chat_template **out, char *err, size_t errlen) CG_WUR;

/* Renders t with the variables of vars (a JSON object or NULL, borrowed: messages,
 * add_generation_prompt, bos_token, eos_token, tools, documents, enable_thinking, ...) and
 * appends the text to out (whose own cap applies too). A template that calls
 * raise_exception(msg) fails with CG_E_VALUE and err holding exactly msg; a runtime error of
 * the template (say, a string method on a null content) fails with CG_E_VALUE and a
 * "line:column: what" message; a bound crossed fails with CG_E_TOO_LARGE; vars not an object,
 * or holding a name the renderer defines itself (true, none, range, namespace, ...), fails with
 * CG_E_TYPE / CG_E_VALUE. On failure out is unchanged. t is immutable: any number of threads
 * may render one template at once. */
cg_status cg_chat_template_render(const cg_chat_template *t, const json_t *vars, cg_buf *out,
                                  char *err, size_t errlen) CG_WUR;

/* Frees *t and sets it to NULL; accepts NULL and *t == NULL. */
void cg_chat_template_free(cg_chat_template **t);

#endif
