/* SparkRing command ring: the one posting routine, compiled by gcc for the host producer
 * (sr_ring_post in sr_progress.c) and by nvcc for the GPU producer (post() in sr_gpu.cu), so
 * the two cannot drift apart. Only the memory operations and the clock differ per side:
 *   host: GCC/C11 atomic builtins (release stores, acquire loads), CLOCK_MONOTONIC;
 *   GPU:  ld.acquire.sys / st.release.sys on the mapped ring (system scope: the consumer is
 *         a host thread), %globaltimer.
 * The protocol itself is stated once, in sr_cmdring.h. */
#ifndef SR_POST_H
#define SR_POST_H

#include <stdint.h>

#include "sr_cmdring.h"
#include "sr_status.h"

#if defined(__CUDACC__)

#define SR_POST_FN static __device__ __forceinline__

SR_POST_FN uint64_t sr_load_acquire_u64(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

SR_POST_FN void sr_store_release_u64(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

SR_POST_FN uint64_t sr_now_ns(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

SR_POST_FN void sr_spin_pause(void) {}

#else

#include <time.h>

#define SR_POST_FN static inline

SR_POST_FN uint64_t sr_load_acquire_u64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

SR_POST_FN void sr_store_release_u64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

SR_POST_FN uint64_t sr_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

SR_POST_FN void sr_spin_pause(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif

/* Post `c` (its seq field is ignored) as sequence `seq` once its slot is free (the command
 * SR_RING_SLOTS before it was answered), within timeout_ns: the fields, then a release store
 * of the slot's seq, then a release store of the doorbell. 0, or SR_ETIMEOUT when the ring
 * stayed full. */
SR_POST_FN int sr_cmdring_post(sr_cmdring *r, uint64_t seq, const sr_cmd *c, uint64_t timeout_ns) {
    sr_cmd *slot = &r->cmd[seq % SR_RING_SLOTS];
    const sr_done *d = &r->done[seq % SR_RING_SLOTS];
    uint64_t start = sr_now_ns();
    while (seq > SR_RING_SLOTS && sr_load_acquire_u64(&d->seq) < seq - SR_RING_SLOTS) {
        if (sr_now_ns() - start > timeout_ns)
            return SR_ETIMEOUT;
        sr_spin_pause();
    }
    slot->plan = c->plan;
    slot->op = c->op;
    slot->dtype = c->dtype;
    slot->count = c->count;
    slot->in_off = c->in_off;
    slot->out_off = c->out_off;
    sr_store_release_u64(&slot->seq, seq);
    sr_store_release_u64(&r->doorbell, seq);
    return SR_OK;
}

#endif
