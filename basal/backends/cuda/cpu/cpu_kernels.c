/* Compiled CPU kernels for the torch backend (basal/backends/cuda/cpu_kernels.py loads them with ctypes).
 *
 * Each function does, in one pass over memory, what a sequence of torch elementwise ops does in several, with the
 * same IEEE-754 f32 operations in the same order: the bits are those of the torch code they replace
 * (kernels.py), which the tests check. That needs -ffp-contract=off (no fused multiply-add) and no -ffast-math;
 * the loader passes both. Vector instructions are fine: a lane's mul or add rounds exactly as the scalar one.
 *
 * Layouts (all contiguous, row-major), for one span of S key tiles of T keys of one attention group:
 *   s, p      [C, KVH, S, G, R, T]  scores of the tile GEMMs / their exps (R rows per chunk, U <= R of them used)
 *   pv        [C, KVH, S, G, R, D]  p @ v
 *   alpha, ps [C, KVH, S, G, U]     the rescale factor and the row sum of p of each tile
 *   active    [C, KVH, S, G, U]     the row sees a key in this tile
 *   m, l      [C, KVH, G, U]        running max / running sum, acc [C, KVH, G, U, D]
 *   q_pos     [C, q_rows]           the layout's query positions (-1: padding); R <= q_rows rows are in the GEMMs
 * A "row" is one (c, kvh, g, u); callers split [0, C*KVH*G*U) among threads.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EXP_MIN (-87.33654f)
#define LOG2E 1.4426950408889634f
#define LN2_HI 0.693359375f
#define LN2_LO (-2.1219444005469057e-04f)
#define EXP_MAX 88.72284f
#define ROUND_MAGIC 12582912.0f

/* n = round(x log2 e) and exp(r) of the Cody-Waite reduction r = x - n ln 2, for a clamped x: kernels._exp_reduced. */
static inline float exp_reduced(float xc, float *n_out) {
    /* round half to even as torch.round: adding 1.5 * 2**23 leaves no fraction bits (|x log2 e| < 2**22). The
     * sign of a zero n may differ from nearbyintf's; no result depends on it. */
    float n = (xc * LOG2E + ROUND_MAGIC) - ROUND_MAGIC;
    float r = xc - n * LN2_HI;
    r = r - n * LN2_LO;
    float p = r * (float)(1.0 / 5040);
    p = p + (float)(1.0 / 720);
    p = p * r;
    p = p + (float)(1.0 / 120);
    p = p * r;
    p = p + (float)(1.0 / 24);
    p = p * r;
    p = p + (float)(1.0 / 6);
    p = p * r;
    p = p + 0.5f;
    p = p * r;
    p = p + 1.0f;
    p = p * r;
    p = p + 1.0f;
    *n_out = n;
    return p;
}

static inline float float_of_bits(int32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* kernels.det_exp (its _exp_into), op for op: 2**n as two normal factors, 0 below EXP_MIN, inf above EXP_MAX. */
static inline float exp_full(float x) {
    float xc = x < EXP_MIN ? EXP_MIN : (x > EXP_MAX ? EXP_MAX : x);
    float n;
    float p = exp_reduced(xc, &n);
    int32_t ni = (int32_t)n, half = ni >> 1;
    p = p * float_of_bits((half + 127) << 23);
    p = p * float_of_bits((ni - half + 127) << 23);
    return x < EXP_MIN ? 0.0f : (x > EXP_MAX ? INFINITY : p);
}

/* kernels.det_exp_nonpositive, op for op: clamp, n = round(x log2 e), Cody-Waite reduction, degree-7 Taylor
 * polynomial, one 2**n factor, 0 below EXP_MIN. */
static inline float exp_nonpositive(float x) {
    float xc = x < EXP_MIN ? EXP_MIN : x;
    float n;
    float p = exp_reduced(xc, &n);
    p = p * float_of_bits(((int32_t)n + 127) << 23);
    return x < EXP_MIN ? 0.0f : p;
}

void basal_exp_nonpositive(const float *x, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = exp_nonpositive(x[i]);
}

void basal_exp(const float *x, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = exp_full(x[i]);
}

/* Rounding an f32 to the model dtype and back, as torch's .to(): round to nearest even (finite values). */
static inline float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline float load_bf16(const uint16_t *p) {
    uint32_t u = (uint32_t)*p << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

enum { DTYPE_F32 = 0, DTYPE_BF16 = 1, DTYPE_F16 = 2 };

/* kernels.swiglu for rows [row_begin, row_end) of gate_up [N, 2F] = [gate | up] into out [N, F], in the model
 * dtype: silu(gate) = gate / (1 + exp(-gate)) in f32, rounded to the dtype, times up (a product of two dtype
 * values is exact in f32, then rounded once: what torch's bf16/f16 multiply does). */
void basal_swiglu(const void *gate_up, void *out, int64_t width, int64_t dtype, int64_t row_begin, int64_t row_end) {
    for (int64_t row = row_begin; row < row_end; row++) {
        if (dtype == DTYPE_F32) {
            const float *g = (const float *)gate_up + row * 2 * width, *up = g + width;
            float *o = (float *)out + row * width;
            for (int64_t i = 0; i < width; i++) {
                float e = exp_full(-g[i]);
                e = e + 1.0f;
                o[i] = (g[i] / e) * up[i];
            }
        } else if (dtype == DTYPE_BF16) {
            const uint16_t *g = (const uint16_t *)gate_up + row * 2 * width, *up = g + width;
            uint16_t *o = (uint16_t *)out + row * width;
            for (int64_t i = 0; i < width; i++) {
                float gi = load_bf16(g + i);
                float e = exp_full(-gi);
                e = e + 1.0f;
                float prod = round_bf16(gi / e) * load_bf16(up + i);
                uint32_t u;
                prod = round_bf16(prod);
                memcpy(&u, &prod, sizeof u);
                o[i] = (uint16_t)(u >> 16);
            }
        } else {
            const _Float16 *g = (const _Float16 *)gate_up + row * 2 * width, *up = g + width;
            _Float16 *o = (_Float16 *)out + row * width;
            for (int64_t i = 0; i < width; i++) {
                float gi = (float)g[i];
                float e = exp_full(-gi);
                e = e + 1.0f;
                float silu = (float)(_Float16)(gi / e);
                o[i] = (_Float16)(silu * (float)up[i]);
            }
        }
    }
}

/* The masked online-softmax step of tiles [0, S) for rows [row_begin, row_end): visible keys (position <= the
 * query's), the tile max, the running max, p = exp(s - max) into p's used rows, alpha = exp(old max - new max).
 * key0: the position of the span's first key. m is updated to the max after the span. */
void basal_softmax_span(const float *s, float *p, float *alpha, uint8_t *active, float *m, const int64_t *q_pos,
                        int64_t q_rows, int64_t C, int64_t KVH, int64_t S, int64_t G, int64_t R, int64_t U, int64_t T, int64_t key0,
                        int64_t row_begin, int64_t row_end) {
    (void)C;
    for (int64_t row = row_begin; row < row_end; row++) {
        int64_t u = row % U, g = (row / U) % G, ch = row / (U * G); /* ch = c * KVH + kvh */
        int64_t c = ch / KVH;
        int64_t pos = q_pos[c * q_rows + u];
        float m_prev = m[row];
        for (int64_t j = 0; j < S; j++) {
            int64_t off = (((ch * S + j) * G + g) * R + u) * T;
            int64_t visible = pos - (key0 + j * T) + 1; /* keys at positions <= pos: a prefix of the tile */
            visible = visible < 0 ? 0 : (visible > T ? T : visible);
            float tile_max = -INFINITY;
            for (int64_t t = 0; t < visible; t++) tile_max = s[off + t] > tile_max ? s[off + t] : tile_max;
            int is_active = tile_max > -INFINITY;
            float m_new = tile_max > m_prev ? tile_max : m_prev;
            float sub = is_active ? m_new : 0.0f;
            for (int64_t t = 0; t < T; t++) p[off + t] = exp_nonpositive((t < visible ? s[off + t] : -INFINITY) - sub);
            int64_t at = ((ch * S + j) * G + g) * U + u;
            alpha[at] = exp_nonpositive(is_active ? m_prev - m_new : 0.0f);
            active[at] = (uint8_t)is_active;
            m_prev = m_new;
        }
        m[row] = m_prev;
    }
}

/* The f32 recurrence over tiles [0, S), in tile order: where the row is active, l = l * alpha + ps and
 * acc = acc * alpha + pv (each product and each sum rounded on its own, as the torch ops do). */
void basal_recurrence_span(const float *alpha, const uint8_t *active, const float *ps, const float *pv, float *l,
                           float *acc, int64_t C, int64_t KVH, int64_t S, int64_t G, int64_t R, int64_t U, int64_t D,
                           int64_t row_begin, int64_t row_end) {
    (void)C;
    (void)KVH;
    for (int64_t row = row_begin; row < row_end; row++) {
        int64_t u = row % U, g = (row / U) % G, ch = row / (U * G);
        float *a = acc + row * D;
        for (int64_t j = 0; j < S; j++) {
            int64_t at = ((ch * S + j) * G + g) * U + u;
            if (!active[at]) continue;
            float al = alpha[at];
            l[row] = l[row] * al + ps[at];
            const float *x = pv + (((ch * S + j) * G + g) * R + u) * D;
            for (int64_t d = 0; d < D; d++) {
                float scaled = a[d] * al;
                a[d] = scaled + x[d];
            }
        }
    }
}

/* The key and value tiles of one span, gathered from the layer's buffers straight into the layouts the tile GEMMs
 * read: k [C, KVH, S, D, T] (transposed: the score GEMM's right-hand side) and v [C, KVH, S, T, D], from key/value
 * buffers [rows, KVH, D] and k_idx [C, idx_stride] (the buffer row of each key, the span's first key at
 * key_begin). Only copies: the bits are those of torch's index, permute and contiguous, in one pass instead of
 * three. A "row" is one (c, kvh, s) tile. */
void basal_gather_kv(const float *key_buf, const float *value_buf, const int64_t *k_idx, float *k, float *v,
                     int64_t kv_heads, int64_t n_span, int64_t tile, int64_t dim, int64_t idx_stride,
                     int64_t key_begin, int64_t row_begin, int64_t row_end) {
    for (int64_t row = row_begin; row < row_end; row++) {
        int64_t c = row / (kv_heads * n_span), h = (row / n_span) % kv_heads, s = row % n_span;
        const int64_t *idx = k_idx + c * idx_stride + key_begin + s * tile;
        float *kt = k + row * dim * tile, *vt = v + row * tile * dim;
        for (int64_t t = 0; t < tile; t++) {
            int64_t src = (idx[t] * kv_heads + h) * dim;
            const float *ks = key_buf + src;
            memcpy(vt + t * dim, value_buf + src, (size_t)dim * sizeof(float));
            for (int64_t d = 0; d < dim; d++)
                kt[d * tile + t] = ks[d];
        }
    }
}

static inline float load_dtype(const void *x, int64_t i, int64_t dtype) {
    if (dtype == DTYPE_F32) return ((const float *)x)[i];
    if (dtype == DTYPE_BF16) return load_bf16((const uint16_t *)x + i);
    return (float)((const _Float16 *)x)[i];
}

/* kernels.apply_rope for rows [row_begin, row_end): x [N, heads, dim] in the model dtype, row n at x + n *
 * row_stride elements (a column slice of the q/k/v GEMM's output), read as f32 (exact); cos/sin [N, dim] f32;
 * out [N, heads, dim] f32 contiguous. out = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]: each
 * product rounded, then the sum, as torch's mul, mul, add. */
void basal_rope(const void *x, int64_t row_stride, int64_t dtype, const float *cos, const float *sin, float *out,
                int64_t heads, int64_t dim, int64_t row_begin, int64_t row_end) {
    int64_t half = dim / 2;
    for (int64_t row = row_begin; row < row_end; row++) {
        const float *c = cos + row * dim, *s = sin + row * dim;
        for (int64_t h = 0; h < heads; h++) {
            int64_t at = row * row_stride + h * dim;
            float *o = out + (row * heads + h) * dim;
            if (dtype == DTYPE_F32) {
                const float *xh = (const float *)x + at;
                for (int64_t i = 0; i < half; i++) {
                    float a = xh[i] * c[i];
                    float b = (-xh[i + half]) * s[i];
                    o[i] = a + b;
                }
                for (int64_t i = half; i < dim; i++) {
                    float a = xh[i] * c[i];
                    float b = xh[i - half] * s[i];
                    o[i] = a + b;
                }
            } else {
                for (int64_t i = 0; i < half; i++) {
                    float a = load_dtype(x, at + i, dtype) * c[i];
                    float b = (-load_dtype(x, at + i + half, dtype)) * s[i];
                    o[i] = a + b;
                }
                for (int64_t i = half; i < dim; i++) {
                    float a = load_dtype(x, at + i, dtype) * c[i];
                    float b = load_dtype(x, at + i - half, dtype) * s[i];
                    o[i] = a + b;
                }
            }
        }
    }
}
