// A small C++ stand-in for the Metal types and built-ins the basal kernels use, so that the kernel source MLX
// generates can run on a Linux CPU (tests/backends/metal_emulation.py).
//
// Execution model: threadgroups run one after another; inside one, every thread is a fiber (ucontext), and the
// fibers run in thread order until each reaches a synchronisation point: a simdgroup collective (simd_max,
// simd_shuffle, simd_shuffle_xor, simdgroup_barrier) or threadgroup_barrier. A collective is resolved when all
// 32 lanes of its simdgroup have reached it, a threadgroup barrier when every thread of the threadgroup has; then
// those threads run on, again in order. A thread that finishes while others of its simdgroup wait at a
// collective or others of its threadgroup at a barrier, a collective reached by a partial simdgroup, lanes that
// meet different collectives, or threads that can never all meet abort the run: on a GPU those are undefined
// behaviour or a hang. Threadgroup memory is a function-scope `static`, shared by the fibers of the running
// threadgroup, as on the GPU (so a kernel declares no `threadgroup` pointers: `static` would make them one-time). simd_sum is not provided: its reduction order is the hardware's, which this
// stand-in cannot know; the kernels reduce across lanes only with exact operations.
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

enum Op { NONE, MAX, SHUFFLE, SHUFFLE_XOR, BARRIER, GROUP_BARRIER };
enum State { RUNNABLE, WAITING, FINISHED };

struct Lane {
    ucontext_t ctx;
    std::vector<char> stack;
    State state = RUNNABLE;
    Op op = NONE;
    float value = 0, result = 0;
    int arg = 0;
};

inline std::vector<Lane> lanes;  // the threads of the running threadgroup
inline int n_threads = 0, current = 0;
inline ucontext_t scheduler;
inline std::function<void(int)> thread_body;

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "metal stand-in: %s\n", what);
    std::exit(3);
}

inline float wait_at(Op op, float value, int arg) {
    Lane& me = lanes[current];
    me.op = op, me.value = value, me.arg = arg, me.state = WAITING;
    swapcontext(&me.ctx, &scheduler);
    return me.result;
}

inline float collective(Op op, float value, int arg) {
    int first = current / 32 * 32;
    if (n_threads - first < 32) fail("a simdgroup collective in a partial simdgroup");
    return wait_at(op, value, arg);
}

inline void thread_entry(int i) {
    thread_body(i);
    lanes[i].state = FINISHED;  // returns to `scheduler` through uc_link
}

// The simdgroup starting at `first`, if all its lanes wait at a collective: resolve it. -> resolved
inline bool resolve_simdgroup(int first) {
    if (n_threads - first < 32) return false;
    Op op = lanes[first].op;
    for (int i = first; i < first + 32; ++i)
        if (lanes[i].state != WAITING || lanes[i].op == GROUP_BARRIER) return false;
    for (int i = first; i < first + 32; ++i)
        if (lanes[i].op != op) fail("lanes of one simdgroup reached different collectives");
    float mx = -INFINITY;
    for (int i = first; i < first + 32; ++i) mx = std::fmax(mx, lanes[i].value);
    for (int i = first; i < first + 32; ++i) {
        Lane& l = lanes[i];
        if (op == MAX) l.result = mx;
        if (op == SHUFFLE) l.result = lanes[first + (l.arg & 31)].value;
        if (op == SHUFFLE_XOR) l.result = lanes[first + ((i - first) ^ l.arg) % 32].value;
        l.state = RUNNABLE;
    }
    return true;
}

// Runs `body(thread)` for threads 0..n-1 of one threadgroup, resolving collectives and barriers as described above.
inline void run_threadgroup(int n, const std::function<void(int)>& body) {
    n_threads = n;
    thread_body = body;
    if ((int)lanes.size() < n) lanes.resize(n);
    for (int i = 0; i < n; ++i) {
        Lane& l = lanes[i];
        if (l.stack.empty()) l.stack.resize(1 << 16);
        getcontext(&l.ctx);
        l.ctx.uc_stack.ss_sp = l.stack.data();
        l.ctx.uc_stack.ss_size = l.stack.size();
        l.ctx.uc_link = &scheduler;
        l.state = RUNNABLE;
        l.op = NONE;
        makecontext(&l.ctx, (void (*)())thread_entry, 1, i);
    }
    while (true) {
        for (int i = 0; i < n; ++i) {
            if (lanes[i].state != RUNNABLE) continue;
            current = i;
            swapcontext(&scheduler, &lanes[i].ctx);
        }
        int finished = 0, at_barrier = 0;
        for (int i = 0; i < n; ++i) {
            finished += lanes[i].state == FINISHED;
            at_barrier += lanes[i].state == WAITING && lanes[i].op == GROUP_BARRIER;
        }
        if (finished == n) return;
        bool progress = false;
        for (int first = 0; first < n; first += 32) {
            int size = std::min(32, n - first), done = 0;
            for (int i = first; i < first + size; ++i) done += lanes[i].state == FINISHED;
            if (done && done < size) fail("a lane finished while others of its simdgroup wait (divergent control flow)");
            progress |= resolve_simdgroup(first);
        }
        if (!progress && at_barrier == n) {
            for (int i = 0; i < n; ++i) lanes[i].state = RUNNABLE;
            progress = true;
        }
        if (!progress && finished + at_barrier == n) fail("a thread finished while others wait at threadgroup_barrier");
        if (!progress) fail("threads wait at synchronisation points that can never all be met (divergent barriers)");
    }
}

}  // namespace standin

inline float simd_max(float x) { return standin::collective(standin::MAX, x, 0); }
inline float simd_shuffle(float x, ushort lane) { return standin::collective(standin::SHUFFLE, x, lane); }
inline float simd_shuffle_xor(float x, ushort mask) { return standin::collective(standin::SHUFFLE_XOR, x, mask); }
inline void simdgroup_barrier(mem_flags) { standin::collective(standin::BARRIER, 0.0f, 0); }
inline void threadgroup_barrier(mem_flags) { standin::wait_at(standin::GROUP_BARRIER, 0.0f, 0); }
