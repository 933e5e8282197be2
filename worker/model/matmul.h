/* Weight products of the forward pass, y[n][rows] = x[n][cols] * W^T, for weights stored as
 * f32, f16 or bf16 and kept in that dtype: activations and accumulation are f32, 16-bit
 * weights are widened to f32 inside the product. Two entry points with different reduction
 * orders: a prefill path (OpenBLAS sgemm on widened panels) for chunks of prompt tokens and a
 * batch-invariant decode kernel for small batches of decode rows. */
#ifndef CG_MATMUL_H
#define CG_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Weight dtypes. The quantised ones are chosen at load, never a checkpoint dtype:
 * - CG_DTYPE_Q8: int8 values with one f32 scale per row (w[r][c] = scale[r] * q[r][c]), made
 *   by cg_matmul_quantize_q8 (kept for comparison; the model does not use it);
 * - CG_DTYPE_Q8_0: blocks of 32 int8 values along a row with one f16 scale each (llama.cpp's
 *   Q8_0 class): w = d[r][c / 32] * q[r][c]; cols a multiple of 32;
 * - CG_DTYPE_Q4_0: blocks of 32 4-bit values with one f16 scale each (Q4_0's class):
 *   w = d[r][c / 32] * (n - 8), n in 0..15; each pair of blocks (64 columns) is 32 bytes,
 *   byte i holding column i in its low nibble and column 32 + i in its high one; cols a
 *   multiple of 64.
 * Both block dtypes are made by cg_matmul_quantize. */
typedef enum cg_dtype {
    CG_DTYPE_F32,
    CG_DTYPE_F16,
    CG_DTYPE_BF16,
    CG_DTYPE_Q8,
    CG_DTYPE_Q8_0,
    CG_DTYPE_Q4_0
} cg_dtype;

/* Bytes per element of a dtype (4, 2 or 1; 1 for the block dtypes too, whose sizes come from
 * cg_matmul_quant_bytes). */
size_t cg_dtype_size(cg_dtype dt);

/* One weight matrix in the Hugging Face layout: [rows = out features][cols = in features],
 * row-major, rows * cols elements of dtype with no padding between rows. The data is
 * borrowed (typically a tensor inside an mmapped safetensors file) and must stay valid and
 * unchanged while products run. Alignment: the element size (2 bytes for f16/bf16, 4 for f32,
 * none for Q8) is all that is required, which is what safetensors guarantees for 16-bit
 * tensors; an f32 tensor at an address that is not a multiple of 4 must be copied by the
 * loader. */
typedef struct cg_weight {
    const void *data;
    cg_dtype dtype;
    int rows;
    int cols;
    const float *scale;     /* CG_DTYPE_Q8 only: `rows` scales, borrowed like data; else NULL */
    const uint16_t *bscale; /* Q8_0 / Q4_0 only: rows * cols / 32 f16 block scales, row-major,
                             * borrowed like data; else NULL */
} cg_weight;

/* Decode batches up to this size are the kernel's design point (each weight is read from
 * memory once for the whole batch); larger n works but rereads x from beyond L2. */
#define CG_MATMUL_DECODE_MAX 64

/* Per-caller scratch of the prefill path: one widening buffer per OpenMP thread (up to 64
 * threads), grown on demand to at most 1 MiB each. Not thread-safe: a thread that issues
 * products owns its scratch; the OpenMP threads a product forks use their own slots in it. */
typedef struct cg_matmul_scratch cg_matmul_scratch;

/* New empty scratch (caller frees with cg_matmul_scratch_free). Also sets OpenBLAS to one
 * thread, process-wide: the products share the cores out through OpenMP, and every sgemm
 * runs on its calling thread (the forward pass has relied on this since its first version). */
cg_matmul_scratch *cg_matmul_scratch_new(void);
/* Frees the scratch and its buffers; accepts NULL and *s == NULL; sets *s to NULL. */
void cg_matmul_scratch_free(cg_matmul_scratch **s);

/* Prefill path: y[n][w->rows] = x[n][w->cols] * W^T, for a chunk of prompt tokens.
 * 16-bit and Q8 weights are widened to f32 one panel at a time into the scratch (required for
 * them; f32 weights do not use it) and multiplied with single-threaded cblas_sgemm; f32
 * weights go to sgemm directly. The output rows of W are split between the OpenMP threads.
 * Deterministic for the same x and the same thread count, in every ISA variant (widening is
 * exact); a row's result depends on n and on its position (OpenBLAS's edge kernels), so a
 * sequence's prompt must be computed in the same chunks to reproduce bits.
 * x, w and y are borrowed; y must not overlap x. n == 0 does nothing.
 * Q8_0 / Q4_0 panels are dequantised exactly the same way (x stays f32 here: no activation
 * quantisation on this path), except in the amx variant: there x and the dequantised weights
 * are rounded to bf16 and multiplied on AMX tiles (rows a multiple of 16), and a row's bits
 * depend neither on n, nor on its position, nor on the thread count. */
void cg_matmul_prefill(const cg_weight *w, const float *x, int n, float *y, cg_matmul_scratch *s);

/* Decode path: the same product for a small batch of rows (1..CG_MATMUL_DECODE_MAX decode
 * tokens of different sequences), through a kernel that reads each weight once for the whole
 * batch and widens it in registers; OpenMP over output rows. Batch-invariant: the bits of a
 * row's result do not depend on n, on the row's position in the batch, nor on the thread
 * count (for a given ISA variant, see cg_matmul_set_isa). Borrowed pointers as above; needs no
 * scratch. Q8_0 / Q4_0 weights: x is quantised to int8 per block of 32 (a temporary buffer),
 * and the result is the same in every ISA variant too (worker/model/matmul_quant.c). */
void cg_matmul_decode(const cg_weight *w, const float *x, int n, float *y);

/* Quantises w (f32, f16 or bf16) to CG_DTYPE_Q8, symmetric per row: scale[r] = max |w[r][.]|
 * / 127 and q[r][c] = round(w[r][c] / scale[r]). The caller allocates q (rows * cols bytes) and
 * scale (rows floats) and keeps them alive as long as *out, which points at them. Returns
 * CG_E_UNSUPPORTED for a Q8 input, CG_E_VALUE when a row holds Inf or NaN. */
cg_status cg_matmul_quantize_q8(const cg_weight *w, int8_t *q, float *scale, cg_weight *out) CG_WUR;

/* Bytes of the values of a rows x cols matrix quantised to dt (CG_DTYPE_Q8_0 or Q4_0); the
 * f16 block scales it needs go to *scale_count (may be NULL). */
size_t cg_matmul_quant_bytes(cg_dtype dt, int rows, int cols, size_t *scale_count);

/* Quantises w (f32, f16 or bf16) to `to` (CG_DTYPE_Q8_0 or CG_DTYPE_Q4_0), block by block of
 * 32 along each row: Q8_0 as llama.cpp does (d = max|w| / 127, round to nearest); Q4_0 picks,
 * per block, the scale with the least squared error among max/-8 (llama.cpp's Q4_0) and seven
 * smaller ones. Scales are rounded to f16 before the values are rounded against them. The
 * caller allocates q (cg_matmul_quant_bytes) and scales and keeps them alive as long as *out,
 * which points at them. Returns CG_E_UNSUPPORTED for other dtypes, CG_E_VALUE when cols is not
 * a multiple of 32 (Q8_0) or 64 (Q4_0), or a weight is Inf or NaN. Uses the OpenMP threads. */
cg_status cg_matmul_quantize(const cg_weight *w, cg_dtype to, void *q, uint16_t *scales,
                             cg_weight *out) CG_WUR;

/* Row `row` of a Q8_0 / Q4_0 matrix, dequantised into out (cols floats): an embedding lookup. */
void cg_matmul_dequant_row(const cg_weight *w, int row, float *out);

/* Kernel variants, chosen once at first use: the best the CPU supports, capped by the
 * environment variable CG_MATMUL_ISA=generic|avx2|avx512|avx512vnni|amx when set. The 16-bit
 * products of avx512vnni and amx are those of avx512; only the block-quantised ones differ. Their
 * decode gives the same bits in every variant (worker/model/matmul_quant.c). Their prefill gives
 * the same bits in every variant but amx, which multiplies on AMX tiles in bf16: activations
 * and dequantised weights rounded to bf16, products summed in f32 (worker/model/matmul_amx.c). */
typedef enum cg_matmul_isa {
    CG_MATMUL_ISA_GENERIC,    /* portable C */
    CG_MATMUL_ISA_AVX2,       /* AVX2 + FMA + F16C */
    CG_MATMUL_ISA_AVX512,     /* AVX-512 F/BW/VL */
    CG_MATMUL_ISA_AVX512VNNI, /* the same with VNNI: vpdpbusd for the Q8_0 / Q4_0 products */
    CG_MATMUL_ISA_AMX,        /* the same with AMX-BF16 tiles for the Q8_0 / Q4_0 prefill */
    CG_MATMUL_ISA_COUNT
} cg_matmul_isa;

/* 1 if this CPU (and OS) can run the variant. */
int cg_matmul_isa_supported(cg_matmul_isa isa);
/* The variant products use now. */
cg_matmul_isa cg_matmul_isa_active(void);
/* "generic", "avx2", "avx512", "avx512vnni", "amx" (static storage). */
const char *cg_matmul_isa_name(cg_matmul_isa isa);
/* Forces a variant (tests, benchmarks). Returns CG_E_UNSUPPORTED, changing nothing, when the
 * CPU cannot run it. Must not be called while a product runs. */
cg_status cg_matmul_set_isa(cg_matmul_isa isa) CG_WUR;

#endif
