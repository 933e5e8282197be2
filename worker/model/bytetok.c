/* Byte-level tokenizer of the tiny model: token b (0..255) is byte b; BOS and EOS come from the
 * config (256 and 257 for generated models). Every byte string round-trips exactly. */
#include "worker/model/model.h"

size_t cg_tok_encode(const cg_model *m, const char *text, size_t len, int add_bos, int32_t *out)
{
    size_t n = 0;
    if (add_bos) out[n++] = cg_model_cfg(m)->bos_id;
    for (size_t i = 0; i < len; i++) out[n++] = (int32_t)(unsigned char)text[i];
    return n;
}

size_t cg_tok_decode(const cg_model *m, int32_t t, char *out)
{
    const cg_model_config *c = cg_model_cfg(m);
    if (t < 0 || t > 255 || t == c->bos_id || t == c->eos_id) return 0; /* BOS, EOS and any other special token print nothing */
    *out = (char)(unsigned char)t;
    return 1;
}
