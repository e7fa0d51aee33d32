// A small C++ stand-in for the Metal types and built-ins the basal kernels use, so that the kernel source MLX
// generates can run on a Linux CPU (tests/backends/metal_emulation.py).
//
// Execution model: threadgroups run one after another; inside one, simdgroups run one after another; a simdgroup
// is 32 lanes, each a fiber (ucontext), run in lane order until it reaches a simdgroup collective (simd_max,
// simd_shuffle, simd_shuffle_xor, simdgroup_barrier). When every lane has arrived, the collective is resolved and
// the lanes run on, again in order. A lane that finishes while others wait, a collective reached by a partial
// simdgroup, or lanes that meet different collectives abort the run: on a GPU those are undefined behaviour.
// Threadgroup memory is a function-scope `static` (one threadgroup runs at a time); simdgroups must not share it,
// because threadgroup_barrier is deliberately not provided. simd_sum is not provided either: its reduction order
// is the hardware's, which this stand-in cannot know; the kernels reduce across lanes only with exact operations.
#pragma once
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 600  // macOS keeps the (deprecated) ucontext routines behind it
#endif
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define device
#define constant
#define thread
#define threadgroup static

typedef unsigned int uint;
typedef unsigned short ushort;
struct uint3 {
    uint x, y, z;
};

namespace metal {
inline float exp(float x) { return std::exp(x); }
inline float sqrt(float x) { return std::sqrt(x); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
}  // namespace metal

enum class mem_flags { mem_none, mem_device, mem_threadgroup };

namespace standin {

enum Op { NONE, MAX, SHUFFLE, SHUFFLE_XOR, BARRIER };

struct Lane {
    ucontext_t ctx;
    std::vector<char> stack;
    int state = 0;  // 0 runnable, 1 waiting at a collective, 2 finished
    Op op = NONE;
    float value = 0, result = 0;
    int arg = 0;
};

inline Lane lanes[32];
inline int n_lanes = 0, current = 0;
inline ucontext_t scheduler;
inline std::function<void(int)> lane_body;

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "metal stand-in: %s\n", what);
    std::exit(3);
}

inline float collective(Op op, float value, int arg) {
    if (n_lanes != 32) fail("a simdgroup collective in a partial simdgroup");
    Lane& me = lanes[current];
    me.op = op, me.value = value, me.arg = arg, me.state = 1;
    swapcontext(&me.ctx, &scheduler);
    return me.result;
}

inline void lane_entry(int i) {
    lane_body(i);
    lanes[i].state = 2;  // returns to `scheduler` through uc_link
}

inline void resolve() {
    Op op = lanes[0].op;
    for (int i = 0; i < 32; ++i)
        if (lanes[i].op != op) fail("lanes of one simdgroup reached different collectives");
    float mx = -INFINITY;
    for (int i = 0; i < 32; ++i) mx = std::fmax(mx, lanes[i].value);
    for (int i = 0; i < 32; ++i) {
        Lane& l = lanes[i];
        if (op == MAX) l.result = mx;
        if (op == SHUFFLE) l.result = lanes[l.arg & 31].value;
        if (op == SHUFFLE_XOR) l.result = lanes[(i ^ l.arg) & 31].value;
        l.state = 0;
    }
}

// Runs `body(lane)` for lanes 0..n-1 of one simdgroup, resolving collectives as described above.
inline void run_simdgroup(int n, const std::function<void(int)>& body) {
    n_lanes = n;
    lane_body = body;
    for (int i = 0; i < n; ++i) {
        Lane& l = lanes[i];
        if (l.stack.empty()) l.stack.resize(1 << 18);
        getcontext(&l.ctx);
        l.ctx.uc_stack.ss_sp = l.stack.data();
        l.ctx.uc_stack.ss_size = l.stack.size();
        l.ctx.uc_link = &scheduler;
        l.state = 0;
        makecontext(&l.ctx, (void (*)())lane_entry, 1, i);
    }
    while (true) {
        for (int i = 0; i < n; ++i) {
            if (lanes[i].state != 0) continue;
            current = i;
            swapcontext(&scheduler, &lanes[i].ctx);
        }
        int done = 0;
        for (int i = 0; i < n; ++i) done += lanes[i].state == 2;
        if (done == n) return;
        if (done) fail("a lane finished while others wait at a collective (divergent control flow)");
        resolve();
    }
}

}  // namespace standin

inline float simd_max(float x) { return standin::collective(standin::MAX, x, 0); }
inline float simd_shuffle(float x, ushort lane) { return standin::collective(standin::SHUFFLE, x, lane); }
inline float simd_shuffle_xor(float x, ushort mask) { return standin::collective(standin::SHUFFLE_XOR, x, mask); }
inline void simdgroup_barrier(mem_flags) { standin::collective(standin::BARRIER, 0.0f, 0); }
