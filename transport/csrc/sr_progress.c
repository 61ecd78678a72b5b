/* SparkRing progress thread: runs the collectives a producer posts on a command ring.
 *
 * The producer is a GPU kernel on the caller's stream (transport/csrc/sr_gpu.cu) or a host
 * thread (sr_ring_post below; the tests and the rxe lane use it); both post through one
 * routine, sr_post.h. The thread is native so the hot path never waits for the GIL. It is
 * fabric-agnostic: it is handed an engine's sr_transfer_lanes (tcp: sr_engine.c, verbs:
 * sr_verbs.c) and that engine's peer handles, and runs each command's plan: a fixed list of
 * steps, built once per collective shape by transport/plan.py from the same schedule the host
 * collectives use (transport/schedule.py), over one arena the producer fills and reads back.
 * The bytes are therefore the host path's.
 *
 * Every wait is bounded. The first failure (a dead or stalled peer, a corrupt frame, a
 * refused command) marks the ring failed, aborts every link (so the neighbours fail fast
 * rather than wait out their own bound), and every command after it is answered at once
 * with the failure's status: no producer is ever left waiting. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "sr_cmdring.h"
#include "sr_layout.h"
#include "sr_post.h"
#include "sr_wire.h"

enum { SR_STEP_LANES = 0, SR_STEP_COPY = 1 };

/* One lane of a step, as arena offsets (the plan is independent of where the arena lives). */
typedef struct sr_step_lane {
    void *to;
    uint64_t soff, slen;
    void *from;
    uint64_t roff, rlen;
} sr_step_lane;

/* One engine call (kind LANES: op COPY or ADD over up to SR_MAX_LANES lanes), or a copy
 * inside the arena (kind COPY: lane[0].slen bytes from soff to roff). A pipelined plan's
 * step first waits until the ring's in_ready reaches need_in (the input chunks it touches
 * are in the arena), and afterwards raises out_ready to out_ready (the result chunks it
 * finished); 0 means neither (transport/plan.py computes both). */
typedef struct sr_step {
    int32_t kind, op, nlanes;
    uint32_t need_in, out_ready, pad;
    sr_step_lane lane[SR_MAX_LANES];
} sr_step;

typedef struct sr_plan {
    uint32_t kind, dtype, label, nsteps;
    uint64_t count, in_off, out_off;
    sr_step *steps;
} sr_plan;

typedef int (*sr_transfer_fn)(const sr_lane *lanes, int n, int op, int dtype, int timeout_ms, sr_error *err);
typedef void (*sr_abort_fn)(void *peer);

#define SR_PROGRESS_PEERS 4
/* After the per-label counts: errors, refused commands, engine steps, the last sequence answered,
 * then where the time goes (ns): running plans (a command seen to its answer), and the part of
 * it pipelined steps spent waiting for the producer's input copies. */
#define SR_STATS (SR_MAX_LABELS + 6)
enum { ST_ERRORS = SR_MAX_LABELS, ST_REFUSED, ST_STEPS, ST_LAST_SEQ, ST_PLAN_NS, ST_INPUT_WAIT_NS };

typedef struct sr_progress {
    sr_cmdring *ring;
    unsigned char *arena;
    uint64_t arena_bytes;
    sr_transfer_fn transfer;
    sr_abort_fn abort_peer;
    void *peers[SR_PROGRESS_PEERS];
    int npeers, timeout_ms, spin_us;
    sr_plan *plans;
    uint32_t max_plans, nplans; /* nplans is published with release: plans below it are immutable */
    pthread_t thread;
    int running, stop, paused; /* stop and paused are read by the thread with acquire */
    uint64_t next, last_bell;
    int failed;
    sr_error error;
    uint64_t host_seq; /* the host producer's sequence (sr_progress_submit) */
    uint64_t stats[SR_STATS];
} sr_progress;

static int64_t now_us(void) { return (int64_t)(sr_now_ns() / 1000); } /* sr_post.h's one clock */

/* Idle policy: spin (the lowest latency), then yield, then sleep in short slices so an idle
 * ring costs no core. `idle_us` is how long nothing has arrived. */
static void idle_wait(int64_t idle_us, int spin_us) {
    if (idle_us < spin_us) {
        for (int i = 0; i < 64; i++)
            sr_spin_pause();
    } else if (idle_us < spin_us + 2000) {
        sched_yield();
    } else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

sr_progress *sr_progress_new(sr_cmdring *ring, void *arena, uint64_t arena_bytes, void *transfer, void *abort_peer,
                             void *const *peers, int npeers, int timeout_ms, int spin_us, uint32_t max_plans) {
    if (!ring || !arena || !transfer || npeers < 0 || npeers > SR_PROGRESS_PEERS || timeout_ms <= 0 || !max_plans)
        return NULL;
    sr_progress *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->plans = calloc(max_plans, sizeof *p->plans);
    if (!p->plans) {
        free(p);
        return NULL;
    }
    memset(ring, 0, sizeof *ring);
    ring->magic = SR_RING_MAGIC;
    ring->slots = SR_RING_SLOTS;
    p->ring = ring;
    p->arena = arena;
    p->arena_bytes = arena_bytes;
    p->transfer = (sr_transfer_fn)transfer;
    p->abort_peer = (sr_abort_fn)abort_peer;
    for (int i = 0; i < npeers; i++)
        p->peers[i] = peers[i];
    p->npeers = npeers;
    p->timeout_ms = timeout_ms;
    p->spin_us = spin_us;
    p->max_plans = max_plans;
    p->next = 1;
    return p;
}

static int in_arena(const sr_progress *p, uint64_t off, uint64_t len) {
    return off <= p->arena_bytes && len <= p->arena_bytes - off;
}

/* Register a plan (copied); returns its id, or -1 with err filled. Plans are immutable once
 * added, so the thread reads them without a lock. */
int sr_progress_add_plan(sr_progress *p, uint32_t kind, uint32_t dtype, uint32_t label, uint64_t count,
                         uint64_t in_off, uint64_t out_off, const sr_step *steps, uint32_t nsteps, sr_error *err) {
    uint32_t id = p->nplans;
    if (id >= p->max_plans)
        return sr_fail(err, SR_EARG, -1, "command ring: %u plans registered, the limit", p->max_plans), -1;
    if (label >= SR_MAX_LABELS || dtype > SR_BF16)
        return sr_fail(err, SR_EARG, -1, "command ring: label %u or dtype %u out of range", label, dtype), -1;
    for (uint32_t s = 0; s < nsteps; s++) {
        const sr_step *st = &steps[s];
        if (st->nlanes < 1 || st->nlanes > SR_MAX_LANES || (st->kind == SR_STEP_COPY && st->nlanes != 1))
            return sr_fail(err, SR_EARG, -1, "plan step %u: %d lanes", s, st->nlanes), -1;
        for (int l = 0; l < st->nlanes; l++) {
            const sr_step_lane *ln = &st->lane[l];
            if (!in_arena(p, ln->soff, ln->slen) || !in_arena(p, ln->roff, st->kind == SR_STEP_COPY ? ln->slen : ln->rlen))
                return sr_fail(err, SR_EARG, -1, "plan step %u lane %d reaches past the %llu-byte arena", s, l,
                               (unsigned long long)p->arena_bytes), -1;
        }
    }
    sr_step *copy = malloc((nsteps ? nsteps : 1) * sizeof *copy);
    if (!copy)
        return sr_fail(err, SR_EIO, -1, "command ring: out of memory for a plan"), -1;
    memcpy(copy, steps, nsteps * sizeof *copy);
    p->plans[id] = (sr_plan){kind, dtype, label, nsteps, count, in_off, out_off, copy};
    __atomic_store_n(&p->nplans, id + 1, __ATOMIC_RELEASE);
    return (int)id;
}

/* Wait (bounded) until the producer has put the input's first `need` chunks in the arena. */
static int wait_input(sr_progress *p, uint32_t need, int64_t deadline, sr_error *err) {
    uint64_t t0 = sr_now_ns();
    int64_t start = (int64_t)(t0 / 1000);
    while (__atomic_load_n(&p->ring->in_ready, __ATOMIC_ACQUIRE) < need) {
        int64_t t = now_us();
        if (t > deadline)
            return sr_fail(err, SR_ETIMEOUT, -1, "command ring: input chunk %u never reached the arena (%u arrived)",
                           need, __atomic_load_n(&p->ring->in_ready, __ATOMIC_ACQUIRE));
        idle_wait(t - start, p->spin_us);
    }
    p->stats[ST_INPUT_WAIT_NS] += sr_now_ns() - t0;
    return 0;
}

static int run_plan(sr_progress *p, const sr_plan *pl, sr_error *err) {
    int64_t deadline = now_us() + (int64_t)p->timeout_ms * 1000;
    for (uint32_t s = 0; s < pl->nsteps; s++) {
        const sr_step *st = &pl->steps[s];
        int rc = st->need_in ? wait_input(p, st->need_in, deadline, err) : 0;
        if (rc)
            return rc;
        if (st->kind == SR_STEP_COPY) {
            memmove(p->arena + st->lane[0].roff, p->arena + st->lane[0].soff, st->lane[0].slen);
            if (st->out_ready)
                __atomic_store_n(&p->ring->out_ready, st->out_ready, __ATOMIC_RELEASE);
            continue;
        }
        sr_lane lanes[SR_MAX_LANES];
        for (int l = 0; l < st->nlanes; l++) {
            const sr_step_lane *ln = &st->lane[l];
            lanes[l] = (sr_lane){ln->to, p->arena + ln->soff, ln->slen, ln->from, p->arena + ln->roff, ln->rlen};
        }
        int64_t left_ms = (deadline - now_us()) / 1000;
        if (left_ms < 1)
            left_ms = 1; /* the engine reports the timeout, naming the peer it waited for */
        rc = p->transfer(lanes, st->nlanes, st->op, (int)pl->dtype, (int)left_ms, err);
        if (rc)
            return rc;
        if (st->out_ready)
            __atomic_store_n(&p->ring->out_ready, st->out_ready, __ATOMIC_RELEASE);
        p->stats[ST_STEPS]++;
    }
    return 0;
}

static void answer(sr_cmdring *r, uint64_t seq, int status, int peer) {
    sr_done *d = &r->done[seq % SR_RING_SLOTS];
    /* A failure leaves out_ready past every chunk, so no stream waits on it (the producer
     * lowers it again before its next post). */
    if (status)
        __atomic_store_n(&r->out_ready, SR_READY_FAILED, __ATOMIC_RELEASE);
    d->status = status;
    d->peer = peer;
    __atomic_store_n(&d->seq, seq, __ATOMIC_RELEASE);
    __atomic_store_n(&r->wake, 1u, __ATOMIC_RELEASE);
}

static void fail(sr_progress *p, const sr_error *e) {
    if (p->failed)
        return;
    p->error = *e;
    __atomic_store_n(&p->failed, 1, __ATOMIC_RELEASE);
    if (p->abort_peer)
        for (int i = 0; i < p->npeers; i++)
            if (p->peers[i])
                p->abort_peer(p->peers[i]);
}

/* Check the command in seq's slot against its plan; 0 or -code with err filled. */
static int vet(const sr_progress *p, const sr_cmd *c, uint64_t seq, sr_error *err) {
    if (c->seq != seq)
        return sr_fail(err, SR_ESEQ, -1, "command ring: slot %llu holds sequence %llu, expected %llu",
                       (unsigned long long)(seq % SR_RING_SLOTS), (unsigned long long)c->seq,
                       (unsigned long long)seq);
    uint32_t n = __atomic_load_n(&p->nplans, __ATOMIC_ACQUIRE);
    if (c->plan >= n)
        return sr_fail(err, SR_EPROTO, -1, "command %llu names plan %u, only %u registered",
                       (unsigned long long)seq, c->plan, n);
    const sr_plan *pl = &p->plans[c->plan];
    if (c->op != pl->kind || c->dtype != pl->dtype || c->count != pl->count || c->in_off != pl->in_off ||
        c->out_off != pl->out_off)
        return sr_fail(err, SR_EPROTO, -1, "command %llu does not match plan %u (op, dtype, count or offsets)",
                       (unsigned long long)seq, c->plan);
    return 0;
}

/* Consume everything posted up to `bell`. */
static void drain(sr_progress *p, uint64_t bell) {
    sr_cmdring *r = p->ring;
    while (p->next <= bell) {
        uint64_t seq = p->next;
        uint64_t posted = __atomic_load_n(&r->cmd[seq % SR_RING_SLOTS].seq, __ATOMIC_ACQUIRE);
        sr_cmd c = r->cmd[seq % SR_RING_SLOTS];
        c.seq = posted;
        sr_error err = {0, -1, ""};
        int rc = p->failed ? -p->error.code : vet(p, &c, seq, &err);
        if (!p->failed && rc) {
            p->stats[ST_REFUSED]++;
            fail(p, &err);
        } else if (!rc) {
            uint64_t t0 = sr_now_ns();
            rc = run_plan(p, &p->plans[c.plan], &err);
            p->stats[ST_PLAN_NS] += sr_now_ns() - t0;
            if (rc) {
                p->stats[ST_ERRORS]++;
                fail(p, &err);
            } else {
                p->stats[p->plans[c.plan].label]++;
            }
        }
        answer(r, seq, rc ? -rc : 0, rc ? p->error.peer_rank : -1);
        p->stats[ST_LAST_SEQ] = seq;
        p->next = seq + 1;
    }
}

static void *progress_loop(void *arg) {
    sr_progress *p = arg;
    sr_cmdring *r = p->ring;
    int64_t idle_since = now_us();
    while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
        uint64_t bell = __atomic_load_n(&r->doorbell, __ATOMIC_ACQUIRE);
        if (bell == p->last_bell || __atomic_load_n(&p->paused, __ATOMIC_ACQUIRE)) {
            idle_wait(now_us() - idle_since, p->spin_us);
            continue;
        }
        if (bell < p->last_bell) {
            /* The doorbell went backwards: a reused sequence. Refuse it, and release its waiter. */
            sr_error err;
            sr_fail(&err, SR_ESEQ, -1, "command ring: doorbell went back from %llu to %llu (a reused sequence)",
                    (unsigned long long)p->last_bell, (unsigned long long)bell);
            p->stats[ST_REFUSED]++;
            fail(p, &err);
            answer(r, bell, SR_ESEQ, -1);
            p->last_bell = bell;
            continue;
        }
        p->last_bell = bell;
        drain(p, bell);
        idle_since = now_us();
    }
    return NULL;
}

int sr_progress_start(sr_progress *p) {
    if (p->running)
        return 0;
    __atomic_store_n(&p->stop, 0, __ATOMIC_RELEASE);
    if (pthread_create(&p->thread, NULL, progress_loop, p))
        return -SR_EIO;
    p->running = 1;
    return 0;
}

void sr_progress_stop(sr_progress *p) {
    if (!p->running)
        return;
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    pthread_join(p->thread, NULL);
    p->running = 0;
}

/* Test hook: a paused thread leaves the ring untouched (to fill it, or to stall a rank). */
void sr_progress_pause(sr_progress *p, int paused) { __atomic_store_n(&p->paused, paused, __ATOMIC_RELEASE); }

void sr_progress_free(sr_progress *p) {
    if (!p)
        return;
    sr_progress_stop(p);
    for (uint32_t i = 0; i < p->nplans; i++)
        free(p->plans[i].steps);
    free(p->plans);
    free(p);
}

/* 1 and the first failure in `out` once the ring has failed, else 0. */
int sr_progress_failure(const sr_progress *p, sr_error *out) {
    if (!__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE))
        return 0;
    *out = p->error;
    return 1;
}

/* Per-label completions, then errors, refused commands, engine steps, the last sequence answered,
 * the ns spent running plans and the ns of it spent waiting for input chunks. Read while the
 * thread runs: each value is a plain word, read whole. */
void sr_progress_stats(const sr_progress *p, uint64_t out[SR_STATS]) {
    for (int i = 0; i < SR_STATS; i++)
        out[i] = __atomic_load_n(&p->stats[i], __ATOMIC_RELAXED);
}

/* ---- the host producer: what the GPU kernel does, for host threads and the tests ---- */

/* Post `c` as sequence `seq` (sr_post.h, the GPU producer's routine too) within timeout_ms: 0,
 * or -SR_ETIMEOUT when the ring stayed full. */
int sr_ring_post(sr_cmdring *r, uint64_t seq, const sr_cmd *c, int timeout_ms) {
    return -sr_cmdring_post(r, seq, c, (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u);
}

/* Wait (bounded) for the answer to `seq`: its status (0 or a code), -SR_ETIMEOUT if none came. */
int sr_ring_wait(const sr_cmdring *r, uint64_t seq, int timeout_ms, int *peer) {
    const sr_done *d = &r->done[seq % SR_RING_SLOTS];
    int64_t start = now_us(), deadline = start + (int64_t)timeout_ms * 1000;
    while (__atomic_load_n(&d->seq, __ATOMIC_ACQUIRE) != seq) {
        int64_t t = now_us();
        if (t > deadline)
            return -SR_ETIMEOUT;
        idle_wait(t - start, 50);
    }
    if (peer)
        *peer = d->peer;
    return d->status;
}

/* Post the registered plan `plan` as the host producer's next command; its sequence goes to
 * *seq. One host producer per ring (the same rule as the GPU's one stream). */
int sr_progress_submit(sr_progress *p, uint32_t plan, int timeout_ms, uint64_t *seq) {
    uint32_t n = __atomic_load_n(&p->nplans, __ATOMIC_ACQUIRE);
    if (plan >= n)
        return -SR_EARG;
    const sr_plan *pl = &p->plans[plan];
    sr_cmd c = {0, plan, pl->kind, pl->dtype, 0, pl->count, pl->in_off, pl->out_off, {0, 0}};
    uint64_t s = p->host_seq + 1;
    int rc = sr_ring_post(p->ring, s, &c, timeout_ms);
    if (rc == 0) {
        p->host_seq = s;
        *seq = s;
    }
    return rc;
}

/* What the Python mirrors of the command ring and the plan steps are checked against when this
 * library loads (sr_layout.h, transport/layout.py). */
static const sr_layout_entry progress_layout[] = {
    SR_LAYOUT_SIZE(sr_step_lane),
    SR_LAYOUT_FIELD(sr_step_lane, to),
    SR_LAYOUT_FIELD(sr_step_lane, soff),
    SR_LAYOUT_FIELD(sr_step_lane, slen),
    SR_LAYOUT_FIELD(sr_step_lane, from),
    SR_LAYOUT_FIELD(sr_step_lane, roff),
    SR_LAYOUT_FIELD(sr_step_lane, rlen),
    SR_LAYOUT_SIZE(sr_step),
    SR_LAYOUT_FIELD(sr_step, kind),
    SR_LAYOUT_FIELD(sr_step, op),
    SR_LAYOUT_FIELD(sr_step, nlanes),
    SR_LAYOUT_FIELD(sr_step, need_in),
    SR_LAYOUT_FIELD(sr_step, out_ready),
    SR_LAYOUT_FIELD(sr_step, pad),
    SR_LAYOUT_FIELD(sr_step, lane),
    SR_LAYOUT_SIZE(sr_cmd),
    SR_LAYOUT_FIELD(sr_cmd, seq),
    SR_LAYOUT_FIELD(sr_cmd, plan),
    SR_LAYOUT_FIELD(sr_cmd, op),
    SR_LAYOUT_FIELD(sr_cmd, dtype),
    SR_LAYOUT_FIELD(sr_cmd, pad0),
    SR_LAYOUT_FIELD(sr_cmd, count),
    SR_LAYOUT_FIELD(sr_cmd, in_off),
    SR_LAYOUT_FIELD(sr_cmd, out_off),
    SR_LAYOUT_FIELD(sr_cmd, pad1),
    SR_LAYOUT_SIZE(sr_cmdring),
    SR_LAYOUT_FIELD(sr_cmdring, in_ready),
    SR_LAYOUT_FIELD(sr_cmdring, out_ready),
    SR_LAYOUT_CONST(SR_RING_SLOTS),
    SR_LAYOUT_CONST(SR_MAX_LANES),
    SR_LAYOUT_CONST(SR_MAX_LABELS),
    SR_LAYOUT_CONST(SR_STATS),
    SR_LAYOUT_END,
};

const sr_layout_entry *sr_progress_layout(void) { return progress_layout; }
