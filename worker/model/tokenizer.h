/* Tokenizers of the worker behind one interface: Hugging Face tokenizer.json files (byte-level
 * BPE as in GPT-2, Llama 3, Qwen; SentencePiece-style BPE with byte fallback as in Llama 2 and
 * Mistral) with token-for-token parity to the `tokenizers` library, and the tiny generated
 * model's byte tokenizer. DESIGN §13.
 *
 * Encoding follows tokenizers' pipeline: added tokens are matched in the raw text (leftmost-
 * longest, with their lstrip/rstrip/single_word/normalized flags), the rest is normalized,
 * pre-tokenized and run through the BPE model; the post-processor's template (BOS) is applied
 * only when add_special is set. Special-token literals in the text are matched whatever
 * add_special says, as tokenizers does.
 *
 * A tokenizer is immutable after construction: encode, decode and the lookups may run
 * concurrently from any number of threads (the BPE cache inside is locked per shard). */
#ifndef CG_TOKENIZER_H
#define CG_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "base/base.h"
#include "base/status.h"

typedef struct cg_tokenizer cg_tokenizer;

/* tokenizer.json and tokenizer_config.json larger than this are refused (CG_E_TOO_LARGE). */
#define CG_TOKENIZER_MAX_FILE ((size_t)64 << 20)

/* A growable array of token ids. Zero-initialise it ({0}); encode appends to it, so the
 * segments of one prompt can be encoded into one array. Owns ids; free with cg_tokens_free. */
typedef struct cg_tokens {
    int32_t *ids;
    size_t n;
    size_t cap;
} cg_tokens;

/* Frees t->ids and zeroes *t; accepts NULL. */
void cg_tokens_free(cg_tokens *t);

/* Loads a Hugging Face tokenizer. path is a directory holding tokenizer.json (and optionally
 * tokenizer_config.json and chat_template.jinja), or the path of a tokenizer.json file whose
 * directory may hold those. tokenizer_config.json is read as transformers reads it: bos_token,
 * eos_token, add_bos_token / add_eos_token (which rebuild the template), the other named special
 * tokens, clean_up_tokenization_spaces, add_prefix_space (GPT-2 class) and chat_template; its
 * other keys are ignored, as are tokenizer.json's truncation and padding.
 * On success *out owns a new tokenizer (free with cg_tokenizer_free).
 * On failure *out is NULL and err (errlen bytes, may be NULL) names the file and the field:
 * CG_E_IO (unreadable), CG_E_TOO_LARGE (over CG_TOKENIZER_MAX_FILE), CG_E_JSON (not JSON),
 * CG_E_UNSUPPORTED (a component type or option this implementation does not have, e.g. a
 * Unigram model or BPE dropout), CG_E_VALUE (wrong types, missing fields, bad regexes, merges
 * or ids that do not fit the vocabulary). */
cg_status cg_tokenizer_new(const char *path, cg_tokenizer **out, char *err, size_t errlen) CG_WUR;

/* The same from objects already parsed: tok as tokenizer.json holds it, config (may be NULL)
 * as tokenizer_config.json does (its chat_template too). Both are borrowed. label names the
 * source in messages (e.g. a GGUF file whose metadata these objects were built from). */
struct json_t;
cg_status cg_tokenizer_new_json(struct json_t *tok, struct json_t *config, const char *label,
                                cg_tokenizer **out, char *err, size_t errlen) CG_WUR;

/* The tiny generated model's byte tokenizer: token b (0..255) is byte b, bos_id and eos_id
 * (both > 255, distinct) are special tokens without text. Encoding with add_special puts BOS
 * first; any bytes are accepted. On success *out owns a new tokenizer; CG_E_VALUE on bad ids. */
cg_status cg_tokenizer_new_bytes(int32_t bos_id, int32_t eos_id, cg_tokenizer **out, char *err,
                                 size_t errlen) CG_WUR;

/* Unicode normalization forms. */
typedef enum { CG_NF_C, CG_NF_D, CG_NF_KC, CG_NF_KD } cg_nf;

/* Appends s[0..n) (valid UTF-8) in normalization form form to out, exactly as Unicode defines
 * it (what tokenizers' normalizers and String.prototype.normalize give), in time O(n log n):
 * runs of combining marks of any length are reordered by a sort, not by swapping neighbours.
 * CG_E_UTF8 for invalid UTF-8, CG_E_TOO_LARGE when out's cap is reached, CG_E_INTERNAL if
 * utf8proc fails. */
cg_status cg_unicode_normalize(const char *s, size_t n, cg_nf form, cg_buf *out) CG_WUR;

/* Frees *t and sets it to NULL; accepts NULL. */
void cg_tokenizer_free(cg_tokenizer **t);

/* Encodes text[0..len) and appends the ids to out (grown with cg_realloc). With add_special the
 * post-processor's template is applied (Llama's BOS); special-token literals in the text are
 * matched either way. Returns CG_E_UTF8 when a tokenizer.json tokenizer is given invalid UTF-8
 * (out unchanged), CG_E_INTERNAL if the regex engine fails (out unchanged). */
cg_status cg_tokenizer_encode(const cg_tokenizer *t, const char *text, size_t len, int add_special,
                              cg_tokens *out) CG_WUR;

/* How cg_tokenizer_encode_opts encodes. */
typedef struct cg_encode_opts {
    int add_special;   /* apply the post-processor's template (BOS); default 1 */
    int split_special; /* special tokens' text in the input is plain text, not their control
                          token (Hugging Face's split_special_tokens); default 0: matched, as
                          Hugging Face does by default. Non-special added tokens still match. */
    size_t max_tokens; /* most ids to add (the template's included); more: CG_E_CONTEXT, out
                          unchanged, the work stopped soon after the limit; 0 = no limit */
    /* Asked between pieces of work (every piece between added tokens, every pre-token): when
     * it returns non-zero (the request went away) the encode stops with CG_E_UNAVAILABLE, out
     * unchanged. NULL = never. */
    int (*cancelled)(void *ud);
    void *cancel_ud;
} cg_encode_opts;

cg_encode_opts cg_encode_default_opts(void);

/* cg_tokenizer_encode with options o (borrowed). Also CG_E_CONTEXT past o->max_tokens, and
 * CG_E_UNAVAILABLE when o->cancelled said so. */
cg_status cg_tokenizer_encode_opts(const cg_tokenizer *t, const char *text, size_t len,
                                   const cg_encode_opts *o, cg_tokens *out) CG_WUR;

/* Decodes ids[0..n) as tokenizers' decode does (decoder chain, invalid UTF-8 replaced by
 * U+FFFD), then applies clean_up_tokenization_spaces when tokenizer_config.json sets it, as
 * transformers' decode does. skip_special drops special tokens. Ids outside the vocabulary are
 * skipped. Appends to out; CG_E_TOO_LARGE when out's cap is reached. */
cg_status cg_tokenizer_decode(const cg_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                              cg_buf *out) CG_WUR;

/* The raw bytes one generated token contributes to a stream: byte-level mapping undone, U+2581
 * turned into a space, <0xXX> turned into its byte, no leading-space strip (that belongs to the
 * start of a whole text, not to a continuation). The bytes may be a partial UTF-8 sequence.
 * Special tokens give their text (check cg_tokenizer_is_special to hide them); the byte
 * tokenizer's BOS/EOS and unknown ids give length 0. Returns a pointer borrowed from t, valid
 * until t is freed, and sets *len. */
const char *cg_tokenizer_token_bytes(const cg_tokenizer *t, int32_t id, size_t *len);

/* The vocabulary string of a token ("Ġhello", "▁the", "<|im_end|>"), borrowed from t, or NULL
 * for an unknown id. Not NUL-terminated in general: use *len. */
const char *cg_tokenizer_token_str(const cg_tokenizer *t, int32_t id, size_t *len);

/* Number of ids: one more than the largest id of the vocabulary and the added tokens. */
int32_t cg_tokenizer_vocab_size(const cg_tokenizer *t);

/* BOS / EOS ids from tokenizer_config.json (or the byte tokenizer's), -1 when there is none.
 * Without tokenizer_config.json, BOS is the special token the post-processor puts first. */
int32_t cg_tokenizer_bos(const cg_tokenizer *t);
int32_t cg_tokenizer_eos(const cg_tokenizer *t);

/* 1 when encode with add_special puts BOS (cg_tokenizer_bos) first. */
int cg_tokenizer_adds_bos(const cg_tokenizer *t);

/* Id of the token whose string is s (NUL-terminated): added tokens first, then the model's
 * vocabulary. -1 when there is none. */
int32_t cg_tokenizer_token_id(const cg_tokenizer *t, const char *s);

/* 1 if id is a special token: an added token marked special, a token tokenizer_config.json
 * names (bos_token, eos_token, unk/sep/pad/cls/mask_token, additional_special_tokens; these are
 * also matched in the text, as transformers does), or the byte tokenizer's BOS/EOS. */
int cg_tokenizer_is_special(const cg_tokenizer *t, int32_t id);

/* The chat template of tokenizer_config.json (its "default" entry when it holds several) or of
 * chat_template.jinja, borrowed from t; NULL when there is none. Rendering is done elsewhere. */
const char *cg_tokenizer_chat_template(const cg_tokenizer *t);

#endif
