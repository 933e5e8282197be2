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

/* AMX-BF16 prefill for block-quantised weights (matmul_amx.c). cg_amx_supported: the CPU has
 * AMX-TILE, AMX-BF16 and AVX512-BF16, and the kernel granted this process the tile state (asked
 * once). The product: cg_amx_pack_x packs x (bf16, zero rows up to a multiple of 32) into
 * cg_amx_x_elems(n, cols) values, 16-row groups [g0, g1) per call so threads can share it;
 * cg_amx_rows then writes weight rows [r0, r1) (a multiple of 16 apart) of y, dequantising
 * panel_rows rows at a time into scratch (panel_rows * cols bf16, then 1024 floats). */
int cg_amx_supported(void);
size_t cg_amx_x_elems(int n, int cols);
void cg_amx_pack_x(const float *x, int n, int cols, uint16_t *xp, size_t g0, size_t g1);
void cg_amx_rows(const cg_weight *w, const uint16_t *xp, int n, float *y, size_t r0, size_t r1,
                 size_t panel_rows, void *scratch);

/* AVX512-BF16 prefill for block-quantised weights on CPUs without AMX (matmul_bf16.c).
 * cg_bf16_supported: the CPU has AVX512-BF16. The product: cg_bf16_pack_x rounds rows [t0, t1)
 * of x to bf16 into xb (n * cols values; threads share it); cg_bf16_rows then
 * writes weight rows [r0, r1) (a multiple of 16 apart) of y, repacking 32 rows at a time into
 * scratch (cg_bf16_scratch_bytes(cols) bytes). */
int cg_bf16_supported(void);
void cg_bf16_pack_x(const float *x, int cols, uint16_t *xb, size_t t0, size_t t1);
size_t cg_bf16_scratch_bytes(int cols);
void cg_bf16_rows(const cg_weight *w, const uint16_t *xb, int n, float *y, size_t r0, size_t r1,
                  void *scratch);

#endif
