// Letter logits at the readout positions, f32: logits[r, j] = sum_d x[r, d] * head[j, d].
//
// One thread per (readout, letter), summing over d in order: a readout's logits never depend on how many
// readouts the forward has (MLX's own matmul picks a kernel by the row count on Metal).
//
// inputs: x [R, D], head [Lt, D] (f32), params = {R, Lt, D}; output: out [R, Lt] f32.
uint gid = thread_position_in_grid.x;
int R = params[0], LT = params[1], D = params[2];
if ((int)gid >= R * LT) {
    return;
}
int r = gid / LT;
int j = gid % LT;
const device float* xv = x + r * D;
const device float* hv = head + j * D;
float sum = 0.0f;
for (int d = 0; d < D; ++d) {
    sum += xv[d] * hv[d];
}
out[gid] = sum;
