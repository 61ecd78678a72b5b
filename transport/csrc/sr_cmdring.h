/* SparkRing command ring: how a producer (a GPU kernel on the caller's stream, or a host
 * thread) hands collectives to the native progress thread (sr_progress.c), MSCCL++ FIFO style.
 *
 * The ring lives in memory both sides see (pinned, mapped host memory when the producer is a
 * GPU). One producer, one consumer, every index monotonic, no locks:
 *   producer: seq = next sequence (a device-side counter on the GPU, so every graph replay
 *             gets a fresh one); wait until done[seq % SLOTS] answers seq - SLOTS (the slot
 *             is free); fill cmd[slot]; release-store cmd[slot].seq = seq; release-store
 *             doorbell = seq; wait until done[slot].seq == seq; read done[slot].status.
 *   consumer: wait until doorbell moves; the command in slot next % SLOTS must carry seq ==
 *             next (anything else, or a doorbell that goes backwards, is a reused or stale
 *             sequence and is refused); run its plan; write status; release-store
 *             done[slot].seq = seq; raise wake (a GPU stream may wait on that one word with a
 *             stream memory operation, whose address and value a graph can bake in).
 * A failed ring answers every later command at once with the failure's status, so no waiter
 * (and no GPU stream) is ever left spinning. Both producers (sr_progress.c's host one and
 * sr_gpu.cu) post through one routine, sr_post.h; the ctypes mirrors in transport/_native.py
 * are checked against the compiled layout when the library loads. */
#ifndef SR_CMDRING_H
#define SR_CMDRING_H

#include <stdint.h>

#ifdef __cplusplus
#define SR_STATIC_ASSERT static_assert
#else
#define SR_STATIC_ASSERT _Static_assert
#endif

#define SR_RING_SLOTS 64
#define SR_RING_MAGIC 0x31474e52u /* "RNG1" */
#define SR_READY_FAILED 0x40000000u /* out_ready after a failure: passes every GEQ wait */

/* One command: which registered plan to run, and what the producer believes it is (the
 * consumer checks every field against the plan, so a stale or foreign command is refused). */
typedef struct sr_cmd {
    uint64_t seq; /* written last; 0 = never used */
    uint32_t plan;
    uint32_t op; /* enum sr_plan_kind */
    uint32_t dtype;
    uint32_t pad0;
    uint64_t count; /* elements */
    uint64_t in_off, out_off; /* arena byte offsets of the input and the result */
    uint64_t pad1[2];
} sr_cmd;

/* The answer to one command. */
typedef struct sr_done {
    uint64_t seq; /* the command answered, written last */
    int32_t status; /* 0 or an enum sr_status code */
    int32_t peer;   /* the peer a failure names, or -1 */
    uint64_t pad[6];
} sr_done;

typedef struct sr_cmdring {
    uint32_t magic;
    uint32_t slots;
    uint32_t wake; /* raised (1) after every answer: a GPU stream waits on it, then lowers it */
    /* Pipelined commands (a plan with chunk > 0): the producer raises in_ready to k once the
     * input's first k chunks are in the arena; the consumer raises out_ready to k once the
     * result's first k chunks are final (a GPU stream waits on it with a stream memory
     * operation, GEQ, then copies chunk k-1 out). The producer lowers both to 0 before it
     * posts (the stream may still be copying chunks out after the answer, so the consumer
     * never lowers them); a failure answer raises out_ready to SR_READY_FAILED so no stream
     * waits. */
    uint32_t in_ready;
    uint32_t out_ready;
    uint32_t pad;
    uint64_t pad0[5];
    uint64_t doorbell; /* the latest seq posted (own cache line) */
    uint64_t pad1[7];
    sr_cmd cmd[SR_RING_SLOTS];
    sr_done done[SR_RING_SLOTS];
} sr_cmdring;

SR_STATIC_ASSERT(sizeof(sr_cmd) == 64, "sr_cmd must be one cache line");
SR_STATIC_ASSERT(sizeof(sr_done) == 64, "sr_done must be one cache line");
SR_STATIC_ASSERT(sizeof(sr_cmdring) == 128 + 2 * 64 * SR_RING_SLOTS, "sr_cmdring layout");

enum sr_plan_kind { SR_PLAN_ALL_REDUCE = 0, SR_PLAN_ALL_GATHER = 1 };

/* Per-label counters of the progress thread (a plan's label is the collective's name as the
 * flight recorder knows it: all_reduce, all_gather, dcp_query_all_gather, ...). */
#define SR_MAX_LABELS 8

#endif
