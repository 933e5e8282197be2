/* RoPE kernels: rotate at absolute positions (model forward) and re-rotate stored K by a
 * position delta (remap of a cached chunk to its new offset). DESIGN §6. */
#ifndef CG_REMAP_H
#define CG_REMAP_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    CG_ROPE_HALF,        /* HF/NeoX: pairs (i, i + d/2) */
    CG_ROPE_INTERLEAVED, /* GPT-J: pairs (2i, 2i + 1) */
} cg_rope_style;

typedef struct cg_rope {
    int head_dim; /* even */
    double theta; /* base, e.g. 10000 */
    cg_rope_style style;
    /* Optional: the rate of each of the head_dim/2 frequencies (borrowed), for RoPE scaling
     * that changes each frequency by a constant (linear, llama3, yarn: DESIGN §13). R(a)R(b) =
     * R(a+b) still holds per frequency, so a remap by a position delta stays exact. NULL:
     * theta^(-2i/d). */
    const double *inv_freq;
    /* yarn's attention factor: cos and sin of an absolute rotation (cg_rope_apply,
     * cg_rope_angles) are multiplied by it, so stored K already carries it; a remap is a pure
     * rotation and never applies it. 0 means 1. */
    double attn_factor;
} cg_rope;

/* "half" / "interleaved"; static storage. */
const char *cg_rope_style_name(cg_rope_style s);

/* Rotates x in place: n_tokens rows, each holding n_heads vectors of head_dim floats
 * (row stride n_heads*head_dim). Row t is rotated to position pos0 + t.
 * Angles pos*theta_i are computed in double; cos/sin applied in float. */
void cg_rope_apply(const cg_rope *r, float *x, size_t n_tokens, int n_heads, int64_t pos0);

/* cos and sin of the n positions pos[0..n): c and s receive [n][head_dim/2] floats (angles in
 * double, times the attention factor), for cg_rope_rotate. The forward pass computes them once
 * per call and rotates q and k of every layer with them. */
void cg_rope_angles(const cg_rope *r, const int64_t *pos, size_t n, float *c, float *s);
/* Rotates x in place: n rows of n_heads vectors of head_dim floats, row t by the angles
 * c/s[t] of cg_rope_angles. */
void cg_rope_rotate(const cg_rope *r, float *x, size_t n, int n_heads, const float *c,
                    const float *s);

/* Remap: dst[t] = R(delta) * src[t] for n_rows rows of head_dim floats, rows contiguous
 * ([n_rows][head_dim]). src and dst may be equal (in place) but must not otherwise overlap.
 * Every row gets the same delta, so cos/sin are head_dim/2 constants; the loop is
 * memory-bound and vectorises. */
void cg_remap_rope(const cg_rope *r, const float *src, float *dst, size_t n_rows, int64_t delta);

/* The cos/sin of one delta, computed once, for remapping a chunk that lives in many small
 * runs of rows (pool blocks: 16 rows each), where recomputing them per call would cost
 * more than the rows. Caller owns it: cg_remap_table_free. */
typedef struct cg_remap_table cg_remap_table;
cg_remap_table *cg_remap_table_new(const cg_rope *r, int64_t delta);
void cg_remap_table_free(cg_remap_table **t);
/* Same as cg_remap_rope with the table's rope and delta. */
void cg_remap_rope_table(const cg_remap_table *t, const float *src, float *dst, size_t n_rows);

#endif
