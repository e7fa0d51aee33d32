// Tree attention, f32, batch-invariant by construction, with each key and value read once per threadgroup.
//
// A threadgroup is one block of up to QB queries of one chunk (they share the chunk's key list) and one key/value
// head; its simdgroups are (query of the block, head of the group) pairs: QB * GROUP of them, GROUP = H / KVH.
// A query's keys are its ancestor blocks and its own block, listed in position order (key_idx row of its chunk),
// so position p of the list is the key at position p of the query's own prompt. Keys are visited in tiles of
// KEY_TILE anchored at position 0, up to the block's last query; a simdgroup works on a tile only while the tile
// holds keys of its own query (t <= pos), and takes part in the loads and barriers of every tile:
//   1. the tile's keys are staged into threadgroup memory, STAGE at a time, by every thread of the group (one
//      device read per key for all QB * GROUP query heads), then lane j scores keys t+j, t+32+j, ... of its
//      query: a full dot product over d in order (no cross-lane sum);
//   2. the tile max is simd_max (exact: max does not round), the running sum and accumulator are rescaled once;
//   3. the tile's p = exp(s - m) go through threadgroup memory; the values are staged like the keys, and every
//      lane adds p * v for its own dims (d = lane, lane+32, ...) key by key in position order; the running sum is
//      added in the same order.
// So every number is the same sequence of f32 operations as one thread per (query, head) would do, whatever the
// forward, the block layout or the number of threads. A simdgroup's control flow is uniform (its query and head
// are fixed), and every thread of the threadgroup runs the same tile and stage loops, so no barrier is divergent.
//
// inputs: q [Nq, H, D], keys/values [Nk, KVH, D] (f32), key_idx [C, L], group_queries [NG, QB] (query rows, -1:
//         none), group_chunk [NG], query_pos [Nq] (int32), params = {H, KVH, D, L, Nq, NG, 0, 0};
//         grid: NG * KVH threadgroups of QB * GROUP * 32 threads; output: out [Nq, H, D] f32.
// Template: KEY_TILE (a multiple of 32), MAX_D (a multiple of 32, >= D), QB, GROUP, STAGE (rows staged at a
//           time: STAGE * MAX_D floats of threadgroup memory).
threadgroup float stage[STAGE * MAX_D];
threadgroup float tile_p[QB * GROUP][KEY_TILE];
uint lane = thread_index_in_simdgroup;
uint simd = simdgroup_index_in_threadgroup;
int tid = (int)thread_index_in_threadgroup;
int threads = QB * GROUP * 32;
int H = params[0], KVH = params[1], D = params[2], L = params[3], NQ = params[4];
int g = (int)threadgroup_position_in_grid.x / KVH;
int kvh = (int)threadgroup_position_in_grid.x % KVH;
int qi = group_queries[g * QB + (int)simd / GROUP];
int h = kvh * GROUP + (int)simd % GROUP;
int pos = qi >= 0 ? query_pos[qi] : -1;
int last = -1;  // the block's last key position: every thread runs the tiles up to it
for (int b = 0; b < QB; ++b) {
    int row = group_queries[g * QB + b];
    if (row >= 0) {
        last = metal::max(last, query_pos[row]);
    }
}
const device float* qv = q + (metal::max(qi, 0) * H + h) * D;
const device int* chain = key_idx + group_chunk[g] * L;
float scale = 1.0f / metal::sqrt((float)D);
float m = -INFINITY;
float l = 0.0f;
float acc[MAX_D / 32];
for (int r = 0; r < MAX_D / 32; ++r) {
    acc[r] = 0.0f;
}
for (int t = 0; t <= last; t += KEY_TILE) {
    int staged = metal::min(KEY_TILE, last + 1 - t);  // keys of this tile some query of the block needs
    int n = metal::min(KEY_TILE, pos + 1 - t);  // keys of this tile this simdgroup's query attends (<= 0: none)
    float s[KEY_TILE / 32];
    for (int r = 0; r < KEY_TILE / 32; ++r) {
        s[r] = -INFINITY;
    }
    for (int u = 0; u < staged; u += STAGE) {
        int rows = metal::min(STAGE, staged - u);
        for (int e = tid; e < rows * D; e += threads) {
            stage[e] = keys[(chain[t + u + e / D] * KVH + kvh) * D + e % D];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int r = 0; r < KEY_TILE / 32; ++r) {
            int j = r * 32 + (int)lane;
            if (j >= u && j < u + rows && j < n) {
                float dot = 0.0f;
                for (int d = 0; d < D; ++d) {
                    dot += (qv[d] * scale) * stage[(j - u) * D + d];
                }
                s[r] = dot;
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // every score is read before the next stage is written
    }
    float m_new = m;
    if (n > 0) {
        float m_lane = -INFINITY;
        for (int r = 0; r < KEY_TILE / 32; ++r) {
            m_lane = metal::max(m_lane, s[r]);
        }
        m_new = metal::max(m, simd_max(m_lane));
        float alpha = metal::exp(m - m_new);
        l *= alpha;
        for (int r = 0; r < MAX_D / 32; ++r) {
            acc[r] *= alpha;
        }
        for (int r = 0; r < KEY_TILE / 32; ++r) {
            tile_p[simd][r * 32 + lane] = metal::exp(s[r] - m_new);
        }
    }  // the next barrier (after the values are staged) also publishes tile_p
    for (int u = 0; u < staged; u += STAGE) {
        int rows = metal::min(STAGE, staged - u);
        for (int e = tid; e < rows * D; e += threads) {
            stage[e] = values[(chain[t + u + e / D] * KVH + kvh) * D + e % D];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int j = u; j < metal::min(u + rows, n); ++j) {
            float p = tile_p[simd][j];
            l += p;
            for (int r = 0; r < MAX_D / 32; ++r) {
                int d = r * 32 + (int)lane;
                if (d < D) {
                    acc[r] += p * stage[(j - u) * D + d];
                }
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // every lane has read the stage before it is rewritten
    }
    m = m_new;
}
if (qi >= 0) {
    device float* o = out + (qi * H + h) * D;
    for (int r = 0; r < MAX_D / 32; ++r) {
        int d = r * 32 + (int)lane;
        if (d < D) {
            o[d] = acc[r] / l;
        }
    }
}
