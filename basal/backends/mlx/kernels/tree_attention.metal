// Tree attention, f32, batch-invariant by construction.
//
// One simdgroup (32 lanes) per (query, head); a threadgroup holds SIMDS of them, independent of each other.
// A query's keys are its ancestor blocks and its own block, listed in position order (key_idx row of its chunk),
// so position p of the list is the key at position p of the query's own prompt. Keys are visited in tiles of
// KEY_TILE anchored at position 0:
//   1. lane j scores keys t+j, t+32+j, ... of the tile: a full dot product over d in order (no cross-lane sum);
//   2. the tile max is simd_max (exact: max does not round), the running sum and accumulator are rescaled once;
//   3. the tile's p = exp(s - m) go through threadgroup memory, and every lane adds p * v for its own dims
//      (d = lane, lane+32, ...) key by key in position order; the running sum is added in the same order.
// So every number is the same sequence of f32 operations as one thread per (query, head) would do, whatever the
// batch, the block layout or the number of threads. Control flow is uniform across a simdgroup (the item index is
// thread_position / 32; the grid is whole simdgroups), so the barriers are never divergent.
//
// inputs: q [Nq, H, D], keys/values [Nk, KVH, D] (f32), key_idx [C, L], query_chunk [Nq], query_pos [Nq] (int32),
//         params = {H, KVH, D, L, Nq, 0, 0, 0}; output: out [Nq, H, D] f32.
// Template: KEY_TILE (a multiple of 32), MAX_D (a multiple of 32, >= D), SIMDS (simdgroups per threadgroup).
threadgroup float tile_p[SIMDS][KEY_TILE];
uint item = thread_position_in_grid.x / 32;
uint lane = thread_index_in_simdgroup;
uint simd = simdgroup_index_in_threadgroup;
int H = params[0], KVH = params[1], D = params[2], L = params[3], NQ = params[4];
if ((int)item >= NQ * H) {
    return;  // a whole simdgroup past the end
}
int qi = item / H;
int h = item % H;
int kvh = h / (H / KVH);
int pos = query_pos[qi];
const device float* qv = q + (qi * H + h) * D;
const device int* chain = key_idx + query_chunk[qi] * L;
float scale = 1.0f / metal::sqrt((float)D);
float m = -INFINITY;
float l = 0.0f;
float acc[MAX_D / 32];
for (int r = 0; r < MAX_D / 32; ++r) {
    acc[r] = 0.0f;
}
for (int t = 0; t <= pos; t += KEY_TILE) {
    int n = metal::min(KEY_TILE, pos + 1 - t);
    float s[KEY_TILE / 32];
    float m_lane = -INFINITY;
    for (int r = 0; r < KEY_TILE / 32; ++r) {
        int j = r * 32 + (int)lane;
        float dot = -INFINITY;
        if (j < n) {
            const device float* kv = keys + (chain[t + j] * KVH + kvh) * D;
            dot = 0.0f;
            for (int d = 0; d < D; ++d) {
                dot += (qv[d] * scale) * kv[d];
            }
        }
        s[r] = dot;
        m_lane = metal::max(m_lane, dot);
    }
    float m_new = metal::max(m, simd_max(m_lane));
    float alpha = metal::exp(m - m_new);
    l *= alpha;
    for (int r = 0; r < MAX_D / 32; ++r) {
        acc[r] *= alpha;
    }
    for (int r = 0; r < KEY_TILE / 32; ++r) {
        tile_p[simd][r * 32 + lane] = metal::exp(s[r] - m_new);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    for (int j = 0; j < n; ++j) {
        float p = tile_p[simd][j];
        l += p;
        const device float* vv = values + (chain[t + j] * KVH + kvh) * D;
        for (int r = 0; r < MAX_D / 32; ++r) {
            int d = r * 32 + (int)lane;
            if (d < D) {
                acc[r] += p * vv[d];
            }
        }
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);  // every lane has read the tile before the next one is written
    m = m_new;
}
device float* o = out + (qi * H + h) * D;
for (int r = 0; r < MAX_D / 32; ++r) {
    int d = r * 32 + (int)lane;
    if (d < D) {
        o[d] = acc[r] / l;
    }
}
