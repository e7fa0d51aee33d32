// Tree attention, f32, batch-invariant by construction.
//
// One thread per (query, head). A query's keys are its ancestor blocks and its own block, listed in position
// order (key_idx row of its chunk), so position p of the list is the key at position p of the query's own
// prompt. Keys are visited in tiles of KEY_TILE anchored at position 0: a tile's scores stay in registers, the
// tile max updates the running max, the running sum and accumulator are rescaled once per tile (online
// softmax), then the tile's values are added in key order. Nothing a thread computes depends on the other
// queries of the batch, on where its block sits in the packed row, or on how many threads run.
//
// inputs: q [Nq, H, D], keys/values [Nk, KVH, D] (f32), key_idx [C, L], query_chunk [Nq], query_pos [Nq] (int32),
//         params = {H, KVH, D, L, Nq}; output: out [Nq, H, D] f32. Template: KEY_TILE, MAX_D (>= D).
uint gid = thread_position_in_grid.x;
int H = params[0], KVH = params[1], D = params[2], L = params[3], NQ = params[4];
if ((int)gid >= NQ * H) {
    return;
}
int qi = gid / H;
int h = gid % H;
int kvh = h / (H / KVH);
int pos = query_pos[qi];
const device float* qv = q + (qi * H + h) * D;
const device int* chain = key_idx + query_chunk[qi] * L;
float scale = 1.0f / metal::sqrt((float)D);
float m = -INFINITY;
float l = 0.0f;
float acc[MAX_D];
for (int d = 0; d < D; ++d) {
    acc[d] = 0.0f;
}
for (int t = 0; t <= pos; t += KEY_TILE) {
    int n = metal::min(KEY_TILE, pos + 1 - t);
    float s[KEY_TILE];
    float m_tile = -INFINITY;
    for (int j = 0; j < n; ++j) {
        const device float* kv = keys + (chain[t + j] * KVH + kvh) * D;
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) {
            dot += (qv[d] * scale) * kv[d];
        }
        s[j] = dot;
        m_tile = metal::max(m_tile, dot);
    }
    float m_new = metal::max(m, m_tile);
    float alpha = metal::exp(m - m_new);
    l *= alpha;
    for (int d = 0; d < D; ++d) {
        acc[d] *= alpha;
    }
    for (int j = 0; j < n; ++j) {
        float p = metal::exp(s[j] - m_new);
        l += p;
        const device float* vv = values + (chain[t + j] * KVH + kvh) * D;
        for (int d = 0; d < D; ++d) {
            acc[d] += p * vv[d];
        }
    }
    m = m_new;
}
device float* o = out + (qi * H + h) * D;
for (int d = 0; d < D; ++d) {
    o[d] = acc[d] / l;
}
