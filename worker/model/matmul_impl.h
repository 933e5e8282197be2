/* The matmul module's private header: the block-quantised weight products (CG_DTYPE_Q8_0,
 * CG_DTYPE_Q4_0) that matmul_quant.c implements and matmul.c routes both of its entry points to
 * for those dtypes. Not a public interface. */
#ifndef CG_MATMUL_IMPL_H
#define CG_MATMUL_IMPL_H

#include "worker/model/matmul.h"

/* y[n][w->rows] = x[n][w->cols] * W^T for a block-quantised w, with the kernels of isa:
 * every row of x quantised to int8 in blocks of 32, integer dot products per block, the
 * blocks' scales applied in f32. Batch-invariant and bit-identical in every variant. */
void cg_qmm_product(const cg_weight *w, const float *x, int n, float *y, cg_matmul_isa isa);

/* Columns [c0, c0 + count) of row `row` of a block-quantised w, dequantised into dst (exact:
 * the same floats in every variant). The prefill path widens its panels with it. */
void cg_qmm_widen(const cg_weight *w, size_t row, size_t c0, size_t count, float *dst,
                  cg_matmul_isa isa);

/* Element i (row-major) of an unquantised w (F32, BF16 or F16) as a float: the quantisers read
 * their source weights with it. */
float cg_weight_at(const cg_weight *w, size_t i);

#endif
